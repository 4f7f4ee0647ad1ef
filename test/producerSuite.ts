/**
 * The `Producer` contract as a behaviour suite, written once and run against every layer (kafkajs on a real broker,
 * the in-memory broker). Each supplies a function from settings to its producer layer and an environment layer with
 * the `Driver` the suite reads back with and a `ProducerTestKit`.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Chunk from "effect/Chunk"
import * as Context from "effect/Context"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Scope from "effect/Scope"
import type { ConsumerRecord } from "../src/ConsumerRecord.js"
import { keyString, valueString } from "../src/ConsumerRecord.js"
import { Driver, type IsolationLevel } from "../src/Driver.js"
import { InvalidConfig, type DriverError, ProduceFailed, TransactionFailed } from "../src/KafkaError.js"
import * as Producer from "../src/Producer.js"
import * as TopicPartition from "../src/TopicPartition.js"

export class ProducerTestKit extends Context.Tag("test/ProducerTestKit")<ProducerTestKit, {
  readonly createTopic: (topic: string, partitions: number) => Effect.Effect<void, unknown>
}>() {}

export interface ProducerSuiteOptions {
  /** vitest timeout of each test, in milliseconds. */
  readonly testTimeout?: number
}

const decoder = new TextDecoder()

/**
 * A reader of the topic's partitions from offset 0, through the layer's `Driver`: each `read` returns, per partition,
 * the records that arrived since the previous one, reading until every partition's position has reached its latest
 * offset (for read_committed, the last stable offset) or, with `atLeast`, until that many records were read in all.
 */
export const makeReader = (
  topic: string,
  partitions: number,
  options: { readonly isolationLevel?: IsolationLevel } = {}
) =>
  Effect.gen(function*() {
    const driver = yield* Driver
    const tps = Array.from({ length: partitions }, (_, partition) => ({ topic, partition }))
    const session = yield* driver.connect({
      groupId: `producer-suite-reader-${crypto.randomUUID()}`,
      clientId: "producer-suite-reader",
      subscription: { _tag: "Partitions", partitions: tps },
      maxPollRecords: 1000,
      pollTimeout: Duration.millis(100),
      sessionTimeout: Duration.seconds(10),
      rebalanceTimeout: Duration.seconds(20),
      isolationLevel: options.isolationLevel ?? "read_committed"
    })
    const positions = new Map<string, bigint>()
    const committedOnly = (options.isolationLevel ?? "read_committed") === "read_committed"
    const read = (atLeast?: number) =>
      Effect.gen(function*() {
        const offsets = yield* session.offsets(tps)
        const end = (tp: TopicPartition.TopicPartition) => {
          const o = offsets.get(TopicPartition.key(tp))!
          return committedOnly ? o.lastStable : o.latest
        }
        const out = new Map<string, Array<ConsumerRecord>>()
        const done = () =>
          atLeast !== undefined
            ? [...out.values()].reduce((n, list) => n + list.length, 0) >= atLeast
            : tps.every((tp) => (positions.get(TopicPartition.key(tp)) ?? -1n) >= end(tp))
        const started = Date.now()
        while (!done()) {
          if (Date.now() - started > 30_000) return yield* Effect.die(new Error(`${topic} not read to its end in 30 s`))
          for (const event of yield* session.poll) {
            if (event._tag === "Assigned") {
              for (const tp of event.partitions) {
                yield* session.seek(tp, 0n)
                positions.set(TopicPartition.key(tp), 0n)
              }
            } else if (event._tag === "Records") {
              const k = TopicPartition.key(event.partition)
              positions.set(k, event.next)
              const list = out.get(k) ?? []
              list.push(...Chunk.toReadonlyArray(event.records))
              out.set(k, list)
            }
          }
        }
        return tps.map((tp) => out.get(TopicPartition.key(tp)) ?? [])
      })
    return { read }
  })

/** Every record of the topic's partitions, read once from offset 0 (see `makeReader`). */
export const readTopic = (
  topic: string,
  partitions: number,
  options: { readonly isolationLevel?: IsolationLevel; readonly atLeast?: number } = {}
) =>
  Effect.flatMap(makeReader(topic, partitions, options), (reader) => reader.read(options.atLeast)).pipe(Effect.scoped)

/**
 * The partitions Kafka's Java client puts these keys on among 6 partitions: `(murmur2(key) & 0x7fffffff) % 6`, with
 * the murmur2 hashes published in Kafka's own tests (`UtilsTest.testMurmur2`): "21" -973932308, "foobar" -790332482,
 * "a-little-bit-long-string" -985981536, "a-little-bit-longer-string" -1486304829,
 * "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8" -58897971, "abc" 479470107.
 */
const javaHashes: ReadonlyArray<readonly [string, number]> = [
  ["21", -973932308],
  ["foobar", -790332482],
  ["a-little-bit-long-string", -985981536],
  ["a-little-bit-longer-string", -1486304829],
  ["lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971],
  ["abc", 479470107]
]

export const producerSuite = <R>(
  name: string,
  producerLayer: (settings: Producer.Settings) => Layer.Layer<Producer.Producer, InvalidConfig | DriverError, R>,
  transactionalLayer: (
    settings: Producer.TransactionalSettings
  ) => Layer.Layer<Producer.TransactionalProducer, InvalidConfig | DriverError | TransactionFailed, R>,
  environment: () => Layer.Layer<Driver | ProducerTestKit | R, unknown>,
  options: ProducerSuiteOptions = {}
) => {
  const timeout = options.testTimeout ?? 60_000
  const topicName = (label: string) => `producer-suite-${label}-${crypto.randomUUID().slice(0, 8)}`
  const createTopic = (topic: string, partitions: number) =>
    Effect.flatMap(ProducerTestKit, (kit) => kit.createTopic(topic, partitions))

  /** Runs `body` with a producer of these settings, on a fresh environment. */
  const withProducer = <A, E>(
    settings: Producer.Settings,
    body: Effect.Effect<A, E, Producer.Producer | Driver | ProducerTestKit | Scope.Scope>
  ) => {
    const env = environment()
    return Effect.scoped(body).pipe(
      Effect.provide(Layer.provideMerge(producerLayer(settings), env))
    )
  }

  describe(`${name}: the Producer contract`, () => {
    it.live(
      "send returns the partition and offset the record was written at, with its key, value and headers",
      () =>
        Effect.gen(function*() {
          const topic = topicName("send")
          yield* createTopic(topic, 3)
          const metadata = yield* Producer.send({
            topic,
            key: "k-1",
            value: "hello",
            headers: { trace: "t-1", bytes: new Uint8Array([0, 255, 7]) },
            timestamp: 1_700_000_000_000
          })
          const second = yield* Producer.send({ topic, partition: metadata.partition, value: null })
          assert.strictEqual(metadata.topic, topic)
          assert.strictEqual(second.offset, metadata.offset + 1n)
          const log = (yield* readTopic(topic, 3))[metadata.partition]!
          const written = log.find((r) => r.offset === metadata.offset)!
          assert.strictEqual(keyString(written), "k-1")
          assert.strictEqual(valueString(written), "hello")
          assert.strictEqual(decoder.decode(written.headers.trace!), "t-1")
          assert.deepStrictEqual(Array.from(written.headers.bytes!), [0, 255, 7])
          assert.strictEqual(written.timestamp, 1_700_000_000_000)
          const tombstone = log.find((r) => r.offset === second.offset)!
          assert.strictEqual(tombstone.value, null)
        }).pipe((e) => withProducer({}, e)),
      timeout
    )

    it.live(
      "a key goes to the partition the Java client's default partitioner picks (murmur2)",
      () =>
        Effect.gen(function*() {
          const topic = topicName("murmur2")
          yield* createTopic(topic, 6)
          for (const [key, hash] of javaHashes) {
            const metadata = yield* Producer.send({ topic, key, value: key })
            assert.strictEqual(metadata.partition, (hash & 0x7fffffff) % 6, `key ${key}`)
          }
          // Bytes and the same key as a string are the same key.
          const bytes = yield* Producer.send({ topic, key: new TextEncoder().encode("foobar"), value: "bytes" })
          assert.strictEqual(bytes.partition, (-790332482 & 0x7fffffff) % 6)
          const log = yield* readTopic(topic, 6)
          for (const [key, hash] of javaHashes) {
            const partition = (hash & 0x7fffffff) % 6
            assert.isTrue(
              log[partition]!.some((r) => keyString(r) === key),
              `${key} read back from partition ${partition}`
            )
          }
        }).pipe((e) => withProducer({}, e)),
      timeout
    )

    it.live(
      "records sent from many fibers at once each get their own metadata, and land where it says",
      () =>
        Effect.gen(function*() {
          const topic = topicName("fibers")
          yield* createTopic(topic, 4)
          const sent = yield* Effect.forEach(
            Array.from({ length: 2000 }, (_, i) => i),
            (i) => Producer.send({ topic, key: `key-${i % 50}`, value: `value-${i}` }),
            { concurrency: "unbounded" }
          )
          const log = yield* readTopic(topic, 4)
          assert.strictEqual(log.reduce((n, p) => n + p.length, 0), 2000)
          const seen = new Set<string>()
          sent.forEach((metadata, i) => {
            const record = log[metadata.partition]!.find((r) => r.offset === metadata.offset)
            assert.isDefined(record, `value-${i} at ${metadata.partition}@${metadata.offset}`)
            assert.strictEqual(valueString(record!), `value-${i}`)
            const where = `${metadata.partition}@${metadata.offset}`
            assert.isFalse(seen.has(where))
            seen.add(where)
          })
        }).pipe((e) => withProducer({ linger: "5 millis" }, e)),
      timeout
    )

    it.live(
      "sendAll writes a key's records in the order given, and answers in that order",
      () =>
        Effect.gen(function*() {
          const topic = topicName("order")
          yield* createTopic(topic, 3)
          const records = Array.from({ length: 3000 }, (_, i) => ({ topic, key: `k${i % 7}`, value: `${i}` }))
          const metadata = yield* Producer.sendAll(records)
          assert.strictEqual(metadata.length, 3000)
          const log = yield* readTopic(topic, 3)
          const byKey = new Map<string, Array<number>>()
          for (const partition of log) {
            for (const r of partition) {
              const list = byKey.get(keyString(r)!) ?? []
              list.push(Number(valueString(r)))
              byKey.set(keyString(r)!, list)
            }
          }
          for (const [key, values] of byKey) {
            assert.deepStrictEqual(values, [...values].sort((a, b) => a - b), `order of ${key}`)
          }
          assert.strictEqual([...byKey.values()].reduce((n, v) => n + v.length, 0), 3000)
          metadata.forEach((m, i) => {
            assert.strictEqual(valueString(log[m.partition]!.find((r) => r.offset === m.offset)!), `${i}`)
          })
        }).pipe((e) => withProducer({ batchSize: 16 * 1024 }, e)),
      timeout
    )

    it.live(
      "records with neither key nor partition are spread over the partitions, batch by batch",
      () =>
        Effect.gen(function*() {
          const topic = topicName("sticky")
          yield* createTopic(topic, 3)
          const used = new Set<number>()
          for (let round = 0; round < 12; round++) {
            const metadata = yield* Producer.sendAll(
              Array.from({ length: 10 }, (_, i) => ({ topic, value: `${round}-${i}` }))
            )
            // One batch, one partition: the Java client's sticky partitioner.
            assert.strictEqual(new Set(metadata.map((m) => m.partition)).size, 1)
            used.add(metadata[0]!.partition)
          }
          assert.strictEqual(used.size, 3)
        }).pipe((e) => withProducer({ linger: 0 }, e)),
      timeout
    )

    it.live(
      "a record for a topic that does not exist fails with UnknownTopic naming it; the others of its batch are written",
      () =>
        Effect.gen(function*() {
          const topic = topicName("known")
          const missing = topicName("missing")
          yield* createTopic(topic, 2)
          const [good, bad] = yield* Effect.all([
            Producer.send({ topic, key: "a", value: "kept" }),
            Effect.flip(Producer.send({ topic: missing, key: "a", value: "lost" }))
          ], { concurrency: "unbounded" })
          assert.instanceOf(bad, ProduceFailed)
          assert.strictEqual(bad.reason, "UnknownTopic")
          assert.strictEqual(bad.topic, missing)
          assert.include(bad.message, missing)
          const log = yield* readTopic(topic, 2)
          assert.strictEqual(valueString(log[good.partition]!.find((r) => r.offset === good.offset)!), "kept")
        }).pipe((e) => withProducer({ linger: "20 millis" }, e)),
      timeout
    )

    it.live("a partition the topic does not have fails with UnknownPartition naming it", () =>
      Effect.gen(function*() {
        const topic = topicName("partition")
        yield* createTopic(topic, 2)
        const error = yield* Effect.flip(Producer.send({ topic, partition: 2, value: "x" }))
        assert.strictEqual(error.reason, "UnknownPartition")
        assert.strictEqual(error.partition, 2)
        assert.include(error.message, `${topic}-2`)
        const negative = yield* Effect.flip(Producer.send({ topic, partition: -1, value: "x" }))
        assert.strictEqual(negative.reason, "UnknownPartition")
        const ok = yield* Producer.send({ topic, partition: 1, value: "x" })
        assert.strictEqual(ok.partition, 1)
      }).pipe((e) => withProducer({}, e)), timeout)

    it.live(
      "a record larger than maxRequestSize fails with RecordTooLarge; the ones sent with it are written",
      () =>
        Effect.gen(function*() {
          const topic = topicName("large")
          yield* createTopic(topic, 1)
          const [error, ok] = yield* Effect.all([
            Effect.flip(Producer.send({ topic, value: new Uint8Array(2 * 1024 * 1024) })),
            Producer.send({ topic, value: "small" })
          ], { concurrency: "unbounded" })
          assert.strictEqual(error.reason, "RecordTooLarge")
          assert.include(error.message, "maxRequestSize")
          const log = yield* readTopic(topic, 1)
          assert.deepStrictEqual(log[0]!.map(valueString), ["small"])
          assert.strictEqual(ok.offset, log[0]![0]!.offset)
        }).pipe((e) => withProducer({ linger: "20 millis" }, e)),
      timeout
    )

    it.live("with acks 0 nobody answers: the offset is -1, and the records arrive", () =>
      Effect.gen(function*() {
        const topic = topicName("acks0")
        yield* createTopic(topic, 1)
        const metadata = yield* Producer.sendAll(Array.from({ length: 20 }, (_, i) => ({ topic, value: `${i}` })))
        assert.isTrue(metadata.every((m) => m.offset === -1n && m.partition === 0))
        // acks 0 gives no answer to wait for; the read waits for the records instead.
        let log = yield* readTopic(topic, 1)
        for (let i = 0; i < 50 && log[0]!.length < 20; i++) {
          yield* Effect.sleep("100 millis")
          log = yield* readTopic(topic, 1)
        }
        assert.deepStrictEqual(log[0]!.map(valueString), Array.from({ length: 20 }, (_, i) => `${i}`))
      }).pipe((e) => withProducer({ acks: 0, idempotent: false }, e)), timeout)

    it.live("acks 1 without idempotence writes and answers", () =>
      Effect.gen(function*() {
        const topic = topicName("acks1")
        yield* createTopic(topic, 2)
        const metadata = yield* Producer.sendAll(
          Array.from({ length: 10 }, (_, i) => ({ topic, key: `${i}`, value: `${i}` }))
        )
        assert.isTrue(metadata.every((m) => m.offset >= 0n))
        const log = yield* readTopic(topic, 2)
        assert.strictEqual(log[0]!.length + log[1]!.length, 10)
      }).pipe((e) => withProducer({ acks: 1, idempotent: false, maxInFlightRequests: 3 }, e)), timeout)

    it.live(
      "closing the producer writes what was sent without waiting for linger; later sends fail with Closed",
      () =>
        Effect.gen(function*() {
          const topic = topicName("close")
          const context = yield* Layer.build(environment())
          yield* createTopic(topic, 1).pipe(Effect.provide(context))
          const scope = yield* Scope.make()
          const producer = yield* Layer.buildWithScope(producerLayer({ linger: "1 hour" }), scope).pipe(
            Effect.provide(context)
          )
          const service = Context.get(producer, Producer.Producer)
          const pending = yield* Effect.fork(service.send({ topic, value: "in the buffer" }))
          yield* Effect.yieldNow()
          yield* Scope.close(scope, Exit.void)
          const metadata = yield* Fiber.join(pending)
          const after = yield* Effect.flip(service.send({ topic, value: "too late" }))
          assert.strictEqual(after.reason, "Closed")
          const log = yield* readTopic(topic, 1).pipe(Effect.provide(context))
          assert.deepStrictEqual(log[0]!.map(valueString), ["in the buffer"])
          assert.strictEqual(log[0]![0]!.offset, metadata.offset)
        }).pipe(Effect.scoped),
      timeout
    )

    it.live("flush writes what is in the buffer without waiting for linger", () =>
      Effect.gen(function*() {
        const topic = topicName("flush")
        yield* createTopic(topic, 1)
        const pending = yield* Effect.fork(Producer.send({ topic, value: "flushed" }))
        yield* Effect.yieldNow()
        yield* Producer.flush
        const metadata = yield* Fiber.join(pending)
        assert.strictEqual(metadata.offset, 0n)
      }).pipe((e) => withProducer({ linger: "1 hour" }, e)), timeout)
  })

  describe(`${name}: bufferMemory and maxBlock`, () => {
    // 1,200 bytes of value: two such records do not fit in 2,000 bytes.
    const large = (topic: string, value: string) => ({
      topic,
      partition: 0,
      key: value,
      value: value.padEnd(1_200, ".")
    })
    const bounded = { bufferMemory: 2_000, maxRequestSize: 2_000 }

    it.live(
      "with maxBlock 0, a send that finds no room fails with BufferFull at once, and is never sent",
      () =>
        Effect.gen(function*() {
          const topic = topicName("buffer-full")
          yield* createTopic(topic, 1)
          const first = yield* Effect.fork(Producer.send(large(topic, "first")))
          // Held in the buffer by the hour's linger.
          yield* Effect.yieldNow()
          const answer = yield* Effect.either(Producer.send(large(topic, "second"))).pipe(
            Effect.timeoutOption("5 seconds")
          )
          if (Option.isNone(answer) || Either.isRight(answer.value)) return assert.fail("the send did not fail at once")
          const error = answer.value.left
          assert.instanceOf(error, ProduceFailed)
          assert.strictEqual(error.reason, "BufferFull")
          assert.strictEqual(error.topic, topic)
          assert.include(error.message, "bufferMemory")
          yield* Producer.flush
          const written = yield* Fiber.join(first)
          const log = yield* readTopic(topic, 1)
          assert.deepStrictEqual(log[0]!.map(keyString), ["first"])
          assert.strictEqual(log[0]![0]!.offset, written.offset)
        }).pipe((e) => withProducer({ ...bounded, linger: "1 hour", maxBlock: 0 }, e)),
      timeout
    )

    it.live(
      "a send that waits for room makes the buffer go out without waiting for linger, then gets in",
      () =>
        Effect.gen(function*() {
          const topic = topicName("buffer-wait")
          yield* createTopic(topic, 1)
          const first = yield* Effect.fork(Producer.send(large(topic, "first")))
          yield* Effect.yieldNow()
          const second = yield* Effect.fork(Producer.send(large(topic, "second")))
          // Linger is an hour: only the waiting send can have made the first one go out.
          const written = yield* Fiber.join(first).pipe(Effect.timeoutOption("5 seconds"))
          assert.isTrue(Option.isSome(written), "the first record was written while the second waited for room")
          // Room again: the second got in, and a flush sends it.
          const after = yield* Effect.zipRight(Producer.flush, Fiber.join(second)).pipe(
            Effect.timeoutOption("5 seconds")
          )
          assert.isTrue(Option.isSome(after), "the second record got in once the first was written")
          assert.strictEqual(Option.getOrThrow(after).offset, Option.getOrThrow(written).offset + 1n)
          const log = yield* readTopic(topic, 1)
          assert.deepStrictEqual(log[0]!.map(keyString), ["first", "second"])
        }).pipe((e) => withProducer({ ...bounded, linger: "1 hour" }, e)),
      timeout
    )

    it.live(
      "a sendAll larger than bufferMemory goes in as room frees: every record written once, in order",
      () =>
        Effect.gen(function*() {
          const topic = topicName("buffer-large-call")
          yield* createTopic(topic, 1)
          const records = Array.from(
            { length: 40 },
            (_, i) => ({ topic, partition: 0, value: `${i}`.padEnd(200, ".") })
          )
          const answer = yield* Producer.sendAll(records).pipe(Effect.timeoutOption("15 seconds"))
          assert.isTrue(Option.isSome(answer), "every record got in and was written")
          const metadata = Option.getOrThrow(answer)
          assert.deepStrictEqual(metadata.map((m) => m.offset), metadata.map((_, i) => metadata[0]!.offset + BigInt(i)))
          const log = yield* readTopic(topic, 1)
          assert.deepStrictEqual(log[0]!.map(valueString), records.map((r) => r.value))
        }).pipe((e) => withProducer({ bufferMemory: 3_000, maxRequestSize: 3_000, batchSize: 1_000 }, e)),
      timeout
    )
  })

  describe(`${name}: transactions`, () => {
    /** Runs `body` with the environment built once, so that several producers share one cluster. */
    const withEnvironment = <A, E>(
      body: (
        transactional: (
          id: string
        ) => Effect.Effect<Context.Tag.Service<typeof Producer.TransactionalProducer>, unknown, Scope.Scope>
      ) => Effect.Effect<A, E, Producer.Producer | Driver | ProducerTestKit | Scope.Scope>
    ) =>
      Effect.gen(function*() {
        const context = yield* Layer.build(Layer.provideMerge(producerLayer({ linger: 0 }), environment()))
        const transactional = (id: string) =>
          Layer.build(transactionalLayer({ transactionalId: id, linger: "2 millis" })).pipe(
            Effect.map((built) => Context.get(built, Producer.TransactionalProducer)),
            Effect.provide(context)
          )
        return yield* body(transactional).pipe(Effect.provide(context))
      }).pipe(Effect.scoped)

    it.live(
      "a committed transaction's records are read together; an aborted one's never, by read_committed",
      () =>
        withEnvironment((transactional) =>
          Effect.gen(function*() {
            const topic = topicName("txn")
            yield* createTopic(topic, 2)
            const producer = yield* transactional(`txn-${topic}`)
            const written = yield* producer.transaction(
              Producer.sendAll(Array.from({ length: 10 }, (_, i) => ({ topic, key: `${i}`, value: `committed-${i}` })))
            )
            const failure = yield* Effect.flip(producer.transaction(
              Effect.zipRight(
                Producer.sendAll(Array.from({ length: 5 }, (_, i) => ({ topic, key: `${i}`, value: `aborted-${i}` }))),
                Effect.fail("the handler gave up" as const)
              )
            ))
            assert.strictEqual(failure, "the handler gave up")
            const after = yield* Producer.send({ topic, partition: 0, value: "plain" })
            const committed = (yield* readTopic(topic, 2)).flat().map(valueString)
            assert.sameMembers(committed, [...Array.from({ length: 10 }, (_, i) => `committed-${i}`), "plain"])
            for (const m of written) assert.isTrue(m.offset >= 0n)
            // Markers and aborted records take offsets: the plain record lands past them.
            const zero = written.filter((m) => m.partition === 0).length
            assert.isTrue(after.offset > BigInt(zero), `plain record at ${after.offset}`)
            const uncommitted = (yield* readTopic(topic, 2, { isolationLevel: "read_uncommitted", atLeast: 16 })).flat()
              .map(valueString)
            assert.includeMembers(uncommitted, Array.from({ length: 5 }, (_, i) => `aborted-${i}`))
          })
        ),
      timeout
    )

    it.live(
      "positions sent with the group metadata of a member not in the group: the transaction fails and lands " +
        "nothing, and the producer goes on",
      () =>
        withEnvironment((transactional) =>
          Effect.gen(function*() {
            const topic = topicName("txn-member")
            yield* createTopic(topic, 1)
            const producer = yield* transactional(`txn-${topic}`)
            const groupId = `${topic}-group`
            const failure = yield* Effect.flip(producer.transaction(Producer.send({ topic, value: "zombie" }), {
              offsets: {
                groupId,
                positions: [{ topic, partition: 0, next: 1n }],
                member: { groupId, generationId: 4, memberId: "a-member-that-left" }
              }
            }))
            // A driver that sends the metadata has the coordinator refuse it; one that cannot refuses it itself.
            assert.instanceOf(failure, TransactionFailed)
            assert.strictEqual(failure.operation, "sendOffsets")
            // The coordinator of a group without members refuses any generation; the in-memory broker knows the member
            // is not in it; kafkajs cannot send the metadata at all.
            assert.match(failure.message, /ILLEGAL_GENERATION|UNKNOWN_MEMBER_ID|KIP-447/)
            assert.strictEqual(failure.reason, "Other")
            yield* producer.transaction(Producer.send({ topic, value: "next" }))
            const log = yield* readTopic(topic, 1)
            assert.deepStrictEqual(log[0]!.map(valueString), ["next"])
          })
        ),
      timeout
    )

    it.live("an interrupted transaction is aborted", () =>
      withEnvironment((transactional) =>
        Effect.gen(function*() {
          const topic = topicName("txn-interrupt")
          yield* createTopic(topic, 1)
          const producer = yield* transactional(`txn-${topic}`)
          const sent = yield* Deferred.make<void>()
          const fiber = yield* Effect.fork(producer.transaction(
            Effect.gen(function*() {
              yield* Producer.send({ topic, value: "interrupted" })
              yield* Deferred.succeed(sent, undefined)
              return yield* Effect.never
            })
          ))
          yield* Deferred.await(sent)
          yield* Fiber.interrupt(fiber)
          yield* producer.transaction(Producer.send({ topic, value: "next" }))
          const log = yield* readTopic(topic, 1)
          assert.deepStrictEqual(log[0]!.map(valueString), ["next"])
        })
      ), timeout)

    it.live(
      "an open transaction holds read_committed readers of its partition at its first record",
      () =>
        withEnvironment((transactional) =>
          Effect.gen(function*() {
            const topic = topicName("txn-lso")
            yield* createTopic(topic, 1)
            yield* Producer.send({ topic, value: "before" })
            const producer = yield* transactional(`txn-${topic}`)
            const inside = yield* Deferred.make<void>()
            const release = yield* Deferred.make<void>()
            const fiber = yield* Effect.fork(producer.transaction(
              Effect.gen(function*() {
                yield* Producer.send({ topic, value: "in the transaction" })
                yield* Deferred.succeed(inside, undefined)
                yield* Deferred.await(release)
              })
            ))
            yield* Deferred.await(inside)
            yield* Producer.send({ topic, value: "after" })
            // One reader, which goes on from where it stopped: it must stop before the open transaction, not pass it.
            const reader = yield* makeReader(topic, 1)
            const during = yield* reader.read()
            assert.deepStrictEqual(during[0]!.map(valueString), ["before"])
            yield* Deferred.succeed(release, undefined)
            yield* Fiber.join(fiber)
            // The last stable offset moves once the commit's markers are written, a moment after the commit returns.
            const rest: Array<string | null> = []
            for (let i = 0; i < 50 && rest.length < 2; i++) {
              if (i > 0) yield* Effect.sleep("100 millis")
              rest.push(...(yield* reader.read())[0]!.map(valueString))
            }
            assert.deepStrictEqual(rest, ["in the transaction", "after"])
          })
        ),
      timeout
    )

    it.live(
      "a producer started with the same transactional id fences the earlier one: its open transaction never lands",
      () =>
        withEnvironment((transactional) =>
          Effect.gen(function*() {
            const topic = topicName("txn-fence")
            yield* createTopic(topic, 1)
            const id = `txn-${topic}`
            const zombie = yield* transactional(id)
            const inside = yield* Deferred.make<void>()
            const release = yield* Deferred.make<void>()
            const late = yield* Effect.fork(Effect.flip(zombie.transaction(
              Effect.gen(function*() {
                yield* Producer.send({ topic, value: "zombie" })
                yield* Deferred.succeed(inside, undefined)
                yield* Deferred.await(release)
              })
            )))
            yield* Deferred.await(inside)
            const successor = yield* transactional(id)
            yield* Deferred.succeed(release, undefined)
            const error = yield* Fiber.join(late)
            assert.instanceOf(error, TransactionFailed)
            assert.strictEqual(error.reason, "Fenced")
            assert.include(error.message, id)
            const again = yield* Effect.flip(zombie.transaction(Producer.send({ topic, value: "zombie again" })))
            assert.isTrue(
              (again instanceof ProduceFailed && again.reason === "Fenced") ||
                (again instanceof TransactionFailed && (again.reason === "Fenced" || again.reason === "Aborted")),
              `the fenced producer can write nothing more: ${again.message}`
            )
            yield* successor.transaction(Producer.send({ topic, value: "successor" }))
            const log = yield* readTopic(topic, 1)
            assert.deepStrictEqual(log[0]!.map(valueString), ["successor"])
          })
        ),
      timeout
    )

    /** A transaction whose body sends `ok`, then `refused`, catching its failure, and succeeds. */
    const catching = (ok: Producer.ProducerRecord, refused: Producer.ProducerRecord) =>
      Effect.gen(function*() {
        yield* Producer.send(ok)
        const failure = yield* Effect.flip(Producer.send(refused))
        return failure.reason
      })

    for (
      const [label, refused] of [
        ["RecordTooLarge", (topic: string) => ({ topic, value: new Uint8Array(2 * 1024 * 1024) })],
        ["UnknownTopic", (_: string) => ({ topic: topicName("txn-missing"), value: "lost" })]
      ] as const
    ) {
      it.live(
        `a send that failed with ${label}, caught by the body, still aborts the transaction: nothing of it lands`,
        () =>
          withEnvironment((transactional) =>
            Effect.gen(function*() {
              const topic = topicName("txn-caught")
              yield* createTopic(topic, 1)
              const producer = yield* transactional(`txn-${topic}`)
              const result = yield* Effect.either(
                producer.transaction(catching({ topic, value: "in the transaction" }, refused(topic)))
              )
              if (Either.isRight(result)) return assert.fail(`the transaction committed after a caught ${label}`)
              const error = result.left
              assert.instanceOf(error, TransactionFailed)
              assert.strictEqual(error.reason, "Aborted")
              assert.include(error.message, label)
              // The producer goes on: its next transaction commits.
              yield* producer.transaction(Producer.send({ topic, value: "next" }))
              const log = yield* readTopic(topic, 1)
              assert.deepStrictEqual(log[0]!.map(valueString), ["next"])
            })
          ),
        timeout
      )
    }

    it.live("a transactional id that is blank is refused before connecting", () =>
      Effect.gen(function*() {
        const error = yield* Effect.flip(Effect.scoped(Layer.build(transactionalLayer({ transactionalId: " " }))))
        assert.instanceOf(error, InvalidConfig)
        assert.strictEqual((error as InvalidConfig).field, "transactionalId")
      }).pipe(Effect.provide(environment())), timeout)
  })

  describe(`${name}: producer settings`, () => {
    const refused = (settings: Producer.Settings) =>
      Effect.either(Effect.scoped(Layer.build(producerLayer(settings)))).pipe(
        Effect.provide(environment()),
        Effect.map((built) => Either.isLeft(built) ? built.left : assert.fail(`accepted: ${JSON.stringify(settings)}`))
      )

    it.live("idempotence without acks all is refused before connecting, naming acks", () =>
      Effect.gen(function*() {
        const error = yield* refused({ acks: 1 })
        assert.instanceOf(error, InvalidConfig)
        assert.strictEqual((error as InvalidConfig).field, "acks")
        assert.include(error.message, "idempotent")
        const zero = yield* refused({ acks: 0, idempotent: true })
        assert.strictEqual((zero as InvalidConfig).field, "acks")
      }), timeout)

    it.live(
      "idempotence with more than one batch in flight is refused, naming maxInFlightRequests",
      () =>
        Effect.gen(function*() {
          const error = yield* refused({ maxInFlightRequests: 5 })
          assert.strictEqual((error as InvalidConfig).field, "maxInFlightRequests")
        }),
      timeout
    )

    it.live("malformed values are refused, naming the setting", () =>
      Effect.gen(function*() {
        const cases: ReadonlyArray<readonly [Producer.Settings, string]> = [
          [{ acks: 2 as unknown as 1 }, "acks"],
          [{ linger: -5 }, "linger"],
          [{ batchSize: 0 }, "batchSize"],
          [{ maxRequestSize: 1.5 }, "maxRequestSize"],
          [{ idempotent: false, maxInFlightRequests: 6 }, "maxInFlightRequests"],
          [{ compression: "zstd" as unknown as "gzip" }, "compression"],
          [{ timeout: "soon" as unknown as number }, "timeout"],
          [{ bufferMemory: 0 }, "bufferMemory"],
          [{ bufferMemory: 1.5 }, "bufferMemory"],
          [{ bufferMemory: 1_000, maxRequestSize: 1_001 }, "bufferMemory"],
          [{ maxBlock: -1 }, "maxBlock"],
          [{ maxBlock: "a while" as unknown as number }, "maxBlock"]
        ]
        for (const [settings, field] of cases) {
          const error = yield* refused(settings)
          assert.instanceOf(error, InvalidConfig, field)
          assert.strictEqual((error as InvalidConfig).field, field)
        }
      }), timeout)
  })
}
