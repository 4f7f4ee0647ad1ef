import { NodeContext } from "@effect/platform-node"
import * as FileSystem from "@effect/platform/FileSystem"
import { afterAll, assert, describe, it } from "@effect/vitest"
import * as Chunk from "effect/Chunk"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as ManagedRuntime from "effect/ManagedRuntime"
import * as TestClock from "effect/TestClock"
import postgres from "postgres"
import {
  appendSink,
  type MakePlan,
  type Outcome,
  type Progress,
  recordKey,
  type ResultSink,
  runWorkload,
  transactionalPlan,
  type Workload
} from "../demo/lab.js"
import * as CommitPolicy from "../src/CommitPolicy.js"
import * as Consumer from "../src/Consumer.js"
import type { ConsumerRecord } from "../src/ConsumerRecord.js"
import { Faults } from "../src/Faults.js"
import * as InMemoryKafka from "../src/InMemoryKafka.js"
import * as OffsetStore from "../src/OffsetStore.js"
import * as PgOffsetStore from "../src/PgOffsetStore.js"
import * as SqlOffsetStore from "../src/SqlOffsetStore.js"
import { createResultsTable, sqlSink as labSqlSink } from "../demo/sql.js"
import { eventually, settled } from "./support/kit.js"
import { clientLayer, type Database, databases, exec } from "./support/sqlStores.js"

const url = process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test"
const run = `${Date.now().toString(36)}_${crypto.randomUUID().slice(0, 6)}`
const offsetsTable = `eos_offsets_${run}`
const resultsTable = `eos_results_${run}`
const admin = postgres(url, { onnotice: () => {}, max: 2 })

afterAll(async () => {
  await admin.unsafe(`drop table if exists "${offsetsTable}"; drop table if exists "${resultsTable}"`)
  await admin.end({ timeout: 5 })
})

const pgReady = Effect.tryPromise({
  try: async () => {
    await admin.unsafe(
      // No unique key on purpose: exactly-once must hold without idempotent writes.
      `create table if not exists "${resultsTable}" (group_id text not null, record text not null)`
    )
  },
  catch: (cause) =>
    new Error(
      `Postgres at ${url} does not answer (${String(cause)}). Start it with ` +
        "`pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start`, or set DATABASE_URL"
    )
})

/** Results written with the store's own transaction, in a plain table with no unique key. */
const pgSink = (groupId: string): ResultSink<never> => ({
  write: (records) =>
    Effect.flatMap(
      PgOffsetStore.sql,
      (sql) =>
        Effect.tryPromise(() =>
          sql`insert into ${sql(resultsTable)} ${
            sql(Chunk.toReadonlyArray(Chunk.map(records, (r) => ({ group_id: groupId, record: recordKey(r) }))))
          }`
        )
    ),
  read: () =>
    Effect.tryPromise(() => admin`select record from ${admin(resultsTable)} where group_id = ${groupId}`).pipe(
      Effect.map((rows) => rows.map((r) => String(r.record)))
    )
})

const pgStore = PgOffsetStore.layer({ url, table: offsetsTable, migrate: true })

// SqlOffsetStore: tables of this run in MariaDB and Postgres (dropped at the end), and in a new SQLite file per test.
const sqlOffsetsTable = `eos_sql_offsets_${run}`
const sqlResultsTable = `eos_sql_results_${run}`
const databaseName: Record<Database, string> = { mysql: "MariaDB", pg: "Postgres", sqlite: "SQLite" }

afterAll(async () => {
  for (const database of ["mysql", "pg"] as const) {
    const runtime = ManagedRuntime.make(clientLayer(database, { poolSize: 1 }))
    await runtime.runPromise(
      Effect.all([exec(`drop table if exists ${sqlOffsetsTable}`), exec(`drop table if exists ${sqlResultsTable}`)])
    ).catch(() => undefined)
    await runtime.dispose()
  }
})

/** Results written by the handler with the application's own `sql`, in a plain table with no unique key. */
const sqlSink = labSqlSink(sqlResultsTable)

/** The in-memory broker, SqlOffsetStore and the results table, on the application's client of `database`. */
const sqlLayer = (database: Database) =>
  Layer.mergeAll(
    InMemoryKafka.layer(),
    SqlOffsetStore.layer({ table: sqlOffsetsTable, migrate: true }),
    Layer.effectDiscard(createResultsTable(sqlResultsTable))
  ).pipe(Layer.provideMerge(clientLayer(database)))

const exactlyOnce = (outcome: Outcome, options: { readonly zombies?: boolean } = {}) => {
  const text =
    `${outcome.policy}: results ${outcome.delivered}, lost ${outcome.lost}, duplicated ${outcome.duplicated}, ` +
    `crashes ${outcome.crashes}, zombies ${outcome.zombies}, rebalances ${outcome.rebalances}`
  assert.strictEqual(outcome.lost, 0, text)
  assert.strictEqual(outcome.duplicated, 0, text)
  assert.strictEqual(outcome.delivered, outcome.produced, text)
  assert.isAtLeast(outcome.crashes, 50, text)
  // Zombies whose late units the store must refuse: without the fence, their results would be there twice.
  if (options.zombies !== false) assert.isAtLeast(outcome.zombies, 1, text)
  assert.strictEqual(outcome.rebalances, 3, text)
}

/**
 * A run that fails as soon as no record has been stored for `quiet` seconds, saying how far it got, instead of
 * waiting for the test's timeout: what a pool of connections that has run dry looks like.
 */
const runProgressing = <R>(workload: Workload, plan: MakePlan<R>, quiet = 30) =>
  Effect.suspend(() => {
    let last: Progress | undefined
    let movedAt = Date.now()
    const stalled = Effect.sleep("1 second").pipe(
      Effect.repeat({ until: () => Date.now() - movedAt > quiet * 1_000 }),
      Effect.zipRight(
        Effect.failSync(() => new Error(`no record stored for ${quiet} seconds: ${JSON.stringify(last)}`))
      )
    )
    const onProgress = (progress: Progress) => {
      if (progress.stored !== last?.stored) movedAt = Date.now()
      last = progress
    }
    return Effect.raceFirst(runWorkload({ ...workload, onProgress }, plan), stalled)
  })

const workload = {
  policy: "transactional",
  records: 10_000,
  partitions: 6,
  consumers: 3,
  crashes: 60,
  crashRate: 0.15,
  rebalances: true,
  maxPollRecords: 25,
  zombies: 3
} as const

describe("exactly-once end to end on the in-memory broker, with crashes and rebalances", () => {
  it.live("memory store: every record's result is stored exactly once", () =>
    Effect.gen(function*() {
      const outcome = yield* runWorkload({ ...workload, seed: 101 }, transactionalPlan(appendSink))
      exactlyOnce(outcome)
    }).pipe(Effect.provide(Layer.merge(InMemoryKafka.layer(), OffsetStore.layerMemory))))

  it.live("memory store, key ordering: every record's result is stored exactly once, keys handled side by side", () =>
    Effect.gen(function*() {
      const outcome = yield* runWorkload(
        { ...workload, seed: 104, ordering: "key", keys: 50, concurrency: 16 },
        transactionalPlan(appendSink)
      )
      exactlyOnce(outcome)
    }).pipe(Effect.provide(Layer.merge(InMemoryKafka.layer(), OffsetStore.layerMemory))))

  it.live("file store: every record's result is stored exactly once", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const dir = yield* fs.makeTempDirectory({ prefix: "eos-" })
      // A crashed member's write that was already under way may still land while the run ends: remove afterwards.
      yield* Effect.addFinalizer(() =>
        fs.remove(dir, { recursive: true }).pipe(Effect.retry({ times: 5 }), Effect.ignore)
      )
      const outcome = yield* runWorkload({ ...workload, seed: 102 }, transactionalPlan(appendSink)).pipe(
        Effect.provide(Layer.merge(InMemoryKafka.layer(), OffsetStore.layerFileSystem(dir)))
      )
      exactlyOnce(outcome)
    }).pipe(Effect.scoped, Effect.provide(NodeContext.layer)), { timeout: 120_000 })

  it.live(
    "Postgres store: every record's result is stored exactly once, with no unique key on the results",
    () =>
      Effect.gen(function*() {
        yield* pgReady
        const groupId = `lab-transactional-103-group`
        const outcome = yield* runWorkload({ ...workload, seed: 103 }, transactionalPlan(pgSink(groupId)))
        exactlyOnce(outcome)
      }).pipe(Effect.provide(Layer.merge(InMemoryKafka.layer(), pgStore))),
    { timeout: 120_000 }
  )

  it.live(
    "file store, key ordering: units of records finished out of order, each result stored exactly once",
    () =>
      Effect.gen(function*() {
        const fs = yield* FileSystem.FileSystem
        const dir = yield* fs.makeTempDirectory({ prefix: "eos-key-" })
        yield* Effect.addFinalizer(() =>
          fs.remove(dir, { recursive: true }).pipe(Effect.retry({ times: 5 }), Effect.ignore)
        )
        const outcome = yield* runWorkload(
          { ...workload, records: 3_000, seed: 105, ordering: "key", keys: 50, concurrency: 16 },
          transactionalPlan(appendSink)
        ).pipe(Effect.provide(Layer.merge(InMemoryKafka.layer(), OffsetStore.layerFileSystem(dir))))
        exactlyOnce(outcome)
      }).pipe(Effect.scoped, Effect.provide(NodeContext.layer)),
    { timeout: 120_000 }
  )

  it.live(
    "Postgres store, key ordering: units of records finished out of order, each result stored exactly once",
    () =>
      Effect.gen(function*() {
        yield* pgReady
        const groupId = `lab-transactional-106-group`
        const outcome = yield* runWorkload(
          { ...workload, records: 3_000, seed: 106, ordering: "key", keys: 50, concurrency: 16 },
          transactionalPlan(pgSink(groupId))
        )
        exactlyOnce(outcome)
      }).pipe(Effect.provide(Layer.merge(InMemoryKafka.layer(), pgStore))),
    { timeout: 120_000 }
  )

  databases.forEach((database, i) => {
    const name = `SqlOffsetStore on ${databaseName[database]}`
    // SQLite's one connection is held by a unit from BEGIN to COMMIT: a member stalled in its unit (the lab's zombies)
    // would stall every other member, and no claim could come first. Its runs have no zombies; the zombie test below
    // stalls one before its unit begins.
    const zombies = database === "sqlite" ? { zombies: 0 } : {}
    it.live(
      `${name}: every record's result is stored exactly once, written with the application's own sql`,
      () =>
        Effect.gen(function*() {
          const outcome = yield* runProgressing({ ...workload, ...zombies, seed: 111 + i }, transactionalPlan(sqlSink))
          exactlyOnce(outcome, { zombies: database !== "sqlite" })
        }).pipe(Effect.provide(sqlLayer(database))),
      { timeout: 120_000 }
    )

    it.live(
      `${name}, key ordering: units of records finished out of order, each result stored exactly once`,
      () =>
        Effect.gen(function*() {
          const outcome = yield* runProgressing(
            { ...workload, ...zombies, records: 3_000, seed: 114 + i, ordering: "key", keys: 50, concurrency: 16 },
            transactionalPlan(sqlSink)
          )
          exactlyOnce(outcome, { zombies: database !== "sqlite" })
        }).pipe(Effect.provide(sqlLayer(database))),
      { timeout: 120_000 }
    )
  })
})

/**
 * The zombie: A stalls mid-batch (frozen: no poll, no heartbeat), the group evicts it and gives its partition to B,
 * which claims it and processes past A's batch; then A wakes and tries to commit. The store refuses A's transaction:
 * B's claim moved the partition's owner epoch on. With `rejoin` (the default) A gives up its partitions and rejoins
 * the group; without, it ends with `Fenced`.
 *
 * A stalls in its handler, its unit's transaction open with its results written in it (`inUnit`), or, where a unit
 * holds the database's only connection (SQLite) and nothing else could run meanwhile, just before its unit begins
 * (`beforeUnit`, held by the consumer's fault-injection hook), its records in hand and its epoch taken.
 */
const zombie = <R>(sink: ResultSink<R>, rejoin: boolean, stall: "inUnit" | "beforeUnit" = "inUnit") =>
  Effect.gen(function*() {
    const kafka = yield* InMemoryKafka.InMemoryKafka
    const topic = `zombie-${crypto.randomUUID().slice(0, 6)}`
    const groupId = `${topic}-group`
    yield* kafka.createTopic(topic, 1)
    yield* kafka.produce(topic, Array.from({ length: 20 }, (_, i) => ({ value: String(i) })))
    const config = { groupId, topics: [topic], maxPollRecords: 5, sessionTimeout: "300 millis" } as const
    const aInBatch = yield* Deferred.make<void>()
    const wakeA = yield* Deferred.make<void>()
    const stallA = Effect.zipRight(Deferred.succeed(aInBatch, undefined), Deferred.await(wakeA))
    let aWrites = 0
    let aHandled = false
    let aStalled = false
    const a = yield* Consumer.run({ ...config, rejoin }, (records) =>
      Effect.gen(function*() {
        yield* sink.write(records)
        // Only A's first batch is counted (and, in its unit, stalled): it is the one whose results must not land.
        if (aHandled) return
        aHandled = true
        aWrites += Chunk.size(records)
        if (stall === "inUnit") yield* stallA
      })).pipe(
        Effect.provide(CommitPolicy.transactional()),
        stall === "inUnit" ? (self) => self : Effect.provideService(Faults, {
          crashAt: (point) =>
            Effect.suspend(() => {
              if (point !== "beforeHandler" || aStalled) return Effect.succeed(false)
              aStalled = true
              return Effect.as(stallA, false)
            })
        }),
        Effect.fork
      )
    yield* Deferred.await(aInBatch)
    const [memberA] = yield* kafka.members(groupId)
    yield* kafka.freeze(memberA!.memberId)

    const store = yield* OffsetStore.OffsetStore
    const position = Effect.map(store.load(groupId, [{ topic, partition: 0 }]), (m) => m.get(`${topic}-0`) ?? 0n)
    const b = yield* Consumer.run(config, sink.write).pipe(Effect.provide(CommitPolicy.transactional()), Effect.fork)
    yield* eventually("B has stored every position", Effect.map(position, (p) => p === 20n))

    // A's handler wakes up and finishes its batch before A has heard from the group that it was evicted: its commit
    // is fenced and rolled back. (Had its poll run first, it would have learnt that its partition was lost and
    // interrupted the batch instead.)
    yield* Deferred.succeed(wakeA, undefined)
    // Had A's commit gone through, its results would be there next to B's: that ends the wait below at once.
    const unlessALanded = <A, E, R2>(wait: Effect.Effect<A, E, R2>) =>
      Effect.raceFirst(
        wait,
        sink.read(groupId).pipe(
          Effect.flatMap((results) =>
            results.length > 20
              ? Effect.fail(new Error(`A's commit was not refused: ${results.length} results, A's with B's`))
              : Effect.sleep("5 millis")
          ),
          Effect.forever
        )
      )
    if (rejoin) {
      // A gave up the partition and joined the group again as a new member: two members, A still running.
      yield* unlessALanded(
        eventually("A rejoined the group", Effect.map(kafka.members(groupId), (ms) => ms.length === 2))
      )
      assert.isTrue((yield* Fiber.poll(a))._tag === "None", "A stopped instead of rejoining")
      yield* Fiber.interrupt(a)
    } else {
      const exitA = yield* unlessALanded(Fiber.await(a)).pipe(
        Effect.timeoutFail({ duration: "10 seconds", onTimeout: () => new Error("A's commit was not refused") })
      )
      assert.isTrue(Exit.isFailure(exitA))
      const error = Exit.isFailure(exitA) && exitA.cause._tag === "Fail" ? exitA.cause.error : undefined
      assert.instanceOf(error, OffsetStore.Fenced)
      if (error instanceof OffsetStore.Fenced) {
        // A claimed the partition first (epoch 1); B's claim made it epoch 2.
        assert.strictEqual(error.epoch, 1n)
        assert.strictEqual(error.currentEpoch, 2n)
      }
    }
    yield* kafka.thaw(memberA!.memberId)
    yield* Fiber.interrupt(b)
    assert.strictEqual(aWrites, 5)
    const results = yield* sink.read(groupId)
    assert.strictEqual(results.length, 20)
    assert.strictEqual(new Set(results).size, 20)
    assert.strictEqual(yield* position, 20n)
  })

describe("a zombie cannot commit after losing its partition", () => {
  for (const rejoin of [false, true]) {
    const outcome = rejoin ? "it rejoins the group" : "with rejoin: false it ends with Fenced"
    it.live(`memory store: ${outcome}`, () =>
      zombie(appendSink, rejoin).pipe(Effect.provide(Layer.merge(InMemoryKafka.layer(), OffsetStore.layerMemory))))

    it.live(`file store: ${outcome}`, () =>
      Effect.gen(function*() {
        const fs = yield* FileSystem.FileSystem
        const dir = yield* fs.makeTempDirectoryScoped({ prefix: "zombie-" })
        yield* zombie(appendSink, rejoin).pipe(
          Effect.provide(Layer.merge(InMemoryKafka.layer(), OffsetStore.layerFileSystem(dir)))
        )
      }).pipe(Effect.scoped, Effect.provide(NodeContext.layer)))

    it.live(`Postgres store: ${outcome}`, () =>
      Effect.gen(function*() {
        yield* pgReady
        yield* zombie(pgSinkAny, rejoin)
      }).pipe(Effect.provide(Layer.merge(InMemoryKafka.layer(), pgStore))))

    for (const database of databases) {
      it.live(`SqlOffsetStore on ${databaseName[database]}: ${outcome}`, () =>
        zombie(sqlSink, rejoin, database === "sqlite" ? "beforeUnit" : "inUnit").pipe(
          Effect.provide(sqlLayer(database))
        ))
    }
  }
})

describe("a unit fenced while its partition is being revoked", () => {
  // A's first unit on partition 0 is still running when B joins: the partition is being revoked from A when the unit
  // tries to commit, and meanwhile another owner has claimed the partition and stored a position. The unit is fenced
  // and rolled back; that is no reason for A to stop: nothing is lost, and A goes on.
  it.effect("is rolled back, and the member goes on with the group", () =>
    Effect.gen(function*() {
      const kafka = yield* InMemoryKafka.InMemoryKafka
      const store = yield* OffsetStore.OffsetStore
      const topic = "late-unit"
      const groupId = `${topic}-group`
      yield* kafka.createTopic(topic, 2)
      for (const partition of [0, 1]) {
        yield* kafka.produce(topic, Array.from({ length: 10 }, (_, i) => ({ value: String(i), partition })))
      }
      const config = { groupId, topics: [topic], maxPollRecords: 5 } as const
      const inFirstUnit = yield* Deferred.make<void>()
      let slow = true
      const handler = (records: Chunk.Chunk<ConsumerRecord>) =>
        Effect.gen(function*() {
          yield* appendSink.write(records)
          if (slow && Chunk.unsafeHead(records).partition === 0) {
            slow = false
            yield* Deferred.succeed(inFirstUnit, undefined)
            yield* Effect.sleep("5 seconds")
          }
        })
      const a = yield* Consumer.run(config, handler).pipe(Effect.provide(CommitPolicy.transactional()), Effect.fork)
      yield* Deferred.await(inFirstUnit)
      const claims = yield* store.claim(groupId, [{ topic, partition: 0 }])
      const epoch = claims.get(`${topic}-0`)!.epoch
      yield* store.commit({ groupId, partition: { topic, partition: 0 }, epoch, next: 5n }, Effect.void)

      const b = yield* Consumer.run(config, handler).pipe(Effect.provide(CommitPolicy.transactional()), Effect.fork)
      // Everything runs until it waits: A has been told of the rebalance and waits for its unit to end.
      yield* Effect.repeatN(Effect.yieldNow(), 1_000)
      yield* TestClock.adjust("5 seconds")
      const positions = store.load(groupId, [{ topic, partition: 0 }, { topic, partition: 1 }])
      yield* settled(
        "both partitions stored to the end",
        Effect.map(positions, (p) => p.get(`${topic}-0`) === 10n && p.get(`${topic}-1`) === 10n)
      )

      assert.isTrue((yield* Fiber.poll(a))._tag === "None", "A stopped")
      assert.isTrue((yield* Fiber.poll(b))._tag === "None", "B stopped")
      const results = yield* appendSink.read(groupId)
      // Partition 0's first five records were "handled" by the other member, which wrote nothing: A's results for
      // them were rolled back with its unit.
      const expected = [
        ...Array.from({ length: 5 }, (_, i) => recordKey({ partition: 0, offset: BigInt(5 + i) })),
        ...Array.from({ length: 10 }, (_, i) => recordKey({ partition: 1, offset: BigInt(i) }))
      ].sort()
      assert.deepStrictEqual([...results].sort(), expected)
      yield* Fiber.interrupt(a)
      yield* Fiber.interrupt(b)
    }).pipe(Effect.provide(Layer.merge(InMemoryKafka.layer(), OffsetStore.layerMemory))))
})

/** The Postgres sink reading whichever group it is asked about. */
const pgSinkAny: ResultSink<never> = {
  write: (records) =>
    Effect.flatMap(
      PgOffsetStore.sql,
      (sql) =>
        Effect.tryPromise(() =>
          sql`insert into ${sql(resultsTable)} ${
            sql(
              Chunk.toReadonlyArray(Chunk.map(records, (r) => ({ group_id: r.topic + "-group", record: recordKey(r) })))
            )
          }`
        )
    ),
  read: (groupId) =>
    Effect.tryPromise(() => admin`select record from ${admin(resultsTable)} where group_id = ${groupId}`).pipe(
      Effect.map((rows) => rows.map((r) => String(r.record)))
    )
}

describe("transactional starts where the store says", () => {
  it.live("on assign a partition starts at the stored position, not at Kafka's committed offset", () =>
    Effect.gen(function*() {
      const kafka = yield* InMemoryKafka.InMemoryKafka
      const store = yield* OffsetStore.OffsetStore
      yield* kafka.createTopic("truth", 1)
      yield* kafka.produce("truth", Array.from({ length: 15 }, (_, i) => ({ value: String(i) })))
      // Kafka's committed offset says 15 (say, from an earlier at-least-once run); the store, the truth, says 10.
      yield* Consumer.run({ groupId: "g", topics: ["truth"] }, () => Effect.void).pipe(
        Effect.provide(CommitPolicy.commitAfter({ maxBatch: 15, maxInterval: "1 hour" })),
        Effect.timeout("300 millis"),
        Effect.ignore
      )
      assert.strictEqual((yield* kafka.committed("g")).get("truth-0"), 15n)
      yield* kafka.produce("truth", Array.from({ length: 5 }, (_, i) => ({ value: String(i + 15) })))
      const { epoch } = (yield* store.claim("g", [{ topic: "truth", partition: 0 }])).get("truth-0")!
      yield* store.commit({ groupId: "g", partition: { topic: "truth", partition: 0 }, epoch, next: 10n }, Effect.void)
      const seen: Array<bigint> = []
      const fiber = yield* Consumer.run({ groupId: "g", topics: ["truth"] }, (records) =>
        Effect.sync(() => {
          for (const r of records) seen.push(r.offset)
        })).pipe(Effect.provide(CommitPolicy.transactional()), Effect.fork)
      yield* eventually("all handled", Effect.sync(() => seen.includes(19n)))
      yield* Fiber.interrupt(fiber)
      assert.deepStrictEqual(seen, Array.from({ length: 10 }, (_, i) => BigInt(i + 10)))
    }).pipe(Effect.provide(Layer.merge(InMemoryKafka.layer(), OffsetStore.layerMemory))))
})

describe("transactional with a position hint for Kafka", () => {
  it.live("commitToKafka also commits each stored position to Kafka, so lag tools see progress", () =>
    Effect.gen(function*() {
      const kafka = yield* InMemoryKafka.InMemoryKafka
      const store = yield* OffsetStore.OffsetStore
      yield* kafka.createTopic("hint", 2)
      yield* kafka.produce("hint", Array.from({ length: 40 }, (_, i) => ({ value: String(i), partition: i % 2 })))
      const fiber = yield* Consumer.run({ groupId: "g", topics: ["hint"], maxPollRecords: 7 }, () => Effect.void).pipe(
        Effect.provide(CommitPolicy.transactional({ commitToKafka: true })),
        Effect.fork
      )
      const partitions = [{ topic: "hint", partition: 0 }, { topic: "hint", partition: 1 }]
      yield* eventually(
        "stored",
        Effect.map(store.load("g", partitions), (m) => m.get("hint-0") === 20n && m.get("hint-1") === 20n)
      )
      yield* eventually(
        "hinted",
        Effect.map(kafka.committed("g"), (m) => m.get("hint-0") === 20n && m.get("hint-1") === 20n)
      )
      yield* Fiber.interrupt(fiber)
    }).pipe(Effect.provide(Layer.merge(InMemoryKafka.layer(), OffsetStore.layerMemory))))
})

describe("Postgres connections lost while records flow", () => {
  // What a server restart does to a client: every backend ends with "terminating connection due to administrator
  // command" (57P01), in the middle of whatever it was doing. Here only this test's own backends are ended, again and
  // again while units run, so that the other tests sharing the server are left alone.
  it.live("the consumer carries on, and every record's result is stored exactly once", () =>
    Effect.gen(function*() {
      yield* pgReady
      const kafka = yield* InMemoryKafka.InMemoryKafka
      const applicationName = `eos-lost-${run}`
      const client = yield* Effect.acquireRelease(
        Effect.sync(() =>
          postgres(url, {
            onnotice: () => {},
            max: 4,
            // Its backends are ended again and again: see PgOffsetStore's `sql` option.
            fetch_types: false,
            connection: { application_name: applicationName }
          })
        ),
        (sql) => Effect.promise(() => sql.end({ timeout: 1 }))
      )
      const topic = `lost-${crypto.randomUUID().slice(0, 6)}`
      const groupId = `${topic}-group`
      const total = 3_000
      yield* kafka.createTopic(topic, 3)
      yield* kafka.produce(topic, Array.from({ length: total }, (_, i) => ({ value: String(i), partition: i % 3 })))
      const written = Effect.tryPromise(() =>
        admin`select count(*)::int as n from ${admin(resultsTable)} where group_id = ${groupId}`
      ).pipe(Effect.map((rows) => Number(rows[0].n)))

      let handled = 0
      const consumer = yield* Consumer.run(
        { groupId, topics: [topic], maxPollRecords: 20 },
        (records) =>
          // Each unit also sleeps a little on the server, so that the terminations land inside units.
          Effect.sync(() => {
            handled += Chunk.size(records)
          }).pipe(Effect.zipRight(PgOffsetStore.query((tx) =>
            tx`insert into ${tx(resultsTable)} ${
              tx(Chunk.toReadonlyArray(Chunk.map(records, (r) => ({ group_id: groupId, record: recordKey(r) }))))
            }`.then(() => tx`select pg_sleep(0.005)`)
          )))
      ).pipe(
        Effect.provide(CommitPolicy.transactional()),
        Effect.provide(PgOffsetStore.layer({ sql: client, table: offsetsTable, migrate: true })),
        Effect.fork
      )

      // At least n results, failing at once if the consumer has ended.
      const atLeast = (n: number) =>
        Effect.flatMap(Fiber.poll(consumer), (exit) =>
          exit._tag === "Some"
            ? Effect.fail(new Error(`the consumer ended: ${String(exit.value)}`))
            : Effect.map(written, (w) =>
              w >= n))

      // Ten times: once more results have landed, end every backend of the consumer's client.
      let terminated = 0
      for (let round = 1; round <= 10; round++) {
        yield* eventually(`${round * 200} results`, atLeast(round * 200), "60 seconds")
        const rows = yield* Effect.tryPromise(() =>
          admin`select count(*) filter (where pg_terminate_backend(pid))::int as n
                from pg_stat_activity where application_name = ${applicationName}`
        )
        terminated += Number(rows[0].n)
        assert.isTrue((yield* Fiber.poll(consumer))._tag === "None", `the consumer ended after round ${round}`)
      }
      yield* eventually(`all ${total} results`, atLeast(total), "60 seconds")

      const results = yield* Effect.tryPromise(() =>
        admin`select record from ${admin(resultsTable)} where group_id = ${groupId}`
      ).pipe(Effect.map((rows) => rows.map((r) => String(r.record))))
      const positions = yield* OffsetStore.OffsetStore.pipe(
        Effect.flatMap((store) => store.load(groupId, [0, 1, 2].map((partition) => ({ topic, partition })))),
        Effect.provide(PgOffsetStore.layer({ sql: client, table: offsetsTable }))
      )
      assert.isTrue((yield* Fiber.poll(consumer))._tag === "None", "the consumer ended")
      yield* Fiber.interrupt(consumer)
      // Every round ended at least one backend that the consumer was using or had open.
      assert.isAtLeast(terminated, 10)
      // Units were cut off in the middle, rolled back and run again: records were handled more often than stored.
      assert.isAbove(handled, total, "no unit was run again")
      assert.strictEqual(results.length, total, "results stored")
      assert.strictEqual(new Set(results).size, total, "distinct results")
      assert.deepStrictEqual([...positions.values()], [1_000n, 1_000n, 1_000n])
    }).pipe(Effect.scoped, Effect.provide(InMemoryKafka.layer())), { timeout: 180_000 })
})
