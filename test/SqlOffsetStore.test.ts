import { afterAll, assert, describe, it } from "@effect/vitest"
import * as SqlClient from "@effect/sql/SqlClient"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as ManagedRuntime from "effect/ManagedRuntime"
import * as Schedule from "effect/Schedule"
import { InvalidConfig } from "../src/KafkaError.js"
import * as OffsetStore from "../src/OffsetStore.js"
import * as PgOffsetStore from "../src/PgOffsetStore.js"
import * as SqlOffsetStore from "../src/SqlOffsetStore.js"
import * as TopicPartition from "../src/TopicPartition.js"
import { offsetStoreSuite, SuiteResults } from "./offsetStoreSuite.js"
import { clientLayer, type Database, databases, exec, serialKey } from "./support/sqlStores.js"

const run = `${Date.now().toString(36)}_${crypto.randomUUID().slice(0, 8)}`
const table = `kafka_offsets_sql_${run}`
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
      Effect.all([exec(`drop table if exists ${table}`), exec(`drop table if exists ${resultsTable}`)])
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
