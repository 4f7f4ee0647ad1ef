import { assert, describe, it } from "@effect/vitest"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as HashMap from "effect/HashMap"
import * as Layer from "effect/Layer"
import * as Logger from "effect/Logger"
import * as LogLevel from "effect/LogLevel"
import * as Redacted from "effect/Redacted"
import { inspect } from "node:util"
import { inject } from "vitest"
import { Driver } from "../src/Driver.js"
import { commitFailed, isRetriable } from "../src/internal/platformatic/errors.js"
import { DriverError, InvalidConfig } from "../src/KafkaError.js"
import * as Platformatic from "../src/Platformatic.js"
import { driverSuite, DriverTestTransactions } from "./driverSuite.js"
import { openTransaction, testKit } from "./support/kafkaKit.js"

const brokers = process.env.KAFKA_BROKERS || inject("kafkaBrokers")

if (brokers) {
  driverSuite(
    "Platformatic driver",
    Layer.mergeAll(
      Platformatic.layer({
        brokers: brokers.split(","),
        clientId: "driver-suite",
        maxWaitTime: "100 millis",
        heartbeatInterval: "500 millis"
      }),
      testKit(brokers),
      Layer.succeed(DriverTestTransactions, { openTransaction: openTransaction(brokers) })
    ),
    // The broker's smallest session timeout: a revoke held past it shows that the member's session is kept.
    { sessionTimeout: "6 seconds", rebalanceTimeout: "20 seconds", pollTimeout: "200 millis" }
  )
}

const SECRET = "s3cret-Pa55word-that-must-not-leak"
const sasl: Platformatic.SaslOptions = { mechanism: "plain", username: "alice", password: Redacted.make(SECRET) }

const sessionOptions = (topic: string, clientId: string) => ({
  groupId: `group-${crypto.randomUUID().slice(0, 8)}`,
  clientId,
  subscription: { _tag: "Topics" as const, topics: [topic] },
  maxPollRecords: 10,
  pollTimeout: Duration.millis(100),
  sessionTimeout: Duration.seconds(10),
  rebalanceTimeout: Duration.seconds(10)
})

if (brokers) {
  describe("Platformatic driver on a real broker", () => {
    it.scopedLive("a session on a topic that does not exist fails to connect with a DriverError naming it", () =>
      Effect.gen(function*() {
        const driver = yield* Driver
        const topic = `missing-${crypto.randomUUID().slice(0, 8)}`
        const error = yield* Effect.flip(driver.connect(sessionOptions(topic, "missing")))
        assert.instanceOf(error, DriverError)
        assert.include(error.message, `no such topic: ${topic}`)
        assert.isFalse(error.retriable, "an unknown topic does not go away by reconnecting")
      }).pipe(Effect.provide(Platformatic.layer({ brokers: brokers.split(","), retries: 1 }))))

    it.scopedLive("a partition subscription naming a partition the topic does not have fails, naming it", () =>
      Effect.gen(function*() {
        const driver = yield* Driver
        const topic = `two-${crypto.randomUUID().slice(0, 8)}`
        yield* Platformatic.createTopic(brokers.split(","), topic, 2)
        const error = yield* Effect.flip(driver.connect({
          ...sessionOptions(topic, "partitions"),
          subscription: { _tag: "Partitions", partitions: [{ topic, partition: 1 }, { topic, partition: 2 }] }
        }))
        assert.instanceOf(error, DriverError)
        assert.include(error.message, `no such partition: ${topic}-2`)
        assert.notInclude(error.message, `${topic}-1`)
      }).pipe(Effect.provide(Platformatic.layer({ brokers: brokers.split(",") }))))

    it.scopedLive("a broker that does not answer fails to connect with a retriable DriverError", () =>
      Effect.gen(function*() {
        const driver = yield* Driver
        const error = yield* Effect.flip(driver.connect(sessionOptions("any", "unreachable")))
        assert.instanceOf(error, DriverError)
        assert.isTrue(error.retriable, `not retriable: ${error.message}`)
      }).pipe(
        // Port 9 (discard) refuses connections on loopback.
        Effect.provide(Platformatic.layer({ brokers: ["127.0.0.1:9"], retries: 0 }))
      ))

    it.scopedLive("the SASL password appears in no log line and in no error", () => {
      const lines: Array<string> = []
      const logger = Logger.make(({ annotations, message }) => {
        lines.push(`${inspect(message, { depth: 10 })} ${inspect(HashMap.toEntries(annotations), { depth: 10 })}`)
      })
      return Effect.gen(function*() {
        const driver = yield* Driver
        // The broker's listener has no SASL: the handshake fails.
        const error = yield* Effect.flip(driver.connect(sessionOptions("any", "sasl")))
        assert.instanceOf(error, DriverError)
        assert.notInclude(inspect(error, { depth: 10 }), SECRET)
        assert.notInclude(JSON.stringify(error), SECRET)
        for (const line of lines) assert.notInclude(line, SECRET)
      }).pipe(
        Effect.provide(Platformatic.layer({ brokers: brokers.split(","), sasl, retries: 0 })),
        Effect.provide(Layer.merge(Logger.replace(Logger.defaultLogger, logger), Logger.minimumLogLevel(LogLevel.All)))
      )
    })
  })
}

describe("Platformatic.layer configuration", () => {
  const configError = (config: Platformatic.Config) => Effect.flip(Effect.provide(Driver, Platformatic.layer(config)))

  it.effect("rejects an empty broker list and addresses that are not host:port, naming the field", () =>
    Effect.gen(function*() {
      assert.strictEqual((yield* configError({ brokers: [] })).field, "brokers")
      for (const broker of ["localhost", "localhost:99999", "kafka://h:9092"]) {
        const error = yield* configError({ brokers: [broker] })
        assert.instanceOf(error, InvalidConfig)
        assert.strictEqual(error.field, "brokers", broker)
        assert.include(error.message, broker)
      }
    }))

  it.effect("takes eager, cooperative and consumer rebalances, and refuses any other, naming it", () =>
    Effect.gen(function*() {
      for (const rebalance of ["eager", "cooperative", "consumer"] as const) {
        yield* Effect.provide(Driver, Platformatic.layer({ brokers: ["h:1"], rebalance }))
      }
      // A caller without the types (JavaScript, a configuration file) gets the refusal at run time.
      const error = yield* configError({ brokers: ["h:1"], rebalance: "sticky" as "eager" })
      assert.instanceOf(error, InvalidConfig)
      assert.strictEqual(error.field, "rebalance")
      assert.include(error.message, "sticky")
    }))

  it.effect("rejects invalid tuning values, naming the field", () =>
    Effect.gen(function*() {
      assert.strictEqual((yield* configError({ brokers: ["h:1"], maxWaitTime: -5 })).field, "maxWaitTime")
      assert.strictEqual((yield* configError({ brokers: ["h:1"], maxBytes: 0 })).field, "maxBytes")
      assert.strictEqual((yield* configError({ brokers: ["h:1"], retries: -1 })).field, "retries")
      assert.strictEqual((yield* configError({ brokers: ["h:1"], clientId: " " })).field, "clientId")
    }))

  it.effect("a configuration error never carries the SASL password", () =>
    Effect.gen(function*() {
      const error = yield* configError({ brokers: ["h:1"], sasl: { ...sasl, username: "" } })
      assert.strictEqual(error.field, "sasl.username")
      for (const text of [error.message, String(error), inspect(error, { depth: 10 }), JSON.stringify(error)]) {
        assert.notInclude(text, SECRET)
      }
      const plain = yield* configError({
        brokers: ["h:1"],
        sasl: { mechanism: "plain", username: "alice", password: SECRET as unknown as Redacted.Redacted<string> }
      })
      assert.strictEqual(plain.field, "sasl.password")
      assert.notInclude(plain.message, SECRET)
    }))
})

describe("@platformatic/kafka errors, classified", () => {
  const protocol = (apiId: string, canRetry = false) => Object.assign(new Error(apiId), { apiId, canRetry })
  const response = (...errors: Array<Error>) =>
    Object.assign(new AggregateError(errors, "Received response with error"), { code: "PLT_KFK_RESPONSE" })
  const tp = [{ topic: "t", partition: 0 }]

  it("a refused commit gets the reason that decides what happens to its positions", () => {
    const cases: ReadonlyArray<readonly [Error, string]> = [
      [response(protocol("REBALANCE_IN_PROGRESS")), "RebalanceInProgress"],
      [response(protocol("ILLEGAL_GENERATION")), "IllegalGeneration"],
      [response(protocol("UNKNOWN_MEMBER_ID")), "UnknownMember"],
      [response(protocol("NOT_COORDINATOR", true)), "CoordinatorNotAvailable"],
      [response(protocol("COORDINATOR_LOAD_IN_PROGRESS", true)), "CoordinatorNotAvailable"],
      [response(protocol("GROUP_AUTHORIZATION_FAILED")), "Unauthorized"],
      [Object.assign(new Error("Connection closed"), { code: "PLT_KFK_NETWORK" }), "Disconnected"],
      [response(protocol("OFFSET_METADATA_TOO_LARGE")), "Other"]
    ]
    for (const [error, reason] of cases) {
      const failed = commitFailed(error, tp)
      assert.strictEqual(failed.reason, reason, error.message)
      assert.deepStrictEqual(failed.partitions, tp)
    }
  })

  it("an error is retriable when it goes away once the cluster is reachable again", () => {
    assert.isTrue(isRetriable(response(protocol("UNSTABLE_OFFSET_COMMIT"))))
    assert.isTrue(isRetriable(response(protocol("COORDINATOR_LOAD_IN_PROGRESS"))))
    assert.isTrue(isRetriable(Object.assign(new Error("refused"), { code: "PLT_KFK_NETWORK" })))
    assert.isFalse(isRetriable(response(protocol("TOPIC_AUTHORIZATION_FAILED"))))
    assert.isFalse(isRetriable(new Error("Unknown topic t.")))
  })
})
