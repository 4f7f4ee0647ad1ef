/**
 * Benchmark 10: retry topics keep the main partition flowing. `runEach` under `commitAfter` with
 * `FailureRoute.retryTopics(["1 second"], ...)`: a run where 5% of the records fail once (they go to the retry topic
 * and are handled from there a second later) against a run where none fails, same records, same settings. The figure
 * is the main topic's rate: its records handed to the handler per second, whatever became of them.
 *
 * Two handlers: one that waits 1 ms per record (a call to a service or a database, as in benchmark 2), where the
 * target applies: a failed record must not hold its partition up; and one that does nothing, where the route's own
 * cost per failed record (the failure, the write to the retry topic, reading it back) is all there is to see,
 * reported with no target.
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
import { type BenchResult, compare, type Plan, ratioAtLeast, ratioInfo, type Sample, timed } from "./harness.js"
import { createTopics } from "./topics.js"

export interface RetrySizes {
  /** Records of the run with the handler that does nothing. */
  readonly records: number
  /** Records of the run with the handler that waits 1 ms per record. */
  readonly timedRecords: number
  readonly partitions: number
}

/** What the handler does per record: nothing, or wait 1 ms (on the main topic and the retry topic alike). */
type Handler = "nothing" | "timer1ms"

const FAILING = 0.05
const DELAY = "1 second"

let seq = 0
const fresh = (what: string) => `bench-${what}-${process.pid}-${++seq}-${crypto.randomUUID().slice(0, 8)}`

/** Every twentieth record is marked to fail (on the main topic only). */
const valueOf = (i: number) => (i % Math.round(1 / FAILING) === 7 ? "fail-" : "ok-") + String(i).padStart(250, "0")

const deadLetterOf = (topic: string) => `${topic}-dlq`

class Refused {
  readonly _tag = "Refused"
}

/** One run: a fresh group reads the topic; `failing` says whether the marked records fail on the main topic. */
const runOnce = <E>(
  runtime: ManagedRuntime.ManagedRuntime<Driver | Producer, E>,
  topic: string,
  records: number,
  failing: boolean,
  handler: Handler
): Promise<Sample> =>
  runtime.runPromise(Effect.gen(function*() {
    const done = yield* Deferred.make<void>()
    const counter = new Counter(records, performance.now(), () => Deferred.unsafeDone(done, Exit.void))
    const decoder = new TextDecoder()
    const work = handler === "timer1ms" ? Effect.sleep(Duration.millis(1)) : Effect.void
    const fiber = yield* Consumer.runEach(
      {
        groupId: fresh("retries"),
        topics: [topic],
        sessionTimeout: Duration.millis(settings.sessionTimeoutMs),
        retry: Schedule.recurs(0),
        onFailure: FailureRoute.retryTopics([DELAY], { deadLetter: { topic: deadLetterOf(topic) }, maxInARow: 1_000 })
      },
      (record) => {
        if (record.topic !== topic) return work
        counter.add(1)
        // Both runs look at the mark, so that the clean run does the same work per record but fail.
        const marked = decoder.decode(record.value!.subarray(0, 5)) === "fail-"
        return failing && marked ? Effect.zipRight(work, Effect.fail(new Refused())) : work
      }
    ).pipe(
      Effect.provide(CommitPolicy.commitAfter({ maxBatch: 1000, maxInterval: Duration.seconds(1) })),
      Effect.fork
    )
    yield* Effect.raceFirst(Deferred.await(done), Fiber.join(fiber))
    yield* Fiber.interrupt(fiber)
    return counter.sample()
  }))

/** Where a main topic's failed records go: its retry topic and its dead-letter topic. */
const routedOf = (topic: string) => [FailureRoute.retryTopic(topic, 0), deadLetterOf(topic)]

/** The topics of a run: the main one and those its failed records go to. */
const topicsOf = (topic: string) => [topic, ...routedOf(topic)]

const measure = async <E>(
  plan: Plan,
  runtime: ManagedRuntime.ManagedRuntime<Driver | Producer, E>,
  topics: { readonly nothing: string; readonly timer1ms: string },
  sizes: RetrySizes,
  id: string,
  where: string,
  /** Empties a main topic's retry and dead-letter topics, so that a run reads only the records it routed. */
  clear: (topic: string) => Promise<void>
): Promise<Omit<BenchResult, "elapsedSeconds" | "load">> => {
  const failingLabel = `${FAILING * 100}% fail once, retried after ${DELAY}`
  const runFresh = async (topic: string, records: number, failing: boolean, handler: Handler) => {
    await clear(topic)
    return runOnce(runtime, topic, records, failing, handler)
  }
  const variants = await compare(plan, [
    {
      id: "timed-clean",
      label: "waits 1 ms per record, no record fails",
      run: () => runFresh(topics.timer1ms, sizes.timedRecords, false, "timer1ms")
    },
    {
      id: "timed-failing",
      label: `waits 1 ms per record, ${failingLabel}`,
      run: () => runFresh(topics.timer1ms, sizes.timedRecords, true, "timer1ms")
    },
    {
      id: "clean",
      label: "does nothing, no record fails",
      run: () => runFresh(topics.nothing, sizes.records, false, "nothing")
    },
    {
      id: "failing",
      label: `does nothing, ${failingLabel}`,
      run: () => runFresh(topics.nothing, sizes.records, true, "nothing")
    }
  ])
  return {
    id,
    title: `10. Retry topics, ${where}: ${sizes.timedRecords.toLocaleString("en-US")} records with a handler ` +
      `that waits 1 ms, ${sizes.records.toLocaleString("en-US")} with one that does nothing, ${sizes.partitions} ` +
      "partitions, the main topic's rate",
    unit: "records/s",
    warmup: plan.warmup,
    rounds: plan.rounds,
    variants,
    checks: [
      ratioAtLeast(variants, "timed-failing", "timed-clean", 0.9),
      ratioInfo(variants, "failing", "clean")
    ],
    notes: [
      `runEach under commitAfter with FailureRoute.retryTopics(["${DELAY}"]), no handler retries; in the failing runs ` +
      "every twentieth record fails on the main topic and is written to the retry topic (acks all), to be handled " +
      "from there once due; the figure counts the main topic's records handed to the handler, after the first",
      "before every run its retry and dead-letter topics are emptied (records deleted), so that a failing run reads " +
      "back only what it routed; the clean run's handler looks at each record's mark as the failing one does",
      "the handler that does nothing shows what the route costs per failed record, on one thread with the consumer: " +
      "failing/clean there is the price of 5% failures when handling a record costs nothing at all"
    ]
  }
}

const produced = (i: number, partitions: number) => ({ value: valueOf(i), partition: i % partitions })

/** 10a. On the in-memory broker. */
export const retriesInMemory = (plan: Plan, sizes: RetrySizes): Promise<BenchResult> =>
  timed(async () => {
    plan.log(`10. retry topics, in-memory broker`)
    const runtime = ManagedRuntime.make(Layer.provideMerge(InMemoryKafka.layerProducer(), InMemoryKafka.layer()))
    try {
      const topics = { nothing: "retries", timer1ms: "retries-timed" }
      await runtime.runPromise(Effect.gen(function*() {
        const kafka = yield* InMemoryKafka.InMemoryKafka
        for (
          const [topic, records] of [[topics.nothing, sizes.records], [topics.timer1ms, sizes.timedRecords]] as const
        ) {
          yield* Effect.forEach(topicsOf(topic), (t) => kafka.createTopic(t, sizes.partitions), { discard: true })
          yield* kafka.produce(topic, Array.from({ length: records }, (_, i) => produced(i, sizes.partitions)))
        }
      }))
      const clear = (topic: string) =>
        runtime.runPromise(Effect.gen(function*() {
          const kafka = yield* InMemoryKafka.InMemoryKafka
          for (const routed of routedOf(topic)) {
            const ends = yield* kafka.endOffsets(routed)
            yield* Effect.forEach(ends, (end, partition) => kafka.deleteRecords(routed, partition, end), {
              discard: true
            })
          }
        }))
      return await measure(plan, runtime, topics, sizes, "retries-inmemory", "in-memory broker", clear)
    } finally {
      await runtime.dispose()
    }
  })

/** 10b. On the real broker. */
export const retriesKafka = (plan: Plan, brokers: string, sizes: RetrySizes): Promise<BenchResult> =>
  timed(async () => {
    plan.log(`10. retry topics, real broker`)
    const topics = { nothing: fresh("retries"), timer1ms: fresh("retries-timed") }
    const kafka = new Kafka({ clientId: "bench-retries", brokers: brokers.split(","), logLevel: logLevel.NOTHING })
    const runtime = ManagedRuntime.make(Layer.orDie(Layer.merge(
      driverLayer(brokers),
      KafkaJs.layerProducer({ brokers: brokers.split(","), clientId: "bench-retries", logLevel: "error" })
    )))
    const admin = kafka.admin()
    try {
      await admin.connect()
      const producer = kafka.producer({
        createPartitioner: Partitioners.DefaultPartitioner,
        allowAutoTopicCreation: false
      })
      await producer.connect()
      try {
        for (
          const [topic, records] of [[topics.nothing, sizes.records], [topics.timer1ms, sizes.timedRecords]] as const
        ) {
          // Leaders elected before anything is read or deleted.
          await createTopics(brokers, topicsOf(topic), sizes.partitions)
          for (let at = 0; at < records; at += 5_000) {
            const messages = []
            for (let i = at; i < Math.min(records, at + 5_000); i++) messages.push(produced(i, sizes.partitions))
            await producer.send({ topic, acks: 1, messages })
          }
        }
      } finally {
        await producer.disconnect()
      }
      const clear = async (topic: string) => {
        for (const routed of routedOf(topic)) {
          // Reading the ends also loads the topic's metadata, which deleting needs.
          const ends = await admin.fetchTopicOffsets(routed)
          const partitions = ends.filter((end) => end.high !== end.low).map((end) => ({
            partition: end.partition,
            offset: end.high
          }))
          if (partitions.length > 0) await admin.deleteTopicRecords({ topic: routed, partitions })
        }
      }
      return await measure(plan, runtime, topics, sizes, "retries-kafka", "real broker", clear)
    } finally {
      await admin.disconnect()
      await runtime.dispose()
    }
  })
