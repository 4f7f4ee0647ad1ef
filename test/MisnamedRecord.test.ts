/**
 * A chunk handler that fails with a `RecordFailed` naming an offset its chunk does not hold: which record failed is
 * unknown, so nothing can be routed, retried as that record, or counted as handled. The consumer ends with
 * `RecordNotInChunk` whatever its route, at once, and its position stays before the chunk.
 */
import { assert, describe, expectTypeOf, it } from "@effect/vitest"
import * as Chunk from "effect/Chunk"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Schedule from "effect/Schedule"
import * as Schema from "effect/Schema"
import * as CommitPolicy from "../src/CommitPolicy.js"
import * as Consumer from "../src/Consumer.js"
import type { ConsumerRecord } from "../src/ConsumerRecord.js"
import * as FailureRoute from "../src/FailureRoute.js"
import * as InMemoryKafka from "../src/InMemoryKafka.js"
import {
  type CircuitOpen,
  type HandlerFailed,
  type ProduceFailed,
  RecordFailed,
  RecordNotInChunk
} from "../src/KafkaError.js"
import * as OffsetStore from "../src/OffsetStore.js"
import { readTopic } from "./producerSuite.js"

class Refused extends Schema.TaggedError<Refused>()("Refused", {}) {}

const source = "misnamed"
const dlq = "misnamed-dlq"

const env = Layer.mergeAll(InMemoryKafka.layerProducer(), OffsetStore.layerMemory).pipe(
  Layer.provideMerge(InMemoryKafka.layer())
)

const seed = Effect.gen(function*() {
  yield* InMemoryKafka.createTopic(source, 1)
  yield* InMemoryKafka.createTopic(dlq, 1)
  yield* InMemoryKafka.produce(source, Array.from({ length: 30 }, (_, i) => ({ key: `k${i % 3}`, value: String(i) })))
})

/** Fails on the chunk that holds offset 10, naming offset 999, which no chunk holds. */
const misnaming = (calls: { n: number }) => (records: Chunk.Chunk<ConsumerRecord>) =>
  Effect.suspend(() => {
    calls.n++
    return Chunk.some(records, (r) => r.offset === 10n)
      ? Effect.fail(new RecordFailed<Refused>({ offset: 999n, cause: new Refused() }))
      : Effect.void
  })

const cases = [
  { policy: "commitAfter", ordering: "partition", route: "deadLetter" },
  { policy: "commitAfter", ordering: "partition", route: "stop" },
  { policy: "commitAfter", ordering: "key", route: "deadLetter" },
  { policy: "transactional", ordering: "partition", route: "deadLetter" },
  { policy: "transactional", ordering: "key", route: "retryTopics" },
  { policy: "atMostOnce", ordering: "partition", route: "deadLetter" }
] as const

describe("a RecordFailed naming a record outside its chunk", () => {
  for (const { ordering, policy, route } of cases) {
    it.live(`${policy}, ${ordering} ordering, ${route}: the consumer ends with RecordNotInChunk, nothing routed, the position before the chunk`, () =>
      Effect.gen(function*() {
        yield* seed
        if (route === "retryTopics") yield* InMemoryKafka.createTopic(FailureRoute.retryTopic(source, 0), 1)
        const calls = { n: 0 }
        const config = {
          groupId: "g",
          topics: [source],
          maxPollRecords: 10,
          ordering,
          retry: Schedule.recurs(3),
          onFailure: route === "deadLetter"
            ? FailureRoute.deadLetter({ topic: dlq })
            : route === "retryTopics"
            ? FailureRoute.retryTopics(["10 millis"], { deadLetter: { topic: dlq } })
            : FailureRoute.stop
        } satisfies Consumer.AnyConfig
        const layer = policy === "commitAfter"
          ? CommitPolicy.commitAfter({ maxBatch: 1, maxInterval: "10 millis" })
          : policy === "atMostOnce"
          ? CommitPolicy.atMostOnce()
          : CommitPolicy.transactional()
        // A handler called again and again (the failed chunk retried without end) fails the test as soon as it shows.
        const runaway = Effect.repeat(Effect.sync(() => calls.n > 50), {
          until: (many) => many,
          schedule: Schedule.spaced("1 millis")
        }).pipe(Effect.as(new Error("the handler was called again and again")))
        const failure = yield* Consumer.run(config, misnaming(calls)).pipe(
          Effect.provide(layer),
          Effect.flip,
          Effect.raceFirst(runaway),
          Effect.timeoutFail({ duration: "10 seconds", onTimeout: () => new Error("the consumer did not end") })
        )
        assert.instanceOf(failure, RecordNotInChunk)
        const misnamed = failure as RecordNotInChunk<RecordFailed<Refused>>
        assert.deepStrictEqual([misnamed.topic, misnamed.partition, misnamed.offset], [source, 0, 999n])
        assert.isTrue(misnamed.first <= 10n && 10n <= misnamed.last, "the chunk it names holds the failed offset")
        assert.instanceOf(misnamed.cause, RecordFailed)
        assert.include(misnamed.message, "999")
        // Not retried as if it were that record, not routed, and no hot loop: a few calls, not thousands.
        assert.isAtMost(calls.n, 12)
        assert.deepStrictEqual((yield* readTopic(dlq, 1))[0], [])
        const positions = policy === "transactional"
          ? yield* Effect.flatMap(
            OffsetStore.OffsetStore,
            (store) => store.load("g", [{ topic: source, partition: 0 }])
          )
          : (yield* InMemoryKafka.committed("g")).positions
        const position = positions.get(`${source}-0`) ?? 0n
        // atMostOnce committed the chunk before its handler ran, as it always does; every other policy stays before it.
        assert.isAtMost(Number(position), policy === "atMostOnce" ? Number(misnamed.last) + 1 : Number(misnamed.first))
      }).pipe(Effect.provide(env)))
  }

  it("types: a handler that can fail with RecordFailed can end the consumer with RecordNotInChunk; others cannot", () => {
    const settings = { groupId: "g", topics: [source], onFailure: FailureRoute.deadLetter({ topic: dlq }) } as const
    const naming = Consumer.run(settings, misnaming({ n: 0 }))
    expectTypeOf<Effect.Effect.Error<typeof naming>>().toEqualTypeOf<
      | Consumer.ConsumerError
      | ProduceFailed
      | CircuitOpen<RecordFailed<Refused>>
      | RecordNotInChunk<RecordFailed<Refused>>
    >()
    const plain = Consumer.run(settings, (_: Chunk.Chunk<ConsumerRecord>) => Effect.fail(new Refused()))
    expectTypeOf<Effect.Effect.Error<typeof plain>>().toEqualTypeOf<
      Consumer.ConsumerError | ProduceFailed | CircuitOpen<Refused>
    >()
    const stopping = Consumer.run({ groupId: "g", topics: [source] }, misnaming({ n: 0 }))
    expectTypeOf<Effect.Effect.Error<typeof stopping>>().toEqualTypeOf<
      Consumer.ConsumerError | HandlerFailed<RecordFailed<Refused>> | RecordNotInChunk<RecordFailed<Refused>>
    >()
    // A record handler names its record itself: RecordNotInChunk cannot happen.
    const each = Consumer.runEach(
      settings,
      (_: ConsumerRecord) => Effect.fail(new RecordFailed<number>({ offset: 1n, cause: 1 }))
    )
    expectTypeOf<Effect.Effect.Error<typeof each>>().toEqualTypeOf<
      Consumer.ConsumerError | ProduceFailed | CircuitOpen<RecordFailed<number>>
    >()
  })
})
