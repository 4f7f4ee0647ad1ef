import { assert, describe, it } from "@effect/vitest"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as HashMap from "effect/HashMap"
import * as Layer from "effect/Layer"
import * as Logger from "effect/Logger"
import * as LogLevel from "effect/LogLevel"
import * as Redacted from "effect/Redacted"
import { createRequire } from "node:module"
import { inspect } from "node:util"
import {
  KafkaJSConnectionError,
  KafkaJSGroupCoordinatorNotFound,
  KafkaJSNonRetriableError,
  KafkaJSNumberOfRetriesExceeded,
  KafkaJSProtocolError,
  KafkaJSRequestTimeoutError,
  KafkaJSSASLAuthenticationError,
  type KafkaMessage
} from "kafkajs"
import { inject } from "vitest"
import { Driver } from "../src/Driver.js"
import * as KafkaJs from "../src/KafkaJs.js"
import { InvalidConfig, DriverError } from "../src/KafkaError.js"
import { toPlain } from "../src/ConsumerRecord.js"
import { commitFailed, isRetriable, toConsumerRecord } from "../src/internal/kafkajs/driver.js"
import { heartbeatAnswer, ResponseTap } from "../src/internal/kafkajs/wire.js"
import { driverSuite, DriverTestTransactions } from "./driverSuite.js"
import { openTransaction, testKit } from "./support/kafkaKit.js"

const brokers = process.env.KAFKA_BROKERS || inject("kafkaBrokers")

const SECRET = "s3cret-Pa55word-that-must-not-leak"

const sasl: KafkaJs.SaslOptions = { mechanism: "plain", username: "alice", password: Redacted.make(SECRET) }

/** Every line logged, with its annotations, as text. */
const captureLogs = () => {
  const lines: Array<string> = []
  const logger = Logger.make(({ annotations, logLevel: level, message }) => {
    const entries = HashMap.toEntries(annotations)
    lines.push(`${level.label} ${inspect(message, { depth: 10 })} ${inspect(entries, { depth: 10 })}`)
  })
  const layer = Layer.merge(Logger.replace(Logger.defaultLogger, logger), Logger.minimumLogLevel(LogLevel.All))
  return { lines, layer }
}

if (brokers) {
  driverSuite(
    "KafkaJs driver",
    Layer.mergeAll(
      KafkaJs.layer({
        brokers: brokers.split(","),
        clientId: "driver-suite",
        maxWaitTime: "100 millis",
        heartbeatInterval: "500 millis",
        logLevel: "error"
      }),
      testKit(brokers),
      Layer.succeed(DriverTestTransactions, { openTransaction: openTransaction(brokers) })
    ),
    // The broker's smallest session timeout: a revoke held past it shows that the member's session is kept.
    { sessionTimeout: "6 seconds", rebalanceTimeout: "20 seconds", pollTimeout: "200 millis" }
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
        assert.isFalse(error.retriable, "an unknown topic does not go away by reconnecting")
      }).pipe(
        Effect.provide(KafkaJs.layer({ brokers: brokers.split(","), logLevel: "nothing", retry: { retries: 1 } }))
      ))

    it.scopedLive("a broker that does not answer fails to connect with a retriable DriverError", () =>
      Effect.gen(function*() {
        const driver = yield* Driver
        const error = yield* Effect.flip(driver.connect({
          groupId: `group-${crypto.randomUUID().slice(0, 8)}`,
          clientId: "unreachable",
          subscription: { _tag: "Topics", topics: ["any"] },
          maxPollRecords: 10,
          pollTimeout: Duration.millis(100),
          sessionTimeout: Duration.seconds(10),
          rebalanceTimeout: Duration.seconds(10)
        }))
        assert.instanceOf(error, DriverError)
        assert.isTrue(error.retriable, `not retriable: ${error.message}`)
      }).pipe(
        // Port 9 (discard) refuses connections on loopback.
        Effect.provide(KafkaJs.layer({ brokers: ["127.0.0.1:9"], logLevel: "nothing", retry: { retries: 0 } }))
      ))

    it.scopedLive("the SASL password appears in no log line and in no error, even at debug level", () => {
      const { layer, lines } = captureLogs()
      return Effect.gen(function*() {
        const driver = yield* Driver
        // The broker's listener has no SASL: the handshake fails, after kafkajs logged every step of it.
        const error = yield* Effect.flip(driver.connect({
          groupId: `group-${crypto.randomUUID().slice(0, 8)}`,
          clientId: "sasl",
          subscription: { _tag: "Topics", topics: ["any"] },
          maxPollRecords: 10,
          pollTimeout: Duration.millis(100),
          sessionTimeout: Duration.seconds(10),
          rebalanceTimeout: Duration.seconds(10)
        }))
        yield* Effect.sleep("100 millis")
        assert.instanceOf(error, DriverError)
        assert.notInclude(inspect(error, { depth: 10 }), SECRET)
        assert.notInclude(JSON.stringify(error), SECRET)
        assert.isTrue(lines.some((line) => line.includes("SASL") || line.includes("sasl")), lines.join("\n"))
        for (const line of lines) assert.notInclude(line, SECRET)
      }).pipe(
        Effect.provide(
          KafkaJs.layer({ brokers: brokers.split(","), sasl, logLevel: "debug", retry: { retries: 0 } })
        ),
        Effect.provide(layer)
      )
    })
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
  const configError = (config: KafkaJs.Config) => Effect.flip(Effect.provide(Driver, KafkaJs.layer(config)))

  it.effect("rebalances eagerly only: cooperative and consumer are refused, saying why", () =>
    Effect.gen(function*() {
      yield* Effect.provide(Driver, KafkaJs.layer({ brokers: ["h:1"], rebalance: "eager" }))
      for (const rebalance of ["cooperative", "consumer"]) {
        const error = yield* configError({ brokers: ["h:1"], rebalance: rebalance as "eager" })
        assert.instanceOf(error, InvalidConfig)
        assert.strictEqual(error.field, "rebalance")
        assert.include(error.message, "eagerly only")
        assert.include(error.message, rebalance)
      }
    }))

  it.effect("rejects an empty broker list, naming the field", () =>
    Effect.gen(function*() {
      const error = yield* configError({ brokers: [] })
      assert.instanceOf(error, InvalidConfig)
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

  it.effect("a configuration error never carries the SASL password, nor do the settings when printed", () =>
    Effect.gen(function*() {
      const { layer, lines } = captureLogs()
      const config: KafkaJs.Config = { brokers: ["h:1"], sasl: { ...sasl, username: "" }, logLevel: "debug" }
      const error = yield* configError(config).pipe(Effect.provide(layer))
      assert.instanceOf(error, InvalidConfig)
      assert.strictEqual(error.field, "sasl.username")
      for (const text of [error.message, String(error), inspect(error, { depth: 10 }), JSON.stringify(error)]) {
        assert.notInclude(text, SECRET)
      }
      assert.notInclude(inspect(config, { depth: 10 }), SECRET)
      assert.notInclude(JSON.stringify(config), SECRET)
      for (const line of lines) assert.notInclude(line, SECRET)
      const plain = yield* configError({
        brokers: ["h:1"],
        sasl: { mechanism: "plain", username: "alice", password: SECRET as unknown as Redacted.Redacted<string> }
      })
      assert.strictEqual(plain.field, "sasl.password")
      assert.notInclude(plain.message, SECRET)
    }))
})

describe("the session's socket layer", () => {
  /** A small deterministic generator, so that a failure can be replayed. */
  const random = (seed: number) => () => {
    seed = (seed * 1103515245 + 12345) % 2147483648
    return seed / 2147483648
  }

  const frame = (correlationId: number, body: Buffer) => {
    const out = Buffer.alloc(8 + body.length)
    out.writeInt32BE(4 + body.length, 0)
    out.writeInt32BE(correlationId, 4)
    body.copy(out, 8)
    return out
  }

  it("takes out the answers to its own heartbeats however the broker's bytes are split, and passes the rest on", () => {
    for (let seed = 1; seed <= 200; seed++) {
      const next = random(seed)
      const answers: Array<number> = []
      const tap = new ResponseTap()
      const theirs: Array<Buffer> = []
      const ours: Array<number> = []
      const stream: Array<Buffer> = []
      let own = -1
      for (let i = 0; i < 30; i++) {
        if (next() < 0.3) {
          // An answer to a heartbeat (v3: throttle_time_ms, error_code), registered before it arrives.
          const code = Math.floor(next() * 100)
          tap.waiting.set(own, heartbeatAnswer(3, (code) => answers.push(code)))
          const body = Buffer.alloc(6)
          body.writeInt16BE(code, 4)
          stream.push(frame(own--, body))
          ours.push(code)
        } else {
          const body = Buffer.alloc(Math.floor(next() < 0.1 ? next() * 70_000 : next() * 40))
          for (let b = 0; b < body.length; b++) body[b] = Math.floor(next() * 256)
          const f = frame(i, body)
          theirs.push(f)
          stream.push(f)
        }
      }
      const bytes = Buffer.concat(stream)
      const forwarded: Array<Buffer> = []
      for (let at = 0; at < bytes.length;) {
        const size = Math.max(1, Math.floor(next() < 0.2 ? next() * 5 : next() * 3000))
        tap.feed(bytes.subarray(at, at + size), (data) => forwarded.push(Buffer.from(data)))
        at += size
      }
      assert.isTrue(Buffer.concat(forwarded).equals(Buffer.concat(theirs)), `seed ${seed}: kafkajs's bytes changed`)
      assert.deepStrictEqual(answers, ours, `seed ${seed}`)
      assert.strictEqual(tap.waiting.size, 0)
    }
  })

  it("passes chunks through untouched while none of its own requests waits for an answer", () => {
    const tap = new ResponseTap()
    const stream = Buffer.concat([frame(0, Buffer.alloc(10)), frame(1, Buffer.alloc(3))])
    const chunks = [stream.subarray(0, 5), stream.subarray(5, 17), stream.subarray(17)]
    const forwarded: Array<Buffer> = []
    for (const chunk of chunks) tap.feed(chunk, (data) => forwarded.push(data))
    assert.deepStrictEqual(forwarded.length, chunks.length)
    chunks.forEach((chunk, i) => assert.strictEqual(forwarded[i], chunk))
  })
})

describe("kafkajs errors, classified", () => {
  // kafkajs's own table of protocol errors (src/protocol/error.js), so that the names checked are the ones it uses.
  const { createErrorFromCode } = createRequire(import.meta.url)("kafkajs/src/protocol/error") as {
    readonly createErrorFromCode: (code: number) => { readonly type: string; readonly retriable: boolean }
  }
  const protocol = (code: number) => new KafkaJSProtocolError(createErrorFromCode(code) as never)
  const exhausted = (cause: Error) => new KafkaJSNumberOfRetriesExceeded(cause, { retryCount: 5, retryTime: 1000 })
  // kafkajs's type declarations leave out some constructor arguments its errors take.
  const bailed = (cause: Error): Error => Reflect.construct(KafkaJSNonRetriableError, [cause, { cause }])
  const partitions = [{ topic: "t", partition: 0 }]
  const coordinatorNotFound = () =>
    Reflect.construct(KafkaJSGroupCoordinatorNotFound, ["Failed to find group coordinator"]) as Error

  it("a refused commit gets the reason that decides what happens to its positions", () => {
    const cases: ReadonlyArray<readonly [Error, string]> = [
      [protocol(27), "RebalanceInProgress"],
      [exhausted(protocol(27)), "RebalanceInProgress"],
      [protocol(16), "CoordinatorNotAvailable"], // NOT_COORDINATOR_FOR_GROUP
      [protocol(15), "CoordinatorNotAvailable"], // GROUP_COORDINATOR_NOT_AVAILABLE
      [protocol(14), "CoordinatorNotAvailable"], // GROUP_LOAD_IN_PROGRESS
      // What a commit meets while the broker restarts: no broker answers where the coordinator is.
      [coordinatorNotFound(), "CoordinatorNotAvailable"],
      [protocol(7), "Timeout"], // REQUEST_TIMED_OUT
      [new KafkaJSRequestTimeoutError("Request OffsetCommit(key: 8, version: 5) timed out"), "Timeout"],
      [new KafkaJSConnectionError("Connection error: ECONNREFUSED"), "Disconnected"],
      [exhausted(new KafkaJSConnectionError("Closed connection")), "Disconnected"],
      [protocol(13), "Disconnected"], // NETWORK_EXCEPTION
      [protocol(22), "IllegalGeneration"],
      [bailed(protocol(22)), "IllegalGeneration"],
      [protocol(25), "UnknownMember"], // UNKNOWN_MEMBER_ID
      [protocol(82), "Other"], // FENCED_INSTANCE_ID: fatal, a rejoin would fence the newer member with the same id
      [protocol(30), "Unauthorized"], // GROUP_AUTHORIZATION_FAILED
      [protocol(29), "Unauthorized"], // TOPIC_AUTHORIZATION_FAILED
      [protocol(12), "Other"], // OFFSET_METADATA_TOO_LARGE
      [protocol(28), "Other"], // INVALID_COMMIT_OFFSET_SIZE
      [protocol(6), "Transient"], // NOT_LEADER_FOR_PARTITION: retriable, not about commits
      [protocol(87), "Other"], // INVALID_RECORD: not retriable
      [new Error("something else"), "Other"]
    ]
    for (const [error, reason] of cases) {
      const failed = commitFailed(error, partitions)
      assert.strictEqual(failed.reason, reason, `${error.name}: ${error.message}`)
      assert.deepStrictEqual(failed.partitions, partitions)
    }
    assert.isTrue(commitFailed(protocol(27), partitions).retriable)
    assert.isTrue(commitFailed(protocol(25), partitions).notOwned)
    assert.isTrue(commitFailed(protocol(30), partitions).fatal)
  })

  it("an error is retriable when it goes away once the cluster is reachable again", () => {
    const retriable = [
      new KafkaJSConnectionError("Connection error: ECONNREFUSED"),
      exhausted(new KafkaJSConnectionError("Closed connection")),
      new KafkaJSRequestTimeoutError("Request Fetch(key: 1, version: 11) timed out"),
      exhausted(protocol(5)), // LEADER_NOT_AVAILABLE
      protocol(8), // BROKER_NOT_AVAILABLE
      protocol(15), // GROUP_COORDINATOR_NOT_AVAILABLE
      coordinatorNotFound()
    ]
    const fatal = [
      exhausted(protocol(3)), // UNKNOWN_TOPIC_OR_PARTITION
      Reflect.construct(KafkaJSSASLAuthenticationError, ["SASL PLAIN authentication failed"]) as Error,
      protocol(29), // TOPIC_AUTHORIZATION_FAILED
      protocol(34), // ILLEGAL_SASL_STATE
      new Error("Invalid configuration")
    ]
    for (const error of retriable) assert.isTrue(isRetriable(error), `${error.name}: ${error.message}`)
    for (const error of fatal) assert.isFalse(isRetriable(error), `${error.name}: ${error.message}`)
  })
})

describe("records over kafkajs's messages", () => {
  // A message as kafkajs decodes it; older message formats leave out the headers (and kafkajs types allow no key).
  const message = (fields: Readonly<Record<string, unknown>>): KafkaMessage =>
    Object.assign(
      { key: null, value: Buffer.from("v"), timestamp: "1700000000000", attributes: 0, offset: "0", headers: {} },
      fields
    ) as never
  const tp = { topic: "t", partition: 2 }
  const text = (bytes: Uint8Array | null | undefined) => bytes == null ? bytes : new TextDecoder().decode(bytes)

  it("offsets are exact at any size, below and above 2^53", () => {
    for (const offset of ["0", "41", "4294967296", "9007199254740991", "9007199254740993", "9223372036854775807"]) {
      assert.strictEqual(toConsumerRecord(tp, message({ offset })).offset, BigInt(offset))
    }
  })

  it("headers: kafkajs's buffers as they are; a repeated header gives its last value, a text value its bytes", () => {
    const single = { a: Buffer.from("1"), b: Buffer.from("2") }
    const record = toConsumerRecord(tp, message({ headers: single }))
    assert.deepStrictEqual(Object.keys(record.headers), ["a", "b"])
    assert.strictEqual(text(record.headers.a), "1")
    const mixed = toConsumerRecord(
      tp,
      message({ headers: { a: [Buffer.from("first"), Buffer.from("last")], b: "text", c: undefined } })
    )
    assert.deepStrictEqual(Object.keys(mixed.headers), ["a", "b"])
    assert.strictEqual(text(mixed.headers.a), "last")
    assert.instanceOf(mixed.headers.b, Uint8Array)
    assert.strictEqual(text(mixed.headers.b), "text")
    assert.deepStrictEqual(Object.keys(toConsumerRecord(tp, message({ headers: undefined })).headers), [])
  })

  it("a missing key and a tombstone read as null; printed and as JSON, a record shows its fields", () => {
    const record = toConsumerRecord(tp, message({ key: undefined, value: null, offset: "7" }))
    assert.strictEqual(record.key, null)
    assert.strictEqual(record.value, null)
    assert.strictEqual(record.timestamp, 1_700_000_000_000)
    assert.deepStrictEqual(toPlain(record), {
      topic: "t",
      partition: 2,
      offset: 7n,
      key: null,
      value: null,
      headers: {},
      timestamp: 1_700_000_000_000
    })
    assert.strictEqual(inspect(record), inspect(toPlain(record)))
    assert.strictEqual(
      JSON.stringify(record, (_, value) => typeof value === "bigint" ? value.toString() : value),
      `{"topic":"t","partition":2,"offset":"7","key":null,"value":null,"headers":{},"timestamp":1700000000000}`
    )
  })
})
