/**
 * Benchmark 9: per-key concurrency. A handler that waits 1 ms per record (asynchronous, as I/O would), records keyed
 * over many keys on 6 partitions: `runEach` with `ordering: "key"` and `concurrency: 100` against `ordering:
 * "partition"`, on the in-memory broker and on the real broker.
 */
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as ManagedRuntime from "effect/ManagedRuntime"
import { CompressionTypes, Kafka, logLevel, Partitioners } from "kafkajs"
import postgres from "postgres"
import * as CommitPolicy from "../src/CommitPolicy.js"
import * as Consumer from "../src/Consumer.js"
import type { Driver } from "../src/Driver.js"
import * as InMemoryKafka from "../src/InMemoryKafka.js"
import type { OffsetStore } from "../src/OffsetStore.js"
import * as PgOffsetStore from "../src/PgOffsetStore.js"
import { Counter, driverLayer, settings } from "./consumers.js"
import { type BenchResult, compare, find, type Plan, ratioAtLeast, ratioInfo, type Sample, timed } from "./harness.js"
import { createTopics } from "./topics.js"

export interface OrderingSizes {
  readonly records: number
  readonly keys: number
  readonly partitions: number
  readonly concurrency: number
}

/** How long the handler waits per record. */
const HANDLER_MILLIS = 1

let seq = 0
const fresh = (what: string) => `bench-${what}-${process.pid}-${++seq}-${crypto.randomUUID().slice(0, 8)}`

/** The records: key `k<i mod keys>`, each key on its murmur2 partition, 256 B values. */
const keyOf = (i: number, keys: number) => `k${i % keys}`

/** One run: a fresh group reads the whole topic with a handler that waits 1 ms per record. */
const runOnce = <E>(
  runtime: ManagedRuntime.ManagedRuntime<Driver, E>,
  topic: string,
  records: number,
  ordering: "partition" | "key",
  concurrency: number
): Promise<Sample> =>
  runtime.runPromise(Effect.gen(function*() {
    const done = yield* Deferred.make<void>()
    const counter = new Counter(records, performance.now(), () => Deferred.unsafeDone(done, Exit.void))
    const wait = Effect.sleep(Duration.millis(HANDLER_MILLIS))
    const fiber = yield* Consumer.runEach(
      {
        groupId: fresh(`ordering-${ordering}`),
        topics: [topic],
        sessionTimeout: Duration.millis(settings.sessionTimeoutMs),
        ...(ordering === "key" ? { ordering, concurrency } : {})
      },
      () => Effect.zipRight(wait, Effect.sync(() => counter.add(1)))
    ).pipe(
      Effect.provide(CommitPolicy.commitAfter({ maxBatch: 1000, maxInterval: Duration.seconds(1) })),
      Effect.fork
    )
    yield* Effect.raceFirst(Deferred.await(done), Fiber.join(fiber))
    yield* Fiber.interrupt(fiber)
    return counter.sample()
  }))

/**
 * What the runtime allows at best: `concurrency` fibers taking the records in turn and waiting as the handler does,
 * with no consumer at all. With many timers of 1 ms at once, each wait takes longer than 1 ms (the event loop fires
 * them in turns), so this, not concurrency / handler time, is the ceiling the key ordering is compared with.
 */
const ceilingOnce = (records: number, concurrency: number): Promise<Sample> => {
  const wait = Effect.sleep(Duration.millis(HANDLER_MILLIS))
  let left = records
  const worker: Effect.Effect<void> = Effect.suspend(() => left-- <= 0 ? Effect.void : Effect.zipRight(wait, worker))
  const started = performance.now()
  return Effect.runPromise(
    Effect.forEach(Array.from({ length: concurrency }), () => worker, { concurrency: "unbounded", discard: true })
  ).then(() => ({ value: records / ((performance.now() - started) / 1000) }))
}

/** Both orderings on one broker, interleaved, and the result. */
const measure = async <E>(
  plan: Plan,
  runtime: ManagedRuntime.ManagedRuntime<Driver, E>,
  topic: string,
  sizes: OrderingSizes,
  id: string,
  where: string
): Promise<Omit<BenchResult, "elapsedSeconds" | "load">> => {
  const variants = await compare(plan, [
    { id: "partition", label: "partition ordering", run: () => runOnce(runtime, topic, sizes.records, "partition", 1) },
    {
      id: "key",
      label: `key ordering, concurrency ${sizes.concurrency}`,
      run: () => runOnce(runtime, topic, sizes.records, "key", sizes.concurrency)
    },
    {
      id: "ceiling",
      label: `${sizes.concurrency} bare waits in flight, no consumer`,
      run: () => ceilingOnce(sizes.records, sizes.concurrency)
    }
  ])
  const ideal = sizes.concurrency * (1000 / HANDLER_MILLIS)
  const key = find(variants, "key").median
  return {
    id,
    title: `9. Per-key concurrency, ${where}: ${sizes.records.toLocaleString("en-US")} records, ` +
      `${sizes.keys.toLocaleString("en-US")} keys, ${sizes.partitions} partitions`,
    unit: "records/s",
    warmup: plan.warmup,
    rounds: plan.rounds,
    variants,
    checks: [
      ratioAtLeast(variants, "key", "partition", 10),
      { name: "key / ideal", value: key / ideal, target: "(reported)", hit: true },
      { name: "key / ceiling", value: key / find(variants, "ceiling").median, target: "(reported)", hit: true },
      {
        name: "ceiling / partition",
        value: find(variants, "ceiling").median / find(variants, "partition").median,
        target: "(reported)",
        hit: true
      }
    ],
    notes: [
      `runEach, a handler that waits ${HANDLER_MILLIS} ms per record (Effect.sleep), commitAfter; key: ordering ` +
      `"key", concurrency ${sizes.concurrency}; partition: the default ordering`,
      `ideal for key: concurrency / handler time = ${ideal.toLocaleString("en-US")} records/s; records/s after ` +
      "the first delivery, the join excluded",
      `ceiling: ${sizes.concurrency} fibers taking the records in turn and waiting ${HANDLER_MILLIS} ms each, ` +
      "without a consumer: the most the runtime's timers allow; ceiling / partition is the best key/partition " +
      "could reach here"
    ]
  }
}

/** 9a. On the in-memory broker. */
export const orderingInMemory = (plan: Plan, sizes: OrderingSizes): Promise<BenchResult> =>
  timed(async () => {
    plan.log(`9. per-key concurrency, in-memory broker, ${sizes.records.toLocaleString("en-US")} records`)
    const runtime = ManagedRuntime.make(InMemoryKafka.layer())
    try {
      const topic = "ordering"
      const value = new Uint8Array(256).fill(0x61)
      await runtime.runPromise(Effect.gen(function*() {
        yield* InMemoryKafka.createTopic(topic, sizes.partitions)
        yield* InMemoryKafka.produce(
          topic,
          Array.from({ length: sizes.records }, (_, i) => ({ key: keyOf(i, sizes.keys), value }))
        )
      }))
      return await measure(plan, runtime, topic, sizes, "ordering-inmemory", "in-memory broker")
    } finally {
      await runtime.dispose()
    }
  })

/** 9b. On the real broker. */
export const orderingKafka = (plan: Plan, brokers: string, sizes: OrderingSizes): Promise<BenchResult> =>
  timed(async () => {
    plan.log(`9. per-key concurrency, real broker, ${sizes.records.toLocaleString("en-US")} records`)
    const kafka = new Kafka({ clientId: "bench-ordering", brokers: brokers.split(","), logLevel: logLevel.NOTHING })
    const admin = kafka.admin()
    await admin.connect()
    const topic = fresh("ordering")
    const runtime = ManagedRuntime.make(Layer.orDie(driverLayer(brokers)))
    try {
      await createTopics(brokers, [topic], sizes.partitions)
      const producer = kafka.producer({
        createPartitioner: Partitioners.DefaultPartitioner,
        allowAutoTopicCreation: false
      })
      await producer.connect()
      try {
        const value = Buffer.alloc(256, 0x61)
        for (let at = 0; at < sizes.records; at += 5_000) {
          const messages = []
          for (let i = at; i < Math.min(sizes.records, at + 5_000); i++) {
            messages.push({ key: keyOf(i, sizes.keys), value })
          }
          await producer.send({ topic, acks: 1, compression: CompressionTypes.None, messages })
        }
      } finally {
        await producer.disconnect()
      }
      return await measure(plan, runtime, topic, sizes, "ordering-kafka", "real broker")
    } finally {
      await runtime.dispose()
      await admin.deleteTopics({ topics: [topic] }).catch(() => undefined)
      await admin.disconnect()
    }
  })

/**
 * One run of exactly-once on Postgres: the handler's wait, and with `insert` each record's result inserted in its
 * unit (without it the units hold only the positions and finished ranges the store writes).
 */
const runTransactional = (
  runtime: ManagedRuntime.ManagedRuntime<Driver | OffsetStore, unknown>,
  topic: string,
  resultsTable: string,
  records: number,
  ordering: "partition" | "key",
  concurrency: number,
  insert: boolean
): Promise<Sample> =>
  runtime.runPromise(Effect.gen(function*() {
    const done = yield* Deferred.make<void>()
    const counter = new Counter(records, performance.now(), () => Deferred.unsafeDone(done, Exit.void))
    const wait = Effect.sleep(Duration.millis(HANDLER_MILLIS))
    const groupId = fresh(`ordering-pg-${ordering}`)
    const fiber = yield* Consumer.runEach(
      { groupId, topics: [topic], ...(ordering === "key" ? { ordering, concurrency } : {}) },
      (record) =>
        !insert ? Effect.zipRight(wait, Effect.sync(() => counter.add(1))) : wait.pipe(
          Effect.zipRight(PgOffsetStore.sql),
          Effect.flatMap((sql) =>
            Effect.tryPromise(() =>
              sql.unsafe(`insert into "${resultsTable}" (group_id, record_offset) values ($1, $2)`, [
                groupId,
                `${record.partition}@${record.offset}`
              ])
            )
          ),
          // Counted once the unit committed would need a hook; counted here, the last unit's commit is left out.
          Effect.zipRight(Effect.sync(() => counter.add(1)))
        )
    ).pipe(Effect.provide(CommitPolicy.transactional()), Effect.fork)
    yield* Effect.raceFirst(Deferred.await(done), Fiber.join(fiber))
    yield* Fiber.interrupt(fiber)
    return counter.sample()
  }))

/** 9c. Exactly-once into Postgres (`transactional`), key against partition ordering, on the in-memory broker. */
export const orderingPostgres = (plan: Plan, databaseUrl: string, sizes: OrderingSizes): Promise<BenchResult> =>
  timed(async () => {
    const records = Math.max(1, Math.floor(sizes.records / 2))
    plan.log(`9. per-key concurrency, transactional on Postgres, ${records.toLocaleString("en-US")} records`)
    const run = `${process.pid}_${Date.now().toString(36)}`
    const offsetsTable = `bench_key_offsets_${run}`
    const resultsTable = `bench_key_results_${run}`
    const sql = postgres(databaseUrl, { onnotice: () => {}, max: 48, connect_timeout: 10 })
    const runtime = ManagedRuntime.make(
      Layer.merge(InMemoryKafka.layer(), PgOffsetStore.layer({ sql, table: offsetsTable, migrate: true }))
    )
    try {
      await sql.unsafe(`create table "${resultsTable}" (group_id text not null, record_offset text not null)`)
      const topic = "ordering-pg"
      const value = new Uint8Array(256).fill(0x61)
      await runtime.runPromise(Effect.gen(function*() {
        yield* InMemoryKafka.createTopic(topic, sizes.partitions)
        yield* InMemoryKafka.produce(
          topic,
          Array.from({ length: records }, (_, i) => ({ key: keyOf(i, sizes.keys), value }))
        )
      }))
      const variants = await compare(plan, [
        {
          id: "partition",
          label: "transactional, partition ordering",
          run: () => runTransactional(runtime, topic, resultsTable, records, "partition", 1, false)
        },
        {
          id: "key",
          label: `transactional, key ordering, concurrency ${sizes.concurrency}`,
          run: () => runTransactional(runtime, topic, resultsTable, records, "key", sizes.concurrency, false)
        },
        {
          id: "partitionInsert",
          label: "transactional, partition ordering, an INSERT per record",
          run: () => runTransactional(runtime, topic, resultsTable, records, "partition", 1, true)
        },
        {
          id: "keyInsert",
          label: `transactional, key ordering, concurrency ${sizes.concurrency}, an INSERT per record`,
          run: () => runTransactional(runtime, topic, resultsTable, records, "key", sizes.concurrency, true)
        }
      ])
      return {
        id: "ordering-postgres",
        title: `9. Per-key concurrency, exactly-once into Postgres: ${records.toLocaleString("en-US")} records, ` +
          `${sizes.keys.toLocaleString("en-US")} keys, ${sizes.partitions} partitions`,
        unit: "records/s",
        warmup: plan.warmup,
        rounds: plan.rounds,
        variants,
        checks: [ratioAtLeast(variants, "key", "partition", 5), ratioInfo(variants, "keyInsert", "partitionInsert")],
        notes: [
          `runEach under CommitPolicy.transactional with PgOffsetStore (a pool of 48 connections), the benchmark's ` +
          `handler (it waits ${HANDLER_MILLIS} ms); in-memory broker. The target is on that handler: its units hold ` +
          "the store's own statements (the position, the finished ranges)",
          "with an INSERT per record: the same handler also inserts the record's result in the unit's transaction " +
          "(reported): the units then hold a statement per record more",
          "partition: a unit per fetched chunk of a partition; key: a unit per few records of waiting keys (up to 32), " +
          "units of a partition side by side"
        ]
      }
    } finally {
      await runtime.dispose()
      await sql.unsafe(`drop table if exists "${offsetsTable}", "${resultsTable}"`).catch(() => undefined)
      await sql.end({ timeout: 5 })
    }
  })
