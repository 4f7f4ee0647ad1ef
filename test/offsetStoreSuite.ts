import { assert, describe, it } from "@effect/vitest"
import * as Cause from "effect/Cause"
import * as Context from "effect/Context"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import type * as Layer from "effect/Layer"
import * as Ref from "effect/Ref"
import type { CommitUnit, Transaction } from "../src/OffsetStore.js"
import { Fenced, OffsetStore } from "../src/OffsetStore.js"
import * as TopicPartition from "../src/TopicPartition.js"

/**
 * How the suite writes a handler's results inside a unit of work and reads back what committed: each store keeps
 * results its own way (appended entries for memory and files, the user's own tables for Postgres).
 */
export class SuiteResults extends Context.Tag("test/OffsetStoreSuite/Results")<SuiteResults, {
  readonly write: (
    groupId: string,
    partition: TopicPartition.TopicPartition,
    values: ReadonlyArray<string>
  ) => Effect.Effect<void, unknown, Transaction>
  readonly read: (
    groupId: string,
    partition: TopicPartition.TopicPartition
  ) => Effect.Effect<ReadonlyArray<string>, unknown>
}>() {}

class Boom extends Error {
  readonly _tag = "Boom"
}

const newGroup = () => `group-${crypto.randomUUID()}`

const unit = (
  groupId: string,
  partition: TopicPartition.TopicPartition,
  expected: bigint | null,
  next: bigint
): CommitUnit => ({ groupId, partition, expected, next })

const write = (groupId: string, partition: TopicPartition.TopicPartition, values: ReadonlyArray<string>) =>
  Effect.flatMap(SuiteResults, (results) => results.write(groupId, partition, values))

const read = (groupId: string, partition: TopicPartition.TopicPartition) =>
  Effect.flatMap(SuiteResults, (results) => results.read(groupId, partition))

const commit = <A, E, R>(unit: CommitUnit, work: Effect.Effect<A, E, R>) =>
  Effect.flatMap(OffsetStore, (store) => store.commit(unit, work))

const load = (groupId: string, partitions: ReadonlyArray<TopicPartition.TopicPartition>) =>
  Effect.flatMap(OffsetStore, (store) => store.load(groupId, partitions))

/** Commits `values` from `expected` to `next`, writing them as the unit's results. */
const commitValues = (
  groupId: string,
  partition: TopicPartition.TopicPartition,
  expected: bigint | null,
  next: bigint,
  values: ReadonlyArray<string>
) => commit(unit(groupId, partition, expected, next), write(groupId, partition, values))

const assertFenced = (error: unknown, expected: bigint | null, actual: bigint | null) => {
  assert.instanceOf(error, Fenced)
  if (error instanceof Fenced) {
    assert.strictEqual(error.expected, expected)
    assert.strictEqual(error.actual, actual)
  }
}

/**
 * The behaviour every `OffsetStore` must have. `layer` is built afresh for every test; tests use their own group ids,
 * so a layer may also share its storage between tests.
 */
export const offsetStoreSuite = <E>(name: string, layer: Layer.Layer<OffsetStore | SuiteResults, E>) =>
  describe(name, () => {
    const orders0 = TopicPartition.make("orders", 0)
    const orders1 = TopicPartition.make("orders", 1)

    it.effect("loads nothing for partitions it never stored", () =>
      Effect.gen(function*() {
        const group = newGroup()
        const positions = yield* load(group, [orders0, orders1])
        assert.strictEqual(positions.size, 0)
        assert.strictEqual((yield* load(group, [])).size, 0)
        assert.deepStrictEqual(yield* read(group, orders0), [])
      }).pipe(Effect.provide(layer)))

    it.effect("commits the work's results and the position together", () =>
      Effect.gen(function*() {
        const group = newGroup()
        const work = write(group, orders0, ["a", "b", "c"]).pipe(Effect.as("done"))
        const value = yield* commit(unit(group, orders0, null, 3n), work)
        assert.strictEqual(value, "done")
        assert.strictEqual((yield* load(group, [orders0])).get("orders-0"), 3n)
        assert.deepStrictEqual(yield* read(group, orders0), ["a", "b", "c"])

        yield* commitValues(group, orders0, 3n, 5n, ["d", "e"])
        assert.strictEqual((yield* load(group, [orders0])).get("orders-0"), 5n)
        assert.deepStrictEqual(yield* read(group, orders0), ["a", "b", "c", "d", "e"])
      }).pipe(Effect.provide(layer)))

    it.effect("rolls back the results and keeps the position when the work fails", () =>
      Effect.gen(function*() {
        const group = newGroup()
        yield* commitValues(group, orders0, null, 3n, ["a"])

        const error = yield* commit(
          unit(group, orders0, 3n, 6n),
          write(group, orders0, ["x", "y"]).pipe(Effect.zipRight(Effect.fail(new Boom("handler failed"))))
        ).pipe(Effect.flip)
        assert.instanceOf(error, Boom)

        const defect = yield* commit(
          unit(group, orders0, 3n, 6n),
          write(group, orders0, ["z"]).pipe(Effect.zipRight(Effect.die("handler crashed")))
        ).pipe(Effect.exit)
        assert.isTrue(Exit.isFailure(defect) && Cause.isDie(defect.cause))

        assert.strictEqual((yield* load(group, [orders0])).get("orders-0"), 3n)
        assert.deepStrictEqual(yield* read(group, orders0), ["a"])

        yield* commitValues(group, orders0, 3n, 4n, ["b"])
        assert.strictEqual((yield* load(group, [orders0])).get("orders-0"), 4n)
        assert.deepStrictEqual(yield* read(group, orders0), ["a", "b"])
      }).pipe(Effect.provide(layer)))

    it.effect("refuses a unit that did not start from the stored position, and nothing of it lands", () =>
      Effect.gen(function*() {
        const group = newGroup()
        yield* commitValues(group, orders0, null, 3n, ["a"])

        const fromNothing = yield* Effect.flip(commitValues(group, orders0, null, 2n, ["stale-1"]))
        assertFenced(fromNothing, null, 3n)
        if (fromNothing instanceof Fenced) {
          assert.strictEqual(fromNothing.groupId, group)
          assert.strictEqual(fromNothing.topic, "orders")
          assert.strictEqual(fromNothing.partition, 0)
        }
        assertFenced(yield* Effect.flip(commitValues(group, orders0, 1n, 2n, ["stale-2"])), 1n, 3n)
        assertFenced(yield* Effect.flip(commitValues(group, orders0, 5n, 6n, ["ahead"])), 5n, 3n)
        assertFenced(yield* Effect.flip(commitValues(group, orders1, 0n, 1n, ["never-stored"])), 0n, null)

        assert.strictEqual((yield* load(group, [orders0])).get("orders-0"), 3n)
        assert.isFalse((yield* load(group, [orders1])).has("orders-1"))
        assert.deepStrictEqual(yield* read(group, orders0), ["a"])
        assert.deepStrictEqual(yield* read(group, orders1), [])
      }).pipe(Effect.provide(layer)))

    it.live("lets exactly one of several concurrent units from the same position commit", () =>
      Effect.gen(function*() {
        const group = newGroup()
        const contenders = 4
        let position: bigint | null = null
        let expectedResults: Array<string> = []
        for (let attempt = 0; attempt < 5; attempt++) {
          const from: bigint | null = position
          const base: bigint = from ?? 0n
          // Every unit's work waits until all of them are running, so that all are open at once when they commit.
          const arrived = yield* Ref.make(0)
          const allRunning = yield* Effect.makeLatch(false)
          const barrier = Ref.updateAndGet(arrived, (n) => n + 1).pipe(
            Effect.flatMap((n) => n === contenders ? allRunning.open : Effect.void),
            Effect.zipRight(allRunning.await),
            Effect.timeoutFail({
              duration: "10 seconds",
              onTimeout: () => new Error("the units never ran at the same time: the store runs one unit at a time")
            })
          )
          const outcomes = yield* Effect.all(
            Array.from({ length: contenders }, (_, i) =>
              commit(
                unit(group, orders0, from, base + BigInt(i + 1)),
                write(group, orders0, [`attempt-${attempt}-unit-${i}`]).pipe(Effect.zipRight(barrier), Effect.as(i))
              ).pipe(Effect.either)),
            { concurrency: "unbounded" }
          )
          const winners = outcomes.flatMap((outcome) => Either.isRight(outcome) ? [outcome.right] : [])
          assert.strictEqual(winners.length, 1, `attempt ${attempt}: one winner`)
          const winner = winners[0]
          const next: bigint = base + BigInt(winner + 1)
          for (const outcome of outcomes) {
            if (Either.isLeft(outcome)) assertFenced(outcome.left, from, next)
          }
          assert.strictEqual((yield* load(group, [orders0])).get("orders-0"), next)
          expectedResults = [...expectedResults, `attempt-${attempt}-unit-${winner}`]
          assert.deepStrictEqual(yield* read(group, orders0), expectedResults)
          position = next
        }
      }).pipe(Effect.provide(layer)))

    it.live("rolls back a unit whose work is interrupted", () =>
      Effect.gen(function*() {
        const group = newGroup()
        yield* commitValues(group, orders0, null, 2n, ["a"])

        const started = yield* Deferred.make<void>()
        const workInterrupted = yield* Ref.make(false)
        const fiber = yield* Effect.fork(
          commit(
            unit(group, orders0, 2n, 5n),
            write(group, orders0, ["x"]).pipe(
              Effect.zipRight(Deferred.succeed(started, undefined)),
              Effect.zipRight(Effect.never),
              Effect.onInterrupt(() => Ref.set(workInterrupted, true))
            )
          )
        )
        yield* Deferred.await(started).pipe(
          Effect.timeoutFail({ duration: "10 seconds", onTimeout: () => new Error("the work never started") })
        )
        const exit = yield* Fiber.interrupt(fiber)
        assert.isTrue(Exit.isInterrupted(exit))
        assert.isTrue(yield* Ref.get(workInterrupted), "the work was interrupted before the commit gave up")

        assert.strictEqual((yield* load(group, [orders0])).get("orders-0"), 2n)
        assert.deepStrictEqual(yield* read(group, orders0), ["a"])

        // Nothing of the interrupted unit holds the partition: the next unit from the same position commits.
        yield* commitValues(group, orders0, 2n, 4n, ["b"])
        assert.strictEqual((yield* load(group, [orders0])).get("orders-0"), 4n)
        assert.deepStrictEqual(yield* read(group, orders0), ["a", "b"])
      }).pipe(Effect.provide(layer)))

    it.effect("keeps the positions of partitions and groups apart", () =>
      Effect.gen(function*() {
        const first = newGroup()
        const second = newGroup()
        const dashed = TopicPartition.make("orders.v1-eu", 0)
        yield* commitValues(first, orders0, null, 10n, ["first-orders-0"])
        yield* commitValues(first, orders1, null, 20n, ["first-orders-1"])
        yield* commitValues(first, dashed, null, 5n, ["first-dashed"])
        yield* commitValues(second, orders0, null, 30n, ["second-orders-0"])

        const firstPositions = yield* load(first, [orders0, orders1, TopicPartition.make("orders", 2), dashed])
        assert.deepStrictEqual(
          [...firstPositions].sort(([a], [b]) => a.localeCompare(b)),
          [["orders-0", 10n], ["orders-1", 20n], ["orders.v1-eu-0", 5n]]
        )
        const secondPositions = yield* load(second, [orders0, orders1])
        assert.deepStrictEqual([...secondPositions], [["orders-0", 30n]])

        yield* commitValues(first, orders0, 10n, 11n, ["first-orders-0-again"])
        assertFenced(yield* Effect.flip(commitValues(second, orders0, 10n, 12n, ["wrong-group"])), 10n, 30n)
        assertFenced(yield* Effect.flip(commitValues(first, orders1, 11n, 12n, ["wrong-partition"])), 11n, 20n)

        assert.strictEqual((yield* load(second, [orders0])).get("orders-0"), 30n)
        assert.strictEqual((yield* load(first, [orders1])).get("orders-1"), 20n)
        assert.deepStrictEqual(yield* read(first, orders0), ["first-orders-0", "first-orders-0-again"])
        assert.deepStrictEqual(yield* read(first, orders1), ["first-orders-1"])
        assert.deepStrictEqual(yield* read(first, dashed), ["first-dashed"])
        assert.deepStrictEqual(yield* read(second, orders0), ["second-orders-0"])
      }).pipe(Effect.provide(layer)))

    it.effect("stores the last of a run of commits", () =>
      Effect.gen(function*() {
        const group = newGroup()
        const commits = 30
        for (let i = 0; i < commits; i++) {
          yield* commitValues(group, orders0, i === 0 ? null : BigInt(i * 2), BigInt((i + 1) * 2), [`value-${i}`])
        }
        assert.strictEqual((yield* load(group, [orders0])).get("orders-0"), BigInt(commits * 2))
        assert.deepStrictEqual(
          yield* read(group, orders0),
          Array.from({ length: commits }, (_, i) => `value-${i}`)
        )
      }).pipe(Effect.provide(layer)))
  })
