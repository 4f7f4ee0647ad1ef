/**
 * The circuit on a partition read in order, from end to end: a record handled between failures breaks their row, so
 * poison records spread among good ones never open it, however many there are.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Cause from "effect/Cause"
import * as Chunk from "effect/Chunk"
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
import * as OffsetStore from "../src/OffsetStore.js"
import { readTopic } from "./producerSuite.js"

class Refused extends Schema.TaggedError<Refused>()("Refused", {}) {}

const source = "in-order"
const dlq = "in-order-dlq"
const records = 300

const env = Layer.mergeAll(InMemoryKafka.layerProducer(), OffsetStore.layerMemory).pipe(
  Layer.provideMerge(InMemoryKafka.layer())
)

/** A handler that refuses the bad records, naming none. */
const handler = (chunk: Chunk.Chunk<ConsumerRecord>) =>
  Chunk.some(chunk, (r) => valueString(r)!.startsWith("bad")) ? Effect.fail(new Refused()) : Effect.void

/** Records in order, no retries; three failures in a row open the circuit. */
const config = {
  groupId: "g",
  topics: [source],
  ordering: "partition",
  maxPollRecords: 50,
  retry: Schedule.recurs(0),
  onFailure: FailureRoute.deadLetter({ topic: dlq, maxInARow: 3 })
} satisfies Consumer.Config<FailureRoute.DeadLetter>

const policies = {
  commitAfter: CommitPolicy.commitAfter({ maxBatch: 50, maxInterval: "10 millis" }),
  transactional: CommitPolicy.transactional()
} as const

describe("the circuit on a partition read in order", () => {
  for (const [name, policy] of Object.entries(policies)) {
    it.live(`${name}: two poison records in every three, never three in a row: the circuit stays closed`, () =>
      Effect.gen(function*() {
        const poison = (i: number) => i % 3 !== 2
        yield* InMemoryKafka.createTopic(source, 1)
        yield* InMemoryKafka.createTopic(dlq, 1)
        yield* InMemoryKafka.produce(
          source,
          Array.from({ length: records }, (_, i) => ({ value: poison(i) ? `bad-${i}` : `ok-${i}` }))
        )
        const bad = Array.from({ length: records }, (_, i) => i).filter(poison)
        const consumer = yield* Consumer.run(config, handler).pipe(Effect.provide(policy), Effect.fork)
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
  }
})
