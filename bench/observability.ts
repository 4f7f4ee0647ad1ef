/**
 * Benchmark 11: what `Observability.layer` costs the consumer. The library's chunk handler that counts, under
 * `commitAfter`, without the layer (the default: nothing recorded), with metrics only, and with metrics, spans (Effect's
 * own tracer, which keeps nothing) and trace context, on the in-memory broker and on the real broker. Every record
 * carries a `traceparent` header, so that the runs with trace context parse one per record and link each chunk's span.
 */
import * as Chunk from "effect/Chunk"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as ManagedRuntime from "effect/ManagedRuntime"
import { Kafka, logLevel, Partitioners } from "kafkajs"
import * as CommitPolicy from "../src/CommitPolicy.js"
import * as Consumer from "../src/Consumer.js"
import type { Driver } from "../src/Driver.js"
import * as InMemoryKafka from "../src/InMemoryKafka.js"
import * as KafkaJs from "../src/KafkaJs.js"
import * as Observability from "../src/Observability.js"
import { Counter, driverLayer, settings } from "./consumers.js"
import { type BenchResult, compare, type Plan, ratioInfo, type Sample, timed } from "./harness.js"

export interface ObservabilitySizes {
  readonly inMemoryRecords: number
  readonly kafkaRecords: number
  readonly partitions: number
}

type Mode = "off" | "metrics" | "all"

let seq = 0
const fresh = (what: string) => `bench-${what}-${process.pid}-${++seq}-${crypto.randomUUID().slice(0, 8)}`

const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
const value = new Uint8Array(256).fill(0x61)

/** The consumer as the mode says: without the layer, or with it. */
const observed = <A, E, R>(mode: Mode, effect: Effect.Effect<A, E, R>) =>
  mode === "off"
    ? effect
    : Effect.provide(effect, Layer.orDie(Observability.layer({ spans: mode === "all", lagInterval: "1 second" })))

/** One run: a fresh group reads the topic to the end with a chunk handler that counts. */
const runOnce = <E>(
  runtime: ManagedRuntime.ManagedRuntime<Driver, E>,
  topic: string,
  records: number,
  mode: Mode
): Promise<Sample> =>
  runtime.runPromise(Effect.gen(function*() {
    const done = yield* Deferred.make<void>()
    const counter = new Counter(records, performance.now(), () => Deferred.unsafeDone(done, Exit.void))
    const consumer = Consumer.run(
      { groupId: fresh("observability"), topics: [topic], sessionTimeout: Duration.millis(settings.sessionTimeoutMs) },
      (chunk) => Effect.sync(() => counter.add(Chunk.size(chunk)))
    ).pipe(Effect.provide(CommitPolicy.commitAfter({ maxBatch: 1000, maxInterval: Duration.seconds(1) })))
    const fiber = yield* Effect.fork(observed(mode, consumer))
    yield* Effect.raceFirst(Deferred.await(done), Fiber.join(fiber))
    yield* Fiber.interrupt(fiber)
    return counter.sample()
  }))

const measure = async <E>(
  plan: Plan,
  runtime: ManagedRuntime.ManagedRuntime<Driver, E>,
  topic: string,
  records: number,
  partitions: number,
  id: string,
  where: string
): Promise<Omit<BenchResult, "elapsedSeconds" | "load">> => {
  const variants = await compare(plan, [
    { id: "off", label: "without Observability.layer", run: () => runOnce(runtime, topic, records, "off") },
    { id: "metrics", label: "metrics only", run: () => runOnce(runtime, topic, records, "metrics") },
    { id: "all", label: "metrics, spans and trace context", run: () => runOnce(runtime, topic, records, "all") }
  ])
  return {
    id,
    title: `11. Observability, ${where}: ${records.toLocaleString("en-US")} records, ${partitions} partitions, ` +
      "chunk handler that counts",
    unit: "records/s",
    warmup: plan.warmup,
    rounds: plan.rounds,
    variants,
    checks: [ratioInfo(variants, "metrics", "off"), ratioInfo(variants, "all", "off")],
    notes: [
      "Consumer.run under commitAfter({ maxBatch: 1000, maxInterval: 1 s }); records/s after the first delivery",
      "spans go to Effect's own tracer (no exporter): the cost of making them, not of exporting them; every record " +
      "has a traceparent header, parsed and linked under trace context"
    ]
  }
}

/** 11a. On the in-memory broker. */
export const observabilityInMemory = (plan: Plan, sizes: ObservabilitySizes): Promise<BenchResult> =>
  timed(async () => {
    plan.log(`11. observability, in-memory broker`)
    const runtime = ManagedRuntime.make(InMemoryKafka.layer())
    try {
      const topic = "observability"
      await runtime.runPromise(Effect.gen(function*() {
        yield* InMemoryKafka.createTopic(topic, sizes.partitions)
        yield* InMemoryKafka.produce(
          topic,
          Array.from({ length: sizes.inMemoryRecords }, (_, i) => ({
            value,
            partition: i % sizes.partitions,
            headers: { traceparent }
          }))
        )
      }))
      return await measure(
        plan,
        runtime,
        topic,
        sizes.inMemoryRecords,
        sizes.partitions,
        "observability-inmemory",
        "in-memory broker"
      )
    } finally {
      await runtime.dispose()
    }
  })

/** 11b. On the real broker. */
export const observabilityKafka = (plan: Plan, brokers: string, sizes: ObservabilitySizes): Promise<BenchResult> =>
  timed(async () => {
    plan.log(`11. observability, real broker`)
    const topic = fresh("observability")
    const runtime = ManagedRuntime.make(Layer.orDie(driverLayer(brokers)))
    const kafka = new Kafka({
      clientId: "bench-observability",
      brokers: brokers.split(","),
      logLevel: logLevel.NOTHING
    })
    try {
      await runtime.runPromise(KafkaJs.createTopic(brokers, topic, sizes.partitions))
      const producer = kafka.producer({
        createPartitioner: Partitioners.DefaultPartitioner,
        allowAutoTopicCreation: false
      })
      await producer.connect()
      try {
        const buffer = Buffer.from(value)
        for (let at = 0; at < sizes.kafkaRecords; at += 5_000) {
          const messages = []
          for (let i = at; i < Math.min(sizes.kafkaRecords, at + 5_000); i++) {
            messages.push({ value: buffer, partition: i % sizes.partitions, headers: { traceparent } })
          }
          await producer.send({ topic, acks: 1, messages })
        }
      } finally {
        await producer.disconnect()
      }
      return await measure(
        plan,
        runtime,
        topic,
        sizes.kafkaRecords,
        sizes.partitions,
        "observability-kafka",
        "real broker"
      )
    } finally {
      await runtime.dispose()
    }
  })
