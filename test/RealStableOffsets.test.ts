/**
 * Stable committed reads on a real broker. A raw kafkajs transactional producer sends a group's position with a
 * transaction (`sendOffsets`) and leaves it open: kafkajs's own read (OffsetFetch v4, which cannot ask for stable
 * offsets) answers the position from before it, the session's read fails with a retriable `DriverError` naming
 * UNSTABLE_OFFSET_COMMIT; once the transaction commits, the session reads the new position. This is what
 * `kafkaTransactional` relies on when it reads the committed position after fencing a partition's earlier owner.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Schedule from "effect/Schedule"
import { Kafka, logLevel } from "kafkajs"
import type { Admin, Producer, Transaction } from "kafkajs"
import { inject } from "vitest"
import { Driver } from "../src/Driver.js"
import * as KafkaJs from "../src/KafkaJs.js"
import { DriverError } from "../src/KafkaError.js"
import * as OffsetBatch from "../src/OffsetBatch.js"
import * as TopicPartition from "../src/TopicPartition.js"
import { makeReadWire } from "../src/internal/kafkajs/wire.js"
import { kafkaClient } from "./support/kafkaKit.js"

const brokers = process.env.KAFKA_BROKERS || inject("kafkaBrokers")
const unique = (prefix: string) => `${prefix}-${crypto.randomUUID().slice(0, 8)}`

const promise = <A>(what: string, f: () => Promise<A>) =>
  Effect.tryPromise({ try: f, catch: (cause) => new Error(`${what} failed: ${String(cause)}`, { cause }) })

/** A kafkajs transactional producer, disconnected with the scope (its open transaction aborted first). */
const transactionalProducer = Effect.acquireRelease(
  promise("producer connect", async () => {
    const producer = kafkaClient(brokers).producer({
      transactionalId: `stable-${crypto.randomUUID()}`,
      idempotent: true,
      maxInFlightRequests: 1
    })
    await producer.connect()
    return producer
  }),
  (producer: Producer) => Effect.promise(() => producer.disconnect().catch(() => undefined))
)

/** Begins a transaction that sends `next` as the group's position of `topic`-0, and leaves it open. */
const sendOffsets = (producer: Producer, groupId: string, topic: string, next: bigint) =>
  Effect.gen(function*() {
    const txn = yield* promise("transaction", () => producer.transaction())
    yield* Effect.addFinalizer(() => Effect.promise(() => txn.abort().catch(() => undefined)))
    yield* promise("sendOffsets", () =>
      txn.sendOffsets({
        consumerGroupId: groupId,
        topics: [{ topic, partitions: [{ partition: 0, offset: next.toString() }] }]
      }))
    return txn
  })

const connectAdmin = (admin: Admin) =>
  Effect.acquireRelease(
    promise("admin connect", () => admin.connect()),
    () => Effect.promise(() => admin.disconnect().catch(() => undefined))
  )

/** kafkajs's own read of the group's committed position of `topic`-0. */
const readWith = (admin: Admin, groupId: string, topic: string) =>
  promise("fetchOffsets", () => admin.fetchOffsets({ groupId, topics: [topic] })).pipe(
    Effect.map((topics) => BigInt(topics[0]!.partitions.find((p) => p.partition === 0)!.offset))
  )

/** Reads again while the read fails with UNSTABLE_OFFSET_COMMIT; counts those answers. */
const readSettled = <A>(read: Effect.Effect<A, DriverError>) =>
  Effect.gen(function*() {
    let unstable = 0
    const value = yield* read.pipe(
      Effect.tapError((error) =>
        Effect.sync(() => {
          if (error.message.includes("UNSTABLE_OFFSET_COMMIT")) unstable++
        })
      ),
      Effect.retry({
        while: (error) => error.retriable && error.message.includes("UNSTABLE_OFFSET_COMMIT"),
        schedule: Schedule.spaced("20 millis")
      }),
      Effect.timeout("30 seconds")
    )
    return { value, unstable }
  })

if (brokers) {
  describe("stable committed reads on a real broker", () => {
    it.scopedLive("the broker takes OffsetFetch v7: a read through the read wire fails UNSTABLE_OFFSET_COMMIT where kafkajs's answers the old position", () =>
      Effect.gen(function*() {
        const topic = unique("stable-wire")
        const groupId = unique("group")
        yield* KafkaJs.createTopic(brokers, topic, 1)
        const plain = kafkaClient(brokers).admin()
        yield* connectAdmin(plain)

        const wire = makeReadWire()
        const reader = new Kafka({
          brokers: brokers.split(","),
          clientId: "stable-wire",
          socketFactory: wire.socketFactory,
          logLevel: logLevel.NOTHING
        }).admin()
        yield* connectAdmin(reader)
        assert.isTrue(wire.stableReads(), "the broker's ApiVersions answer does not list OffsetFetch v7")

        // The group's position 3, committed by a first transaction; a second one sends 8 and stays open.
        const producer = yield* transactionalProducer
        const first = yield* sendOffsets(producer, groupId, topic, 3n)
        yield* promise("commit", () => first.commit())
        const settled = yield* readWith(reader, groupId, topic).pipe(
          Effect.retry({ schedule: Schedule.spaced("20 millis"), times: 500 })
        )
        assert.strictEqual(settled, 3n)
        const txn: Transaction = yield* sendOffsets(producer, groupId, topic, 8n)
        // kafkajs's own read: the position from before the open transaction.
        assert.strictEqual(yield* readWith(plain, groupId, topic), 3n)
        const read = yield* Effect.either(readWith(reader, groupId, topic))
        if (Either.isRight(read)) {
          return assert.fail(`the stable read answered ${read.right} while the transaction is open`)
        }
        assert.include(String(read.left.cause), "unstable offsets")
        assert.deepInclude(read.left.cause, { type: "UNSTABLE_OFFSET_COMMIT", retriable: true })

        yield* promise("commit", () => txn.commit())
        const after = yield* readWith(reader, groupId, topic).pipe(
          Effect.retry({ schedule: Schedule.spaced("20 millis"), times: 500 })
        )
        assert.strictEqual(after, 8n)
      }))

    it.scopedLive("the session's committed read fails retriable while a transaction sends the position, and reads it once it commits", () =>
      Effect.gen(function*() {
        const topic = unique("stable-session")
        const groupId = unique("group")
        const p0 = TopicPartition.make(topic, 0)
        yield* KafkaJs.createTopic(brokers, topic, 1)
        yield* KafkaJs.produce(brokers, topic, Array.from({ length: 10 }, (_, i) => ({ partition: 0, value: `v${i}` })))
        const driver = yield* Driver
        const session = yield* driver.connect({
          groupId,
          clientId: "stable-session",
          subscription: { _tag: "Topics", topics: [topic] },
          maxPollRecords: 10,
          pollTimeout: Duration.millis(100),
          sessionTimeout: Duration.seconds(6),
          rebalanceTimeout: Duration.seconds(20)
        })
        // The member owns the partition once its assignment has been polled.
        yield* session.poll.pipe(
          Effect.repeat({ until: (events) => events.some((e) => e._tag === "Assigned"), times: 100 })
        )
        yield* session.commit(OffsetBatch.of(p0, 3n))
        assert.strictEqual((yield* session.committed([p0])).get(TopicPartition.key(p0)), 3n)

        const producer = yield* transactionalProducer
        const txn = yield* sendOffsets(producer, groupId, topic, 8n)
        const open = yield* Effect.either(session.committed([p0]))
        if (Either.isRight(open)) {
          return assert.fail(
            `read while the transaction is open: ${open.right.get(TopicPartition.key(p0))}, the position before it`
          )
        }
        assert.instanceOf(open.left, DriverError)
        assert.isTrue(open.left.retriable, open.left.message)
        assert.include(open.left.message, "UNSTABLE_OFFSET_COMMIT")
        const withMetadata = yield* Effect.either(session.committedWithMetadata([p0]))
        assert.isTrue(Either.isLeft(withMetadata), "committedWithMetadata read the position before the transaction")

        yield* promise("commit", () => txn.commit())
        const { unstable, value } = yield* readSettled(session.committed([p0]))
        assert.strictEqual(value.get(TopicPartition.key(p0)), 8n)
        yield* Effect.logDebug(`after the commit, ${unstable} reads answered UNSTABLE_OFFSET_COMMIT`)
      }).pipe(
        Effect.provide(KafkaJs.layer({ brokers: brokers.split(","), maxWaitTime: "100 millis", logLevel: "error" }))
      ))
  })
} else {
  describe("stable committed reads on a real broker", () => {
    it("needs a Kafka broker", () => {
      assert.fail(`No Kafka broker for this run: ${inject("kafkaSetupError") || "KAFKA_BROKERS is unset"}.`)
    })
  })
}
