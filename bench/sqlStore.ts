/**
 * Benchmark 3, on the application's own database: `SqlOffsetStore` on MariaDB (`@effect/sql-mysql2`) and SQLite (the
 * examples' client over `node:sqlite`). The store's unit (the rows written with the application's `SqlClient`, and
 * the position in the same transaction) against a transaction written by hand on the same client doing the same
 * writes: BEGIN, the rows, the position's row locked, its owner epoch checked and written, COMMIT.
 */
import { MysqlClient } from "@effect/sql-mysql2"
import * as SqlClient from "@effect/sql/SqlClient"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as ManagedRuntime from "effect/ManagedRuntime"
import * as Redacted from "effect/Redacted"
import * as os from "node:os"
import * as path from "node:path"
import * as fs from "node:fs"
import * as Sqlite from "../examples/support/sqlite.js"
import { OffsetStore } from "../src/OffsetStore.js"
import * as SqlOffsetStore from "../src/SqlOffsetStore.js"
import * as TopicPartition from "../src/TopicPartition.js"
import { type BenchResult, compare, pairedRatioAtLeast, pairedRatioInfo, type Plan, timed } from "./harness.js"

export interface SqlStoreSizes {
  /** Records per run for each batch size. */
  readonly recordsPerBatchSize: ReadonlyArray<readonly [batch: number, records: number]>
}

export type SqlDatabase = "mysql" | "sqlite"

const targets: Readonly<Record<number, number>> = { 100: 0.75, 1000: 0.9 }

const partition = TopicPartition.make("bench", 0)

const names = (database: SqlDatabase) => ({
  title: database === "mysql" ? "MariaDB" : "SQLite",
  partitionColumn: database === "mysql" ? "`partition`" : "\"partition\"",
  lock: database === "mysql" ? " for update" : "",
  begin: database === "mysql" ? "start transaction" : "begin immediate",
  now: database === "mysql" ? "current_timestamp(3)" : "strftime('%Y-%m-%dT%H:%M:%fZ')"
})

export const exactlyOnceSql = async (
  plan: Plan,
  database: SqlDatabase,
  sizes: SqlStoreSizes
): Promise<ReadonlyArray<BenchResult>> => {
  const suffix = `${process.pid}_${Math.floor(Math.random() * 1e9)}`
  const resultsTable = `bench_sql_results_${suffix}`
  const offsetsTable = `bench_sql_offsets_${suffix}`
  const file = path.join(os.tmpdir(), `bench-sql-${suffix}.db`)
  const client: Layer.Layer<SqlClient.SqlClient, unknown> = database === "mysql"
    ? MysqlClient.layer({
      url: Redacted.make(process.env.MYSQL_URL ?? "mysql://root@127.0.0.1:3306/test"),
      maxConnections: 4
    })
    : Sqlite.layer({ filename: file })
  const runtime = ManagedRuntime.make(
    SqlOffsetStore.layer({ table: offsetsTable, migrate: true }).pipe(Layer.provideMerge(client))
  )
  const n = names(database)
  const run = <A, E>(effect: Effect.Effect<A, E, SqlClient.SqlClient | OffsetStore>) => runtime.runPromise(effect)
  const exec = (text: string) => run(Effect.flatMap(SqlClient.SqlClient, (sql) => sql.unsafe(text)))
  try {
    await exec(
      `create table ${resultsTable} (${n.partitionColumn} integer not null, record_offset bigint not null,
       value varchar(300) not null, primary key (${n.partitionColumn}, record_offset))`
    )
    const value = "a".repeat(256)
    const insert = (rows: ReadonlyArray<{ readonly partition: number; readonly record_offset: string }>) =>
      Effect.flatMap(
        SqlClient.SqlClient,
        (sql) =>
          sql`insert into ${sql(resultsTable)} ${
            sql.insert(rows.map((row) => ({ partition: row.partition, record_offset: row.record_offset, value })))
          }`
      )
    // What the store's unit does, written by hand with the same client: on one reserved connection, BEGIN, the rows,
    // the position's row read with a lock, its epoch checked, the position written, COMMIT.
    const handWritten = (groupId: string, rows: ReadonlyArray<Row>, epoch: bigint, next: bigint) =>
      Effect.scoped(Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const connection = yield* sql.reserve
        const plain = (text: string) => connection.executeUnprepared(text, [], undefined)
        yield* plain(n.begin)
        const body = Effect.gen(function*() {
          yield* Effect.provideService(insert(rows), SqlClient.TransactionConnection, [connection, 0] as const)
          const found = yield* connection.execute(
            `select cast(epoch as ${database === "mysql" ? "char" : "text"}) as epoch from ${offsetsTable}
             where group_id = ? and topic = 'bench' and ${n.partitionColumn} = 0${n.lock}`,
            [groupId],
            undefined
          )
          if (String(found[0]?.epoch) !== epoch.toString()) return yield* Effect.dieMessage("fenced")
          yield* connection.execute(
            `update ${offsetsTable} set next_offset = ?, updated_at = ${n.now}
             where group_id = ? and topic = 'bench' and ${n.partitionColumn} = 0`,
            [next.toString(), groupId],
            undefined
          )
          yield* plain("commit")
        })
        yield* Effect.onError(body, () => Effect.ignore(plain("rollback")))
      }))
    const out: Array<BenchResult> = []
    for (const [batch, records] of sizes.recordsPerBatchSize) {
      out.push(
        await timed(async () => {
          plan.log(
            `3. exactly-once on ${n.title} (SqlOffsetStore), batches of ${batch}, ${
              records.toLocaleString("en-US")
            } records`
          )
          const batches: Array<ReadonlyArray<Row>> = []
          for (let start = 0; start < records; start += batch) {
            const rows: Array<Row> = []
            for (let o = start; o < Math.min(records, start + batch); o++) {
              rows.push({ partition: 0, record_offset: String(o) })
            }
            batches.push(rows)
          }
          const rate = (started: number) => ({
            value: records / ((performance.now() - started) / 1000),
            details: { "ms per batch": (performance.now() - started) / batches.length }
          })
          let group = 0
          // Each run claims a fresh group and starts from an empty results table.
          const fresh = async () => {
            await exec(`delete from ${resultsTable}`)
            const groupId = `bench-${suffix}-${batch}-${++group}`
            const claims = await run(Effect.flatMap(OffsetStore, (store) => store.claim(groupId, [partition])))
            return { groupId, epoch: claims.get(TopicPartition.key(partition))!.epoch }
          }
          const variants = await compare(plan, [
            {
              id: "h",
              label: "hand-written transaction on the same client: rows, position locked, checked, written",
              run: async () => {
                const { epoch, groupId } = await fresh()
                const started = performance.now()
                await run(Effect.gen(function*() {
                  let next = 0n
                  for (const rows of batches) {
                    next += BigInt(rows.length)
                    yield* handWritten(groupId, rows, epoch, next)
                  }
                }))
                return rate(started)
              }
            },
            {
              id: "tx",
              label: "SqlOffsetStore.commit: the rows through the SqlClient + the position, one transaction",
              run: async () => {
                const { epoch, groupId } = await fresh()
                const started = performance.now()
                await run(Effect.gen(function*() {
                  const store = yield* OffsetStore
                  let next = 0n
                  for (const rows of batches) {
                    next += BigInt(rows.length)
                    yield* store.commit({ groupId, partition, epoch, next }, insert(rows))
                  }
                }))
                return rate(started)
              }
            }
          ])
          const target = targets[batch]
          return {
            id: `sql-${database}-batch-${batch}`,
            title: `3. Exactly-once on ${n.title} (SqlOffsetStore): ${
              records.toLocaleString("en-US")
            } records of 256 B, batches of ${batch}`,
            unit: "records/s",
            warmup: plan.warmup,
            rounds: plan.rounds,
            variants,
            checks: [
              target === undefined
                ? pairedRatioInfo(variants, "tx", "h")
                : pairedRatioAtLeast(variants, "tx", "h", target)
            ],
            notes: [
              `one partition, batches one after another, the same ${
                database === "mysql"
                  ? "@effect/sql-mysql2 pool (4 connections)"
                  : "node:sqlite connection (a file, WAL)"
              } and results table for both; the rows are deleted and a fresh group claimed before every run`,
              "tx: a connection reserved from the client, BEGIN, the multi-row INSERT written with the SqlClient, the " +
              "position's row read with a lock and its epoch checked, the position written with the unit's id, COMMIT; " +
              "h: the same statements by hand on the same client (the ceiling for tx)"
            ]
          }
        })
      )
    }
    return out
  } finally {
    if (database === "mysql") {
      await exec(`drop table if exists ${resultsTable}`).catch(() => undefined)
      await exec(`drop table if exists ${offsetsTable}`).catch(() => undefined)
    }
    await runtime.dispose()
    if (database === "sqlite") {
      for (const f of [file, `${file}-wal`, `${file}-shm`]) fs.rmSync(f, { force: true })
    }
  }
}

interface Row {
  readonly partition: number
  readonly record_offset: string
}
