/**
 * Benchmarks 1 and 2: the library against raw kafkajs on a real broker.
 */
import { driverLayer, library, rawKafkajs } from "./consumers.js"
import { type BenchResult, compare, type Plan, ratioAtLeast, timed } from "./harness.js"
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
      { id: "a", label: "raw kafkajs eachBatch (count, no commits)", run: () => rawKafkajs(brokers, topic, "eachBatch", "count", false) },
      { id: "b", label: "raw kafkajs eachMessage (count, no commits)", run: () => rawKafkajs(brokers, topic, "eachMessage", "count", false) },
      { id: "c", label: "library run, chunk handler, commitAfter", run: () => library(driver, topic, "chunk", "count") },
      { id: "d", label: "library runEach, commitAfter", run: () => library(driver, topic, "each", "count") }
    ])
    return {
      id: `overhead-${valueBytes}b`,
      title: `1. Consumer overhead on a real broker: ${topic.records.toLocaleString("en-US")} records x ${valueBytes} B, ${topic.partitions} partitions`,
      unit: "records/s",
      warmup: plan.warmup,
      rounds: plan.rounds,
      variants,
      checks: [ratioAtLeast(variants, "c", "a", 0.95), ratioAtLeast(variants, "d", "b", 0.9)],
      notes: [
        "records/s after the first delivery (records handled after it / time since it): the group join is excluded; " +
        "the time to the first record and the rate including the join are reported next to it",
        "same fetch settings everywhere: maxWaitTime 100 ms, kafkajs default minBytes/maxBytes/maxBytesPerPartition, " +
        "partitionsConsumedConcurrently 6, sessionTimeout 10 s, heartbeat 3 s; a fresh group per run",
        "library: commitAfter({ maxBatch: 1000, maxInterval: 1 s }), default maxPollRecords (500) and bufferSize"
      ]
    }
  })

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
      { id: "lib", label: "library runEach, commitAfter", run: () => library(driver, topic, "each", "timer1ms") }
    ])
    return {
      id: "realistic",
      title: `2. Realistic handlers: ${topic.records.toLocaleString("en-US")} records, 1 ms of timer per record, ${topic.partitions} partitions`,
      unit: "records/s",
      warmup: plan.warmup,
      rounds: plan.rounds,
      variants,
      checks: [ratioAtLeast(variants, "lib", "raw", 1)],
      notes: [
        `the ideal is ${topic.partitions} partitions x ~900 records/s (one 1 ms timer at a time per partition)`,
        "raw kafkajs keeps its default autoCommit (offsets resolved per message, committed after each batch); " +
        "the library commits after 1,000 records or 1 s"
      ]
    }
  })
