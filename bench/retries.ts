/**
 * Benchmark 10: retry topics keep the main partition flowing. `runEach` under `commitAfter` with
 * `FailureRoute.retryTopics(["1 second"], ...)`: a run where 5% of the records fail once (they go to the retry topic
 * and are handled from there a second later) against a run where none fails, same records, same settings. The figure
 * is the main topic's rate: its records handed to the handler per second, whatever became of them.
 */
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as ManagedRuntime from "effect/ManagedRuntime"
import * as Schedule from "effect/Schedule"
import { Kafka, logLevel, Partitioners } from "kafkajs"
import * as CommitPolicy from "../src/CommitPolicy.js"
import * as Consumer from "../src/Consumer.js"
import type { Driver } from "../src/Driver.js"
import * as FailureRoute from "../src/FailureRoute.js"
import * as InMemoryKafka from "../src/InMemoryKafka.js"
import * as KafkaJs from "../src/KafkaJs.js"
import type { Producer } from "../src/Producer.js"
import { Counter, driverLayer, settings } from "./consumers.js"
import { type BenchResult, compare, type Plan, ratioAtLeast, type Sample, timed } from "./harness.js"

export interface RetrySizes {
  readonly records: number
  readonly partitions: number
}

const FAILING = 0.05
const DELAY = "1 second"

let seq = 0
const fresh = (what: string) => `bench-${what}-${process.pid}-${++seq}-${crypto.randomUUID().slice(0, 8)}`

/** Every twentieth record is marked to fail (on the main topic only). */
const valueOf = (i: number) => (i % Math.round(1 / FAILING) === 7 ? "fail-" : "ok-") + String(i).padStart(250, "0")

class Refused {
  readonly _tag = "Refused"
}

/** One run: a fresh group reads the topic; `failing` says whether the marked records fail on the main topic. */
const runOnce = <E>(
  runtime: ManagedRuntime.ManagedRuntime<Driver | Producer, E>,
  topic: string,
  records: number,
  failing: boolean
): Promise<Sample> =>
  runtime.runPromise(Effect.gen(function*() {
    const done = yield* Deferred.make<void>()
    const counter = new Counter(records, performance.now(), () => Deferred.unsafeDone(done, Exit.void))
    const decoder = new TextDecoder()
    const fiber = yield* Consumer.runEach(
      {
        groupId: fresh("retries"),
        topics: [topic],
        sessionTimeout: Duration.millis(settings.sessionTimeoutMs),
        retry: Schedule.recurs(0),
        onFailure: FailureRoute.retryTopics([DELAY], { deadLetter: { topic: `${topic}-dlq` }, maxInARow: 1_000 })
      },
      (record) => {
        if (record.topic !== topic) return Effect.void
        counter.add(1)
        return failing && decoder.decode(record.value!.subarray(0, 5)) === "fail-"
          ? Effect.fail(new Refused())
          : Effect.void
      }
    ).pipe(
      Effect.provide(CommitPolicy.commitAfter({ maxBatch: 1000, maxInterval: Duration.seconds(1) })),
      Effect.fork
    )
    yield* Effect.raceFirst(Deferred.await(done), Fiber.join(fiber))
    yield* Fiber.interrupt(fiber)
    return counter.sample()
  }))

const measure = async <E>(
  plan: Plan,
  runtime: ManagedRuntime.ManagedRuntime<Driver | Producer, E>,
  topic: string,
  sizes: RetrySizes,
  id: string,
  where: string
): Promise<Omit<BenchResult, "elapsedSeconds" | "load">> => {
  const variants = await compare(plan, [
    { id: "clean", label: "no record fails", run: () => runOnce(runtime, topic, sizes.records, false) },
    {
      id: "failing",
      label: `${FAILING * 100}% fail once, retried after ${DELAY}`,
      run: () => runOnce(runtime, topic, sizes.records, true)
    }
  ])
  return {
    id,
    title: `10. Retry topics, ${where}: ${sizes.records.toLocaleString("en-US")} records, ${sizes.partitions} ` +
      "partitions, the main topic's rate",
    unit: "records/s",
    warmup: plan.warmup,
    rounds: plan.rounds,
    variants,
    checks: [ratioAtLeast(variants, "failing", "clean", 0.9)],
    notes: [
      `runEach under commitAfter with FailureRoute.retryTopics(["${DELAY}"]), no handler retries; in the failing run ` +
      "every twentieth record fails on the main topic and is written to the retry topic (acks all), to be handled " +
      "from there once due; the figure counts the main topic's records handed to the handler, after the first"
    ]
  }
}

const createTopics = (create: (topic: string, partitions: number) => Effect.Effect<void, unknown>, topic: string, partitions: number) =>
  Effect.forEach([topic, `${topic}-retry-0`, `${topic}-dlq`], (t) => create(t, partitions), { discard: true })

/** 10a. On the in-memory broker. */
export const retriesInMemory = (plan: Plan, sizes: RetrySizes): Promise<BenchResult> =>
  timed(async () => {
    plan.log(`10. retry topics, in-memory broker, ${sizes.records.toLocaleString("en-US")} records`)
    const runtime = ManagedRuntime.make(Layer.provideMerge(InMemoryKafka.layerProducer(), InMemoryKafka.layer()))
    try {
      const topic = "retries"
      await runtime.runPromise(Effect.gen(function*() {
        const kafka = yield* InMemoryKafka.InMemoryKafka
        yield* createTopics(kafka.createTopic, topic, sizes.partitions)
        yield* kafka.produce(
          topic,
          Array.from({ length: sizes.records }, (_, i) => ({ value: valueOf(i), partition: i % sizes.partitions }))
        )
      }))
      return await measure(plan, runtime, topic, sizes, "retries-inmemory", "in-memory broker")
    } finally {
      await runtime.dispose()
    }
  })

/** 10b. On the real broker. */
export const retriesKafka = (plan: Plan, brokers: string, sizes: RetrySizes): Promise<BenchResult> =>
  timed(async () => {
    plan.log(`10. retry topics, real broker, ${sizes.records.toLocaleString("en-US")} records`)
    const topic = fresh("retries")
    const kafka = new Kafka({ clientId: "bench-retries", brokers: brokers.split(","), logLevel: logLevel.NOTHING })
    const runtime = ManagedRuntime.make(Layer.orDie(Layer.merge(
      driverLayer(brokers),
      KafkaJs.layerProducer({ brokers: brokers.split(","), clientId: "bench-retries", logLevel: "error" })
    )))
    try {
      await runtime.runPromise(createTopics((t, n) => KafkaJs.createTopic(brokers, t, n), topic, sizes.partitions))
      const producer = kafka.producer({ createPartitioner: Partitioners.DefaultPartitioner, allowAutoTopicCreation: false })
      await producer.connect()
      try {
        for (let at = 0; at < sizes.records; at += 5_000) {
          const messages = []
          for (let i = at; i < Math.min(sizes.records, at + 5_000); i++) {
            messages.push({ value: valueOf(i), partition: i % sizes.partitions })
          }
          await producer.send({ topic, acks: 1, messages })
        }
      } finally {
        await producer.disconnect()
      }
      return await measure(plan, runtime, topic, sizes, "retries-kafka", "real broker")
    } finally {
      await runtime.dispose()
    }
  })
