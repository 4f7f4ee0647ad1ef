/**
 * Observability on a real broker, through kafkajs: the lag read from the broker's latest offsets grows while the
 * consumer is held and falls to 0 once it catches up, and a trace id set by the producer reaches the span of the chunk
 * its record was handled in, through the record's `traceparent` header; once the consumer ended, a later subscriber
 * to the lag gets nothing of it.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Chunk from "effect/Chunk"
import * as Clock from "effect/Clock"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Stream from "effect/Stream"
import { inject } from "vitest"
import * as CommitPolicy from "../src/CommitPolicy.js"
import * as Consumer from "../src/Consumer.js"
import type { ConsumerRecord } from "../src/ConsumerRecord.js"
import * as KafkaJs from "../src/KafkaJs.js"
import * as Observability from "../src/Observability.js"
import * as Producer from "../src/Producer.js"
import { withAdmin } from "./support/kafkaKit.js"
import { eventually } from "./support/kit.js"
import { metricValue, recordingTracer } from "./support/tracing.js"

const brokers = process.env.KAFKA_BROKERS || inject("kafkaBrokers")
const setupError = inject("kafkaSetupError")
const unique = (prefix: string) => `${prefix}-${crypto.randomUUID().slice(0, 8)}`

const nextSnapshot = (groupId: string) =>
  Effect.gen(function*() {
    const now = yield* Clock.currentTimeMillis
    const next = yield* Observability.lag({ groupId }).pipe(
      Stream.filter((s) => s.at > now && s.partitions.length > 0),
      Stream.runHead,
      Effect.timeoutFail({ duration: "20 seconds", onTimeout: () => new Error(`no lag snapshot of ${groupId}`) })
    )
    return Option.getOrThrow(next)
  })

describe("observability against a real broker", () => {
  it.live(
    "lag grows while the consumer is held and falls to 0 once it catches up; the producer's trace reaches the handler's span",
    () => {
      assert.isNotEmpty(brokers, `no Kafka broker for this run: ${setupError}`)
      const list = brokers.split(",")
      const tracing = recordingTracer()
      const layer = Layer.mergeAll(
        KafkaJs.layer({ brokers: list, clientId: "observability", maxWaitTime: "100 millis", logLevel: "error" }),
        KafkaJs.layerProducer({ brokers: list, clientId: "observability", logLevel: "nothing", linger: 0 }),
        Observability.layer({ lagInterval: "100 millis" }),
        tracing.layer
      )
      return Effect.gen(function*() {
        const topic = unique("observability")
        const groupId = unique("observability-group")
        yield* KafkaJs.createTopic(list, topic, 1)
        yield* Effect.withSpan(
          Producer.sendAll(Array.from({ length: 40 }, (_, i) => ({ topic, value: `r${i}` }))),
          "checkout"
        )
        const gate = yield* Deferred.make<void>()
        const handled: Array<ConsumerRecord> = []
        const fiber = yield* Consumer.runEach(
          { groupId, topics: [topic], maxPollRecords: 10 },
          (record) => Effect.zipRight(Deferred.await(gate), Effect.sync(() => handled.push(record)))
        ).pipe(
          Effect.provide(CommitPolicy.commitAfter({ maxBatch: 10, maxInterval: "100 millis" })),
          Effect.fork
        )
        // Held: nothing is committed, the lag is every record; what is produced meanwhile adds to it.
        const held = yield* nextSnapshot(groupId)
        assert.deepStrictEqual(held.partitions, [{ topic, partition: 0, position: 0n, latest: 40n, lag: 40n }])
        yield* Producer.sendAll(Array.from({ length: 20 }, (_, i) => ({ topic, value: `late${i}` })))
        const grown = yield* nextSnapshot(groupId)
        assert.deepStrictEqual(grown.partitions, [{ topic, partition: 0, position: 0n, latest: 60n, lag: 60n }])
        yield* Deferred.succeed(gate, undefined)
        yield* eventually("every record handled", Effect.sync(() => handled.length === 60), "30 seconds")
        yield* eventually(
          "every record committed",
          Effect.map(
            withAdmin(brokers, (admin) => admin.fetchOffsets({ groupId, topics: [topic] })),
            (offsets) => offsets[0]?.partitions.find((p) => p.partition === 0)?.offset === "60"
          ),
          "30 seconds"
        )
        const caughtUp = yield* nextSnapshot(groupId)
        assert.deepStrictEqual(caughtUp.partitions, [{ topic, partition: 0, position: 60n, latest: 60n, lag: 0n }])
        const labels = {
          "messaging.consumer.group.name": groupId,
          "messaging.destination.name": topic,
          "messaging.destination.partition.id": "0"
        }
        assert.strictEqual(yield* metricValue("kafka.consumer.lag", labels), 0)
        assert.strictEqual(yield* metricValue("kafka.consumer.handled.records", labels), 60)

        // The first forty records were sent in the checkout's trace: a chunk that handled one of them links to it.
        const checkout = tracing.spans.find((s) => s.name === "checkout")!
        const send = tracing.spans.find((s) => s.name === `send ${topic}` && s.parentSpanId === checkout.spanId)!
        assert.strictEqual(send.traceId, checkout.traceId)
        const first = handled[0]!
        assert.strictEqual(
          new TextDecoder().decode(first.headers["traceparent"]),
          `00-${send.traceId}-${send.spanId}-01`
        )
        const linked = tracing.spans.filter((s) =>
          s.name === `process ${topic}` && s.links.some((link) => link.span.spanId === send.spanId)
        )
        assert.isNotEmpty(linked, "a chunk span linked to the checkout's send span")
        assert.strictEqual(linked[0]!.links[0]!.span.traceId, checkout.traceId)
        yield* Fiber.interrupt(fiber)

        // The consumer ended: a subscriber that comes now gets nothing of it (neither its member id from before it
        // joined nor the one it had). A snapshot reported after the end marks where what was kept stops.
        const observability = yield* Observability.Observability
        const marker = unique("marker")
        yield* observability.report({
          groupId: marker,
          memberId: "m",
          at: 0,
          partitions: [{ topic, partition: 0, position: 0n, latest: 0n, lag: 0n }]
        })
        const kept = yield* Observability.lag().pipe(
          Stream.takeUntil((s) => s.groupId === marker),
          Stream.runCollect,
          Effect.timeoutFail({ duration: "5 seconds", onTimeout: () => new Error("the marker snapshot never came") })
        )
        assert.deepStrictEqual(Chunk.toReadonlyArray(kept).map((s) => s.groupId), [marker])
      }).pipe(Effect.provide(layer), Effect.scoped)
    },
    120_000
  )
})
