/**
 * A failure route on a log with gaps, under every policy, ordering and route. A chunk handler that fails without
 * naming its record makes the route take the unit apart, a record at a time; the records are found by their offsets,
 * which are not contiguous: a log that starts with an aborted transaction (its first record above the start
 * position), aborted transactions and commit markers in the middle, and one at the end.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Cause from "effect/Cause"
import * as Chunk from "effect/Chunk"
import type { ConsumerRecord } from "../src/ConsumerRecord.js"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import * as Schema from "effect/Schema"
import * as CommitPolicy from "../src/CommitPolicy.js"
import * as Consumer from "../src/Consumer.js"
import { valueString } from "../src/ConsumerRecord.js"
import type { Driver } from "../src/Driver.js"
import * as FailureRoute from "../src/FailureRoute.js"
import * as InMemoryKafka from "../src/InMemoryKafka.js"
import * as OffsetStore from "../src/OffsetStore.js"
import * as Producer from "../src/Producer.js"
import { readTopic } from "./producerSuite.js"

class Refused extends Schema.TaggedError<Refused>()("Refused", {}) {}

const source = "gapped"
const dlq = "gapped-dlq"
const output = "gapped-out"
const partitions = 2

const policies = ["atMostOnce", "autoCommit", "commitAfter", "transactional", "kafkaTransactional"] as const
const orderings = ["partition", "key", "unordered"] as const
const routes = ["deadLetter", "retryTopics"] as const

const layerOf = (policy: "atMostOnce" | "autoCommit" | "commitAfter") => {
  switch (policy) {
    case "atMostOnce":
      return CommitPolicy.atMostOnce()
    case "autoCommit":
      return CommitPolicy.autoCommit({ interval: "20 millis" })
    case "commitAfter":
      return CommitPolicy.commitAfter({ maxBatch: 5, maxInterval: "20 millis" })
  }
}

/**
 * Each partition: an aborted transaction first, then plain records, an aborted transaction, a committed one, plain
 * records, and an aborted transaction last. Keys k0..k3; every fifth visible record is "bad". Returns the values of
 * the records a read_committed consumer sees.
 */
const seed = Effect.gen(function*() {
  const kafka = yield* InMemoryKafka.InMemoryKafka
  for (const topic of [source, FailureRoute.retryTopic(source, 0), dlq, output]) {
    yield* kafka.createTopic(topic, partitions)
  }
  const visible: Array<string> = []
  let n = 0
  const batch = (partition: number, count: number, keep: boolean) =>
    Array.from({ length: count }, () => {
      const i = n++
      const value = keep ? `${i % 5 === 2 ? "bad" : "ok"}-${partition}-${i}` : `aborted-${i}`
      if (keep) visible.push(value)
      return { key: `k${i % 4}`, value, partition }
    })
  for (let partition = 0; partition < partitions; partition++) {
    yield* kafka.produceTransaction(source, batch(partition, 2, false), "abort")
    yield* kafka.produce(source, batch(partition, 9, true))
    yield* kafka.produceTransaction(source, batch(partition, 3, false), "abort")
    yield* kafka.produceTransaction(source, batch(partition, 7, true), "commit")
    yield* kafka.produce(source, batch(partition, 6, true))
    yield* kafka.produceTransaction(source, batch(partition, 2, false), "abort")
  }
  return visible
})

describe("a failure route takes a failed unit apart on a log with gaps", () => {
  for (const policy of policies) {
    for (const ordering of orderings) {
      for (const route of routes) {
        it.live(`${policy}, ${ordering} ordering, ${route}: every record is handled or routed, and the consumer goes on`, () =>
          Effect.gen(function*() {
            const visible = yield* seed
            const bad = visible.filter((v) => v.startsWith("bad"))
            const handled: Array<string> = []
            const onFailure = route === "deadLetter"
              ? FailureRoute.deadLetter({ topic: dlq, maxInARow: 1_000 })
              : FailureRoute.retryTopics(["10 millis"], { deadLetter: { topic: dlq }, maxInARow: 1_000 })
            const config = {
              groupId: "g",
              topics: [source],
              maxPollRecords: 6,
              ordering,
              retry: Schedule.recurs(1),
              onFailure
            } satisfies Consumer.Config<FailureRoute.FailureRoute>
            // A chunk handler that fails without saying on which record: the route must find each record alone.
            const failing =
              <E, R>(each: (value: string, record: ConsumerRecord) => Effect.Effect<void, E, R>) =>
              (records: Chunk.Chunk<ConsumerRecord>): Effect.Effect<void, E | Refused, R> =>
                Chunk.some(records, (r) => valueString(r)!.startsWith("bad"))
                  ? Effect.fail(new Refused())
                  : Effect.forEach(records, (r) => each(valueString(r)!, r), { discard: true })
            type Needs = Driver | Producer.Producer | OffsetStore.OffsetStore | InMemoryKafka.InMemoryKafka
            const program: Effect.Effect<never, unknown, Needs> = policy === "transactional"
              ? Consumer.run(config, failing((value) => OffsetStore.append([value]))).pipe(
                Effect.provide(CommitPolicy.transactional())
              )
              : policy === "kafkaTransactional"
              ? Consumer.run(
                config,
                failing((value, r) => Effect.asVoid(Producer.send({ topic: output, value, partition: r.partition })))
              ).pipe(
                Effect.provide(CommitPolicy.kafkaTransactional()),
                Effect.provide(InMemoryKafka.layerTransactionalProducers())
              )
              : Consumer.run(config, failing((value) => Effect.sync(() => handled.push(value)))).pipe(
                Effect.provide(layerOf(policy))
              )
            const consumer = yield* Effect.fork(program)

            const ends = yield* Effect.flatMap(InMemoryKafka.InMemoryKafka, (kafka) => kafka.endOffsets(source))
            const positions = policy === "transactional"
              ? Effect.flatMap(
                OffsetStore.OffsetStore,
                (store) =>
                  store.load("g", Array.from({ length: partitions }, (_, partition) => ({ topic: source, partition })))
              )
              : Effect.map(InMemoryKafka.committed("g"), (batch) => batch.positions)
            const letters = Effect.map(readTopic(dlq, partitions), (lists) => lists.flat().map(valueString))
            const results = policy === "transactional"
              ? Effect.flatMap(OffsetStore.Results, (r) => Effect.map(r.read("g"), (all) => all.map(String)))
              : policy === "kafkaTransactional"
              ? Effect.map(readTopic(output, partitions), (lists) => lists.flat().map((r) => valueString(r)!))
              : Effect.sync(() => handled)
            const done = Effect.gen(function*() {
              const at = yield* positions
              if (!ends.every((end, partition) => at.get(`${source}-${partition}`) === end)) return false
              const routed = new Set(yield* letters)
              if (!bad.every((v) => routed.has(v))) return false
              const seen = new Set(yield* results)
              return visible.every((v) => seen.has(v) || routed.has(v))
            })
            for (let turn = 0; !(yield* done); turn++) {
              const exit = yield* Fiber.poll(consumer)
              if (Option.isSome(exit)) {
                assert.fail(`the consumer ended: ${Exit.isFailure(exit.value) ? Cause.pretty(exit.value.cause) : "?"}`)
              }
              if (turn > 4_000) assert.fail("not every record was handled or routed within 20 seconds")
              yield* Effect.sleep("5 millis")
            }
            yield* Fiber.interrupt(consumer)
            const routed = yield* letters
            const out = yield* results
            for (const value of bad) assert.notInclude(out, value, `${value} handled although its handler failed`)
            if (policy === "transactional" || policy === "kafkaTransactional") {
              // Exactly once: each good record's result once, each bad record routed once.
              assert.deepStrictEqual([...out].sort(), visible.filter((v) => !v.startsWith("bad")).sort())
              assert.deepStrictEqual([...routed].sort(), [...bad].sort())
            }
            if (policy === "atMostOnce") {
              const all = [...out, ...routed]
              assert.strictEqual(new Set(all).size, all.length, "under atMostOnce a record is handed over once")
            }
          }).pipe(
            Effect.provide(
              Layer.mergeAll(InMemoryKafka.layerProducer(), OffsetStore.layerMemory).pipe(
                Layer.provideMerge(InMemoryKafka.layer())
              )
            )
          ))
      }
    }
  }
})
