import { afterAll, assert, describe, it } from "@effect/vitest"
import * as Cause from "effect/Cause"
import * as ConfigProvider from "effect/ConfigProvider"
import * as Context from "effect/Context"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Queue from "effect/Queue"
import * as Ref from "effect/Ref"
import * as Schedule from "effect/Schedule"
import postgres from "postgres"
import { OutsideUnit } from "../src/internal/store/unitBuffer.js"
import { InvalidConfig } from "../src/KafkaError.js"
import * as OffsetStore from "../src/OffsetStore.js"
import * as PgOffsetStore from "../src/PgOffsetStore.js"
import * as TopicPartition from "../src/TopicPartition.js"
import { offsetStoreSuite, refusal, SuiteResults } from "./offsetStoreSuite.js"
import { commitDroppingProxy as sharedCommitDroppingProxy } from "./support/commitProxy.js"

const url = process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test"
const run = `${Date.now().toString(36)}_${crypto.randomUUID().slice(0, 8)}`
const table = `kafka_offsets_test_${run}`
const resultsTable = `${table}_results`
const schema = `kafka_offsets_schema_${run}`
const legacyTable = `kafka_offsets_legacy_${run}`
// Every connection of these tests carries it, so that a test can tell its own backends from other engineers'.
const applicationName = `pg-offset-store-test-${run}`

class TestSql extends Context.Tag("test/PgOffsetStore/TestSql")<TestSql, postgres.Sql>() {}

class TestDatabaseError extends Error {}

const query = <A>(f: (sql: postgres.Sql) => Promise<A>) =>
  Effect.flatMap(TestSql, (sql) =>
    Effect.tryPromise({
      try: () => f(sql),
      catch: (cause) => new TestDatabaseError(`test query failed: ${String(cause)}`)
    }))

const client = (options: Partial<postgres.Options<{}>> = {}, target = url) =>
  Effect.acquireRelease(
    Effect.sync(() =>
      postgres(target, { onnotice: () => {}, max: 6, connection: { application_name: applicationName }, ...options })
    ),
    // A connection lost in the middle of a query keeps postgres.js's `end` waiting for its timeout.
    (sql) => Effect.tryPromise(() => sql.end({ timeout: 1 })).pipe(Effect.ignore)
  )

/** The statement a frontend message runs: a simple query's text, or a Parse's name and text, or a Bind's statement. */
const frontendMessages = function*(buffer: Buffer): Generator<
  | { readonly type: "query"; readonly text: string }
  | { readonly type: "parse"; readonly name: string; readonly text: string }
  | { readonly type: "bind"; readonly statement: string }
  | { readonly type: "other" }
> {
  const cstring = (at: number) => {
    const end = buffer.indexOf(0, at)
    return { text: buffer.toString("utf8", at, end), next: end + 1 }
  }
  let at = 0
  while (at + 5 <= buffer.length) {
    const type = buffer[at]
    const length = buffer.readInt32BE(at + 1)
    const body = at + 5
    if (type === 0x51) yield { type: "query", text: cstring(body).text }
    else if (type === 0x50) {
      const name = cstring(body)
      yield { type: "parse", name: name.text, text: cstring(name.next).text }
    } else if (type === 0x42) yield { type: "bind", statement: cstring(cstring(body).next).text }
    else yield { type: "other" }
    at += 1 + length
  }
}

/**
 * A TCP proxy in front of Postgres that, once armed, drops a connection just after the server answered its COMMIT:
 * the transaction committed, and the client never hears it. COMMIT is recognised whether it is sent as a simple query
 * or through the extended protocol (a Parse of `commit`, or a Bind of a statement parsed as `commit` before).
 */
const commitDroppingProxy = sharedCommitDroppingProxy(url, 5432, () => {
  // The first message (startup, or an SSL request) has no type byte.
  let startup = true
  const commits = new Set<string>()
  return (chunk) => {
    if (startup) {
      startup = false
      return false
    }
    let found = false
    for (const message of frontendMessages(chunk)) {
      const isCommit = (message.type === "query" && message.text.trim().toLowerCase() === "commit") ||
        (message.type === "parse" && message.text.trim().toLowerCase() === "commit") ||
        (message.type === "bind" && commits.has(message.statement))
      if (message.type === "parse" && isCommit) commits.add(message.name)
      if (isCommit) found = true
    }
    return found
  }
})

// The test's own connection, to set up tables and to read what committed from outside any unit of work.
const testSql = Layer.scoped(
  TestSql,
  client().pipe(Effect.tap((sql) =>
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

const insertResults = (groupId: string, partition: TopicPartition.TopicPartition, values: ReadonlyArray<string>) =>
  PgOffsetStore.query((tx) =>
    tx.unsafe(
      `insert into "${resultsTable}" (group_id, topic, partition, value)
       select $1, $2, $3::int, v from unnest($4::text[]) with ordinality as t(v, n) order by n`,
      [groupId, partition.topic, partition.partition, [...values]]
    )
  )

const readResults = (groupId: string, partition: TopicPartition.TopicPartition) =>
  query((sql) =>
    sql.unsafe(
      `select value from "${resultsTable}" where group_id = $1 and topic = $2 and partition = $3::int order by id`,
      [groupId, partition.topic, partition.partition]
    ).values()
  ).pipe(Effect.map((rows) => rows.map((row) => String(row[0]))))

const createResultsTable = query((sql) =>
  sql.unsafe(
    `create table if not exists "${resultsTable}" (
      id bigserial primary key, group_id text not null, topic text not null, partition int not null,
      value text not null
    )`
  )
)

const resultsInTable = Layer.effect(
  SuiteResults,
  Effect.gen(function*() {
    yield* createResultsTable
    const sql = yield* TestSql
    return {
      write: (groupId: string, partition: TopicPartition.TopicPartition, values: ReadonlyArray<string>) =>
        Effect.asVoid(insertResults(groupId, partition, values)),
      read: (groupId: string, partition: TopicPartition.TopicPartition) =>
        readResults(groupId, partition).pipe(Effect.provideService(TestSql, sql))
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
    await sql.unsafe(`drop table if exists "${table}", "${resultsTable}", "${legacyTable}", "${legacyTable}_epochs"`)
    await sql.unsafe(`drop schema if exists "${schema}" cascade`)
    await sql.unsafe(`drop function if exists "hold_${run}"() cascade`)
    await sql.unsafe(`drop function if exists "fail_once_${run}"() cascade`)
    await sql.unsafe(`drop function if exists "die_at_commit_${run}"() cascade`)
    await sql.unsafe(`drop sequence if exists "fail_once_${run}"`)
  } finally {
    await sql.end({ timeout: 5 })
  }
})

const orders0 = TopicPartition.make("orders", 0)

const newGroup = () => `g-${crypto.randomUUID()}`

/** Builds `layer`, claims a partition and commits one unit through it. */
const commitWith = (layer: Layer.Layer<OffsetStore.OffsetStore, unknown>) =>
  Effect.flatMap(OffsetStore.OffsetStore, (store) => {
    const groupId = newGroup()
    return Effect.flatMap(
      store.claim(groupId, [orders0]),
      (claims) =>
        store.commit({ groupId, partition: orders0, epoch: claims.get("orders-0")?.epoch ?? 0n, next: 1n }, Effect.void)
    )
  }).pipe(Effect.provide(layer))

const epochOf = (store: OffsetStore.OffsetStore["Type"], groupId: string) =>
  Effect.map(store.claim(groupId, [orders0]), (claims) => claims.get("orders-0")?.epoch ?? -1n)

const within = <A, E, R>(what: string, effect: Effect.Effect<A, E, R>) =>
  Effect.timeoutFail(effect, { duration: "20 seconds", onTimeout: () => new Error(`timed out waiting for ${what}`) })

/** Polls `check` until it holds, for at most 20 seconds. */
const eventually = <E, R>(what: string, check: Effect.Effect<boolean, E, R>) =>
  within(what, Effect.repeat(check, { schedule: Schedule.spaced("20 millis"), until: (done) => done }))

/** How many of this run's backends wait for a lock of one of `locktypes`. */
const waitingFor = (...locktypes: ReadonlyArray<string>) =>
  query((sql) =>
    sql.unsafe(
      `select count(*)::int from pg_locks l join pg_stat_activity a using (pid)
       where not l.granted and l.locktype = any($1::text[]) and a.application_name = $2`,
      [[...locktypes], applicationName]
    ).values()
  ).pipe(Effect.map((rows) => Number(rows[0][0])))

const backendPid = PgOffsetStore.query((tx) => tx.unsafe("select pg_backend_pid()").values()).pipe(
  Effect.map((rows) => Number(rows[0][0]))
)

/** Ends the backend of one of this run's own units, from the test's connection. */
const terminate = (pid: number) =>
  query((sql) =>
    sql.unsafe(
      "select pg_terminate_backend($1) from pg_stat_activity where pid = $1 and application_name = $2",
      [pid, applicationName]
    )
  )

/**
 * A store on a client of its own, whose lost connections the test can wait for (postgres.js has noticed the loss
 * once `closed` has an element), retrying quickly.
 */
const storeOnOwnClient = (options: Partial<PgOffsetStore.Options> = {}, target = url, max = 2) =>
  Effect.gen(function*() {
    const closed = yield* Queue.unbounded<number>()
    const sql = yield* client({ max, onclose: (id) => Queue.unsafeOffer(closed, id) }, target)
    const store = yield* Layer.build(
      PgOffsetStore.layer({ sql, table, retry: Schedule.spaced("20 millis"), retryFor: "10 seconds", ...options })
    ).pipe(Effect.map(Context.get(OffsetStore.OffsetStore)))
    return { store, closed }
  })

describe("PgOffsetStore", () => {
  it.effect("refuses a table or schema name that is not an identifier, before connecting", () =>
    Effect.gen(function*() {
      const unreachable = "postgres://postgres@127.0.0.1:1/test"
      const badTable = yield* Effect.flip(
        commitWith(PgOffsetStore.layer({ url: unreachable, table: "offsets; drop table x" }))
      )
      assert.instanceOf(badTable, InvalidConfig)
      assert.strictEqual(badTable instanceof InvalidConfig ? badTable.field : undefined, "table")
      assert.include(badTable.message, "\"table\"")

      const badSchema = yield* Effect.flip(commitWith(PgOffsetStore.layer({ url: unreachable, schema: "public\"x" })))
      assert.instanceOf(badSchema, InvalidConfig)
      assert.strictEqual(badSchema instanceof InvalidConfig ? badSchema.field : undefined, "schema")

      const badMigrate = yield* PgOffsetStore.migrate({ url: unreachable, table: "1offsets" }).pipe(Effect.flip)
      assert.instanceOf(badMigrate, InvalidConfig)

      const noUrl = yield* commitWith(PgOffsetStore.layer({})).pipe(Effect.flip)
      assert.instanceOf(noUrl, InvalidConfig)
      assert.strictEqual(noUrl instanceof InvalidConfig ? noUrl.field : undefined, "url")

      const level = "chaos" as PgOffsetStore.IsolationLevel
      const badLevel = yield* commitWith(PgOffsetStore.layer({ url: unreachable, isolationLevel: level })).pipe(
        Effect.flip
      )
      assert.strictEqual(badLevel instanceof InvalidConfig ? badLevel.field : undefined, "isolationLevel")
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

  it.live("fails at once, saying so, when the client it was given has been ended", () =>
    Effect.gen(function*() {
      const sql = postgres(url, { onnotice: () => {}, max: 1 })
      const store = yield* Layer.build(
        PgOffsetStore.layer({ sql, table, migrate: true, retry: Schedule.spaced("20 millis"), retryFor: "10 seconds" })
      ).pipe(Effect.map(Context.get(OffsetStore.OffsetStore)))
      yield* Effect.promise(() => sql.end({ timeout: 1 }))
      const error = yield* store.load(newGroup(), [orders0]).pipe(Effect.flip)
      assert.instanceOf(error, OffsetStore.OffsetStoreError)
      // Not retried: an ended client never connects again.
      assert.notInclude(error.message, "still failing")
      assert.include(error.message, "has been ended with sql.end()")
    }).pipe(Effect.scoped))

  it.live("reads the connection URL from DATABASE_URL", () =>
    Effect.gen(function*() {
      yield* commitWith(PgOffsetStore.layerConfig({ table, migrate: true })).pipe(
        Effect.withConfigProvider(ConfigProvider.fromMap(new Map([["DATABASE_URL", url]])))
      )
      const missing = yield* commitWith(PgOffsetStore.layerConfig({ table })).pipe(
        Effect.withConfigProvider(ConfigProvider.fromMap(new Map())),
        Effect.flip
      )
      assert.instanceOf(missing, InvalidConfig)
      assert.strictEqual(missing instanceof InvalidConfig ? missing.field : undefined, "DATABASE_URL")
    }))

  it.live("creates the table in a schema of its own, idempotently, and stores positions there", () =>
    Effect.gen(function*() {
      yield* PgOffsetStore.migrate({ url, schema, table: "offsets" })
      yield* PgOffsetStore.migrate({ url, schema, table: "offsets" })
      const columns = yield* query((sql) =>
        sql.unsafe(
          `select column_name, data_type, is_nullable from information_schema.columns
           where table_schema = $1 and table_name = 'offsets' order by ordinal_position`,
          [schema]
        ).values()
      )
      assert.deepStrictEqual(columns.map((row) => row.map(String)), [
        ["group_id", "text", "NO"],
        ["topic", "text", "NO"],
        ["partition", "integer", "NO"],
        ["next_offset", "bigint", "YES"],
        ["epoch", "bigint", "NO"],
        ["finished", "text", "YES"],
        ["updated_at", "timestamp with time zone", "NO"]
      ])

      const store = PgOffsetStore.layer({ url, schema, table: "offsets" })
      const groupId = newGroup()
      const beyondDoubles = 9_007_199_254_740_993n
      yield* Effect.flatMap(OffsetStore.OffsetStore, (offsets) =>
        Effect.flatMap(
          epochOf(offsets, groupId),
          (epoch) => offsets.commit({ groupId, partition: orders0, epoch, next: beyondDoubles }, Effect.void)
        )).pipe(Effect.provide(store))
      const stored = yield* query((sql) =>
        sql.unsafe(`select next_offset::text, epoch::text from "${schema}"."offsets" where group_id = $1`, [groupId])
          .values()
      )
      assert.deepStrictEqual(stored.map((row) => row.map(String)), [["9007199254740993", "1"]])
      const loaded = yield* Effect.flatMap(OffsetStore.OffsetStore, (offsets) => offsets.load(groupId, [orders0])).pipe(
        Effect.provide(store)
      )
      assert.strictEqual(loaded.get("orders-0"), beyondDoubles)
    }).pipe(Effect.provide(testSql)))

  it.live("upgrades a table of the previous version in place, concurrently, and keeps its positions", () =>
    Effect.gen(function*() {
      // The DDL of the previous version, and rows it stored.
      yield* query((sql) =>
        sql.unsafe(
          `create table "${legacyTable}" (
            group_id text not null,
            topic text not null,
            partition integer not null,
            next_offset bigint not null,
            updated_at timestamptz not null default now(),
            primary key (group_id, topic, partition)
          )`
        )
      )
      yield* query((sql) =>
        sql.unsafe(
          `insert into "${legacyTable}" (group_id, topic, partition, next_offset)
           values ('billing', 'orders', 0, 42), ('billing', 'orders', 1, 7)`
        )
      )
      const sql = yield* TestSql
      yield* Effect.all(
        Array.from({ length: 3 }, () => PgOffsetStore.migrate({ sql, table: legacyTable })),
        { concurrency: "unbounded" }
      )
      const orders1 = TopicPartition.make("orders", 1)
      const orders2 = TopicPartition.make("orders", 2)
      yield* Effect.gen(function*() {
        const store = yield* OffsetStore.OffsetStore
        assert.deepStrictEqual([...(yield* store.load("billing", [orders0, orders1]))].sort(), [
          ["orders-0", 42n],
          ["orders-1", 7n]
        ])
        // The old rows were never claimed: a unit of any epoch is fenced until a member claims.
        const fenced = yield* refusal(
          "a unit before any claim",
          store.commit({ groupId: "billing", partition: orders0, epoch: 1n, next: 43n }, Effect.void)
        )
        assert.deepInclude(fenced, { _tag: "Fenced", epoch: 1n, currentEpoch: null })
        const claims = yield* store.claim("billing", [orders0, orders1, orders2])
        assert.deepStrictEqual([...claims].sort(([a], [b]) => a.localeCompare(b)), [
          ["orders-0", { epoch: 1n, position: 42n }],
          ["orders-1", { epoch: 1n, position: 7n }],
          ["orders-2", { epoch: 1n, position: null }]
        ])
        yield* store.commit({ groupId: "billing", partition: orders0, epoch: 1n, next: 43n }, Effect.void)
        assert.strictEqual((yield* store.load("billing", [orders0])).get("orders-0"), 43n)
      }).pipe(Effect.provide(PgOffsetStore.layer({ sql, table: legacyTable, migrate: true })))
    }).pipe(Effect.provide(testSql)))

  it.live("upgrades a table with owner epochs and no finished ranges (the previous version) and keeps its epochs", () =>
    Effect.gen(function*() {
      const epochTable = `${legacyTable}_epochs`
      yield* query((sql) =>
        sql.unsafe(
          `create table "${epochTable}" (
            group_id text not null,
            topic text not null,
            partition integer not null,
            next_offset bigint,
            epoch bigint not null default 0,
            updated_at timestamptz not null default now(),
            primary key (group_id, topic, partition)
          )`
        )
      )
      yield* query((sql) =>
        sql.unsafe(
          `insert into "${epochTable}" (group_id, topic, partition, next_offset, epoch)
           values ('billing', 'orders', 0, 42, 3)`
        )
      )
      const sql = yield* TestSql
      // Without the upgrade, a unit of records finished out of order cannot be stored: the error says what to do.
      const before = yield* Effect.gen(function*() {
        const store = yield* OffsetStore.OffsetStore
        return yield* refusal(
          "a unit on a table without the finished column",
          store.commit(
            { groupId: "billing", partition: orders0, epoch: 3n, next: 42n, finished: [[43n, 44n]] },
            Effect.void
          )
        )
      }).pipe(Effect.provide(PgOffsetStore.layer({ sql, table: epochTable, retryFor: "1 second" })))
      assert.instanceOf(before, OffsetStore.OffsetStoreError)
      yield* Effect.gen(function*() {
        const store = yield* OffsetStore.OffsetStore
        const claims = yield* store.claim("billing", [orders0])
        assert.deepStrictEqual(claims.get("orders-0"), { epoch: 4n, position: 42n })
        yield* store.commit(
          { groupId: "billing", partition: orders0, epoch: 4n, next: 42n, finished: [[44n, 46n]] },
          Effect.void
        )
        assert.deepStrictEqual((yield* store.claim("billing", [orders0])).get("orders-0"), {
          epoch: 5n,
          position: 42n,
          finished: [[44n, 46n]]
        })
      }).pipe(Effect.provide(PgOffsetStore.layer({ sql, table: epochTable, migrate: true })))
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

      const outside = { store: "postgres", handle: new OutsideUnit("postgres") }
      const refusals = [
        yield* PgOffsetStore.sql.pipe(Effect.provideService(OffsetStore.Transaction, outside), Effect.flip),
        yield* PgOffsetStore.query((sql) => sql`select 1`).pipe(
          Effect.provideService(OffsetStore.Transaction, outside),
          Effect.flip
        )
      ]
      for (const refused of refusals) {
        assert.instanceOf(refused, OffsetStore.OffsetStoreError)
        assert.include(refused.message, "no unit of work is open")
      }
    }))

  it.live("runs units at the isolation level it is given, read committed by default", () =>
    Effect.gen(function*() {
      const sql = yield* TestSql
      const levelIn = (layer: Layer.Layer<OffsetStore.OffsetStore, unknown>) =>
        Effect.flatMap(OffsetStore.OffsetStore, (store) => {
          const groupId = newGroup()
          return Effect.flatMap(epochOf(store, groupId), (epoch) =>
            store.commit(
              { groupId, partition: orders0, epoch, next: 1n },
              PgOffsetStore.query((tx) => tx.unsafe("show transaction_isolation").values())
            ))
        }).pipe(Effect.map((rows) => String(rows[0][0])), Effect.provide(layer))
      assert.strictEqual(yield* levelIn(PgOffsetStore.layer({ sql, table })), "read committed")
      assert.strictEqual(
        yield* levelIn(PgOffsetStore.layer({ sql, table, isolationLevel: "serializable" })),
        "serializable"
      )
      assert.strictEqual(
        yield* levelIn(PgOffsetStore.layer({ sql, table, isolationLevel: "repeatable read" })),
        "repeatable read"
      )
    }).pipe(Effect.provide(suiteLayer)))

  it.live("does not hold up the partition's new owner while a zombie is stalled in its work", () =>
    Effect.gen(function*() {
      const store = yield* OffsetStore.OffsetStore
      const results = yield* SuiteResults
      const groupId = newGroup()
      const zombieEpoch = yield* epochOf(store, groupId)
      const unit = (epoch: bigint, next: bigint) => ({ groupId, partition: orders0, epoch, next })
      yield* store.commit(unit(zombieEpoch, 1n), results.write(groupId, orders0, ["a"]))

      const zombieWrote = yield* Deferred.make<void>()
      const wakeZombie = yield* Deferred.make<void>()
      const zombie = yield* Effect.fork(
        store.commit(
          unit(zombieEpoch, 3n),
          results.write(groupId, orders0, ["zombie"]).pipe(
            Effect.zipRight(Deferred.succeed(zombieWrote, undefined)),
            Effect.zipRight(Deferred.await(wakeZombie))
          )
        )
      )
      yield* within("the zombie's work", Deferred.await(zombieWrote))
      // The zombie's transaction is open, with its results written: the claim and the owner's unit go through.
      const ownerEpoch = yield* within("the new owner's claim", epochOf(store, groupId))
      yield* within("the new owner's unit", store.commit(unit(ownerEpoch, 2n), results.write(groupId, orders0, ["b"])))
      yield* Deferred.succeed(wakeZombie, undefined)
      const fenced = yield* refusal("the zombie's unit", Fiber.join(zombie))
      assert.instanceOf(fenced, OffsetStore.Fenced)
      assert.deepInclude(fenced, { epoch: zombieEpoch, currentEpoch: ownerEpoch })
      assert.deepStrictEqual(yield* results.read(groupId, orders0), ["a", "b"])
      assert.strictEqual((yield* store.load(groupId, [orders0])).get("orders-0"), 2n)
    }).pipe(Effect.provide(suiteLayer)))

  it.live("makes a claim wait for a unit that holds the row, and returns that unit's position once it commits", () =>
    Effect.gen(function*() {
      const store = yield* OffsetStore.OffsetStore
      const sql = yield* TestSql
      const groupId = newGroup()
      const key = 424242
      // A trigger that keeps this group's units (and claims) from finishing their UPDATE while the test holds an
      // advisory lock: the unit then holds the row's lock, its position written and not committed.
      yield* query((sql) =>
        sql.unsafe(
          `create or replace function "hold_${run}"() returns trigger language plpgsql as $$
           begin perform pg_advisory_xact_lock(${key}); return null; end $$`
        )
      )
      yield* query((sql) =>
        sql.unsafe(
          `create trigger "hold_${run}" after update on "${table}" for each row
           when (new.group_id = '${groupId}') execute function "hold_${run}"()`
        )
      )
      const first = yield* epochOf(store, groupId)
      yield* store.commit(
        { groupId, partition: orders0, epoch: first, next: 1n },
        insertResults(groupId, orders0, ["a"])
      )

      const gate = yield* Effect.acquireRelease(
        Effect.tryPromise(() => sql.reserve()),
        (gate) => Effect.sync(() => gate.release())
      )
      yield* Effect.tryPromise(() => gate.unsafe(`select pg_advisory_lock(${key})`))
      const unit = yield* Effect.fork(
        store.commit({ groupId, partition: orders0, epoch: first, next: 2n }, insertResults(groupId, orders0, ["b"]))
      )
      yield* eventually("the unit to hold the row", Effect.map(waitingFor("advisory"), (n) => n === 1))
      const claim = yield* Effect.fork(store.claim(groupId, [orders0]))
      yield* eventually(
        "the claim to wait for the row",
        Effect.map(waitingFor("transactionid", "tuple"), (n) => n === 1)
      )
      yield* Effect.tryPromise(() => gate.unsafe(`select pg_advisory_unlock(${key})`))

      yield* within("the unit", Fiber.join(unit))
      const claimed = yield* within("the claim", Fiber.join(claim))
      assert.deepStrictEqual(claimed.get("orders-0"), { epoch: first + 1n, position: 2n })
      assert.deepStrictEqual(yield* readResults(groupId, orders0), ["a", "b"])
    }).pipe(Effect.scoped, Effect.provide(suiteLayer)))

  it.live("reports a failed position statement as the store's error, and nothing of the unit lands", () =>
    Effect.gen(function*() {
      const groupId = newGroup()
      const error = yield* Effect.flatMap(OffsetStore.OffsetStore, (store) =>
        store.commit(
          { groupId, partition: orders0, epoch: 1n, next: 1n },
          insertResults(groupId, orders0, ["lost"])
        )).pipe(
          Effect.provide(Layer.unwrapEffect(
            Effect.map(TestSql, (sql) => PgOffsetStore.layer({ sql, table: `missing_${run}` }))
          )),
          Effect.flip
        )
      assert.instanceOf(error, OffsetStore.OffsetStoreError)
      assert.include(error.message, "PgOffsetStore.migrate")
      assert.deepStrictEqual(yield* readResults(groupId, orders0), [])
    }).pipe(Effect.provide(suiteLayer)))

  it.live("a unit whose ranges fail to be written back, once their row is locked, is rolled back and fails", () =>
    Effect.gen(function*() {
      const store = yield* OffsetStore.OffsetStore
      const groupId = newGroup()
      const epoch = yield* epochOf(store, groupId)
      // A unit of records finished out of order locks its partition's row, adds its ranges and writes the row back;
      // COMMIT is sent along with that UPDATE. Here a trigger refuses the UPDATE (for this group only): the server then
      // rolls the COMMIT back, and the store must say the unit failed.
      yield* query((sql) =>
        sql.unsafe(
          `create or replace function "refuse_ranges_${run}"() returns trigger language plpgsql as $$
           begin raise exception 'ranges refused' using errcode = 'P0001'; end $$`
        )
      )
      yield* query((sql) =>
        sql.unsafe(
          `create trigger "refuse_ranges_${run}" before update on "${table}" for each row
           when (new.group_id = '${groupId}' and new.finished is not null) execute function "refuse_ranges_${run}"()`
        )
      )
      const error = yield* store.commit(
        { groupId, partition: orders0, epoch, next: 0n, finished: [[3n, 4n]] },
        insertResults(groupId, orders0, ["rolled back"])
      ).pipe(Effect.flip)
      assert.instanceOf(error, OffsetStore.OffsetStoreError)
      assert.include(error.message, "ranges refused")
      assert.deepStrictEqual(yield* readResults(groupId, orders0), [], "nothing of the unit landed")
      const claimed = (yield* store.claim(groupId, [orders0])).get("orders-0")
      assert.deepStrictEqual(claimed, { epoch: epoch + 1n, position: null }, "no position and no ranges were stored")
    }).pipe(Effect.provide(suiteLayer)))

  it.live("fails a query with a typed error naming its SQLSTATE, and does not retry what does not pass", () =>
    Effect.gen(function*() {
      const store = yield* OffsetStore.OffsetStore
      const groupId = newGroup()
      const epoch = yield* epochOf(store, groupId)
      const attempts = yield* Ref.make(0)
      const error = yield* store.commit(
        { groupId, partition: orders0, epoch, next: 1n },
        Ref.update(attempts, (n) => n + 1).pipe(
          Effect.zipRight(insertResults(groupId, orders0, ["a"])),
          Effect.zipRight(PgOffsetStore.query((tx) => tx`select * from no_such_table`))
        )
      ).pipe(Effect.flip)
      assert.instanceOf(error, OffsetStore.OffsetStoreError)
      if (error instanceof OffsetStore.OffsetStoreError) {
        assert.strictEqual(error.operation, "query")
        assert.include(error.reason, "42P01")
        assert.include(error.reason, "no_such_table")
        assert.instanceOf(error.cause, postgres.PostgresError)
      }
      assert.strictEqual(yield* Ref.get(attempts), 1)
      assert.deepStrictEqual(yield* readResults(groupId, orders0), [])
    }).pipe(Effect.provide(suiteLayer)))

  it.live("runs a unit again when a query fails with a serialization failure or a deadlock", () =>
    Effect.gen(function*() {
      const store = yield* OffsetStore.OffsetStore
      for (const code of ["40001", "40P01"]) {
        const groupId = newGroup()
        const epoch = yield* epochOf(store, groupId)
        const attempts = yield* Ref.make(0)
        yield* store.commit(
          { groupId, partition: orders0, epoch, next: 1n },
          Effect.gen(function*() {
            const attempt = yield* Ref.updateAndGet(attempts, (n) => n + 1)
            yield* insertResults(groupId, orders0, [`${code}-a`])
            if (attempt === 1) {
              const conflict = PgOffsetStore.query((tx) =>
                tx.unsafe(`do $$ begin raise exception 'conflict' using errcode = '${code}'; end $$`)
              )
              // The work turns the error into its own (40001), or carries on as if nothing happened (40P01): the
              // store still knows the failure passes, and runs the unit again.
              yield* code === "40001"
                ? conflict.pipe(Effect.mapError(() => new Error("the handler's own wrapping")))
                : Effect.ignore(conflict)
            }
            yield* insertResults(groupId, orders0, [`${code}-b`]).pipe(Effect.orElse(() => Effect.void))
          })
        )
        assert.strictEqual(yield* Ref.get(attempts), 2, code)
        assert.deepStrictEqual(yield* readResults(groupId, orders0), [`${code}-a`, `${code}-b`])
        assert.strictEqual((yield* store.load(groupId, [orders0])).get("orders-0"), 1n)
      }
    }).pipe(Effect.provide(suiteLayer)))

  it.live("retries a claim that fails with a serialization failure", () =>
    Effect.gen(function*() {
      const store = yield* OffsetStore.OffsetStore
      const groupId = newGroup()
      yield* query((sql) => sql.unsafe(`create sequence "fail_once_${run}"`))
      yield* query((sql) =>
        sql.unsafe(
          `create or replace function "fail_once_${run}"() returns trigger language plpgsql as $$
           begin
             if nextval('"fail_once_${run}"') = 1 then raise exception 'conflict' using errcode = '40001'; end if;
             return new;
           end $$`
        )
      )
      yield* query((sql) =>
        sql.unsafe(
          `create trigger "fail_once_${run}" before insert on "${table}" for each row
           when (new.group_id = '${groupId}') execute function "fail_once_${run}"()`
        )
      )
      const claims = yield* store.claim(groupId, [orders0])
      assert.deepStrictEqual(claims.get("orders-0"), { epoch: 1n, position: null })
      const calls = yield* query((sql) => sql.unsafe(`select last_value::int from "fail_once_${run}"`).values())
      assert.strictEqual(Number(calls[0][0]), 2, "the claim ran twice")
    }).pipe(Effect.provide(suiteLayer)))

  describe("when the connection of a unit is lost", () => {
    const scenarios: ReadonlyArray<{
      readonly name: string
      readonly sabotage: (
        closed: Queue.Dequeue<number>
      ) => Effect.Effect<void, unknown, OffsetStore.Transaction | TestSql>
    }> = [
      {
        name: "while the work waits, before it writes again",
        sabotage: (closed) =>
          Effect.flatMap(backendPid, terminate).pipe(Effect.zipRight(within("the loss", Queue.take(closed))))
      },
      {
        name: "while the work waits, before it writes again with PgOffsetStore.sql",
        sabotage: (closed) =>
          Effect.flatMap(backendPid, terminate).pipe(
            Effect.zipRight(within("the loss", Queue.take(closed))),
            Effect.zipRight(Effect.flatMap(PgOffsetStore.sql, (tx) => Effect.tryPromise(() => tx`select 1`)))
          )
      },
      {
        name: "while a query of the work runs",
        sabotage: () =>
          Effect.gen(function*() {
            const pid = yield* backendPid
            const running = query((sql) =>
              sql.unsafe(
                "select count(*)::int from pg_stat_activity where pid = $1 and query like 'select pg_sleep%'",
                [pid]
              ).values()
            ).pipe(Effect.map((rows) => Number(rows[0][0]) === 1))
            yield* Effect.fork(eventually("the query to run", running).pipe(Effect.zipRight(terminate(pid))))
            yield* PgOffsetStore.query((tx) => tx.unsafe("select pg_sleep(30)"))
          })
      }
    ]

    for (const scenario of scenarios) {
      it.live(`${scenario.name}, runs the unit again and commits it once`, () =>
        Effect.gen(function*() {
          const { closed, store } = yield* storeOnOwnClient()
          const groupId = newGroup()
          const epoch = yield* epochOf(store, groupId)
          const attempts = yield* Ref.make(0)
          yield* within(
            "the unit",
            store.commit(
              { groupId, partition: orders0, epoch, next: 2n },
              Effect.gen(function*() {
                const attempt = yield* Ref.updateAndGet(attempts, (n) => n + 1)
                yield* insertResults(groupId, orders0, ["a"])
                if (attempt === 1) yield* scenario.sabotage(closed)
                yield* insertResults(groupId, orders0, ["b"])
              })
            )
          )
          assert.strictEqual(yield* Ref.get(attempts), 2)
          assert.deepStrictEqual(yield* readResults(groupId, orders0), ["a", "b"])
          assert.strictEqual((yield* store.load(groupId, [orders0])).get("orders-0"), 2n)
          // The pool is whole: the next unit commits.
          yield* store.commit({ groupId, partition: orders0, epoch, next: 3n }, insertResults(groupId, orders0, ["c"]))
          assert.deepStrictEqual(yield* readResults(groupId, orders0), ["a", "b", "c"])
        }).pipe(Effect.scoped, Effect.provide(suiteLayer)))
    }

    it.live("refuses a statement sent the moment the connection closed, before postgres.js has told the unit", () =>
      Effect.gen(function*() {
        // The client's `onclose` runs inside postgres.js's own handling of the closed socket, before the transaction
        // has heard of it. A statement sent there would be written to a socket that is gone, in a timer, and the
        // uncaught TypeError would end the process.
        let probe: (() => void) | undefined
        const outcome = yield* Deferred.make<string>()
        const sql = yield* client({ max: 2, onclose: () => probe?.() })
        const store = yield* Layer.build(
          PgOffsetStore.layer({ sql, table, retry: Schedule.spaced("20 millis"), retryFor: "10 seconds" })
        ).pipe(Effect.map(Context.get(OffsetStore.OffsetStore)))
        const groupId = newGroup()
        const epoch = yield* epochOf(store, groupId)
        const attempts = yield* Ref.make(0)
        yield* within(
          "the unit",
          store.commit(
            { groupId, partition: orders0, epoch, next: 1n },
            Effect.gen(function*() {
              const attempt = yield* Ref.updateAndGet(attempts, (n) => n + 1)
              if (attempt === 1) {
                const tx = yield* PgOffsetStore.sql
                probe = () => {
                  probe = undefined
                  try {
                    tx`select 1`.execute().catch(() => undefined)
                    Deferred.unsafeDone(outcome, Effect.succeed("sent"))
                  } catch (error) {
                    Deferred.unsafeDone(outcome, Effect.succeed(`refused: ${String(error)}`))
                  }
                }
                yield* Effect.flatMap(backendPid, terminate)
                yield* within("the probe", Deferred.await(outcome))
              }
              yield* insertResults(groupId, orders0, ["a"])
            })
          )
        )
        assert.match(
          yield* Deferred.await(outcome),
          /^refused: TransactionClosed: the unit's connection to Postgres was lost/
        )
        assert.strictEqual(yield* Ref.get(attempts), 2)
        assert.deepStrictEqual(yield* readResults(groupId, orders0), ["a"])
      }).pipe(Effect.scoped, Effect.provide(suiteLayer)))

    it.live("a unit waiting for a connection gets one, though the connection it waited for was lost", () =>
      Effect.gen(function*() {
        // One connection: B waits for it while A holds it, and A's connection is then lost.
        const { store } = yield* storeOnOwnClient({}, url, 1)
        const groupA = newGroup()
        const groupB = newGroup()
        const epochA = yield* epochOf(store, groupA)
        const epochB = yield* epochOf(store, groupB)
        const aHolds = yield* Deferred.make<number>()
        const bDone = yield* Deferred.make<void>()
        const attemptsA = yield* Ref.make(0)
        const a = yield* store.commit(
          { groupId: groupA, partition: orders0, epoch: epochA, next: 1n },
          Effect.gen(function*() {
            const attempt = yield* Ref.updateAndGet(attemptsA, (n) => n + 1)
            yield* insertResults(groupA, orders0, ["a"])
            if (attempt === 1) {
              yield* Deferred.succeed(aHolds, yield* backendPid)
              yield* Deferred.await(bDone)
            }
          })
        ).pipe(Effect.fork)
        const pid = yield* Deferred.await(aHolds)
        const b = yield* store.commit(
          { groupId: groupB, partition: orders0, epoch: epochB, next: 1n },
          insertResults(groupB, orders0, ["b"])
        ).pipe(Effect.fork)
        yield* eventually("B to wait", Effect.map(Fiber.status(b), (status) => status._tag === "Suspended"))
        yield* terminate(pid)
        yield* Effect.timeoutFail(Fiber.join(b), {
          duration: "5 seconds",
          onTimeout: () => new Error("B never got a connection")
        })
        yield* Deferred.succeed(bDone, undefined)
        yield* within("A's second attempt", Fiber.join(a))
        assert.deepStrictEqual(yield* readResults(groupA, orders0), ["a"])
        assert.deepStrictEqual(yield* readResults(groupB, orders0), ["b"])
      }).pipe(Effect.scoped, Effect.provide(suiteLayer)))

    it.live("after the work ended, does not store the position on it: runs the unit again", () =>
      Effect.gen(function*() {
        const { closed, store } = yield* storeOnOwnClient()
        const groupId = newGroup()
        const epoch = yield* epochOf(store, groupId)
        const attempts = yield* Ref.make(0)
        yield* within(
          "the unit",
          store.commit(
            { groupId, partition: orders0, epoch, next: 1n },
            Effect.gen(function*() {
              const attempt = yield* Ref.updateAndGet(attempts, (n) => n + 1)
              yield* insertResults(groupId, orders0, ["a"])
              if (attempt === 1) {
                yield* Effect.flatMap(backendPid, terminate)
                yield* within("the loss", Queue.take(closed))
              }
            })
          )
        )
        assert.strictEqual(yield* Ref.get(attempts), 2)
        assert.deepStrictEqual(yield* readResults(groupId, orders0), ["a"])
        assert.strictEqual((yield* store.load(groupId, [orders0])).get("orders-0"), 1n)
      }).pipe(Effect.scoped, Effect.provide(suiteLayer)))

    it.live("during COMMIT, before it committed, asks the server and runs the unit again", () =>
      Effect.gen(function*() {
        const { store } = yield* storeOnOwnClient()
        const groupId = newGroup()
        // A trigger deferred to COMMIT that ends its own backend when it meets this value.
        yield* query((sql) =>
          sql.unsafe(
            `create or replace function "die_at_commit_${run}"() returns trigger language plpgsql as $$
             begin perform pg_terminate_backend(pg_backend_pid()); return null; end $$`
          )
        )
        yield* query((sql) =>
          sql.unsafe(
            `create constraint trigger "die_at_commit_${run}" after insert on "${resultsTable}"
             deferrable initially deferred for each row when (new.value = 'die-at-commit')
             execute function "die_at_commit_${run}"()`
          )
        )
        const epoch = yield* epochOf(store, groupId)
        const attempts = yield* Ref.make(0)
        yield* within(
          "the unit",
          store.commit(
            { groupId, partition: orders0, epoch, next: 1n },
            Effect.gen(function*() {
              const attempt = yield* Ref.updateAndGet(attempts, (n) => n + 1)
              yield* insertResults(groupId, orders0, [attempt === 1 ? "die-at-commit" : "a"])
            })
          )
        )
        assert.strictEqual(yield* Ref.get(attempts), 2)
        assert.deepStrictEqual(yield* readResults(groupId, orders0), ["a"])
        assert.strictEqual((yield* store.load(groupId, [orders0])).get("orders-0"), 1n)
      }).pipe(Effect.scoped, Effect.provide(suiteLayer)))

    // A unit of records finished out of order sends COMMIT along with the UPDATE that writes its ranges back: the
    // proxy then drops the answers to both.
    for (const shape of ["a unit of a chunk", "a unit of records finished out of order"] as const) {
      it.live(`during COMMIT, after it committed, asks the server and does not run the unit again (${shape})`, () =>
        Effect.gen(function*() {
          const proxy = yield* commitDroppingProxy
          const { store } = yield* storeOnOwnClient({}, proxy.url)
          const groupId = newGroup()
          const epoch = yield* epochOf(store, groupId)
          const attempts = yield* Ref.make(0)
          proxy.state.armed = "after"
          const unit = shape === "a unit of a chunk"
            ? { groupId, partition: orders0, epoch, next: 1n }
            : { groupId, partition: orders0, epoch, next: 1n, finished: [[3n, 4n]] as const }
          yield* within(
            "the unit",
            store.commit(
              unit,
              Ref.update(attempts, (n) => n + 1).pipe(Effect.zipRight(insertResults(groupId, orders0, ["a"])))
            )
          )
          assert.strictEqual(proxy.state.dropped, 1, "the proxy dropped the answer to COMMIT")
          assert.deepStrictEqual(yield* readResults(groupId, orders0), ["a"], "the unit's results, once")
          assert.strictEqual(yield* Ref.get(attempts), 1, "the unit committed, so it ran once")
          assert.deepStrictEqual(
            (yield* store.claim(groupId, [orders0])).get("orders-0"),
            shape === "a unit of a chunk"
              ? { epoch: epoch + 1n, position: 1n }
              : { epoch: epoch + 1n, position: 1n, finished: [[3n, 4n]] }
          )
        }).pipe(Effect.scoped, Effect.provide(suiteLayer)))
    }

    it.live("fails with the store's error once retries run out, naming the operation and the last failure", () =>
      Effect.gen(function*() {
        const { closed, store } = yield* storeOnOwnClient({ retry: Schedule.spaced("50 millis"), retryFor: "1 second" })
        const groupId = newGroup()
        const epoch = yield* epochOf(store, groupId)
        const attempts = yield* Ref.make(0)
        const error = yield* store.commit(
          { groupId, partition: orders0, epoch, next: 1n },
          Effect.gen(function*() {
            yield* Ref.update(attempts, (n) => n + 1)
            yield* insertResults(groupId, orders0, ["a"])
            yield* Effect.flatMap(backendPid, terminate)
            yield* within("the loss", Queue.take(closed))
            yield* insertResults(groupId, orders0, ["b"])
          })
        ).pipe(Effect.flip)
        assert.instanceOf(error, OffsetStore.OffsetStoreError)
        if (error instanceof OffsetStore.OffsetStoreError) {
          assert.strictEqual(error.operation, "commit")
          assert.include(error.reason, `still failing after ${yield* Ref.get(attempts)} attempts`)
          assert.include(error.reason, "connection to Postgres")
          assert.include(error.reason, "was lost")
        }
        assert.isAbove(yield* Ref.get(attempts), 2)
        assert.deepStrictEqual(yield* readResults(groupId, orders0), [])
        assert.isUndefined((yield* store.load(groupId, [orders0])).get("orders-0"))
      }).pipe(Effect.scoped, Effect.provide(suiteLayer)))
  })

  it.live("gives its connection back to the pool whatever the outcome of a unit", () =>
    Effect.gen(function*() {
      // One connection in the pool: a unit that kept it would leave the next one waiting for ever.
      const sql = yield* client({ max: 1 })
      const store = yield* Layer.build(PgOffsetStore.layer({ sql, table, migrate: true })).pipe(
        Effect.map(Context.get(OffsetStore.OffsetStore))
      )
      const groupId = newGroup()
      const epoch = yield* epochOf(store, groupId)
      const unit = (epoch: bigint, next: bigint) => ({ groupId, partition: orders0, epoch, next })
      const touch = PgOffsetStore.query((tx) => tx.unsafe("select 1"))

      yield* store.commit(unit(epoch, 1n), touch)
      const failed = yield* store.commit(unit(epoch, 2n), Effect.zipRight(touch, Effect.fail("handler failed"))).pipe(
        Effect.flip
      )
      assert.strictEqual(failed, "handler failed")
      const later = yield* refusal("a unit of a later epoch", store.commit(unit(epoch + 1n, 6n), touch))
      assert.instanceOf(later, OffsetStore.Fenced)
      const broken = yield* store.commit(
        unit(epoch, 2n),
        Effect.flatMap(PgOffsetStore.sql, (tx) => Effect.tryPromise(() => tx.unsafe("select * from no_such_table")))
      ).pipe(Effect.flip)
      assert.isTrue(Cause.isUnknownException(broken), "the work's own error")
      const started = yield* Deferred.make<void>()
      const stalled = yield* Effect.fork(
        store.commit(
          unit(epoch, 2n),
          touch.pipe(Effect.zipRight(Deferred.succeed(started, undefined)), Effect.zipRight(Effect.never))
        )
      )
      yield* Deferred.await(started)
      yield* Fiber.interrupt(stalled)

      yield* within("the pool's only connection", store.commit(unit(epoch, 2n), touch))
      assert.strictEqual((yield* store.load(groupId, [orders0])).get("orders-0"), 2n)
    }).pipe(Effect.scoped))
})
