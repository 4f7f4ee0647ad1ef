import { assert, describe, it } from "@effect/vitest"
import * as Layer from "effect/Layer"
import * as Effect from "effect/Effect"
import { Kafka, logLevel } from "kafkajs"
import { inject } from "vitest"
import * as Producer from "../src/Producer.js"
import * as KafkaJs from "../src/KafkaJs.js"
import { valueString } from "../src/ConsumerRecord.js"
import { producerSuite, ProducerTestKit, readTopic } from "./producerSuite.js"
import { runJava } from "./support/kafkaKit.js"

const brokers = process.env.KAFKA_BROKERS || inject("kafkaBrokers")

if (brokers) {
  const list = brokers.split(",")
  const readerLayer = KafkaJs.layer({
    brokers: list,
    clientId: "producer-suite-reader",
    maxWaitTime: "100 millis",
    logLevel: "error"
  })
  producerSuite(
    "KafkaJs producer",
    (settings) =>
      KafkaJs.layerProducer({ brokers: list, clientId: "producer-suite", logLevel: "nothing", ...settings }),
    (settings) => KafkaJs.layerTransactionalProducer({ brokers: list, logLevel: "nothing", ...settings }),
    () =>
      Layer.merge(
        readerLayer,
        Layer.succeed(ProducerTestKit, {
          createTopic: (topic, partitions) => KafkaJs.createTopic(list, topic, partitions)
        })
      )
  )

  describe("KafkaJs producer: refusals only the broker knows", () => {
    /** Creates a topic of one partition that takes records of at most 1,000 bytes. */
    const smallMessagesTopic = Effect.gen(function*() {
      const topic = `small-messages-${crypto.randomUUID().slice(0, 8)}`
      yield* Effect.tryPromise(async () => {
        const admin = new Kafka({ brokers: list, logLevel: logLevel.NOTHING }).admin()
        await admin.connect()
        try {
          await admin.createTopics({
            topics: [{ topic, numPartitions: 1, configEntries: [{ name: "max.message.bytes", value: "1000" }] }],
            waitForLeaders: false
          })
        } finally {
          await admin.disconnect()
        }
      })
      // kafkajs's own wait for leaders gives up on a new topic's UNKNOWN_TOPIC_OR_PARTITION; this one waits.
      yield* KafkaJs.createTopic(list, topic, 1)
      return topic
    })

    it.live(
      "a request refused for one of its partitions: the other was written, and its failure says the outcome is unknown",
      () =>
        Effect.gen(function*() {
          const small = yield* smallMessagesTopic
          const normal = `normal-${crypto.randomUUID().slice(0, 8)}`
          yield* KafkaJs.createTopic(list, normal, 1)
          // One broker leads both partitions: kafkajs writes both records in one produce request.
          const [kept, refused] = yield* Effect.all([
            Effect.flip(Producer.send({ topic: normal, value: "kept" })),
            Effect.flip(Producer.send({ topic: small, value: new Uint8Array(5_000) }))
          ], { concurrency: "unbounded" })
          const normalLog = yield* readTopic(normal, 1)
          const smallLog = yield* readTopic(small, 1)
          // What the broker did: wrote the record to normal, refused the one to small.
          assert.deepStrictEqual(normalLog[0]!.map(valueString), ["kept"])
          assert.deepStrictEqual(smallLog[0]!, [])
          // What the producer can say: kafkajs reports MESSAGE_TOO_LARGE for the request, not for which partition.
          for (const error of [kept, refused]) {
            assert.strictEqual(error.reason, "OutcomeUnknown", `not said refused: ${error.message}`)
            assert.match(error.detail ?? "", /^outcome unknown/, error.message)
            assert.include(error.detail ?? "", "MESSAGE_TOO_LARGE")
          }
          // The producer goes on.
          const after = yield* Producer.send({ topic: normal, value: "after" })
          assert.strictEqual(after.offset, normalLog[0]![0]!.offset + 1n)
        }).pipe(
          Effect.provide(KafkaJs.layerProducer({ brokers: list, logLevel: "nothing", linger: "100 millis" })),
          Effect.provide(readerLayer),
          Effect.scoped
        ),
      60_000
    )

    it.live(
      "a record larger than the topic's max.message.bytes fails with RecordTooLarge naming the topic; what was acknowledged stays",
      () =>
        Effect.gen(function*() {
          const topic = yield* smallMessagesTopic
          const kept = yield* Producer.send({ topic, value: "small" })
          // Below the producer's maxRequestSize: only the broker can refuse it.
          const error = yield* Effect.flip(Producer.send({ topic, value: new Uint8Array(5_000) }))
          assert.strictEqual(error.reason, "RecordTooLarge")
          assert.strictEqual(error.code, "MESSAGE_TOO_LARGE")
          assert.include(error.message, topic)
          const after = yield* Producer.send({ topic, value: "after" })
          assert.strictEqual(after.offset, kept.offset + 1n)
        }).pipe(
          Effect.provide(KafkaJs.layerProducer({ brokers: list, logLevel: "nothing", linger: 0 })),
          Effect.scoped
        ),
      60_000
    )
  })

  describe("KafkaJs producer and the Java client", () => {
    /** Writes one record per key with the Java client (the broker's kafka-clients, default partitioner); key → partition. */
    const javaPartitions = (topic: string, keys: ReadonlyArray<string>) =>
      Effect.map(runJava("KeyPartitions.java", [brokers, topic, ...keys]), (stdout) => {
        const out = new Map<string, number>()
        for (const line of stdout.trim().split("\n")) {
          const at = line.lastIndexOf(" ", line.lastIndexOf(" ") - 1)
          out.set(line.slice(0, at), Number(line.slice(at + 1).split(" ")[0]))
        }
        return out
      })

    it.live("every key lands on the partition the Java client's producer writes it to", () =>
      Effect.gen(function*() {
        const topic = `java-keys-${crypto.randomUUID().slice(0, 8)}`
        yield* KafkaJs.createTopic(list, topic, 12)
        const keys = Array.from({ length: 300 }, (_, i) =>
          i % 3 === 0 ? `user-${i}` : i % 3 === 1 ? `ключ-${i}-é` : `${crypto.randomUUID()}${"x".repeat(i % 7)}`)
        const java = yield* javaPartitions(topic, keys)
        assert.strictEqual(java.size, keys.length)
        const ours = yield* Producer.sendAll(keys.map((key) => ({ topic, key, value: "typescript" })))
        const spread = new Set<number>()
        keys.forEach((key, i) => {
          assert.strictEqual(ours[i]!.partition, java.get(key), `key ${key}`)
          spread.add(ours[i]!.partition)
        })
        assert.strictEqual(spread.size, 12)
      }).pipe(
        Effect.provide(KafkaJs.layerProducer({ brokers: list, logLevel: "nothing" })),
        Effect.scoped
      ), 120_000)
  })
} else {
  describe("KafkaJs producer", () => {
    it("needs a Kafka broker", () => {
      assert.fail(`No Kafka broker for this run: ${inject("kafkaSetupError") || "KAFKA_BROKERS is unset"}`)
    })
  })
}
