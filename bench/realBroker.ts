/**
 * Benchmarks 1 and 2: the library against raw kafkajs on a real broker.
 */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import { driverLayer, library, rawKafkajs } from "./consumers.js"
import { type BenchResult, compare, type Plan, ratioAtLeast, ratioInfo, type Sample, timed } from "./harness.js"
import type { Topics } from "./topics.js"

export interface RealBrokerSizes {
  readonly overheadRecords: number
  readonly overheadValueBytes: ReadonlyArray<number>
  readonly realisticRecords: number
  readonly partitions: number
}

/**
 * 1. What the library costs on top of kafkajs when the handler does nothing: records per second, chunk handler
 * against `eachBatch`, per-record handler against `eachMessage`.
 */
export const overhead = (
  plan: Plan,
  brokers: string,
  topics: Topics,
  sizes: RealBrokerSizes,
  valueBytes: number
): Promise<BenchResult> =>
  timed(async () => {
    const topic = await topics.get(sizes.overheadRecords, valueBytes, sizes.partitions)
    const driver = driverLayer(brokers)
    plan.log(`1. consumer overhead, ${topic.records.toLocaleString("en-US")} x ${valueBytes} B`)
    const variants = await compare(plan, [
      {
        id: "a",
        label: "raw kafkajs eachBatch (count, no commits)",
        run: () => rawKafkajs(brokers, topic, "eachBatch", "count", false)
      },
      {
        id: "b",
        label: "raw kafkajs eachMessage (count, no commits)",
        run: () => rawKafkajs(brokers, topic, "eachMessage", "count", false)
      },
      {
        id: "c",
        label: "library run, chunk handler, commitAfter",
        run: () => library(driver, topic, "chunk", "count")
      },
      { id: "d", label: "library runEach, commitAfter", run: () => library(driver, topic, "each", "count") },
      {
        id: "e",
        label: "raw kafkajs eachBatch reading key, value, offset",
        run: () => rawKafkajs(brokers, topic, "eachBatch", "read", false)
      },
      {
        id: "f",
        label: "library run, chunk handler reading key, value, offset",
        run: () => library(driver, topic, "chunk", "read")
      }
    ])
    return {
      id: `overhead-${valueBytes}b`,
      title: `1. Consumer overhead on a real broker: ${
        topic.records.toLocaleString("en-US")
      } records x ${valueBytes} B, ${topic.partitions} partitions`,
      unit: "records/s",
      warmup: plan.warmup,
      rounds: plan.rounds,
      variants,
      checks: [
        ratioAtLeast(variants, "c", "a", 0.95),
        ratioAtLeast(variants, "d", "b", 0.9),
        ratioAtLeast(variants, "f", "e", 0.95),
        ratioAtLeast(variants, "f", "a", 0.9)
      ],
      notes: [
        "records/s after the first delivery (records handled after it / time since it): the group join is excluded; " +
        "the time to the first record and the rate including the join are reported next to it",
        "same fetch settings everywhere: maxWaitTime 100 ms, kafkajs default minBytes/maxBytes/maxBytesPerPartition, " +
        "partitionsConsumedConcurrently 6, sessionTimeout 10 s, heartbeat 3 s; a fresh group per run",
        "library: commitAfter({ maxBatch: 1000, maxInterval: 1 s }), default maxPollRecords (500) and bufferSize",
        "e and f read each record's key and value lengths and its offset, as any real handler reads them; f/e compares " +
        "the library with that baseline, f/a with the count-only one"
      ]
    }
  })

/** `records` timers of 1 ms, one after another in each of `lanes` lanes, as promises or as Effect fibers. */
const timerLanes = async (records: number, lanes: number, style: "promise" | "effect"): Promise<Sample> => {
  const perLane = Math.ceil(records / lanes)
  const started = performance.now()
  if (style === "promise") {
    const sleep = () => new Promise<void>((resolve) => setTimeout(resolve, 1))
    await Promise.all(Array.from({ length: lanes }, async () => {
      for (let i = 0; i < perLane; i++) await sleep()
    }))
  } else {
    const sleep = Effect.sleep(Duration.millis(1))
    const lane = Effect.forEach(Array.from({ length: perLane }), () => sleep, { discard: true })
    await Effect.runPromise(Effect.all(Array.from({ length: lanes }, () => lane), { concurrency: "unbounded" }))
  }
  const millis = performance.now() - started
  return { value: (perLane * lanes) / (millis / 1000), details: { "total ms": millis } }
}

/**
 * 2. Handlers that wait on I/O: every record costs a 1 ms timer. The library runs partitions concurrently; kafkajs
 * gets `partitionsConsumedConcurrently: 6`.
 */
export const realistic = (
  plan: Plan,
  brokers: string,
  topics: Topics,
  sizes: RealBrokerSizes
): Promise<BenchResult> =>
  timed(async () => {
    const topic = await topics.get(sizes.realisticRecords, 256, sizes.partitions)
    const driver = driverLayer(brokers)
    plan.log(`2. realistic handlers (1 ms timer per record), ${topic.records.toLocaleString("en-US")} records`)
    const variants = await compare(plan, [
      {
        id: "raw",
        label: "raw kafkajs eachMessage, 6 concurrent partitions",
        run: () => rawKafkajs(brokers, topic, "eachMessage", "timer1ms", true)
      },
      { id: "lib", label: "library runEach, commitAfter", run: () => library(driver, topic, "each", "timer1ms") },
      // No Kafka at all: the same timers, one lane per partition. What any consumer written with promises (timers)
      // or with Effect fibers (fxTimers) could reach at best on this machine.
      {
        id: "timers",
        label: "no Kafka: await setTimeout(1) per record, 6 lanes",
        run: () => timerLanes(topic.records, topic.partitions, "promise")
      },
      {
        id: "fxTimers",
        label: "no Kafka: Effect.sleep(1 ms) per record, 6 fibers",
        run: () => timerLanes(topic.records, topic.partitions, "effect")
      }
    ])
    return {
      id: "realistic",
      title: `2. Realistic handlers: ${
        topic.records.toLocaleString("en-US")
      } records, 1 ms of timer per record, ${topic.partitions} partitions`,
      unit: "records/s",
      warmup: plan.warmup,
      rounds: plan.rounds,
      variants,
      checks: [
        ratioAtLeast(variants, "lib", "raw", 1),
        ratioInfo(variants, "raw", "timers"),
        ratioInfo(variants, "lib", "fxTimers"),
        ratioInfo(variants, "fxTimers", "timers")
      ],
      notes: [
        `the ideal is ${topic.partitions} partitions x ~900 records/s (one 1 ms timer at a time per partition)`,
        "raw kafkajs keeps its default autoCommit (offsets resolved per message, committed after each batch); " +
        "the library commits after 1,000 records or 1 s"
      ]
    }
  })
