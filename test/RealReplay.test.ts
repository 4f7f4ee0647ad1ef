/**
 * `FailureRoute.replay` on a real broker, through kafkajs, after the broker removed dead letters the replay's group
 * had not reached (admin `deleteRecords`, as retention does): the replay goes on from the log's earliest offset, counts
 * what was removed, and ends. Each replay is raced against a deadline: one that never ends fails the test by assertion.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import { inject } from "vitest"
import type { ConsumerRecord } from "../src/ConsumerRecord.js"
import { valueString } from "../src/ConsumerRecord.js"
import * as FailureRoute from "../src/FailureRoute.js"
import * as KafkaJs from "../src/KafkaJs.js"
import * as Producer from "../src/Producer.js"
import { readTopic } from "./producerSuite.js"
import { withAdmin } from "./support/kafkaKit.js"

const brokers = process.env.KAFKA_BROKERS || inject("kafkaBrokers")
const setupError = inject("kafkaSetupError")
const unique = (prefix: string) => `${prefix}-${crypto.randomUUID().slice(0, 8)}`

/** The effect, raced against `deadline`: one that does not end by then fails the test by assertion. */
const within = <A, E, R>(effect: Effect.Effect<A, E, R>, deadline: Duration.DurationInput) =>
  Effect.flatMap(Effect.fork(effect), (fiber) =>
    Effect.timeoutOption(Fiber.await(fiber), deadline).pipe(
      Effect.flatMap(Option.match({
        onNone: () =>
          Effect.zipRight(
            Fiber.interrupt(fiber),
            Effect.sync(() => assert.fail(`did not end within ${Duration.format(Duration.decode(deadline))}`))
          ),
        onSome: (exit) => exit
      }))
    ))

describe("replay against a real broker", () => {
  it.live("records removed before the replay reached them: it goes on from the earliest offset, counting them", () => {
    assert.isNotEmpty(brokers, `no Kafka broker for this run: ${setupError}`)
    const list = brokers.split(",")
    const layer = Layer.mergeAll(
      KafkaJs.layer({ brokers: list, clientId: "replay", maxWaitTime: "100 millis", logLevel: "error" }),
      KafkaJs.layerProducer({ brokers: list, clientId: "replay", logLevel: "nothing", linger: 0 })
    )
    return Effect.gen(function*() {
      const source = unique("replay-source")
      const dlq = unique("replay-dlq")
      const groupId = unique("replayer")
      yield* KafkaJs.createTopic(list, source, 1)
      yield* KafkaJs.createTopic(list, dlq, 1)
      /** Dead letters of the source records `from` to `to` (excluded), as the failure route writes them. */
      const deadLetters = (from: number, to: number) =>
        Producer.sendAll(Array.from({ length: to - from }, (_, i) => {
          const record: ConsumerRecord = {
            topic: source,
            partition: 0,
            offset: BigInt(from + i),
            key: null,
            value: new TextEncoder().encode(`order ${from + i}`),
            headers: {},
            timestamp: 0
          }
          return { ...FailureRoute.deadLetterRecord(dlq, record, new Error("refused"), 1), partition: 0 }
        }))
      const replay = within(FailureRoute.replay({ topic: dlq, groupId }), "30 seconds")

      yield* deadLetters(0, 3)
      assert.deepStrictEqual(yield* replay, { replayed: 3, foreign: 0, removed: 0 })
      // Five more are dead-lettered; the broker removes three of them before the next replay.
      yield* deadLetters(3, 8)
      yield* withAdmin(brokers, async (admin) => {
        await admin.fetchTopicMetadata({ topics: [dlq] })
        await admin.deleteTopicRecords({ topic: dlq, partitions: [{ partition: 0, offset: "6" }] })
      })

      assert.deepStrictEqual(yield* replay, { replayed: 2, foreign: 0, removed: 3 })
      const [back] = yield* readTopic(source, 1)
      assert.deepStrictEqual(back!.map(valueString), ["order 0", "order 1", "order 2", "order 6", "order 7"])
      const committed = yield* withAdmin(brokers, (admin) => admin.fetchOffsets({ groupId, topics: [dlq] }))
      assert.strictEqual(committed[0]?.partitions.find((p) => p.partition === 0)?.offset, "8")
    }).pipe(Effect.provide(layer), Effect.scoped)
  }, 180_000)
})
