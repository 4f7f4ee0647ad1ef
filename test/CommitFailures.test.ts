/**
 * One rule for refused commits, under every policy that commits to Kafka: retriable refusals are retried and their
 * positions kept for the next commit; a partition the member no longer owns is dropped alone; a fatal refusal ends
 * the consumer with `CommitFailed` naming the reason; retriable refusals that go on past `reconnectTimeout` end it too.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Chunk from "effect/Chunk"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as CommitPolicy from "../src/CommitPolicy.js"
import * as Consumer from "../src/Consumer.js"
import * as InMemoryKafka from "../src/InMemoryKafka.js"
import { CommitFailed } from "../src/KafkaError.js"
import * as OffsetBatch from "../src/OffsetBatch.js"
import { advanceUntil, inMemoryWrapping, settled } from "./support/kit.js"

const config = { groupId: "g", topics: ["t"], maxPollRecords: 5, reconnectTimeout: "30 seconds" } as const

const setup = (partitions: number, perPartition: number) =>
  Effect.gen(function*() {
    yield* InMemoryKafka.createTopic("t", partitions)
    for (let partition = 0; partition < partitions; partition++) {
      yield* InMemoryKafka.produce(
        "t",
        Array.from({ length: perPartition }, (_, i) => ({ value: String(i), partition }))
      )
    }
  })

const committed = Effect.map(InMemoryKafka.committed("g"), (batch) => Object.fromEntries(batch.positions))

const failureOf = (exit: Exit.Exit<unknown, unknown>) =>
  Exit.isFailure(exit) && exit.cause._tag === "Fail" ? exit.cause.error : undefined

const policies = {
  commitAfter: CommitPolicy.commitAfter({ maxBatch: 5, maxInterval: "1 second" }),
  autoCommit: CommitPolicy.autoCommit({ interval: "1 second" })
} as const

describe("refused commits", () => {
  for (const [name, policy] of Object.entries(policies)) {
    it.effect(`${name}: a fatal refusal (not authorized) ends the consumer with CommitFailed naming the reason`, () =>
      Effect.gen(function*() {
        const kafka = yield* InMemoryKafka.InMemoryKafka
        yield* setup(2, 10)
        yield* kafka.refuseCommits("g", "Unauthorized", 100)
        const fiber = yield* Consumer.run(config, () => Effect.void).pipe(Effect.provide(policy), Effect.fork)
        yield* advanceUntil("the consumer ends", Effect.map(Fiber.poll(fiber), (p) => p._tag === "Some"), 5)
        const error = failureOf(yield* Fiber.await(fiber))
        assert.instanceOf(error, CommitFailed)
        if (error instanceof CommitFailed) {
          assert.strictEqual(error.reason, "Unauthorized")
          assert.isTrue(error.fatal)
          assert.include(error.message, "Unauthorized")
        }
        assert.deepStrictEqual(yield* committed, {})
      }).pipe(Effect.provide(InMemoryKafka.layer())))

    it.effect(`${name}: retriable refusals are retried, their positions kept, and the next commit lands them`, () =>
      Effect.gen(function*() {
        const kafka = yield* InMemoryKafka.InMemoryKafka
        yield* setup(2, 10)
        // More refusals than the immediate retries: the positions must wait for a later commit.
        yield* kafka.refuseCommits("g", "RebalanceInProgress", 8)
        let handled = 0
        const fiber = yield* Consumer.run(config, (records) => Effect.sync(() => (handled += Chunk.size(records))))
          .pipe(Effect.provide(policy), Effect.fork)
        yield* advanceUntil(
          "everything committed",
          Effect.map(committed, (c) => c["t-0"] === 10n && c["t-1"] === 10n),
          20
        )
        assert.strictEqual(handled, 20)
        assert.isTrue((yield* Fiber.poll(fiber))._tag === "None")
        yield* Fiber.interrupt(fiber)
      }).pipe(Effect.provide(InMemoryKafka.layer())))

    it.effect(`${name}: retriable refusals that go on past reconnectTimeout end the consumer with the last one`, () =>
      Effect.gen(function*() {
        const kafka = yield* InMemoryKafka.InMemoryKafka
        yield* setup(1, 10)
        yield* kafka.refuseCommits("g", "CoordinatorNotAvailable", 1_000_000)
        const fiber = yield* Consumer.run(config, () => Effect.void).pipe(Effect.provide(policy), Effect.fork)
        yield* advanceUntil("the consumer ends", Effect.map(Fiber.poll(fiber), (p) => p._tag === "Some"), 60)
        const error = failureOf(yield* Fiber.await(fiber))
        assert.instanceOf(error, CommitFailed)
        if (error instanceof CommitFailed) assert.strictEqual(error.reason, "CoordinatorNotAvailable")
      }).pipe(Effect.provide(InMemoryKafka.layer())))
  }

  for (const rejoin of [true, false]) {
    it.effect(`commitAfter: a refusal for a stale membership ${rejoin ? "makes the member rejoin at once, losing nothing" : "ends the consumer with rejoin: false"}`, () =>
      Effect.gen(function*() {
        const kafka = yield* InMemoryKafka.InMemoryKafka
        yield* setup(1, 10)
        yield* kafka.refuseCommits("g", "IllegalGeneration", 1)
        const handled: Array<bigint> = []
        const fiber = yield* Consumer.run({ ...config, rejoin }, (records) =>
          Effect.sync(() => {
            for (const r of records) handled.push(r.offset)
          })).pipe(Effect.provide(CommitPolicy.commitAfter({ maxBatch: 5, maxInterval: "1 second" })), Effect.fork)
        if (rejoin) {
          const [first] = yield* Effect.repeat(kafka.members("g"), { until: (ms) => ms.length === 1 })
          yield* advanceUntil(
            "committed by a new member",
            Effect.map(committed, (c) => c["t-0"] === 10n),
            10
          )
          const [now] = yield* kafka.members("g")
          assert.notStrictEqual(now!.memberId, first!.memberId, "the member did not rejoin")
          assert.deepStrictEqual(
            [...new Set(handled)].sort((a, b) => Number(a - b)),
            Array.from({ length: 10 }, (_, i) => BigInt(i))
          )
          yield* Fiber.interrupt(fiber)
        } else {
          yield* advanceUntil("the consumer ends", Effect.map(Fiber.poll(fiber), (p) => p._tag === "Some"), 10)
          const error = failureOf(yield* Fiber.await(fiber))
          assert.instanceOf(error, CommitFailed)
          if (error instanceof CommitFailed) assert.strictEqual(error.reason, "IllegalGeneration")
        }
      }).pipe(Effect.provide(InMemoryKafka.layer())))
  }

  it.effect("commitAfter: a partition the member no longer owns is dropped alone; the others' positions land", () =>
    Effect.gen(function*() {
      yield* setup(2, 10)
      let handled = 0
      const fiber = yield* Consumer.run(config, (records) => Effect.sync(() => (handled += Chunk.size(records)))).pipe(
        Effect.provide(CommitPolicy.commitAfter({ maxBatch: 20, maxInterval: "1 hour" })),
        Effect.fork
      )
      yield* settled("handled", Effect.sync(() => handled === 20))
      yield* advanceUntil("partition 0 committed", Effect.map(committed, (c) => c["t-0"] === 10n), 5)
      // The refused partition's position was dropped; the same flush committed the other one.
      assert.deepStrictEqual(yield* committed, { "t-0": 10n })
      yield* Fiber.interrupt(fiber)
    }).pipe(Effect.provide(notOwnedOnce({ topic: "t", partition: 1 }))))

  it.effect("atMostOnce: a fatal refusal ends the consumer before any record is handled", () =>
    Effect.gen(function*() {
      const kafka = yield* InMemoryKafka.InMemoryKafka
      yield* setup(1, 10)
      yield* kafka.refuseCommits("g", "Unauthorized", 100)
      let handled = 0
      const exit = yield* Consumer.run(config, (records) => Effect.sync(() => (handled += Chunk.size(records)))).pipe(
        Effect.provide(CommitPolicy.atMostOnce()),
        Effect.exit
      )
      const error = failureOf(exit)
      assert.instanceOf(error, CommitFailed)
      if (error instanceof CommitFailed) assert.strictEqual(error.reason, "Unauthorized")
      assert.strictEqual(handled, 0)
    }).pipe(Effect.provide(InMemoryKafka.layer())))

  it.effect("atMostOnce: retriable refusals delay the handler until the commit lands", () =>
    Effect.gen(function*() {
      const kafka = yield* InMemoryKafka.InMemoryKafka
      yield* setup(1, 10)
      yield* kafka.refuseCommits("g", "RebalanceInProgress", 8)
      const violations: Array<string> = []
      let handled = 0
      const fiber = yield* Consumer.run(config, (records) =>
        Effect.gen(function*() {
          const position = (yield* committed)["t-0"] ?? -1n
          const last = Chunk.unsafeLast(records).offset
          if (position <= last) violations.push(`${last}: committed ${position}`)
          handled += Chunk.size(records)
        })).pipe(Effect.provide(CommitPolicy.atMostOnce()), Effect.fork)
      yield* advanceUntil("handled", Effect.sync(() => handled === 10), 20)
      assert.deepStrictEqual(violations, [])
      yield* Fiber.interrupt(fiber)
    }).pipe(Effect.provide(InMemoryKafka.layer())))

  it.effect("atMostOnce: a chunk whose commit is refused as not owned is skipped, never handled", () =>
    Effect.gen(function*() {
      yield* setup(2, 5)
      const handledPartitions = new Set<number>()
      const fiber = yield* Consumer.run(config, (records) =>
        Effect.sync(() => {
          for (const r of records) handledPartitions.add(r.partition)
        })).pipe(Effect.provide(CommitPolicy.atMostOnce()), Effect.fork)
      yield* advanceUntil("partition 0 handled", Effect.sync(() => handledPartitions.has(0)), 5)
      yield* Effect.repeatN(Effect.yieldNow(), 1_000)
      assert.deepStrictEqual([...handledPartitions], [0])
      assert.deepStrictEqual(yield* committed, { "t-0": 5n })
      yield* Fiber.interrupt(fiber)
    }).pipe(Effect.provide(notOwnedOnce({ topic: "t", partition: 1 }))))
})

/**
 * The in-memory broker, with a driver whose first commit that includes `partition` is refused as not owned (as a
 * client that learnt of a rebalance before the runloop did refuses it), naming only that partition.
 */
function notOwnedOnce(partition: { readonly topic: string; readonly partition: number }) {
  let refused = false
  return inMemoryWrapping((session) => ({
    commit: (offsets: OffsetBatch.OffsetBatch) =>
      Effect.suspend(() => {
        if (refused || OffsetBatch.get(offsets, partition) === undefined) return session.commit(offsets)
        refused = true
        return Effect.fail(new CommitFailed({ reason: "NotOwned", partitions: [partition] }))
      })
  }))
}
