/**
 * `FailureRoute.replay` on the in-memory broker when its dead-letter topic or its group changes under it: records
 * removed by retention before they were replayed, partitions revoked by a member that joins, partitions lost by an
 * eviction. Each replay is raced against a deadline: a replay that never ends fails its test by assertion.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as TestClock from "effect/TestClock"
import * as TestServices from "effect/TestServices"
import type { ConsumerRecord } from "../src/ConsumerRecord.js"
import { valueString } from "../src/ConsumerRecord.js"
import { Driver, type DriverEvent } from "../src/Driver.js"
import * as FailureRoute from "../src/FailureRoute.js"
import * as InMemoryKafka from "../src/InMemoryKafka.js"
import type * as OffsetBatch from "../src/OffsetBatch.js"
import { readTopic } from "./producerSuite.js"
import { inMemoryWrapping } from "./support/kit.js"

const source = "orders"
const dlq = "orders-dlq"
const groupId = "replayer"

/** The dead letter of the source record at `offset`, as the failure route writes it. */
const letter = (offset: number): InMemoryKafka.ProducerRecord => {
  const record: ConsumerRecord = {
    topic: source,
    partition: 0,
    offset: BigInt(offset),
    key: null,
    value: new TextEncoder().encode(`order ${offset}`),
    headers: {},
    timestamp: 0
  }
  const { topic: _, ...rest } = FailureRoute.deadLetterRecord(dlq, record, new Error("refused"), 1)
  return { ...rest, partition: 0 }
}

/** Dead letters of the source records `from` to `to` (excluded), written to the dead-letter topic's partition 0. */
const deadLetters = (from: number, to: number) =>
  InMemoryKafka.produce(dlq, Array.from({ length: to - from }, (_, i) => letter(from + i)))

const topics = Effect.zipRight(InMemoryKafka.createTopic(source, 1), InMemoryKafka.createTopic(dlq, 1))

/**
 * The effect, raced against `deadline` of real time (on the `TestClock` too): one that does not end by then fails the
 * test by assertion, rather than hanging it.
 */
const within = <A, E, R>(effect: Effect.Effect<A, E, R>, deadline: Duration.DurationInput = "5 seconds") =>
  Effect.flatMap(
    Effect.fork(effect),
    (fiber) =>
      TestServices.provideLive(Effect.timeoutOption(Fiber.await(fiber), deadline)).pipe(
        Effect.flatMap(Option.match({
          onNone: () =>
            Effect.zipRight(
              Fiber.interrupt(fiber),
              Effect.sync(() => assert.fail(`did not end within ${Duration.format(Duration.decode(deadline))}`))
            ),
          onSome: (exit) => exit
        }))
      )
  )

/** How the replay ended: its result, or the error it failed with. */
const stoppedWith = (outcome: Either.Either<FailureRoute.Replayed, unknown>) => {
  assert.isTrue(Either.isLeft(outcome), `the replay should have failed, it returned ${JSON.stringify(outcome)}`)
  const error = (outcome as Either.Left<unknown, FailureRoute.Replayed>).left
  assert.instanceOf(error, FailureRoute.ReplayStopped)
  return error as FailureRoute.ReplayStopped
}

const replay = FailureRoute.replay({ topic: dlq, groupId })

/** What the replay wrote back to the source topic, by value. */
const replayedValues = Effect.map(readTopic(source, 1), ([records]) => records!.map(valueString))

const committed = Effect.map(InMemoryKafka.committed(groupId), (batch) => batch.positions.get(`${dlq}-0`))

const orders = (offsets: ReadonlyArray<number>) => offsets.map((i) => `order ${i}`)
const range = (from: number, to: number) => Array.from({ length: to - from }, (_, i) => from + i)

describe("replay: records removed by retention", () => {
  it.live("removed before the replay began: it goes on from the log's earliest offset and counts them", () =>
    Effect.gen(function*() {
      yield* topics
      yield* deadLetters(0, 3)
      const first = yield* within(replay)
      assert.deepStrictEqual(first, { replayed: 3, foreign: 0, removed: 0 })
      // Five more are dead-lettered; retention removes three of them before the next replay.
      yield* deadLetters(3, 8)
      yield* Effect.flatMap(InMemoryKafka.InMemoryKafka, (kafka) => kafka.deleteRecords(dlq, 0, 6n))

      const second = yield* within(replay)
      assert.deepStrictEqual(second, { replayed: 2, foreign: 0, removed: 3 })
      assert.deepStrictEqual(yield* replayedValues, orders([0, 1, 2, 6, 7]))
      assert.strictEqual(yield* committed, 8n)
      // Everything up to the end removed: nothing to replay, the loss counted, and the position moved past it.
      yield* deadLetters(8, 10)
      yield* Effect.flatMap(InMemoryKafka.InMemoryKafka, (kafka) => kafka.deleteRecords(dlq, 0, 10n))
      const third = yield* within(replay)
      assert.deepStrictEqual(third, { replayed: 0, foreign: 0, removed: 2 })
      assert.strictEqual(yield* committed, 10n)
      // The loss was told once: the next replay starts past it.
      const fourth = yield* within(replay)
      assert.deepStrictEqual(fourth, { replayed: 0, foreign: 0, removed: 0 })
    }).pipe(Effect.provide(Layer.provideMerge(InMemoryKafka.layerProducer(), InMemoryKafka.layer()))))

  it.live("removed while the replay runs: it goes on from the earliest offset, counting what it had not read", () => {
    // Retention runs right after the replay's first commit.
    let afterCommit: Effect.Effect<void> = Effect.void
    const kafka = inMemoryWrapping((session) => ({
      commit: (batch: OffsetBatch.OffsetBatch) =>
        Effect.zipRight(
          session.commit(batch),
          Effect.suspend(() => {
            const run = afterCommit
            afterCommit = Effect.void
            return run
          })
        )
    }))
    return Effect.gen(function*() {
      const broker = yield* InMemoryKafka.InMemoryKafka
      yield* topics
      yield* deadLetters(0, 600)
      afterCommit = Effect.orDie(broker.deleteRecords(dlq, 0, 550n))

      const outcome = yield* within(replay)
      // The first fetch took 500 records; 500 to 549 were removed before the next one.
      assert.deepStrictEqual(outcome, { replayed: 550, foreign: 0, removed: 50 })
      assert.deepStrictEqual(yield* replayedValues, orders([...range(0, 500), ...range(550, 600)]))
      assert.strictEqual(yield* committed, 600n)
    }).pipe(Effect.provide(Layer.provideMerge(InMemoryKafka.layerProducer(), kafka)))
  })
})

/**
 * The in-memory broker with the replay's first commit held until `open` completes; `holding` completes when it is
 * reached (the replay has fetched and written back the first 500 records).
 */
const holdingFirstCommit = Effect.gen(function*() {
  const holding = yield* Deferred.make<void>()
  const open = yield* Deferred.make<void>()
  let first = true
  const layer = inMemoryWrapping((session) => ({
    commit: (batch: OffsetBatch.OffsetBatch) =>
      Effect.suspend(() => {
        if (!first || !session.memberId.startsWith(`${groupId}-replay`)) return session.commit(batch)
        first = false
        return Deferred.succeed(holding, undefined).pipe(
          Effect.zipRight(Deferred.await(open)),
          Effect.zipRight(session.commit(batch))
        )
      })
  }))
  return { holding, open, layer }
})

const sessionOptions = {
  groupId,
  clientId: "another",
  subscription: { _tag: "Topics", topics: [dlq] },
  maxPollRecords: 500,
  pollTimeout: Duration.millis(50),
  sessionTimeout: Duration.seconds(10),
  rebalanceTimeout: Duration.seconds(30)
} as const

describe("replay: partitions taken away", () => {
  it.live("revoked by a member that joins: ReplayStopped, its work committed, the partition the other member's", () =>
    Effect.gen(function*() {
      const { holding, open, layer } = yield* holdingFirstCommit
      return yield* Effect.gen(function*() {
        yield* topics
        yield* deadLetters(0, 600)
        const running = yield* Effect.fork(Effect.either(within(replay)))
        yield* Deferred.await(holding)
        // Another member joins the replay's group while the replay is between its fetch and its commit.
        const driver = yield* Driver
        const other = yield* driver.connect(sessionOptions)
        yield* Deferred.succeed(open, undefined)

        const error = stoppedWith(yield* Fiber.join(running))
        const { reason, partitions, replayed, removed } = error
        assert.deepStrictEqual({ reason, partitions, replayed, removed }, {
          reason: "Revoked",
          partitions: [{ topic: dlq, partition: 0 }],
          replayed: 500,
          removed: 0
        })
        assert.include(error.message, "run the replay again")
        // What it replayed is committed, and the partition went to the other member.
        assert.strictEqual(yield* committed, 500n)
        assert.deepStrictEqual(yield* replayedValues, orders(range(0, 500)))
        const assigned = yield* within(
          Effect.repeat(other.poll, {
            until: (events: ReadonlyArray<DriverEvent>) => events.some((e) => e._tag === "Assigned")
          }),
          "2 seconds"
        )
        assert.deepStrictEqual(assigned.find((e) => e._tag === "Assigned"), {
          _tag: "Assigned",
          partitions: [{ topic: dlq, partition: 0 }]
        })
      }).pipe(Effect.provide(Layer.provideMerge(InMemoryKafka.layerProducer(), layer)), Effect.scoped)
    }))

  it.effect("lost by an eviction (paused past its session): ReplayStopped, its work committed, and it goes on", () =>
    Effect.gen(function*() {
      const { holding, open, layer } = yield* holdingFirstCommit
      return yield* Effect.gen(function*() {
        const kafka = yield* InMemoryKafka.InMemoryKafka
        yield* topics
        yield* deadLetters(0, 600)
        const running = yield* Effect.fork(Effect.either(within(replay)))
        yield* Deferred.await(holding)
        // The member is paused past its session (10 seconds): its next poll finds it evicted.
        const [member] = yield* kafka.members(groupId)
        yield* kafka.freeze(member!.memberId)
        yield* TestClock.adjust("11 seconds")
        yield* kafka.thaw(member!.memberId)
        yield* Deferred.succeed(open, undefined)

        const { reason, partitions, replayed } = stoppedWith(yield* Fiber.join(running))
        assert.deepStrictEqual({ reason, partitions, replayed }, {
          reason: "Lost",
          partitions: [{ topic: dlq, partition: 0 }],
          replayed: 500
        })
        assert.strictEqual(yield* committed, 500n)
        // Run again, alone, it goes on from there.
        const again = yield* within(replay)
        assert.deepStrictEqual(again, { replayed: 100, foreign: 0, removed: 0 })
        assert.deepStrictEqual(yield* replayedValues, orders(range(0, 600)))
      }).pipe(Effect.provide(Layer.provideMerge(InMemoryKafka.layerProducer({ linger: 0 }), layer)))
    }))
})
