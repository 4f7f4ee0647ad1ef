/**
 * Benchmark 12: the driver on @platformatic/kafka against the raw client doing the same work, and each driver of the
 * library against the other on the same broker, for the consumer and for the producer.
 */
import { Consumer as RawConsumer, Producer as RawProducer } from "@platformatic/kafka"
import * as Platformatic from "../src/Platformatic.js"
import { Counter, driverLayer, library, rawKafkajs, settings } from "./consumers.js"
import {
  type BenchResult,
  compare,
  pairedRatioAtLeast,
  pairedRatioInfo,
  type Plan,
  ratioAtLeast,
  ratioInfo,
  type Sample,
  timed
} from "./harness.js"
import {
  createTopic,
  deleteTopics,
  libraryThroughput,
  rate,
  rawThroughput,
  SLICE,
  type ThroughputRun
} from "./producer.js"
import type { BenchTopic, Topics } from "./topics.js"

export interface DriverSizes {
  readonly consumerRecords: number
  readonly producerRecords: number
  readonly partitions: number
}

let groupSeq = 0

/** Raw @platformatic/kafka: its messages stream from the earliest offset, no commits, counting the messages. */
const rawPlatformatic = async (brokers: string, topic: BenchTopic): Promise<Sample> => {
  const consumer = new RawConsumer({
    clientId: "bench-raw-platformatic",
    bootstrapBrokers: brokers.split(","),
    groupId: `bench-raw-platformatic-${process.pid}-${++groupSeq}-${crypto.randomUUID()}`,
    maxWaitTime: settings.maxWaitTimeInMs,
    sessionTimeout: settings.sessionTimeoutMs,
    heartbeatInterval: settings.heartbeatIntervalMs,
    autocreateTopics: false
  })
  const started = performance.now()
  let finish: () => void = () => {}
  const done = new Promise<void>((resolve) => {
    finish = resolve
  })
  const counter = new Counter(topic.records, started, finish)
  try {
    const stream = await consumer.consume({ topics: [topic.name], mode: "earliest", autocommit: false })
    stream.on("data", () => counter.add(1))
    const failed = new Promise<never>((_, reject) => stream.on("error", reject))
    await Promise.race([done, failed])
    await stream.close()
    return counter.sample()
  } finally {
    await consumer.close(true)
  }
}

/** Raw @platformatic/kafka: `send` of SLICE records at a time, one in flight, explicit partitions. */
const rawPlatformaticThroughput = async (
  { brokers, durability, partitions, records, topic, valueBytes }: ThroughputRun
): Promise<Sample> => {
  const idempotent = durability === "idempotent"
  const producer = new RawProducer({
    clientId: "bench-raw-platformatic",
    bootstrapBrokers: brokers.split(","),
    idempotent,
    acks: idempotent ? -1 : 1,
    autocreateTopics: false
  })
  try {
    await producer.listApis()
    const value = Buffer.alloc(valueBytes, 0x61)
    const started = performance.now()
    for (let at = 0; at < records; at += SLICE) {
      const messages = []
      for (let i = at; i < Math.min(records, at + SLICE); i++) {
        messages.push({ topic, partition: i % partitions, value })
      }
      await producer.send({ messages, acks: idempotent ? -1 : 1, idempotent })
    }
    return rate(records, started)
  } finally {
    await producer.close()
  }
}

/** The consumer: each client raw, and the library's chunk handler on each driver. */
export const driversConsumer = (
  plan: Plan,
  brokers: string,
  topics: Topics,
  sizes: DriverSizes
): Promise<BenchResult> =>
  timed(async () => {
    const topic = await topics.get(sizes.consumerRecords, 256, sizes.partitions)
    const platformatic = Platformatic.layer({
      brokers: brokers.split(","),
      clientId: "bench-lib-platformatic",
      maxWaitTime: settings.maxWaitTimeInMs,
      heartbeatInterval: settings.heartbeatIntervalMs
    })
    plan.log(`12. drivers, consumer, ${topic.records.toLocaleString("en-US")} x 256 B`)
    const variants = await compare(plan, [
      {
        id: "rawP",
        label: "raw @platformatic/kafka stream (count, no commits)",
        run: () => rawPlatformatic(brokers, topic)
      },
      {
        id: "libP",
        label: "library run on Platformatic, chunk handler, commitAfter",
        run: () => library(platformatic, topic, "chunk", "count")
      },
      {
        id: "rawK",
        label: "raw kafkajs eachBatch (count, no commits)",
        run: () => rawKafkajs(brokers, topic, "eachBatch", "count", false)
      },
      {
        id: "libK",
        label: "library run on KafkaJs, chunk handler, commitAfter",
        run: () => library(driverLayer(brokers), topic, "chunk", "count")
      }
    ])
    return {
      id: "drivers-consumer",
      title: `12. Drivers, consumer: ${
        topic.records.toLocaleString("en-US")
      } records x 256 B, ${topic.partitions} partitions`,
      unit: "records/s",
      warmup: plan.warmup,
      rounds: plan.rounds,
      variants,
      checks: [
        ratioAtLeast(variants, "libP", "rawP", 0.9),
        pairedRatioInfo(variants, "libP", "rawP"),
        ratioInfo(variants, "libP", "libK"),
        ratioInfo(variants, "rawP", "rawK")
      ],
      notes: [
        "records/s after the first delivery, the group join excluded; a fresh group per run, reading from the start",
        "the same maxWaitTime (100 ms) on every side; the raw @platformatic/kafka stream counts each message it emits",
        "libP/libK is the library on one driver against the other; rawP/rawK the two clients alone"
      ]
    }
  })

/** The producer: each client raw, and the library's `sendAll` on each driver, acks all and idempotent. */
export const driversProducer = (plan: Plan, brokers: string, sizes: DriverSizes): Promise<BenchResult> =>
  timed(async () => {
    const topic = await createTopic(brokers, sizes.partitions)
    try {
      const n = sizes.producerRecords
      plan.log(`12. drivers, producer, ${n.toLocaleString("en-US")} x 256 B`)
      const spec: ThroughputRun = {
        brokers,
        topic,
        records: n,
        valueBytes: 256,
        partitions: sizes.partitions,
        durability: "idempotent"
      }
      const throughputPlan = { ...plan, rounds: plan.rounds * 3 }
      const variants = await compare(throughputPlan, [
        {
          id: "rawP",
          label: "raw @platformatic/kafka send, acks all, idempotent",
          run: () => rawPlatformaticThroughput(spec)
        },
        {
          id: "libP",
          label: "library sendAll on Platformatic, acks all, idempotent",
          run: () => libraryThroughput(spec, "platformatic")
        },
        { id: "rawK", label: "raw kafkajs sendBatch, acks all, idempotent", run: () => rawThroughput(spec) },
        {
          id: "libK",
          label: "library sendAll on KafkaJs, acks all, idempotent",
          run: () => libraryThroughput(spec, "kafkajs")
        }
      ])
      return {
        id: "drivers-producer",
        title: `12. Drivers, producer: ${n.toLocaleString("en-US")} records x 256 B, ${sizes.partitions} partitions`,
        unit: "records/s",
        warmup: throughputPlan.warmup,
        rounds: throughputPlan.rounds,
        variants,
        checks: [
          pairedRatioAtLeast(variants, "libP", "rawP", 0.95),
          ratioInfo(variants, "libP", "libK"),
          ratioInfo(variants, "rawP", "rawK")
        ],
        notes: [
          `every side sends ${SLICE.toLocaleString("en-US")} records at a time, one send in flight, explicit ` +
          "partitions (round robin), no compression, the same Buffer as value; a fresh producer per run",
          "the target is on the median of the round-by-round ratios, over 3x the rounds of the other benchmarks"
        ]
      }
    } finally {
      await deleteTopics(brokers, [topic])
    }
  })
