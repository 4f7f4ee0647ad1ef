import { assert, describe, it } from "@effect/vitest"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Layer from "effect/Layer"
import * as TestClock from "effect/TestClock"
import { Driver, type DriverEvent } from "../src/Driver.js"
import * as InMemoryKafka from "../src/InMemoryKafka.js"
import { InvalidConfig } from "../src/KafkaError.js"
import * as OffsetBatch from "../src/OffsetBatch.js"
import { driverSuite, DriverTestKit, DriverTestTransactions } from "./driverSuite.js"

const testKit: Layer.Layer<DriverTestKit, never, InMemoryKafka.InMemoryKafka> = Layer.effect(
  DriverTestKit,
  Effect.map(InMemoryKafka.InMemoryKafka, (kafka) => ({
    createTopic: (topic, partitions, options) => kafka.createTopic(topic, partitions, options),
    produce: (topic, partition, values) => kafka.produce(topic, values.map((value) => ({ value, partition }))),
    produceKeyed: (topic, partition, entries) =>
      kafka.produce(topic, entries.map(([key, value]) => ({ key, value, partition }))),
    produceRecords: (topic, partition, records) =>
      kafka.produce(topic, records.map((record) => ({ ...record, partition }))),
    produceTransaction: (topic, partition, values, outcome) =>
      kafka.produceTransaction(topic, values.map((value) => ({ value, partition })), outcome),
    compact: (topic) => kafka.compact(topic),
    deleteRecords: (topic, partition, before) => kafka.deleteRecords(topic, partition, before),
    endOffsets: (topic) => Effect.map(kafka.endOffsets(topic), (ends) => new Map(ends.map((e, p) => [p, e] as const)))
  }))
)

const transactions: Layer.Layer<DriverTestTransactions, never, InMemoryKafka.InMemoryKafka> = Layer.effect(
  DriverTestTransactions,
  Effect.map(InMemoryKafka.InMemoryKafka, (kafka) => ({
    openTransaction: (topic, partition, values, offsets) =>
      Effect.gen(function*() {
        const transactionalId = `suite-${crypto.randomUUID()}`
        const epoch = yield* kafka.initProducer(transactionalId, "1 minute")
        if (values.length > 0) {
          const records = values.map((value) => ({ value, partition }))
          yield* kafka.transactionalProduce(transactionalId, epoch, topic, records)
        }
        if (offsets !== undefined) {
          yield* kafka.sendOffsets(transactionalId, epoch, offsets.groupId, [
            { topic, partition: offsets.partition, next: offsets.next }
          ])
        }
        let open = true
        yield* Effect.addFinalizer(() =>
          open ? Effect.ignore(kafka.endTransaction(transactionalId, epoch, "abort")) : Effect.void
        )
        return {
          end: (outcome) =>
            Effect.suspend(() => {
              open = false
              return kafka.endTransaction(transactionalId, epoch, outcome)
            })
        }
      })
  }))
)

driverSuite(
  "InMemoryKafka driver",
  Layer.provideMerge(Layer.merge(testKit, transactions), InMemoryKafka.layer()),
  {
    sessionTimeout: "10 seconds",
    rebalanceTimeout: "20 seconds",
    pollTimeout: "20 millis",
    deadline: "10 seconds",
    settle: 0
  }
)

const options = (clientId: string, sessionTimeout = "10 seconds" as Duration.DurationInput) => ({
  groupId: "g",
  clientId,
  subscription: { _tag: "Topics", topics: ["t"] } as const,
  maxPollRecords: 100,
  pollTimeout: Duration.millis(10),
  sessionTimeout: Duration.decode(sessionTimeout),
  rebalanceTimeout: Duration.seconds(30)
})

const pollUntil = (poll: Effect.Effect<ReadonlyArray<DriverEvent>, unknown>, tag: DriverEvent["_tag"]) =>
  Effect.gen(function*() {
    for (let i = 0; i < 1_000; i++) {
      const events = yield* poll
      const found = events.find((e) => e._tag === tag)
      if (found !== undefined) return found
      yield* TestClock.adjust("10 millis")
    }
    return yield* Effect.dieMessage(`no ${tag} event`)
  })

describe("InMemoryKafka on the TestClock", () => {
  it.scoped("a member that stops heartbeating is evicted after its session timeout; it learns its partitions are lost", () =>
    Effect.gen(function*() {
      const kafka = yield* InMemoryKafka.InMemoryKafka
      const driver = yield* Driver
      yield* kafka.createTopic("t", 2)
      const a = yield* driver.connect(options("a"))
      yield* pollUntil(a.poll, "Assigned")
      yield* kafka.freeze(a.memberId)
      const b = yield* driver.connect(options("b"))
      // a does not answer the rebalance (it is frozen): after the session timeout the group goes on without it.
      yield* TestClock.adjust("11 seconds")
      const assigned = yield* pollUntil(b.poll, "Assigned")
      assert.strictEqual(assigned._tag === "Assigned" ? assigned.partitions.length : 0, 2)
      yield* kafka.thaw(a.memberId)
      const lost = yield* pollUntil(a.poll, "Lost")
      assert.strictEqual(lost._tag === "Lost" ? lost.partitions.length : 0, 2)
      // The zombie's commit is refused.
      const refused = yield* Effect.flip(a.commit(OffsetBatch.of({ topic: "t", partition: 0 }, 5n)))
      assert.isFalse(refused.retriable)
    }).pipe(Effect.provide(InMemoryKafka.layer())))

  it.scoped("a killed member leaves at once, without a revoke, and its commits never land", () =>
    Effect.gen(function*() {
      const kafka = yield* InMemoryKafka.InMemoryKafka
      const driver = yield* Driver
      yield* kafka.createTopic("t", 2)
      const a = yield* driver.connect(options("a"))
      yield* pollUntil(a.poll, "Assigned")
      const b = yield* driver.connect(options("b"))
      yield* pollUntil(a.poll, "Revoked").pipe(Effect.flatMap((e) => e._tag === "Revoked" ? e.release : Effect.void))
      yield* pollUntil(b.poll, "Assigned")
      const before = yield* kafka.generation("g")
      yield* kafka.kill(b.memberId)
      // b is gone at once; a, the survivor, is asked to release what it has and then gets everything.
      assert.deepStrictEqual((yield* kafka.members("g")).map((m) => m.memberId), [a.memberId])
      yield* pollUntil(a.poll, "Revoked").pipe(Effect.flatMap((e) => e._tag === "Revoked" ? e.release : Effect.void))
      yield* pollUntil(a.poll, "Assigned")
      assert.strictEqual(yield* kafka.generation("g"), before + 1)
      const members = yield* kafka.members("g")
      assert.deepStrictEqual(members.map((m) => m.partitions.length), [2])
      const stillWaiting = yield* b.commit(OffsetBatch.of({ topic: "t", partition: 0 }, 1n)).pipe(
        Effect.timeoutOption("1 second"),
        Effect.fork
      )
      yield* TestClock.adjust("1 second")
      const outcome = yield* stillWaiting.await
      assert.isTrue(outcome._tag === "Success" && outcome.value._tag === "None")
      assert.strictEqual((yield* kafka.committed("g")).size, 0)
    }).pipe(Effect.provide(InMemoryKafka.layer())))

  it.live("range and round robin assignment spread partitions evenly", () =>
    Effect.gen(function*() {
      for (const assignor of ["range", "roundRobin"] as const) {
        yield* Effect.scoped(
          Effect.gen(function*() {
            const kafka = yield* InMemoryKafka.InMemoryKafka
            const driver = yield* Driver
            yield* kafka.createTopic("t", 7)
            const sessions = [
              yield* driver.connect(options("a")),
              yield* driver.connect(options("b")),
              yield* driver.connect(options("c"))
            ]
            for (let round = 0; round < 5; round++) {
              for (const s of sessions) {
                const events = yield* s.poll
                for (const e of events) if (e._tag === "Revoked") yield* e.release
              }
            }
            const members = yield* kafka.members("g")
            assert.sameMembers(members.map((m) => m.partitions.length), [3, 2, 2], assignor)
          }).pipe(Effect.provide(InMemoryKafka.layer({ assignor })))
        )
      }
    }))

  it.scoped("a transaction's positions are pending until it ends: a committed read of them fails retriable, until the broker aborts it at its timeout", () =>
    Effect.gen(function*() {
      const kafka = yield* InMemoryKafka.InMemoryKafka
      const driver = yield* Driver
      yield* kafka.createTopic("t", 2)
      const a = yield* driver.connect(options("a"))
      yield* pollUntil(a.poll, "Assigned")
      const p0 = { topic: "t", partition: 0 }
      yield* a.commit(OffsetBatch.of(p0, 2n))
      const epoch = yield* kafka.initProducer("txn", "1 minute")
      yield* kafka.sendOffsets("txn", epoch, "g", [{ topic: "t", partition: 0, next: 7n }])
      const read = yield* Effect.either(a.committed([p0]))
      if (Either.isRight(read)) return assert.fail(`read while the transaction is open: ${read.right.get("t-0")}`)
      const unstable = read.left
      assert.isTrue(unstable.retriable)
      assert.include(unstable.message, "UNSTABLE_OFFSET_COMMIT")
      assert.include(unstable.message, "txn")
      // The group's committed position is still the one before the transaction (the broker's view, not a stable read).
      assert.strictEqual((yield* kafka.committed("g")).get("t-0"), 2n)
      // Past its timeout the broker aborts the transaction and fences its producer: the position never lands.
      yield* TestClock.adjust("61 seconds")
      assert.strictEqual((yield* a.committed([p0])).get("t-0"), 2n)
      const fenced = yield* Effect.flip(kafka.sendOffsets("txn", epoch, "g", [{ topic: "t", partition: 0, next: 8n }]))
      assert.strictEqual(fenced.reason, "Fenced")
    }).pipe(Effect.provide(InMemoryKafka.layer())))

  it.effect("bad topic settings give a typed error naming the field", () =>
    Effect.gen(function*() {
      const kafka = yield* InMemoryKafka.InMemoryKafka
      const e1 = yield* Effect.flip(kafka.createTopic("", 1))
      const e2 = yield* Effect.flip(kafka.createTopic("t", 0))
      assert.instanceOf(e1, InvalidConfig)
      assert.strictEqual(e1.field, "topic")
      assert.strictEqual(e2.field, "partitions")
      const e3 = yield* Effect.flip(kafka.produce("nope", [{ value: "x" }]))
      assert.include(e3.message, "nope")
    }).pipe(Effect.provide(InMemoryKafka.layer())))
})
