/**
 * Benchmarks 6 to 8: the producer against raw kafkajs on a real broker, and consume-transform-produce exactly once
 * against a hand-written kafkajs transactional loop.
 */
import * as Chunk from "effect/Chunk"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { CompressionTypes, Kafka, logLevel, type Message } from "kafkajs"
import * as CommitPolicy from "../src/CommitPolicy.js"
import * as Consumer from "../src/Consumer.js"
import * as KafkaJs from "../src/KafkaJs.js"
import * as Platformatic from "../src/Platformatic.js"
import type { ProduceFailed } from "../src/KafkaError.js"
import * as Producer from "../src/Producer.js"
import { settings } from "./consumers.js"
import {
  type BenchResult,
  compare,
  pairedRatioAtLeast,
  type Plan,
  ratioAtLeast,
  ratioInfo,
  type Sample,
  timed
} from "./harness.js"
import { createTopics } from "./topics.js"

export interface ProducerSizes {
  /** Records per run of the throughput benchmark, per value size. */
  readonly throughputRecords: number
  readonly valueBytes: ReadonlyArray<number>
  /** Records per run of the many-fibers benchmark. */
  readonly fiberRecords: number
  /** Input records per run of the consume-transform-produce benchmark. */
  readonly pipelineRecords: number
  readonly partitions: number
}

let seq = 0
const fresh = (what: string) => `bench-${what}-${process.pid}-${++seq}-${crypto.randomUUID().slice(0, 8)}`

const kafkaOf = (brokers: string) =>
  new Kafka({ clientId: "bench-producer", brokers: brokers.split(","), logLevel: logLevel.NOTHING })

export const createTopic = async (brokers: string, partitions: number): Promise<string> => {
  const topic = fresh("out")
  await createTopics(brokers, [topic], partitions)
  return topic
}

export const deleteTopics = async (brokers: string, topics: ReadonlyArray<string>) => {
  const admin = kafkaOf(brokers).admin()
  await admin.connect()
  await admin.deleteTopics({ topics: [...topics] }).catch(() => undefined)
  await admin.disconnect()
}

/** Both sides send in slices of this many records, so that they batch alike. */
export const SLICE = 1_000

export type Durability = "acks1" | "idempotent"

export interface ThroughputRun {
  readonly brokers: string
  readonly topic: string
  readonly records: number
  readonly valueBytes: number
  readonly partitions: number
  readonly durability: Durability
}

/** `records` per second since `started`, with the elapsed time. */
export const rate = (records: number, started: number): Sample => {
  const millis = performance.now() - started
  return { value: records / (millis / 1000), details: { "total ms": millis } }
}

/** Raw kafkajs: `sendBatch` of SLICE records at a time, one in flight, explicit partitions. */
export const rawThroughput = async (
  { brokers, durability, partitions, records, topic, valueBytes }: ThroughputRun
): Promise<Sample> => {
  const producer = kafkaOf(brokers).producer({
    idempotent: durability === "idempotent",
    maxInFlightRequests: 1,
    allowAutoTopicCreation: false
  })
  await producer.connect()
  try {
    const value = Buffer.alloc(valueBytes, 0x61)
    const started = performance.now()
    for (let at = 0; at < records; at += SLICE) {
      const messages: Array<Message> = []
      for (let i = at; i < Math.min(records, at + SLICE); i++) messages.push({ partition: i % partitions, value })
      await producer.sendBatch({
        topicMessages: [{ topic, messages }],
        acks: durability === "idempotent" ? -1 : 1,
        compression: CompressionTypes.None
      })
    }
    return rate(records, started)
  } finally {
    await producer.disconnect()
  }
}

/** The library: `sendAll` of SLICE records at a time, linger 0 (a slice is a batch as it is), on either driver. */
export const libraryThroughput = (
  { brokers, durability, partitions, records, topic, valueBytes }: ThroughputRun,
  driver: "kafkajs" | "platformatic" = "kafkajs"
): Promise<Sample> =>
  Effect.runPromise(
    Effect.gen(function*() {
      const value = Buffer.alloc(valueBytes, 0x61)
      const started = performance.now()
      for (let at = 0; at < records; at += SLICE) {
        const slice: Array<Producer.ProducerRecord> = []
        for (let i = at; i < Math.min(records, at + SLICE); i++) slice.push({ topic, partition: i % partitions, value })
        yield* Producer.sendAll(slice)
      }
      return rate(records, started)
    }).pipe(
      Effect.provide(
        driver === "platformatic"
          ? Platformatic.layerProducer({
            brokers: brokers.split(","),
            linger: 0,
            batchSize: 4 * 1024 * 1024,
            ...(durability === "idempotent" ? { acks: "all", idempotent: true } : { acks: 1, idempotent: false })
          })
          : KafkaJs.layerProducer({
            brokers: brokers.split(","),
            logLevel: "nothing",
            linger: 0,
            batchSize: 4 * 1024 * 1024,
            ...(durability === "idempotent" ? { acks: "all", idempotent: true } : { acks: 1, idempotent: false })
          })
      ),
      Effect.scoped
    )
  )

/**
 * Benchmark 6 runs this many times the rounds of the others: a run's rate moves by up to a quarter from one run to the
 * next on a small machine (the broker shares it), and its target is on the median of 20 round-by-round ratios.
 */
const THROUGHPUT_ROUNDS = 4

/**
 * 6. Producer throughput: records/s written with sends of 1,000 records, at acks 1 and at acks all with idempotence,
 * the library against raw kafkajs `sendBatch`.
 */
export const producerThroughput = (
  plan: Plan,
  brokers: string,
  sizes: ProducerSizes,
  valueBytes: number
): Promise<BenchResult> =>
  timed(async () => {
    const topic = await createTopic(brokers, sizes.partitions)
    try {
      const n = sizes.throughputRecords
      const throughputPlan = { ...plan, rounds: plan.rounds * THROUGHPUT_ROUNDS }
      plan.log(`6. producer throughput, ${n.toLocaleString("en-US")} x ${valueBytes} B`)
      const run = (side: "raw" | "lib", durability: Durability) => () => {
        const spec = { brokers, topic, records: n, valueBytes, partitions: sizes.partitions, durability }
        return side === "raw" ? rawThroughput(spec) : libraryThroughput(spec)
      }
      const variants = await compare(throughputPlan, [
        { id: "raw1", label: "raw kafkajs sendBatch, acks 1", run: run("raw", "acks1") },
        { id: "lib1", label: "library sendAll, acks 1", run: run("lib", "acks1") },
        { id: "rawAll", label: "raw kafkajs sendBatch, acks all, idempotent", run: run("raw", "idempotent") },
        { id: "libAll", label: "library sendAll, acks all, idempotent", run: run("lib", "idempotent") }
      ])
      return {
        id: `producer-${valueBytes}b`,
        title: `6. Producer throughput on a real broker: ${n.toLocaleString("en-US")} records x ${valueBytes} B, ` +
          `${sizes.partitions} partitions`,
        unit: "records/s",
        warmup: throughputPlan.warmup,
        rounds: throughputPlan.rounds,
        variants,
        checks: [
          pairedRatioAtLeast(variants, "lib1", "raw1", 0.95),
          pairedRatioAtLeast(variants, "libAll", "rawAll", 0.95),
          ratioInfo(variants, "lib1", "raw1"),
          ratioInfo(variants, "libAll", "rawAll")
        ],
        notes: [
          `both send ${SLICE.toLocaleString("en-US")} records at a time, one send in flight, explicit partitions ` +
          "(round robin), no compression, the same Buffer as value; a fresh producer per run, connect excluded",
          `${THROUGHPUT_ROUNDS}x the rounds of the other benchmarks, and the target on the median of the round-by-round ` +
          "ratios (each round runs every variant, in alternating order): a run's rate moves by up to a quarter from run " +
          "to run here, by more than the gap the target is about, and the drift is common to the runs of a round"
        ]
      }
    } finally {
      await deleteTopics(brokers, [topic])
    }
  })

/**
 * 7. Many fibers, one record each: every record is its own `send` from its own fiber (or promise), all at once, as
 * request handlers of an application would; the library merges them within its linger, kafkajs sends each alone.
 * The senders exist before the clock starts and are released together.
 */
export const manyFibers = (plan: Plan, brokers: string, sizes: ProducerSizes): Promise<BenchResult> =>
  timed(async () => {
    const topic = await createTopic(brokers, sizes.partitions)
    try {
      const n = sizes.fiberRecords
      plan.log(`7. many fibers, one record each, ${n.toLocaleString("en-US")} records`)
      // Both sides start their n senders (fibers, promises) before the clock starts, as an application's request
      // handlers exist before they send, and release them all at once: what is timed is the sends, not the forks.
      const raw = async (): Promise<Sample> => {
        const producer = kafkaOf(brokers).producer({
          idempotent: true,
          maxInFlightRequests: 1,
          allowAutoTopicCreation: false
        })
        await producer.connect()
        try {
          const value = Buffer.alloc(256, 0x61)
          let release = () => {}
          const gate = new Promise<void>((resolve) => (release = resolve))
          const senders = Array.from({ length: n }, async (_, i) => {
            await gate
            await producer.send({ topic, acks: -1, messages: [{ partition: i % sizes.partitions, value }] })
          })
          const started = performance.now()
          release()
          await Promise.all(senders)
          return rate(n, started)
        } finally {
          await producer.disconnect()
        }
      }
      const lib = (): Promise<Sample> =>
        Effect.runPromise(
          Effect.gen(function*() {
            const value = Buffer.alloc(256, 0x61)
            const gate = yield* Deferred.make<void>()
            const finished = yield* Deferred.make<void, ProduceFailed>()
            let answered = 0
            for (let i = 0; i < n; i++) {
              yield* Deferred.await(gate).pipe(
                Effect.zipRight(Producer.send({ topic, partition: i % sizes.partitions, value })),
                Effect.matchCauseEffect({
                  onFailure: (cause) => Deferred.failCause(finished, cause),
                  onSuccess: () => ++answered === n ? Deferred.succeed(finished, undefined) : Effect.void
                }),
                Effect.forkScoped
              )
            }
            const started = performance.now()
            yield* Deferred.succeed(gate, undefined)
            yield* Deferred.await(finished)
            return rate(n, started)
          }).pipe(
            Effect.provide(KafkaJs.layerProducer({ brokers: brokers.split(","), logLevel: "nothing" })),
            Effect.scoped
          )
        )
      const variants = await compare(plan, [
        { id: "raw", label: "raw kafkajs: one send per record, all awaited at once (idempotent, acks all)", run: raw },
        {
          id: "lib",
          label: "library: one Producer.send per fiber, all at once (defaults: idempotent, linger 5 ms)",
          run: lib
        }
      ])
      return {
        id: "producer-fibers",
        title: `7. Many fibers, one record each: ${
          n.toLocaleString("en-US")
        } records x 256 B, ${sizes.partitions} partitions`,
        unit: "records/s",
        warmup: plan.warmup,
        rounds: plan.rounds,
        variants,
        checks: [ratioAtLeast(variants, "lib", "raw", 5)],
        notes: [
          "kafkajs has no linger: each send is a request of its own, one in flight per broker when idempotent",
          `both sides start their ${n.toLocaleString("en-US")} senders (fibers, promises) before the clock starts ` +
          "and release them at once: timed from the release until every send is answered"
        ]
      }
    } finally {
      await deleteTopics(brokers, [topic])
    }
  })

/** Fills an input topic for the pipeline benchmark. */
const fillInput = async (brokers: string, records: number, partitions: number): Promise<string> => {
  const topic = await createTopic(brokers, partitions)
  const producer = kafkaOf(brokers).producer({ allowAutoTopicCreation: false })
  await producer.connect()
  try {
    const value = Buffer.alloc(256, 0x61)
    for (let at = 0; at < records; at += 5_000) {
      const messages: Array<Message> = []
      for (let i = at; i < Math.min(records, at + 5_000); i++) messages.push({ partition: i % partitions, value })
      await producer.send({ topic, acks: 1, messages })
    }
  } finally {
    await producer.disconnect()
  }
  return topic
}

/**
 * The hand-written kafkajs pipeline: a consumer's `eachBatch` sends the batch's records to the output and the batch's
 * position in one transaction of one transactional producer, then commits it.
 */
const rawPipeline = async (brokers: string, input: string, output: string, records: number): Promise<Sample> => {
  const kafka = kafkaOf(brokers)
  const group = fresh("raw-pipeline")
  const producer = kafka.producer({
    transactionalId: `${group}-tx`,
    idempotent: true,
    maxInFlightRequests: 1,
    allowAutoTopicCreation: false
  })
  const consumer = kafka.consumer({
    groupId: group,
    maxWaitTimeInMs: settings.maxWaitTimeInMs,
    sessionTimeout: settings.sessionTimeoutMs,
    heartbeatInterval: settings.heartbeatIntervalMs,
    readUncommitted: false
  })
  await producer.connect()
  await consumer.connect()
  try {
    await consumer.subscribe({ topics: [input], fromBeginning: true })
    let count = 0
    const done = new Promise<void>((resolve, reject) => {
      void consumer.run({
        autoCommit: false,
        eachBatch: async ({ batch }) => {
          const txn = await producer.transaction()
          try {
            await txn.send({
              topic: output,
              messages: batch.messages.map((m) => ({ partition: batch.partition, value: m.value }))
            })
            await txn.sendOffsets({
              consumerGroupId: group,
              topics: [{
                topic: batch.topic,
                partitions: [{ partition: batch.partition, offset: String(Number(batch.lastOffset()) + 1) }]
              }]
            })
            await txn.commit()
          } catch (error) {
            await txn.abort()
            reject(error)
            return
          }
          count += batch.messages.length
          if (count >= records) resolve()
        }
      }).catch(reject)
    })
    const started = performance.now()
    await done
    return rate(records, started)
  } finally {
    await consumer.disconnect()
    await producer.disconnect()
  }
}

/** The library's pipeline: `kafkaTransactional`, the handler sending each chunk's records to the output. */
const libraryPipeline = (brokers: string, input: string, output: string, records: number): Promise<Sample> =>
  Effect.runPromise(Effect.gen(function*() {
    const done = yield* Deferred.make<void>()
    let count = 0
    const started = performance.now()
    // Chunks as large as kafkajs's fetched batches (up to a megabyte of records per partition), so that both sides
    // commit transactions of the same size.
    yield* Consumer.run(
      { groupId: fresh("lib-pipeline"), topics: [input], maxPollRecords: 5_000 },
      (chunk) =>
        Effect.gen(function*() {
          yield* Producer.sendAll(Chunk.map(chunk, (r) => ({ topic: output, partition: r.partition, value: r.value })))
          count += Chunk.size(chunk)
          if (count >= records) yield* Deferred.succeed(done, undefined)
        })
    ).pipe(
      Effect.raceFirst(Deferred.await(done)),
      Effect.provide(
        CommitPolicy.kafkaTransactional().pipe(
          Layer.provide(
            KafkaJs.layerTransactionalProducers({ brokers: brokers.split(","), logLevel: "nothing", linger: 0 })
          )
        )
      ),
      Effect.provide(KafkaJs.layer({
        brokers: brokers.split(","),
        logLevel: "nothing",
        maxWaitTime: settings.maxWaitTimeInMs,
        partitionsConsumedConcurrently: settings.partitionsConsumedConcurrently
      }))
    )
    return rate(records, started)
  }))

/**
 * 8. Consume, transform, produce exactly once: the `kafkaTransactional` policy (a transactional producer per input
 * partition, partitions in parallel) against a hand-written kafkajs loop (one transaction per fetched batch).
 */
export const pipeline = (plan: Plan, brokers: string, sizes: ProducerSizes): Promise<BenchResult> =>
  timed(async () => {
    const n = sizes.pipelineRecords
    const input = await fillInput(brokers, n, sizes.partitions)
    const outputs: Array<string> = []
    const output = async () => {
      const topic = await createTopic(brokers, sizes.partitions)
      outputs.push(topic)
      return topic
    }
    try {
      plan.log(`8. consume-transform-produce exactly once, ${n.toLocaleString("en-US")} records`)
      const variants = await compare(plan, [
        {
          id: "raw",
          label: "hand-written kafkajs loop: a transaction per eachBatch",
          run: async () => rawPipeline(brokers, input, await output(), n)
        },
        {
          id: "lib",
          label: "library: kafkaTransactional, sendAll per chunk, maxPollRecords 5,000",
          run: async () => libraryPipeline(brokers, input, await output(), n)
        }
      ])
      return {
        id: "pipeline",
        title: `8. Consume-transform-produce exactly once: ${
          n.toLocaleString("en-US")
        } records x 256 B, ${sizes.partitions} partitions`,
        unit: "records/s",
        warmup: plan.warmup,
        rounds: plan.rounds,
        variants,
        checks: [ratioAtLeast(variants, "lib", "raw", 0.9)],
        notes: [
          "time from subscribing until the last input record's transaction committed, group join included on both sides",
          "the raw loop sends each batch's records and position in one transaction of one producer, as kafkajs's " +
          "documentation shows; the library uses a producer per input partition (zombie fencing: 6 InitProducerId " +
          "at the start) and chunks of up to 5,000 records (maxPollRecords), as large as kafkajs's batches"
        ]
      }
    } finally {
      await deleteTopics(brokers, [input, ...outputs])
    }
  })
