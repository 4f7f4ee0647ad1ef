import { afterAll, assert, describe, it } from "@effect/vitest"
import * as Cause from "effect/Cause"
import * as ConfigProvider from "effect/ConfigProvider"
import * as Context from "effect/Context"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import postgres from "postgres"
import { ConfigError } from "../src/KafkaError.js"
import * as OffsetStore from "../src/OffsetStore.js"
import * as PgOffsetStore from "../src/PgOffsetStore.js"
import * as TopicPartition from "../src/TopicPartition.js"
import { offsetStoreSuite, SuiteResults } from "./offsetStoreSuite.js"

const url = process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test"
const run = `${Date.now().toString(36)}_${crypto.randomUUID().slice(0, 8)}`
const table = `kafka_offsets_test_${run}`
const resultsTable = `${table}_results`
const schema = `kafka_offsets_schema_${run}`

class TestSql extends Context.Tag("test/PgOffsetStore/TestSql")<TestSql, postgres.Sql>() {}

class TestDatabaseError extends Error {}

const query = <A>(f: (sql: postgres.Sql) => Promise<A>) =>
  Effect.flatMap(TestSql, (sql) =>
    Effect.tryPromise({
      try: () => f(sql),
      catch: (cause) => new TestDatabaseError(`test query failed: ${String(cause)}`)
    }))

// The test's own connection, to set up tables and to read what committed from outside any unit of work.
const testSql = Layer.scoped(
  TestSql,
  Effect.acquireRelease(
    Effect.sync(() => postgres(url, { onnotice: () => {}, max: 4 })),
    (sql) => Effect.tryPromise(() => sql.end({ timeout: 5 })).pipe(Effect.ignore)
  ).pipe(Effect.tap((sql) =>
    Effect.tryPromise({
      try: () => sql.unsafe("select 1"),
      catch: (cause) =>
        new TestDatabaseError(
          `Postgres at ${url} does not answer (${String(cause)}). These tests need it: start it with ` +
            "`pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start`, or set DATABASE_URL"
        )
    })
  ))
)

const resultsInTable = Layer.effect(
  SuiteResults,
  Effect.gen(function*() {
    yield* query((sql) =>
      sql.unsafe(
        `create table if not exists "${resultsTable}" (
          id bigserial primary key, group_id text not null, topic text not null, partition int not null,
          value text not null
        )`
      )
    )
    const sql = yield* TestSql
    return {
      write: (groupId: string, partition: TopicPartition.TopicPartition, values: ReadonlyArray<string>) =>
        Effect.flatMap(PgOffsetStore.sql, (tx) =>
          Effect.tryPromise({
            try: () =>
              tx.unsafe(
                `insert into "${resultsTable}" (group_id, topic, partition, value)
                 select $1, $2, $3::int, v from unnest($4::text[]) with ordinality as t(v, n) order by n`,
                [groupId, partition.topic, partition.partition, [...values]]
              ),
            catch: (cause) => new TestDatabaseError(`writing results failed: ${String(cause)}`)
          })),
      read: (groupId: string, partition: TopicPartition.TopicPartition) =>
        Effect.tryPromise({
          try: async () => {
            const rows = await sql.unsafe(
              `select value from "${resultsTable}" where group_id = $1 and topic = $2 and partition = $3::int
               order by id`,
              [groupId, partition.topic, partition.partition]
            ).values()
            return rows.map((row) => String(row[0]))
          },
          catch: (cause) => new TestDatabaseError(`reading results failed: ${String(cause)}`)
        })
    }
  })
)

const storeLayer = Layer.unwrapEffect(
  Effect.map(TestSql, (sql) => PgOffsetStore.layer({ sql, table, migrate: true }))
)

const suiteLayer = Layer.mergeAll(resultsInTable, storeLayer).pipe(Layer.provideMerge(testSql))

offsetStoreSuite("PgOffsetStore", suiteLayer)

afterAll(async () => {
  const sql = postgres(url, { onnotice: () => {}, max: 1 })
  try {
    await sql.unsafe(`drop table if exists "${table}", "${resultsTable}"`)
    await sql.unsafe(`drop schema if exists "${schema}" cascade`)
  } finally {
    await sql.end({ timeout: 5 })
  }
})

const orders0 = TopicPartition.make("orders", 0)

/** Builds `layer` and commits one unit through it. */
const commitWith = (layer: Layer.Layer<OffsetStore.OffsetStore, unknown>) =>
  Effect.flatMap(OffsetStore.OffsetStore, (store) =>
    store.commit(
      { groupId: `g-${crypto.randomUUID()}`, partition: orders0, expected: null, next: 1n },
      Effect.void
    )).pipe(Effect.provide(layer))

describe("PgOffsetStore", () => {
  it.effect("refuses a table or schema name that is not an identifier, before connecting", () =>
    Effect.gen(function*() {
      const unreachable = "postgres://postgres@127.0.0.1:1/test"
      const badTable = yield* Effect.flip(
        commitWith(PgOffsetStore.layer({ url: unreachable, table: "offsets; drop table x" }))
      )
      assert.instanceOf(badTable, ConfigError)
      assert.strictEqual(badTable instanceof ConfigError ? badTable.field : undefined, "table")
      assert.include(badTable.message, "\"table\"")

      const badSchema = yield* Effect.flip(commitWith(PgOffsetStore.layer({ url: unreachable, schema: "public\"x" })))
      assert.instanceOf(badSchema, ConfigError)
      assert.strictEqual(badSchema instanceof ConfigError ? badSchema.field : undefined, "schema")

      const badMigrate = yield* PgOffsetStore.migrate({ url: unreachable, table: "1offsets" }).pipe(Effect.flip)
      assert.instanceOf(badMigrate, ConfigError)

      const noUrl = yield* commitWith(PgOffsetStore.layer({})).pipe(Effect.flip)
      assert.instanceOf(noUrl, ConfigError)
      assert.strictEqual(noUrl instanceof ConfigError ? noUrl.field : undefined, "url")
    }))

  it.live("says how to start Postgres when nothing answers", () =>
    Effect.gen(function*() {
      const error = yield* commitWith(PgOffsetStore.layer({ url: "postgres://postgres@127.0.0.1:1/test", table })).pipe(
        Effect.flip
      )
      assert.instanceOf(error, OffsetStore.OffsetStoreError)
      assert.include(error.message, "127.0.0.1:1")
      assert.include(error.message, "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start")
      assert.include(error.message, "DATABASE_URL")
    }))

  it.live("reads the connection URL from DATABASE_URL", () =>
    Effect.gen(function*() {
      yield* commitWith(PgOffsetStore.layerConfig({ table })).pipe(
        Effect.withConfigProvider(ConfigProvider.fromMap(new Map([["DATABASE_URL", url]])))
      )
      const missing = yield* commitWith(PgOffsetStore.layerConfig({ table })).pipe(
        Effect.withConfigProvider(ConfigProvider.fromMap(new Map())),
        Effect.flip
      )
      assert.instanceOf(missing, ConfigError)
      assert.strictEqual(missing instanceof ConfigError ? missing.field : undefined, "DATABASE_URL")
    }))

  it.live("creates the table in a schema of its own, idempotently, and stores positions there", () =>
    Effect.gen(function*() {
      yield* PgOffsetStore.migrate({ url, schema, table: "offsets" })
      yield* PgOffsetStore.migrate({ url, schema, table: "offsets" })
      const columns = yield* query((sql) =>
        sql.unsafe(
          `select column_name, data_type from information_schema.columns
           where table_schema = $1 and table_name = 'offsets' order by ordinal_position`,
          [schema]
        ).values()
      )
      assert.deepStrictEqual(columns.map((row) => [String(row[0]), String(row[1])]), [
        ["group_id", "text"],
        ["topic", "text"],
        ["partition", "integer"],
        ["next_offset", "bigint"],
        ["updated_at", "timestamp with time zone"]
      ])

      const store = PgOffsetStore.layer({ url, schema, table: "offsets" })
      const groupId = `g-${crypto.randomUUID()}`
      const beyondDoubles = 9_007_199_254_740_993n
      yield* Effect.flatMap(OffsetStore.OffsetStore, (offsets) =>
        offsets.commit({ groupId, partition: orders0, expected: null, next: beyondDoubles }, Effect.void)).pipe(
          Effect.provide(store)
        )
      const stored = yield* query((sql) =>
        sql.unsafe(`select next_offset::text from "${schema}"."offsets" where group_id = $1`, [groupId]).values()
      )
      assert.deepStrictEqual(stored.map((row) => String(row[0])), ["9007199254740993"])
      const loaded = yield* Effect.flatMap(OffsetStore.OffsetStore, (offsets) => offsets.load(groupId, [orders0])).pipe(
        Effect.provide(store)
      )
      assert.strictEqual(loaded.get("orders-0"), beyondDoubles)
    }).pipe(Effect.provide(testSql)))

  it.live("says to migrate when the table is missing", () =>
    Effect.gen(function*() {
      const error = yield* Effect.flatMap(OffsetStore.OffsetStore, (offsets) => offsets.load("g", [orders0])).pipe(
        Effect.provide(PgOffsetStore.layer({ url, table: `missing_${run}` })),
        Effect.flip
      )
      assert.instanceOf(error, OffsetStore.OffsetStoreError)
      assert.include(error.message, "PgOffsetStore.migrate")
    }))

  it.effect("gives the transaction only to work of a Postgres unit", () =>
    Effect.gen(function*() {
      const error = yield* PgOffsetStore.sql.pipe(
        Effect.provideService(OffsetStore.Transaction, { store: "memory", handle: {} }),
        Effect.flip
      )
      assert.instanceOf(error, OffsetStore.OffsetStoreError)
      assert.include(error.message, "OffsetStore.append")
    }))

  it.live("does not hold up the partition's new owner while a zombie is stalled in its work", () =>
    Effect.gen(function*() {
      const store = yield* OffsetStore.OffsetStore
      const results = yield* SuiteResults
      const groupId = `g-${crypto.randomUUID()}`
      const unit = (expected: bigint | null, next: bigint) => ({ groupId, partition: orders0, expected, next })
      yield* store.commit(unit(null, 1n), results.write(groupId, orders0, ["a"]))

      const zombieWrote = yield* Deferred.make<void>()
      const wakeZombie = yield* Deferred.make<void>()
      const zombie = yield* Effect.fork(
        store.commit(
          unit(1n, 3n),
          results.write(groupId, orders0, ["zombie"]).pipe(
            Effect.zipRight(Deferred.succeed(zombieWrote, undefined)),
            Effect.zipRight(Deferred.await(wakeZombie))
          )
        )
      )
      yield* Deferred.await(zombieWrote)
      // The zombie's transaction is open, with its results written: the owner's unit from the same position commits.
      yield* store.commit(unit(1n, 2n), results.write(groupId, orders0, ["b"])).pipe(
        Effect.timeoutFail({
          duration: "10 seconds",
          onTimeout: () => new Error("the owner's commit waited for the zombie's open transaction")
        })
      )
      yield* Deferred.succeed(wakeZombie, undefined)
      const fenced = yield* Fiber.join(zombie).pipe(Effect.flip)
      assert.instanceOf(fenced, OffsetStore.Fenced)
      if (fenced instanceof OffsetStore.Fenced) {
        assert.strictEqual(fenced.expected, 1n)
        assert.strictEqual(fenced.actual, 2n)
      }
      assert.deepStrictEqual(yield* results.read(groupId, orders0), ["a", "b"])
      assert.strictEqual((yield* store.load(groupId, [orders0])).get("orders-0"), 2n)
    }).pipe(Effect.provide(suiteLayer)))

  it.live("reports a failed position statement as the store's error, and nothing of the unit lands", () =>
    Effect.gen(function*() {
      const results = yield* SuiteResults
      const groupId = `g-${crypto.randomUUID()}`
      const error = yield* Effect.flatMap(OffsetStore.OffsetStore, (store) =>
        store.commit(
          { groupId, partition: orders0, expected: null, next: 1n },
          results.write(groupId, orders0, ["lost"])
        )).pipe(
          Effect.provide(Layer.unwrapEffect(
            Effect.map(TestSql, (sql) => PgOffsetStore.layer({ sql, table: `missing_${run}` }))
          )),
          Effect.flip
        )
      assert.instanceOf(error, OffsetStore.OffsetStoreError)
      assert.include(error.message, "PgOffsetStore.migrate")
      assert.deepStrictEqual(yield* results.read(groupId, orders0), [])
    }).pipe(Effect.provide(suiteLayer)))

  it.live("gives its connection back to the pool whatever the outcome of a unit", () =>
    Effect.gen(function*() {
      // One connection in the pool: a unit that kept it would leave the next one waiting for ever.
      const sql = yield* Effect.acquireRelease(
        Effect.sync(() => postgres(url, { onnotice: () => {}, max: 1 })),
        (sql) => Effect.tryPromise(() => sql.end({ timeout: 5 })).pipe(Effect.ignore)
      )
      const store = yield* Layer.build(PgOffsetStore.layer({ sql, table, migrate: true })).pipe(
        Effect.map(Context.get(OffsetStore.OffsetStore))
      )
      const groupId = `g-${crypto.randomUUID()}`
      const unit = (expected: bigint | null, next: bigint) => ({ groupId, partition: orders0, expected, next })
      const touch = Effect.flatMap(PgOffsetStore.sql, (tx) => Effect.tryPromise(() => tx.unsafe("select 1")))

      yield* store.commit(unit(null, 1n), touch)
      const failed = yield* store.commit(unit(1n, 2n), Effect.zipRight(touch, Effect.fail("handler failed"))).pipe(
        Effect.flip
      )
      assert.strictEqual(failed, "handler failed")
      assert.instanceOf(yield* store.commit(unit(5n, 6n), touch).pipe(Effect.flip), OffsetStore.Fenced)
      const broken = yield* store.commit(
        unit(1n, 2n),
        Effect.flatMap(PgOffsetStore.sql, (tx) => Effect.tryPromise(() => tx.unsafe("select * from no_such_table")))
      ).pipe(Effect.flip)
      assert.isTrue(Cause.isUnknownException(broken), "the work's own error")
      const started = yield* Deferred.make<void>()
      const stalled = yield* Effect.fork(
        store.commit(
          unit(1n, 2n),
          touch.pipe(Effect.zipRight(Deferred.succeed(started, undefined)), Effect.zipRight(Effect.never))
        )
      )
      yield* Deferred.await(started)
      yield* Fiber.interrupt(stalled)

      yield* store.commit(unit(1n, 2n), touch).pipe(
        Effect.timeoutFail({
          duration: "10 seconds",
          onTimeout: () => new Error("the pool's only connection was kept")
        })
      )
      assert.strictEqual((yield* store.load(groupId, [orders0])).get("orders-0"), 2n)
    }).pipe(Effect.scoped))
})
