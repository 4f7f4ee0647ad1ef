/**
 * Members heal: a cluster that cannot be reached for less than `reconnectTimeout` does not end a consumer (it
 * reconnects with backoff and goes on with its policy's guarantee), and an evicted member rejoins. Past the deadline,
 * or with `rejoin: false`, the consumer ends with the typed error.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Chunk from "effect/Chunk"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as TestClock from "effect/TestClock"
import * as CommitPolicy from "../src/CommitPolicy.js"
import * as Consumer from "../src/Consumer.js"
import * as InMemoryKafka from "../src/InMemoryKafka.js"
import { DriverError, PartitionsLost } from "../src/KafkaError.js"
import { advanceUntil, logCollector, settled } from "./support/kit.js"

const config = { groupId: "g", topics: ["t"], maxPollRecords: 5, reconnectTimeout: "60 seconds" } as const
const commitAfter = CommitPolicy.commitAfter({ maxBatch: 5, maxInterval: "1 second" })

const produce = (n: number, from = 0) =>
  InMemoryKafka.produce("t", Array.from({ length: n }, (_, i) => ({ value: String(from + i), partition: 0 })))

describe("a cluster that cannot be reached for a while", () => {
  it.effect("does not end the consumer: it reconnects and goes on, and commitAfter loses nothing", () => {
    const logs = logCollector()
    return Effect.gen(function*() {
      const kafka = yield* InMemoryKafka.InMemoryKafka
      yield* kafka.createTopic("t", 1)
      yield* produce(20)
      const gate = yield* Deferred.make<void>()
      const handled: Array<bigint> = []
      const fiber = yield* Consumer.run(config, (records) =>
        Effect.gen(function*() {
          if (Chunk.unsafeHead(records).offset >= 10n) yield* Deferred.await(gate)
          for (const r of records) handled.push(r.offset)
        })).pipe(Effect.provide(commitAfter), Effect.fork)
      yield* advanceUntil("10 handled and committed", Effect.map(kafka.committed("g"), (c) => c.get("t-0") === 10n), 5)
      yield* kafka.unreachable
      yield* Deferred.succeed(gate, undefined)
      // Away for 40 seconds: less than reconnectTimeout.
      for (let i = 0; i < 40; i++) {
        yield* Effect.repeatN(Effect.yieldNow(), 50)
        yield* TestClock.adjust("1 second")
      }
      assert.isTrue((yield* Fiber.poll(fiber))._tag === "None", "the consumer ended while the cluster was away")
      yield* kafka.reachable
      yield* produce(10, 20)
      yield* advanceUntil("everything committed", Effect.map(kafka.committed("g"), (c) => c.get("t-0") === 30n), 30)
      yield* Fiber.interrupt(fiber)
      const missing = Array.from({ length: 30 }, (_, i) => BigInt(i)).filter((o) => !handled.includes(o))
      assert.deepStrictEqual(missing, [])
      assert.isTrue(
        logs.lines.some((l) => l.startsWith("WARN") && l.includes("cannot be reached; reconnecting")),
        logs.lines.join("\n")
      )
    }).pipe(Effect.provide(InMemoryKafka.layer()), Effect.provide(logs.layer))
  })

  it.effect("past reconnectTimeout, ends the consumer with the retriable DriverError", () =>
    Effect.gen(function*() {
      const kafka = yield* InMemoryKafka.InMemoryKafka
      yield* kafka.createTopic("t", 1)
      yield* produce(5)
      let handled = 0
      const fiber = yield* Consumer.run(config, (records) => Effect.sync(() => (handled += Chunk.size(records)))).pipe(
        Effect.provide(commitAfter),
        Effect.fork
      )
      yield* settled("handled", Effect.sync(() => handled === 5))
      yield* kafka.unreachable
      yield* advanceUntil("the consumer ends", Effect.map(Fiber.poll(fiber), (p) => p._tag === "Some"), 90)
      const exit = yield* Fiber.await(fiber)
      const error = Exit.isFailure(exit) && exit.cause._tag === "Fail" ? exit.cause.error : undefined
      assert.instanceOf(error, DriverError)
      if (error instanceof DriverError) {
        assert.isTrue(error.retriable)
        assert.include(error.message, "cannot be reached")
      }
      const now = yield* TestClock.currentTimeMillis
      // It gave up after the deadline, not before.
      assert.isAtLeast(now, 60_000)
    }).pipe(Effect.provide(InMemoryKafka.layer())))

  it.effect("a consumer that cannot connect at all ends past the deadline too", () =>
    Effect.gen(function*() {
      const kafka = yield* InMemoryKafka.InMemoryKafka
      yield* kafka.createTopic("t", 1)
      yield* kafka.unreachable
      const fiber = yield* Consumer.run(config, () => Effect.void).pipe(Effect.provide(commitAfter), Effect.fork)
      yield* advanceUntil("30 seconds of attempts", Effect.map(TestClock.currentTimeMillis, (t) => t >= 30_000), 40)
      assert.isTrue((yield* Fiber.poll(fiber))._tag === "None")
      yield* kafka.reachable
      yield* produce(3)
      yield* advanceUntil("committed", Effect.map(kafka.committed("g"), (c) => c.get("t-0") === 3n), 30)
      yield* Fiber.interrupt(fiber)
    }).pipe(Effect.provide(InMemoryKafka.layer())))
})

describe("an evicted member", () => {
  const evict = (rejoin: boolean) =>
    Effect.gen(function*() {
      const kafka = yield* InMemoryKafka.InMemoryKafka
      yield* kafka.createTopic("t", 1)
      yield* produce(10)
      const handled: Array<bigint> = []
      const fiber = yield* Consumer.run({ ...config, sessionTimeout: "6 seconds", rejoin }, (records) =>
        Effect.sync(() => {
          for (const r of records) {
            handled.push(r.offset)
          }
        })).pipe(Effect.provide(commitAfter), Effect.fork)
      yield* advanceUntil(
        "committed",
        Effect.map(kafka.committed("g"), (c) =>
          c.get("t-0") === 10n),
        5
      )
      const [member] = yield* kafka.members("g")
      // Paused past its session: on its next poll it learns that the group evicted it.
      yield* kafka.freeze(member!.memberId)
      yield* TestClock.adjust("7 seconds")
      yield* kafka.thaw(member!.memberId)
      return { fiber, handled, kafka, evicted: member!.memberId }
    })

  it.effect("gives up its partitions and rejoins by itself", () =>
    Effect.gen(function*() {
      const { evicted, fiber, handled, kafka } = yield* evict(true)
      yield* advanceUntil(
        "rejoined as a new member",
        Effect.map(kafka.members("g"), (ms) => ms.length === 1 && ms[0]!.memberId !== evicted),
        10
      )
      yield* produce(5, 10)
      yield* advanceUntil(
        "the new records committed",
        Effect.map(kafka.committed("g"), (c) => c.get("t-0") === 15n),
        10
      )
      assert.deepStrictEqual(handled, Array.from({ length: 15 }, (_, i) => BigInt(i)))
      yield* Fiber.interrupt(fiber)
    }).pipe(Effect.provide(InMemoryKafka.layer())))

  it.effect("with rejoin: false, ends with PartitionsLost naming them", () =>
    Effect.gen(function*() {
      const { fiber } = yield* evict(false)
      yield* advanceUntil("the consumer ends", Effect.map(Fiber.poll(fiber), (p) => p._tag === "Some"), 10)
      const exit = yield* Fiber.await(fiber)
      const error = Exit.isFailure(exit) && exit.cause._tag === "Fail" ? exit.cause.error : undefined
      assert.instanceOf(error, PartitionsLost)
      if (error instanceof PartitionsLost) assert.deepStrictEqual(error.partitions, [{ topic: "t", partition: 0 }])
    }).pipe(Effect.provide(InMemoryKafka.layer())))
})
