/**
 * SqlOffsetStore across a restart of its database server: a MariaDB server of this file's own (a data directory in
 * the temporary directory, on a free port), killed with SIGKILL in the middle of a unit and started again. The unit
 * is rolled back with the server and run again once the server answers, within `retryFor`; it lands once.
 */
import { MysqlClient } from "@effect/sql-mysql2"
import * as SqlClient from "@effect/sql/SqlClient"
import { afterAll, assert, beforeAll, describe, it } from "@effect/vitest"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Redacted from "effect/Redacted"
import * as Ref from "effect/Ref"
import * as Schedule from "effect/Schedule"
import { type ChildProcess, execFileSync, spawn } from "node:child_process"
import * as fs from "node:fs"
import * as net from "node:net"
import * as os from "node:os"
import * as path from "node:path"
import { OffsetStore } from "../src/OffsetStore.js"
import * as SqlOffsetStore from "../src/SqlOffsetStore.js"
import * as TopicPartition from "../src/TopicPartition.js"
import { SuiteResults } from "./offsetStoreSuite.js"

const directory = fs.mkdtempSync(path.join(os.tmpdir(), "sql-store-restart-"))
const dataDirectory = path.join(directory, "data")
let port = 0
let server: ChildProcess | undefined

const freePort = () =>
  new Promise<number>((resolve, reject) => {
    const probe = net.createServer()
    probe.once("error", reject)
    probe.listen(0, "127.0.0.1", () => {
      const address = probe.address()
      probe.close(() => resolve(typeof address === "object" && address !== null ? address.port : 0))
    })
  })

/** Starts the server on the data directory; answers once it takes connections. */
const startServer = () => {
  server = spawn("mariadbd", [
    "--no-defaults",
    `--datadir=${dataDirectory}`,
    "--user=root",
    `--port=${port}`,
    "--bind-address=127.0.0.1",
    `--socket=${path.join(directory, "sock")}`,
    `--pid-file=${path.join(directory, "pid")}`,
    "--skip-log-bin",
    "--innodb-buffer-pool-size=32M"
  ], { stdio: "ignore" })
}

const answers = () =>
  new Promise<boolean>((resolve) => {
    const socket = net.connect(port, "127.0.0.1")
    socket.once("connect", () => {
      socket.destroy()
      resolve(true)
    })
    socket.once("error", () => resolve(false))
  })

const untilAnswers = async () => {
  for (let i = 0; i < 200; i++) {
    if (await answers()) return
    await new Promise((resolve) => setTimeout(resolve, 100))
  }
  throw new Error(`the test's MariaDB server on port ${port} did not start; see mariadbd in ${directory}`)
}

beforeAll(async () => {
  port = await freePort()
  execFileSync("mariadb-install-db", [
    "--no-defaults",
    `--datadir=${dataDirectory}`,
    "--user=root",
    "--auth-root-authentication-method=normal",
    "--skip-test-db"
  ], { stdio: "ignore" })
  startServer()
  await untilAnswers()
  execFileSync("mariadb", ["-h", "127.0.0.1", "-P", String(port), "-u", "root", "-e", "create database test"])
}, 60_000)

afterAll(() => {
  server?.kill("SIGKILL")
  fs.rmSync(directory, { recursive: true, force: true })
})

const partition = TopicPartition.make("orders", 0)

describe("SqlOffsetStore when its MariaDB server is killed and restarted", () => {
  it.live(
    "mid-unit: the unit is rolled back with the server, runs again once it answers, and lands once",
    () =>
      Effect.gen(function*() {
        const results = yield* SuiteResults
        const store = yield* OffsetStore
        const groupId = `g-${crypto.randomUUID()}`
        const claims = yield* store.claim(groupId, [partition])
        const epoch = claims.get(TopicPartition.key(partition))!.epoch
        const attempts = yield* Ref.make(0)
        yield* store.commit(
          { groupId, partition, epoch, next: 2n },
          Effect.gen(function*() {
            const attempt = yield* Ref.updateAndGet(attempts, (n) => n + 1)
            yield* results.write(groupId, partition, ["a"])
            if (attempt === 1) {
              // SIGKILL: the server ends its transaction only by its recovery, once it is started again.
              yield* Effect.sync(() => {
                server?.kill("SIGKILL")
              })
              yield* Effect.async<void>((resume) => {
                server!.once("exit", () => resume(Effect.void))
              })
              yield* Effect.sync(startServer)
            }
            yield* results.write(groupId, partition, ["b"])
          })
        )
        assert.isAtLeast(yield* Ref.get(attempts), 2, "the first attempt was lost with the server")
        assert.deepStrictEqual(yield* results.read(groupId, partition), ["a", "b"])
        const positions = yield* store.load(groupId, [partition])
        assert.strictEqual(positions.get(TopicPartition.key(partition)), 2n)
      }).pipe(
        Effect.provide(Layer.unwrapEffect(Effect.sync(() => {
          const client = MysqlClient.layer({
            url: Redacted.make(`mysql://root@127.0.0.1:${port}/test`),
            maxConnections: 4
          })
          const resultsLayer = Layer.effect(
            SuiteResults,
            Effect.gen(function*() {
              const sql = yield* SqlClient.SqlClient
              yield* sql.unsafe(
                "create table if not exists results (id bigint auto_increment primary key, group_id varchar(100), " +
                  "value varchar(100))"
              )
              return {
                write: (groupId, _partition, values) =>
                  Effect.forEach(
                    values,
                    (value) => sql`insert into results (group_id, value) values (${groupId}, ${value})`,
                    {
                      discard: true
                    }
                  ),
                read: (groupId) =>
                  Effect.map(
                    sql<{ readonly value: string }>`select value from results where group_id = ${groupId} order by id`,
                    (rows) => rows.map((row) => row.value)
                  )
              }
            })
          )
          return Layer.mergeAll(
            resultsLayer,
            SqlOffsetStore.layer({ migrate: true, retry: Schedule.spaced("100 millis"), retryFor: "30 seconds" })
          ).pipe(Layer.provideMerge(client))
        })))
      ),
    { timeout: 60_000 }
  )
})
