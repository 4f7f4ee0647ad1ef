/**
 * The failure route's circuit counts records in a row in offset order, whatever the ordering: under key ordering many
 * records are in flight at once and finish in any order, and poison records spread among good ones must not open it,
 * while a partition whose every record fails must.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Chunk from "effect/Chunk"
import * as Cause from "effect/Cause"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import * as Schema from "effect/Schema"
import * as CommitPolicy from "../src/CommitPolicy.js"
import * as Consumer from "../src/Consumer.js"
import { type ConsumerRecord, valueString } from "../src/ConsumerRecord.js"
import * as FailureRoute from "../src/FailureRoute.js"
import * as InMemoryKafka from "../src/InMemoryKafka.js"
import { CircuitOpen } from "../src/KafkaError.js"
import * as OffsetStore from "../src/OffsetStore.js"
import { readTopic } from "./producerSuite.js"

class Refused extends Schema.TaggedError<Refused>()("Refused", {}) {}

const source = "circuit"
const dlq = "circuit-dlq"
const records = 1_000

const env = Layer.mergeAll(InMemoryKafka.layerProducer(), OffsetStore.layerMemory).pipe(
  Layer.provideMerge(InMemoryKafka.layer())
)

/** A record is poison when its place says so; `every` makes all of them poison (a dependency that is down). */
const seed = (poison: (i: number) => boolean) =>
  Effect.gen(function*() {
    yield* InMemoryKafka.createTopic(source, 1)
    yield* InMemoryKafka.createTopic(dlq, 1)
    yield* InMemoryKafka.produce(
      source,
      Array.from({ length: records }, (_, i) => ({ key: `k${i % 97}`, value: poison(i) ? `bad-${i}` : `ok-${i}` }))
    )
  })

/** A handler that does I/O (it yields) and refuses the bad records, naming none. */
const handler = (chunk: Chunk.Chunk<ConsumerRecord>) =>
  Effect.zipRight(
    Effect.yieldNow(),
    Chunk.some(chunk, (r) => valueString(r)!.startsWith("bad")) ? Effect.fail(new Refused()) : Effect.void
  )

/** Up to 64 calls in flight, keyed records, no retries; nine failures in a row open the circuit. */
const config = {
  groupId: "g",
  topics: [source],
  ordering: "key",
  concurrency: 64,
  maxPollRecords: 200,
  retry: Schedule.recurs(0),
  onFailure: FailureRoute.deadLetter({ topic: dlq, maxInARow: 9 })
} satisfies Consumer.Config<FailureRoute.DeadLetter>

const policies = {
  commitAfter: CommitPolicy.commitAfter({ maxBatch: 50, maxInterval: "10 millis" }),
  transactional: CommitPolicy.transactional()
} as const

describe("the circuit under key ordering", () => {
  for (const [name, policy] of Object.entries(policies)) {
    it.live(`${name}: eight poison records in every nine, never nine in a row, 64 in flight: the circuit stays closed`, () =>
      Effect.gen(function*() {
        // Eight poison records, then a good one, and so on: 8 in a row at most, under maxInARow 9.
        const poison = (i: number) => i % 9 !== 8
        yield* seed(poison)
        const bad = Array.from({ length: records }, (_, i) => i).filter(poison)
        const consumer = yield* Consumer.run(
          config,
          handler
        ).pipe(Effect.provide(policy), Effect.fork)
        for (let turn = 0;; turn++) {
          const exit = yield* Fiber.poll(consumer)
          if (Option.isSome(exit)) {
            assert.fail(`the consumer ended: ${Exit.isFailure(exit.value) ? Cause.pretty(exit.value.cause) : "?"}`)
          }
          const letters = yield* readTopic(dlq, 1)
          if (letters[0]!.length >= bad.length) break
          if (turn > 2_000) assert.fail("not every poison record was dead-lettered within 10 s")
          yield* Effect.sleep("5 millis")
        }
        yield* Fiber.interrupt(consumer)
        const routed = (yield* readTopic(dlq, 1))[0]!.map((r) => Number(valueString(r)!.slice(4)))
        assert.deepStrictEqual(new Set(routed), new Set(bad))
      }).pipe(Effect.provide(env)))

    it.live(`${name}: every record failing ends the consumer with CircuitOpen, before a run of maxInARow is routed`, () =>
      Effect.gen(function*() {
        yield* seed(() => true)
        const failure = yield* Consumer.run(
          config,
          handler
        ).pipe(Effect.provide(policy), Effect.flip, Effect.timeout("10 seconds"))
        assert.instanceOf(failure, CircuitOpen)
        assert.strictEqual((failure as CircuitOpen).count, 9)
        // What was routed holds no nine consecutive records, and not the one the circuit opened on.
        const routed = new Set((yield* readTopic(dlq, 1))[0]!.map((r) => Number(valueString(r)!.slice(4))))
        assert.isFalse(routed.has(Number((failure as CircuitOpen).offset)))
        let longest = 0
        for (let i = 0, row = 0; i < records; i++) {
          row = routed.has(i) ? row + 1 : 0
          longest = Math.max(longest, row)
        }
        assert.isBelow(longest, 9)
      }).pipe(Effect.provide(env)))
  }
})
