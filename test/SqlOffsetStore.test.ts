import { afterAll, assert, describe, it } from "@effect/vitest"
import { MysqlClient } from "@effect/sql-mysql2"
import * as SqlClient from "@effect/sql/SqlClient"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as ManagedRuntime from "effect/ManagedRuntime"
import * as Ref from "effect/Ref"
import * as Redacted from "effect/Redacted"
import * as Schedule from "effect/Schedule"
import { InvalidConfig } from "../src/KafkaError.js"
import * as OffsetStore from "../src/OffsetStore.js"
import * as PgOffsetStore from "../src/PgOffsetStore.js"
import * as SqlOffsetStore from "../src/SqlOffsetStore.js"
import * as TopicPartition from "../src/TopicPartition.js"
import { offsetStoreSuite, SuiteResults } from "./offsetStoreSuite.js"
import { commitDroppingProxy as sharedCommitDroppingProxy } from "./support/commitProxy.js"
import { clientLayer, type Database, databases, exec, mysqlUrl, serialKey } from "./support/sqlStores.js"

const runId = `${Date.now().toString(36)}_${crypto.randomUUID().slice(0, 8)}`
const table = `kafka_offsets_sql_${runId}`
const resultsTable = `${table}_results`

const partitionColumn = (database: Database) => database === "mysql" ? "`partition`" : "\"partition\""

/** The handler's results: rows in a table of the application's, written with its own `sql`. */
const resultsLayer = (database: Database) =>
  Layer.effect(
    SuiteResults,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      yield* sql.unsafe(
        `create table if not exists ${resultsTable} (id ${serialKey(database)}, group_id varchar(200) not null,
         topic varchar(200) not null, ${partitionColumn(database)} int not null, value varchar(200) not null)`
      )
      return {
        write: (groupId, partition, values) =>
          Effect.forEach(values, (value) =>
            sql`insert into ${sql(resultsTable)} (group_id, topic, ${sql("partition")}, value)
                values (${groupId}, ${partition.topic}, ${partition.partition}, ${value})`, { discard: true }),
        read: (groupId, partition) =>
          sql<{ readonly value: string }>`select value from ${sql(resultsTable)}
            where group_id = ${groupId} and topic = ${partition.topic} and ${sql("partition")} = ${partition.partition}
            order by id`.pipe(Effect.map((rows) =>
            rows.map((row) =>
              row.value
            )
          ))
      }
    })
  )

const storeLayer = (options: SqlOffsetStore.Options = {}) =>
  SqlOffsetStore.layer({ table, migrate: true, retry: Schedule.spaced("20 millis"), ...options })

const suiteLayer = (database: Database) =>
  Layer.mergeAll(resultsLayer(database), storeLayer()).pipe(Layer.provideMerge(clientLayer(database)))

for (const database of databases) {
  offsetStoreSuite(`SqlOffsetStore (${database})`, suiteLayer(database), { oneWriter: database === "sqlite" })
}

afterAll(async () => {
  for (const database of ["mysql", "pg"] as const) {
    const runtime = ManagedRuntime.make(clientLayer(database, { poolSize: 1 }))
    await runtime.runPromise(
      Effect.all([
        exec(`drop table if exists ${table}`),
        exec(`drop table if exists ${resultsTable}`),
        exec(`drop table if exists ${table}_locks`)
      ])
    ).catch(() => undefined)
    await runtime.dispose()
  }
})

const orders0 = TopicPartition.make("orders", 0)
const newGroup = () => `g-${crypto.randomUUID()}`

const claimOne = (groupId: string) =>
  Effect.flatMap(OffsetStore.OffsetStore, (store) => store.claim(groupId, [orders0])).pipe(
    Effect.map((claims) => claims.get(TopicPartition.key(orders0))!)
  )

const commitValues = <A, E, R>(groupId: string, epoch: bigint, next: bigint, work: Effect.Effect<A, E, R>) =>
  Effect.flatMap(
    OffsetStore.OffsetStore,
    (store) => store.commit({ groupId, partition: orders0, epoch, next }, work)
  )

const readResults = (groupId: string) => Effect.flatMap(SuiteResults, (results) => results.read(groupId, orders0))

const writeResults = (groupId: string, values: ReadonlyArray<string>) =>
  Effect.flatMap(SuiteResults, (results) => results.write(groupId, orders0, values))

const position = (groupId: string) =>
  Effect.flatMap(OffsetStore.OffsetStore, (store) => store.load(groupId, [orders0])).pipe(
    Effect.map((positions) => positions.get(TopicPartition.key(orders0)))
  )

describe("SqlOffsetStore", () => {
  for (const database of databases) {
    describe(database, () => {
      it.effect("refuses a table name that is not an identifier, naming it", () =>
        Effect.gen(function*() {
          const exit = yield* Effect.exit(
            Layer.build(SqlOffsetStore.layer({ table: "offsets; drop table x" })).pipe(Effect.scoped)
          )
          assert.isTrue(Exit.isFailure(exit))
          const error = Exit.isFailure(exit) ? exit.cause : undefined
          assert.include(String(error), "table")
          assert.isTrue(
            Exit.isFailure(exit) && exit.cause._tag === "Fail" && exit.cause.error instanceof InvalidConfig
          )
        }).pipe(Effect.provide(clientLayer(database))))

      it.effect("says to use the SqlClient when the handler reaches for another store's transaction", () =>
        Effect.gen(function*() {
          const group = newGroup()
          const { epoch } = yield* claimOne(group)
          const appended = yield* Effect.exit(commitValues(group, epoch, 1n, OffsetStore.append(["x"])))
          assert.isTrue(Exit.isFailure(appended))
          assert.include(String(Exit.isFailure(appended) ? appended.cause : ""), "SqlClient")
          const pg = yield* Effect.exit(commitValues(group, epoch, 1n, PgOffsetStore.sql))
          assert.isTrue(Exit.isFailure(pg))
          assert.strictEqual(yield* position(group), undefined)
        }).pipe(Effect.provide(suiteLayer(database))))

      it.effect("runs a nested withTransaction of the handler as a savepoint of the unit", () =>
        Effect.gen(function*() {
          const sql = yield* SqlClient.SqlClient
          const group = newGroup()
          const { epoch } = yield* claimOne(group)
          yield* commitValues(
            group,
            epoch,
            3n,
            Effect.gen(function*() {
              yield* writeResults(group, ["kept"])
              yield* sql.withTransaction(Effect.zipRight(writeResults(group, ["undone"]), Effect.fail("inner"))).pipe(
                Effect.ignore
              )
              yield* sql.withTransaction(writeResults(group, ["nested"]))
            })
          )
          assert.deepStrictEqual(yield* readResults(group), ["kept", "nested"])
          assert.strictEqual(yield* position(group), 3n)
        }).pipe(Effect.provide(suiteLayer(database))))

      it.effect("refuses the statements of a fiber of the handler that outlived the unit", () =>
        Effect.gen(function*() {
          const group = newGroup()
          const { epoch } = yield* claimOne(group)
          const later = yield* Deferred.make<void>()
          const fiber = yield* commitValues(
            group,
            epoch,
            1n,
            Effect.forkDaemon(Effect.zipRight(Deferred.await(later), writeResults(group, ["late"])))
          )
          yield* Deferred.succeed(later, undefined)
          const exit = yield* Fiber.await(fiber)
          assert.isTrue(Exit.isFailure(exit))
          assert.include(String(Exit.isFailure(exit) ? exit.cause : ""), "has ended")
          assert.deepStrictEqual(yield* readResults(group), [])
          assert.strictEqual(yield* position(group), 1n)
        }).pipe(Effect.provide(suiteLayer(database))))
    })
  }

  it.effect("refuses an isolation level on SQLite, whose transactions are serializable", () =>
    Effect.gen(function*() {
      const exit = yield* Effect.exit(
        Layer.build(SqlOffsetStore.layer({ isolationLevel: "read committed" })).pipe(Effect.scoped)
      )
      assert.isTrue(Exit.isFailure(exit) && exit.cause._tag === "Fail" && exit.cause.error instanceof InvalidConfig)
    }).pipe(Effect.provide(clientLayer("sqlite"))))
})

/** A connection of the test's own, reserved from the application's pool, for statements outside any unit. */
const control = <A, E, R>(
  f: (run: (text: string) => Effect.Effect<ReadonlyArray<any>, unknown>) => Effect.Effect<A, E, R>
) =>
  Effect.scoped(
    Effect.flatMap(
      Effect.flatMap(SqlClient.SqlClient, (sql) => sql.reserve),
      (connection) => f((text) => connection.executeUnprepared(text, [], undefined))
    )
  )

/** Polls until `check` holds, for at most 20 seconds: the test waits for a state of the server, not for a time. */
const until = <E, R>(what: string, check: Effect.Effect<boolean, E, R>) =>
  Effect.repeat(check, { until: (held) => held, schedule: Schedule.spaced("10 millis") }).pipe(
    Effect.timeoutFail({ duration: "20 seconds", onTimeout: () => new Error(`timed out waiting for ${what}`) })
  )

/** What the fault tests do differently on each server. */
const faults = {
  mysql: {
    connectionId: "select connection_id() as id",
    kill: (id: string) => `kill connection ${id}`,
    killName: "KILL CONNECTION",
    waitingForLock: (id: string) =>
      `select count(*) as n from information_schema.innodb_trx where trx_mysql_thread_id = ${id}
       and trx_state = 'LOCK WAIT'`,
    begin: "start transaction"
  },
  pg: {
    connectionId: "select pg_backend_pid() as id",
    kill: (id: string) => `select pg_terminate_backend(${id})`,
    killName: "pg_terminate_backend",
    waitingForLock: (id: string) =>
      `select count(*) as n from pg_stat_activity where pid = ${id} and wait_event_type = 'Lock'`,
    begin: "begin"
  }
} as const

/** The id of the connection a statement of the unit runs on, asked in the unit. */
const connectionId = (database: "mysql" | "pg") =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) =>
      Effect.map(
        sql.unsafe<{ readonly id: string | number }>(faults[database].connectionId),
        (rows) => String(rows[0]!.id)
      )
  )

for (const database of ["mysql", "pg"] as const) {
  describe(`SqlOffsetStore on ${database === "mysql" ? "MariaDB" : "Postgres"}, under faults`, () => {
    const layer = suiteLayer(database)
    const fault = faults[database]

    for (const swallowed of [false, true]) {
      it.live(
        `a connection killed mid-unit (${fault.killName}${
          swallowed ? ", the work catching the failure and going on" : ""
        }): rolled back, run again, lands once`,
        () =>
          Effect.gen(function*() {
            const group = newGroup()
            const { epoch } = yield* claimOne(group)
            const attempts = yield* Ref.make(0)
            const work = Effect.gen(function*() {
              const attempt = yield* Ref.updateAndGet(attempts, (n) => n + 1)
              yield* writeResults(group, ["a"])
              if (attempt === 1) {
                const id = yield* connectionId(database)
                yield* control((run) => run(fault.kill(id)))
              }
              const second = writeResults(group, ["b"])
              yield* swallowed ? Effect.ignore(second) : second
            })
            yield* commitValues(group, epoch, 2n, work)
            assert.strictEqual(yield* Ref.get(attempts), 2)
            assert.deepStrictEqual(yield* readResults(group), ["a", "b"])
            assert.strictEqual(yield* position(group), 2n)
          }).pipe(Effect.provide(layer))
      )
    }

    it.live("a unit that deadlocks with another writer is rolled back, runs again and lands once", () =>
      Effect.gen(function*() {
        const locks = `${table}_locks`
        const group = newGroup()
        yield* exec(`create table if not exists ${locks} (id varchar(100) not null, k int not null, n int not null,
          primary key (id, k))`)
        yield* exec(`insert into ${locks} values ('${group}', 1, 0), ('${group}', 2, 0)`)
        const { epoch } = yield* claimOne(group)
        const attempts = yield* Ref.make(0)
        const holdsFirst = yield* Deferred.make<string>()
        const otherHoldsSecond = yield* Deferred.make<void>()
        const bump = (k: number) =>
          Effect.flatMap(
            SqlClient.SqlClient,
            (sql) => sql`update ${sql(locks)} set n = n + 1 where id = ${group} and k = ${k}`
          )
        const committing = yield* Effect.fork(commitValues(
          group,
          epoch,
          1n,
          Effect.gen(function*() {
            const attempt = yield* Ref.updateAndGet(attempts, (n) => n + 1)
            yield* bump(1)
            if (attempt === 1) {
              yield* Deferred.succeed(holdsFirst, yield* connectionId(database))
              yield* Deferred.await(otherHoldsSecond)
            }
            yield* bump(2)
            yield* writeResults(group, ["a"])
          })
        ))
        const unitId = yield* Deferred.await(holdsFirst)
        yield* control((run) =>
          Effect.gen(function*() {
            yield* run(fault.begin)
            // The other writer has done more: InnoDB rolls back the lighter transaction, the unit's. Postgres rolls
            // back the one whose deadlock check runs first: the unit's, which began waiting first.
            yield* run(
              `insert into ${locks} values ${
                Array.from({ length: 20 }, (_, i) => `('${group}', ${100 + i}, 0)`).join(", ")
              }`
            )
            yield* run(`update ${locks} set n = n + 1 where id = '${group}' and k = 2`)
            yield* Deferred.succeed(otherHoldsSecond, undefined)
            yield* until(
              "the unit to wait for the other writer's row",
              Effect.map(run(fault.waitingForLock(unitId)), (rows) => Number(rows[0].n) > 0)
            )
            yield* run(`update ${locks} set n = n + 1 where id = '${group}' and k = 1`)
            yield* run("commit")
          })
        )
        yield* Fiber.join(committing)
        assert.strictEqual(yield* Ref.get(attempts), 2, "the first attempt was the deadlock's victim")
        const counts = yield* Effect.flatMap(
          SqlClient.SqlClient,
          (sql) =>
            sql<{ readonly k: number; readonly n: number }>`select k, n from ${
              sql(locks)
            } where id = ${group} and k < 3 order by k`
        )
        // The other writer's update and the unit's second attempt each added one; the first attempt's was rolled
        // back.
        assert.deepStrictEqual(counts.map((row) => [Number(row.k), Number(row.n)]), [[1, 2], [2, 2]])
        assert.deepStrictEqual(yield* readResults(group), ["a"])
        assert.strictEqual(yield* position(group), 1n)
      }).pipe(Effect.provide(layer)))
  })
}

describe("SqlOffsetStore on MariaDB, when the position is being stored", () => {
  const layer = suiteLayer("mysql")

  it.live("a connection killed while the unit stores its position: nothing lands, it runs again and lands once", () =>
    Effect.gen(function*() {
      const group = `hold-${crypto.randomUUID()}`
      const { epoch } = yield* claimOne(group)
      // The position's UPDATE waits in a trigger for a lock the test holds, so that the test can kill the unit's
      // connection at that moment, after the work's writes and before COMMIT.
      yield* control((run) =>
        run(
          `create trigger if not exists hold_${runId} after update on ${table} for each row begin
             if new.group_id like 'hold-%' then do get_lock(new.group_id, 30); do release_lock(new.group_id); end if;
           end`
        )
      )
      const attempts = yield* Ref.make(0)
      const unitConnection = yield* Deferred.make<string>()
      yield* control((run) =>
        Effect.gen(function*() {
          yield* run(`select get_lock('${group}', 5)`)
          const committing = yield* Effect.fork(commitValues(
            group,
            epoch,
            1n,
            Effect.gen(function*() {
              const attempt = yield* Ref.updateAndGet(attempts, (n) => n + 1)
              if (attempt === 1) yield* Deferred.succeed(unitConnection, yield* connectionId("mysql"))
              yield* writeResults(group, ["a"])
            })
          ))
          const id = yield* Deferred.await(unitConnection)
          yield* until(
            "the position's statement to wait in the trigger",
            Effect.map(
              run(`select count(*) as n from information_schema.processlist where state = 'User lock'
                   and info like '%get_lock%'`),
              (rows) => Number(rows[0].n) > 0
            )
          )
          yield* run(`kill connection ${id}`)
          yield* run(`select release_lock('${group}')`)
          yield* Fiber.join(committing)
        })
      )
      assert.strictEqual(yield* Ref.get(attempts), 2)
      assert.deepStrictEqual(yield* readResults(group), ["a"])
      assert.strictEqual(yield* position(group), 1n)
    }).pipe(Effect.provide(layer)))
})

/**
 * A proxy in front of MariaDB that, once armed, drops the connection that sends COMMIT (a COM_QUERY whose text is
 * `commit`): before passing it on (the transaction does not commit), or after, before its answer reaches the client
 * (it commits, and the client never hears it).
 */
const commitDroppingProxy = sharedCommitDroppingProxy(mysqlUrl, 3306, () => (chunk) =>
  // A COM_QUERY packet: three bytes of length, one of sequence, the command 0x03, then the statement.
  chunk.length > 5 && chunk[4] === 0x03 && chunk.subarray(5).toString("utf8").trim().toLowerCase() === "commit")

describe("SqlOffsetStore on MariaDB, when the connection is lost during COMMIT", () => {
  for (const when of ["before", "after"] as const) {
    it.live(
      `${when} the server committed: settled from the position's unit id, ${
        when === "before" ? "run again" : "not run again"
      }, landed once`,
      () =>
        Effect.gen(function*() {
          const proxy = yield* commitDroppingProxy
          yield* Effect.gen(function*() {
            const group = newGroup()
            const { epoch } = yield* claimOne(group)
            const attempts = yield* Ref.make(0)
            proxy.state.armed = when
            yield* commitValues(
              group,
              epoch,
              5n,
              Effect.zipRight(Ref.update(attempts, (n) => n + 1), writeResults(group, ["a", "b"]))
            )
            assert.strictEqual(proxy.state.dropped, 1, "the proxy dropped the connection at COMMIT")
            assert.strictEqual(yield* Ref.get(attempts), when === "before" ? 2 : 1)
            assert.deepStrictEqual(yield* readResults(group), ["a", "b"])
            assert.strictEqual(yield* position(group), 5n)
          }).pipe(
            Effect.provide(
              Layer.mergeAll(resultsLayer("mysql"), storeLayer()).pipe(
                Layer.provideMerge(MysqlClient.layer({ url: Redacted.make(proxy.url), maxConnections: 4 }))
              )
            )
          )
        }).pipe(Effect.scoped)
    )
  }
})

describe("SqlOffsetStore and the application's pool", () => {
  for (const database of databases) {
    it.live(`${database}: a unit interrupted while it waits for a connection ends at once, and the connection goes back to the pool once it comes`, () =>
      Effect.gen(function*() {
        const group = newGroup()
        const { epoch } = yield* claimOne(group)
        const holding = yield* Deferred.make<void>()
        const release = yield* Deferred.make<void>()
        // The only connection of the pool, held by a unit.
        const first = yield* Effect.fork(commitValues(
          group,
          epoch,
          1n,
          Effect.zipRight(Deferred.succeed(holding, undefined), Deferred.await(release))
        ))
        yield* Deferred.await(holding)
        // Units that wait for it, interrupted while they wait.
        for (let i = 0; i < 3; i++) {
          const waiting = yield* Effect.fork(commitValues(group, epoch, 2n, writeResults(group, ["never"])))
          // Long enough for it to ask the pool, which queues the request at once.
          yield* Effect.repeatN(Effect.yieldNow(), 50)
          // At once: an interrupted unit does not wait for the connection it asked for.
          yield* Fiber.interrupt(waiting).pipe(
            Effect.timeoutFail({
              duration: "5 seconds",
              onTimeout: () => new Error("interrupting a unit that waits for a connection waited for the connection")
            })
          )
        }
        yield* Deferred.succeed(release, undefined)
        yield* Fiber.join(first)
        // The pool still has its connection: the next unit gets it.
        yield* commitValues(group, epoch, 3n, writeResults(group, ["next"])).pipe(
          Effect.timeoutFail({
            duration: "5 seconds",
            onTimeout: () => new Error("the next unit got no connection: the pool lost the one it had")
          })
        )
        assert.deepStrictEqual(yield* readResults(group), ["next"])
        assert.strictEqual(yield* position(group), 3n)
      }).pipe(
        Effect.provide(
          Layer.mergeAll(resultsLayer(database), storeLayer()).pipe(
            Layer.provideMerge(clientLayer(database, { poolSize: 1 }))
          )
        )
      ))
  }
})

describe("SqlOffsetStore.migrate", () => {
  for (const database of ["mysql", "pg"] as const) {
    it.effect(`${database}: fails, saying why, when the column it adds cannot be added`, () =>
      Effect.gen(function*() {
        // A view by the table's name: `create table if not exists` leaves it be, and it takes no new column.
        const view = `${table}_view`
        yield* exec(`create view ${view} as select 1 as group_id`)
        const exit = yield* Effect.exit(SqlOffsetStore.migrate({ table: view }))
        yield* exec(`drop view ${view}`)
        assert.isTrue(Exit.isFailure(exit), "migrate went on without the unit_id column")
        assert.isTrue(
          Exit.isFailure(exit) && exit.cause._tag === "Fail" &&
            exit.cause.error instanceof OffsetStore.OffsetStoreError,
          String(Exit.isFailure(exit) ? exit.cause : "")
        )
      }).pipe(Effect.provide(clientLayer(database))))
  }
})
