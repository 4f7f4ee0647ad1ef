import { assert, describe, it } from "@effect/vitest"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { inject } from "vitest"
import { Driver } from "../src/Driver.js"
import * as KafkaJs from "../src/KafkaJs.js"
import { ConfigError, DriverError } from "../src/KafkaError.js"
import { driverSuite, DriverTestKit } from "./driverSuite.js"

const brokers = process.env.KAFKA_BROKERS || inject("kafkaBrokers")

/** The suite's admin needs, on a real broker through the module's own helpers. */
const testKit = (brokers: string): Layer.Layer<DriverTestKit> =>
  Layer.succeed(DriverTestKit, {
    createTopic: (topic, partitions) => KafkaJs.createTopic(brokers, topic, partitions),
    produce: (topic, partition, values) =>
      KafkaJs.produce(brokers, topic, values.map((value) => ({ partition, value, key: `${partition}` }))),
    endOffsets: (topic) => KafkaJs.endOffsets(brokers, topic)
  })

if (brokers) {
  driverSuite(
    "KafkaJs driver",
    Layer.merge(
      KafkaJs.layer({
        brokers: brokers.split(","),
        clientId: "driver-suite",
        maxWaitTime: "100 millis",
        heartbeatInterval: "500 millis",
        logLevel: "error"
      }),
      testKit(brokers)
    ),
    { sessionTimeout: "10 seconds", rebalanceTimeout: "20 seconds", pollTimeout: "200 millis" }
  )
  describe("KafkaJs driver on a real broker", () => {
    it.scopedLive("a session on a topic that does not exist fails to connect with a DriverError", () =>
      Effect.gen(function*() {
        const driver = yield* Driver
        const topic = `missing-${crypto.randomUUID().slice(0, 8)}`
        const error = yield* Effect.flip(driver.connect({
          groupId: `group-${crypto.randomUUID().slice(0, 8)}`,
          clientId: "missing",
          subscription: { _tag: "Topics", topics: [topic] },
          maxPollRecords: 10,
          pollTimeout: Duration.millis(100),
          sessionTimeout: Duration.seconds(10),
          rebalanceTimeout: Duration.seconds(10)
        }))
        assert.instanceOf(error, DriverError)
        assert.include(error.message, "not host this topic-partition")
      }).pipe(
        Effect.provide(KafkaJs.layer({ brokers: brokers.split(","), logLevel: "nothing", retry: { retries: 1 } }))
      ))
  })
} else {
  describe("KafkaJs driver", () => {
    it("needs a Kafka broker", () => {
      assert.fail(
        `No Kafka broker for this run: ${inject("kafkaSetupError") || "KAFKA_BROKERS is unset"}. ` +
          "Install Java 17 and Maven so that scripts/kafka.sh can start one, or point the tests at a running broker: " +
          "KAFKA_BROKERS=host:port npm test"
      )
    })
  })
}

describe("KafkaJs.layer configuration", () => {
  const configError = (config: KafkaJs.Config) =>
    Effect.flip(Effect.provide(Driver, KafkaJs.layer(config)))

  it.effect("rejects an empty broker list, naming the field", () =>
    Effect.gen(function*() {
      const error = yield* configError({ brokers: [] })
      assert.instanceOf(error, ConfigError)
      assert.strictEqual(error.field, "brokers")
    }))

  it.effect("rejects broker addresses that are not host:port", () =>
    Effect.gen(function*() {
      for (const broker of ["localhost", "localhost:", "localhost:99999", ":9092", "kafka://h:9092", "a b:1"]) {
        const error = yield* configError({ brokers: [broker] })
        assert.strictEqual(error.field, "brokers", broker)
        assert.include(error.message, broker)
      }
    }))

  it.effect("accepts host names, IPv4 and bracketed IPv6 addresses", () =>
    Effect.gen(function*() {
      const parsed = yield* KafkaJs.parseBrokers("kafka-1.internal:9092, 10.0.0.1:19092,[::1]:9093")
      assert.deepStrictEqual(parsed, ["kafka-1.internal:9092", "10.0.0.1:19092", "[::1]:9093"])
    }))

  it.effect("rejects invalid tuning values, naming the field", () =>
    Effect.gen(function*() {
      const concurrency = yield* configError({ brokers: ["h:1"], partitionsConsumedConcurrently: 0 })
      assert.strictEqual(concurrency.field, "partitionsConsumedConcurrently")
      const wait = yield* configError({ brokers: ["h:1"], maxWaitTime: -5 })
      assert.strictEqual(wait.field, "maxWaitTime")
      const clientId = yield* configError({ brokers: ["h:1"], clientId: " " })
      assert.strictEqual(clientId.field, "clientId")
    }))
})
