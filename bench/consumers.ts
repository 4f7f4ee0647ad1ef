/**
 * The consumers the real-broker benchmarks compare: raw kafkajs (eachBatch, eachMessage) and this library (chunk
 * handler, per-record handler), all with the same fetch settings, each in a fresh group reading a pre-produced topic
 * from the beginning until it has seen every record.
 */
import * as Chunk from "effect/Chunk"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import { Kafka, logLevel } from "kafkajs"
import * as CommitPolicy from "../src/CommitPolicy.js"
import * as Consumer from "../src/Consumer.js"
import type { Driver } from "../src/Driver.js"
import * as KafkaJs from "../src/KafkaJs.js"
import type { Sample } from "./harness.js"
import type { BenchTopic } from "./topics.js"

/** Fetch and group settings every variant uses, raw or not. */
export const settings = {
  maxWaitTimeInMs: 100,
  sessionTimeoutMs: 10_000,
  heartbeatIntervalMs: 3_000,
  partitionsConsumedConcurrently: 6
} as const

/** What a handler costs per record. */
export type Work = "count" | "read" | "timer1ms"

/**
 * What "read" handlers add up from each record (its key's and value's lengths and its offset), kept where the
 * optimizer cannot see that nobody looks at it.
 */
export const readings = { bytes: 0, offset: 0n }

const sleep = (millis: number) => new Promise<void>((resolve) => setTimeout(resolve, millis))

let groupSeq = 0
const freshGroup = (variant: string) => `bench-${variant}-${process.pid}-${++groupSeq}-${crypto.randomUUID()}`

/** Counts handled records and notes when the first and the last arrived. */
export class Counter {
  count = 0
  /** Records of the first delivery (a batch, a chunk or one record), which arrive all at the first instant. */
  firstCount = 0
  first = 0
  last = 0
  constructor(readonly total: number, readonly started: number, readonly onDone: () => void) {}
  add(n: number): void {
    if (this.count === 0) {
      this.first = performance.now()
      this.firstCount = n
    }
    this.count += n
    if (this.count >= this.total && this.last === 0) {
      this.last = performance.now()
      this.onDone()
    }
  }
  /**
   * The steady rate: records handled after the first delivery, per second since it. The group join, which every
   * variant pays alike, is left out; the time to the first record and the rate from the start are reported next
   * to it.
   */
  sample(): Sample {
    const steady = (this.count - this.firstCount) / ((this.last - this.first) / 1000)
    return {
      value: steady,
      details: {
        "to 1st rec ms": this.first - this.started,
        "total ms": this.last - this.started,
        "rec/s incl. join": this.count / ((this.last - this.started) / 1000)
      }
    }
  }
}

/** Raw kafkajs, `eachBatch` or `eachMessage`. `autoCommit` is off for the overhead runs: nothing is committed. */
export const rawKafkajs = async (
  brokers: string,
  topic: BenchTopic,
  mode: "eachBatch" | "eachMessage",
  work: Work,
  autoCommit: boolean
): Promise<Sample> => {
  const kafka = new Kafka({ clientId: "bench-raw", brokers: brokers.split(","), logLevel: logLevel.NOTHING })
  const consumer = kafka.consumer({
    groupId: freshGroup(`raw-${mode}`),
    maxWaitTimeInMs: settings.maxWaitTimeInMs,
    sessionTimeout: settings.sessionTimeoutMs,
    heartbeatInterval: settings.heartbeatIntervalMs,
    allowAutoTopicCreation: false
  })
  let finish: () => void = () => {}
  const done = new Promise<void>((resolve) => {
    finish = resolve
  })
  let failed: ((error: unknown) => void) | undefined
  const crashed = new Promise<never>((_, reject) => {
    failed = reject
  })
  consumer.on(consumer.events.CRASH, (event) => failed?.(event.payload.error))
  const started = performance.now()
  const counter = new Counter(topic.records, started, finish)
  try {
    await consumer.connect()
    await consumer.subscribe({ topics: [topic.name], fromBeginning: true })
    await consumer.run(
      mode === "eachBatch"
        ? {
          autoCommit,
          partitionsConsumedConcurrently: settings.partitionsConsumedConcurrently,
          eachBatch: async ({ batch }) => {
            if (work === "timer1ms") {
              for (let i = 0; i < batch.messages.length; i++) await sleep(1)
            } else if (work === "read") {
              const messages = batch.messages
              for (let i = 0; i < messages.length; i++) {
                const message = messages[i]!
                readings.bytes += (message.key?.length ?? 0) + (message.value?.length ?? 0)
                readings.offset = BigInt(message.offset)
              }
            }
            counter.add(batch.messages.length)
          }
        }
        : {
          autoCommit,
          partitionsConsumedConcurrently: settings.partitionsConsumedConcurrently,
          eachMessage: async () => {
            if (work === "timer1ms") await sleep(1)
            counter.add(1)
          }
        }
    )
    await Promise.race([done, crashed])
    return counter.sample()
  } finally {
    await consumer.disconnect()
  }
}

/** The library's driver with the same fetch settings as the raw variants. */
export const driverLayer = (brokers: string) =>
  KafkaJs.layer({
    brokers: brokers.split(","),
    clientId: "bench-lib",
    maxWaitTime: settings.maxWaitTimeInMs,
    heartbeatInterval: settings.heartbeatIntervalMs,
    partitionsConsumedConcurrently: settings.partitionsConsumedConcurrently,
    logLevel: "nothing"
  })

/** The policy every library variant uses: commit after every 1,000 handled records or every second. */
export const policyLayer = CommitPolicy.commitAfter({ maxBatch: 1000, maxInterval: Duration.seconds(1) })

export interface LibraryOptions {
  readonly maxPollRecords?: number | undefined
  readonly bufferSize?: number | undefined
  /** `commitAfter.maxBatch`; 1,000 unless given (profiling only). */
  readonly commitEvery?: number | undefined
  /** Another policy in place of `commitAfter` (profiling only). */
  readonly policy?: Layer.Layer<CommitPolicy.CommitPolicy> | undefined
}

/**
 * This library: `Consumer.run` with a chunk handler, or `Consumer.runEach` with a handler per record. Stops the
 * consumer (a clean revoke with a final commit) once every record was handled, outside the measured time.
 */
export const library = (
  driver: Layer.Layer<Driver, unknown>,
  topic: BenchTopic,
  handler: "chunk" | "each",
  work: Work,
  options: LibraryOptions = {}
): Promise<Sample> =>
  Effect.runPromise(
    Effect.gen(function*() {
      const done = yield* Deferred.make<void>()
      const started = performance.now()
      const counter = new Counter(topic.records, started, () => Deferred.unsafeDone(done, Exit.void))
      const config: Omit<Consumer.Config, "onFailure"> = {
        groupId: freshGroup(`lib-${handler}`),
        topics: [topic.name],
        sessionTimeout: Duration.millis(settings.sessionTimeoutMs),
        ...(options.maxPollRecords === undefined ? {} : { maxPollRecords: options.maxPollRecords }),
        ...(options.bufferSize === undefined ? {} : { bufferSize: options.bufferSize })
      }
      const timer = Effect.sleep(Duration.millis(1))
      const consumer = handler === "chunk"
        ? Consumer.run(config, (records) =>
          work === "count"
            ? Effect.sync(() => counter.add(Chunk.size(records)))
            : work === "read"
            ? Effect.sync(() => {
              for (const record of records) {
                readings.bytes += (record.key?.length ?? 0) + (record.value?.length ?? 0)
                readings.offset = record.offset
              }
              counter.add(Chunk.size(records))
            })
            : Effect.forEach(records, () => Effect.zipRight(timer, Effect.sync(() => counter.add(1))), {
              discard: true
            }))
        : Consumer.runEach(config, (record) =>
          work === "count"
            ? Effect.sync(() => counter.add(1))
            : work === "read"
            ? Effect.sync(() => {
              readings.bytes += (record.key?.length ?? 0) + (record.value?.length ?? 0)
              readings.offset = record.offset
              counter.add(1)
            })
            : Effect.zipRight(timer, Effect.sync(() => counter.add(1))))
      const policy = options.policy !== undefined
        ? options.policy
        : options.commitEvery === undefined
        ? policyLayer
        : CommitPolicy.commitAfter({ maxBatch: options.commitEvery, maxInterval: Duration.seconds(1) })
      const fiber = yield* consumer.pipe(Effect.provide(Layer.merge(driver, policy)), Effect.fork)
      yield* Effect.raceFirst(Deferred.await(done), Fiber.join(fiber))
      yield* Fiber.interrupt(fiber)
      return counter.sample()
    })
  )
