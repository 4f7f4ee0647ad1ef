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

const unit = (groupId: string, partition: TopicPartition.TopicPartition, epoch: bigint, next: bigint): CommitUnit => ({
  groupId,
  partition,
  epoch,
  next
})

const write = (groupId: string, partition: TopicPartition.TopicPartition, values: ReadonlyArray<string>) =>
  Effect.flatMap(SuiteResults, (results) => results.write(groupId, partition, values))

const read = (groupId: string, partition: TopicPartition.TopicPartition) =>
  Effect.flatMap(SuiteResults, (results) => results.read(groupId, partition))

const commit = <A, E, R>(unit: CommitUnit, work: Effect.Effect<A, E, R>) =>
  Effect.flatMap(OffsetStore, (store) => store.commit(unit, work))

const load = (groupId: string, partitions: ReadonlyArray<TopicPartition.TopicPartition>) =>
  Effect.flatMap(OffsetStore, (store) => store.load(groupId, partitions))

const position = (groupId: string, partition: TopicPartition.TopicPartition) =>
  Effect.map(load(groupId, [partition]), (positions) => positions.get(TopicPartition.key(partition)))

/** Claims one partition and returns its claim. */
const claim = (groupId: string, partition: TopicPartition.TopicPartition) =>
  Effect.flatMap(OffsetStore, (store) => store.claim(groupId, [partition])).pipe(
    Effect.flatMap((claims) => {
      const claimed = claims.get(TopicPartition.key(partition))
      return claimed === undefined
        ? Effect.dieMessage(`the claim returned nothing for ${TopicPartition.key(partition)}`)
        : Effect.succeed(claimed)
    })
  )

/** Commits a unit of `epoch` moving the position to `next`, writing `values` as its results. */
const commitValues = (
  groupId: string,
  partition: TopicPartition.TopicPartition,
  epoch: bigint,
  next: bigint,
  values: ReadonlyArray<string>
) => commit(unit(groupId, partition, epoch, next), write(groupId, partition, values))

/**
 * The failure of a unit that the store must refuse; a unit that commits instead fails the test, saying so (rather
 * than with what `Effect.flip` makes of a success).
 */
export const refusal = <A, E, R>(what: string, effect: Effect.Effect<A, E, R>): Effect.Effect<E, never, R> =>
  Effect.map(Effect.either(effect), (outcome) => {
    if (Either.isRight(outcome)) assert.fail(`${what} committed, but the store had to refuse it`)
    return outcome.left
  })

const assertFenced = (error: unknown, epoch: bigint, currentEpoch: bigint | null) => {
  assert.instanceOf(error, Fenced)
  if (error instanceof Fenced) {
    assert.strictEqual(error.epoch, epoch, "the unit's epoch")
    assert.strictEqual(error.currentEpoch, currentEpoch, "the partition's epoch")
  }
}

const within = <A, E, R>(what: string, effect: Effect.Effect<A, E, R>) =>
  Effect.timeoutFail(effect, { duration: "20 seconds", onTimeout: () => new Error(`timed out: ${what}`) })

/**
 * The behaviour every `OffsetStore` must have. `layer` is built afresh for every test; tests use their own group ids,
 * so a layer may also share its storage between tests.
 */
export const offsetStoreSuite = <E>(
  name: string,
  layer: Layer.Layer<OffsetStore | SuiteResults, E>,
  options: {
    /**
     * The store's database takes one writer at a time (SQLite): an open unit holds it, so a claim waits for that
     * unit, and units of one owner run one after another instead of side by side.
     */
    readonly oneWriter?: boolean
  } = {}
) =>
  describe(name, () => {
    const oneWriter = options.oneWriter === true
    /** Units that wait for each other, where they can run side by side. */
    const barrierOf = (contenders: number) =>
      Effect.gen(function*() {
        if (oneWriter) return Effect.void
        const arrived = yield* Ref.make(0)
        const allRunning = yield* Effect.makeLatch(false)
        return Ref.updateAndGet(arrived, (n) => n + 1).pipe(
          Effect.flatMap((n) => n === contenders ? allRunning.open : Effect.void),
          Effect.zipRight(allRunning.await)
        )
      })
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

    it.effect("raises the owner epoch by one on every claim and returns the stored position", () =>
      Effect.gen(function*() {
        const group = newGroup()
        const store = yield* OffsetStore
        const first = yield* store.claim(group, [orders0, orders1])
        assert.deepStrictEqual(
          [...first].sort(([a], [b]) => a.localeCompare(b)),
          [["orders-0", { epoch: 1n, position: null }], ["orders-1", { epoch: 1n, position: null }]]
        )
        // A claim leaves the position where it was: claimed but nothing stored loads nothing.
        assert.strictEqual((yield* load(group, [orders0, orders1])).size, 0)

        yield* commitValues(group, orders0, 1n, 3n, ["a"])
        assert.deepStrictEqual(yield* claim(group, orders0), { epoch: 2n, position: 3n })
        assert.deepStrictEqual(yield* claim(group, orders0), { epoch: 3n, position: 3n })
        // The other partition kept its own epoch.
        assert.deepStrictEqual(yield* claim(group, orders1), { epoch: 2n, position: null })
        assert.strictEqual(yield* position(group, orders0), 3n)
        assert.deepStrictEqual(yield* read(group, orders0), ["a"])
      }).pipe(Effect.provide(layer)))

    it.effect("commits the work's results and the position together", () =>
      Effect.gen(function*() {
        const group = newGroup()
        const { epoch } = yield* claim(group, orders0)
        const work = write(group, orders0, ["a", "b", "c"]).pipe(Effect.as("done"))
        const value = yield* commit(unit(group, orders0, epoch, 3n), work)
        assert.strictEqual(value, "done")
        assert.strictEqual(yield* position(group, orders0), 3n)
        assert.deepStrictEqual(yield* read(group, orders0), ["a", "b", "c"])

        yield* commitValues(group, orders0, epoch, 5n, ["d", "e"])
        assert.strictEqual(yield* position(group, orders0), 5n)
        assert.deepStrictEqual(yield* read(group, orders0), ["a", "b", "c", "d", "e"])
      }).pipe(Effect.provide(layer)))

    it.effect("rolls back the results and keeps the position when the work fails", () =>
      Effect.gen(function*() {
        const group = newGroup()
        const { epoch } = yield* claim(group, orders0)
        yield* commitValues(group, orders0, epoch, 3n, ["a"])

        const error = yield* commit(
          unit(group, orders0, epoch, 6n),
          write(group, orders0, ["x", "y"]).pipe(Effect.zipRight(Effect.fail(new Boom("handler failed"))))
        ).pipe(Effect.flip)
        assert.instanceOf(error, Boom)

        const defect = yield* commit(
          unit(group, orders0, epoch, 6n),
          write(group, orders0, ["z"]).pipe(Effect.zipRight(Effect.die("handler crashed")))
        ).pipe(Effect.exit)
        assert.isTrue(Exit.isFailure(defect) && Cause.isDie(defect.cause))

        assert.strictEqual(yield* position(group, orders0), 3n)
        assert.deepStrictEqual(yield* read(group, orders0), ["a"])

        yield* commitValues(group, orders0, epoch, 4n, ["b"])
        assert.strictEqual(yield* position(group, orders0), 4n)
        assert.deepStrictEqual(yield* read(group, orders0), ["a", "b"])
      }).pipe(Effect.provide(layer)))

    it.effect("fences a unit of another owner epoch, and nothing of it lands", () =>
      Effect.gen(function*() {
        const group = newGroup()
        const zombie = yield* claim(group, orders0)
        yield* commitValues(group, orders0, zombie.epoch, 3n, ["a"])
        const owner = yield* claim(group, orders0)
        assert.strictEqual(owner.epoch, zombie.epoch + 1n)

        const stale = yield* refusal("the zombie's unit", commitValues(group, orders0, zombie.epoch, 5n, ["stale"]))
        assertFenced(stale, zombie.epoch, owner.epoch)
        if (stale instanceof Fenced) {
          assert.strictEqual(stale.groupId, group)
          assert.strictEqual(stale.topic, "orders")
          assert.strictEqual(stale.partition, 0)
          assert.include(stale.message, `epoch ${owner.epoch}`)
        }
        assertFenced(yield* refusal("a unit of a later epoch", commitValues(group, orders0, 3n, 6n, ["ahead"])), 3n, 2n)
        assertFenced(
          yield* refusal("a unit of an unclaimed partition", commitValues(group, orders1, 1n, 1n, ["never-claimed"])),
          1n,
          null
        )

        assert.strictEqual(yield* position(group, orders0), 3n)
        assert.isUndefined(yield* position(group, orders1))
        assert.deepStrictEqual(yield* read(group, orders0), ["a"])
        assert.deepStrictEqual(yield* read(group, orders1), [])

        // The owner's units commit from the position the claim returned.
        yield* commitValues(group, orders0, owner.epoch, 4n, ["b"])
        assert.strictEqual(yield* position(group, orders0), 4n)
        assert.deepStrictEqual(yield* read(group, orders0), ["a", "b"])
        assertFenced(yield* refusal("the zombie's next unit", commitValues(group, orders0, 1n, 9n, ["late"])), 1n, 2n)
      }).pipe(Effect.provide(layer)))

    it.live("fences a unit that started before a claim and commits after it; the claim does not include it", () =>
      Effect.gen(function*() {
        const group = newGroup()
        const first = yield* claim(group, orders0)
        yield* commitValues(group, orders0, first.epoch, 2n, ["a"])

        const working = yield* Deferred.make<void>()
        const finish = yield* Deferred.make<void>()
        const zombie = yield* Effect.fork(
          commit(
            unit(group, orders0, first.epoch, 7n),
            write(group, orders0, ["zombie"]).pipe(
              Effect.zipRight(Deferred.succeed(working, undefined)),
              Effect.zipRight(Deferred.await(finish))
            )
          )
        )
        yield* within("the zombie's work to start", Deferred.await(working))
        if (oneWriter) {
          // The zombie's unit holds the database: the claim waits for it, and includes what it committed.
          const claiming = yield* Effect.fork(claim(group, orders0))
          yield* Effect.sleep("50 millis")
          assert.isNull(claiming.unsafePoll(), "the claim waits for the open unit")
          yield* Deferred.succeed(finish, undefined)
          yield* within("the zombie's unit", Fiber.join(zombie))
          const after = yield* within("the claim", Fiber.join(claiming))
          assert.deepStrictEqual(after, { epoch: first.epoch + 1n, position: 7n })
          assert.deepStrictEqual(yield* read(group, orders0), ["a", "zombie"])
          assertFenced(
            yield* refusal("the zombie's next unit", commitValues(group, orders0, first.epoch, 9n, ["late"])),
            first.epoch,
            after.epoch
          )
          return
        }
        // The zombie's unit is open, its results written: the claim neither waits for it nor includes it.
        const second = yield* within("the claim", claim(group, orders0))
        assert.deepStrictEqual(second, { epoch: first.epoch + 1n, position: 2n })
        yield* Deferred.succeed(finish, undefined)
        assertFenced(yield* refusal("the unit started before the claim", Fiber.join(zombie)), first.epoch, second.epoch)

        assert.strictEqual(yield* position(group, orders0), 2n)
        assert.deepStrictEqual(yield* read(group, orders0), ["a"])
        yield* commitValues(group, orders0, second.epoch, 3n, ["b"])
        assert.deepStrictEqual(yield* read(group, orders0), ["a", "b"])
      }).pipe(Effect.provide(layer)))

    it.live("gives a claim made while an earlier owner's unit commits either that unit's position or fences it", () =>
      Effect.gen(function*() {
        const group = newGroup()
        let owner = yield* claim(group, orders0)
        let expected: Array<string> = []
        let stored: bigint | null = null
        const outcomes = { landed: 0, fenced: 0 }
        for (let round = 0; round < 20; round++) {
          const next = BigInt(round + 1) * 10n
          const value = `round-${round}`
          // The claim starts as the unit's work starts (in even rounds) or as it ends (in odd ones), so that it meets
          // the unit at every step of its commit.
          const ready = yield* Effect.makeLatch(false)
          const work = round % 2 === 0
            ? ready.open.pipe(Effect.zipRight(Effect.yieldNow()), Effect.zipRight(write(group, orders0, [value])))
            : write(group, orders0, [value]).pipe(Effect.zipRight(ready.open))
          const [committed, claimed] = yield* Effect.all([
            commit(unit(group, orders0, owner.epoch, next), work).pipe(Effect.either),
            ready.await.pipe(Effect.zipRight(claim(group, orders0)))
          ], { concurrency: "unbounded" }).pipe((both) => within(`round ${round}`, both))
          assert.strictEqual(claimed.epoch, owner.epoch + 1n)
          if (Either.isRight(committed)) {
            outcomes.landed++
            assert.strictEqual(claimed.position, next, `round ${round}: the unit landed, so the claim includes it`)
            expected = [...expected, value]
            stored = next
          } else {
            outcomes.fenced++
            assertFenced(committed.left, owner.epoch, claimed.epoch)
            assert.strictEqual(claimed.position, stored, `round ${round}: the unit was fenced before it landed`)
          }
          assert.strictEqual((yield* position(group, orders0)) ?? null, stored)
          assert.deepStrictEqual(yield* read(group, orders0), expected)
          owner = claimed
        }
        yield* Effect.logDebug(`claims racing units: ${outcomes.landed} landed, ${outcomes.fenced} fenced`)
      }).pipe(Effect.provide(layer)))

    it.live("commits every unit of the owner when several run side by side", () =>
      Effect.gen(function*() {
        const group = newGroup()
        const { epoch } = yield* claim(group, orders0)
        const contenders = 3
        const barrier = yield* barrierOf(contenders)
        const nexts = Array.from({ length: contenders }, (_, i) => BigInt(i + 1))
        yield* within(
          "units running side by side",
          Effect.all(
            nexts.map((next) =>
              commit(
                unit(group, orders0, epoch, next),
                write(group, orders0, [`unit-${next}`]).pipe(Effect.zipRight(barrier))
              )
            ),
            { concurrency: "unbounded" }
          )
        )
        const stored = yield* position(group, orders0)
        assert.isTrue(stored !== undefined && nexts.includes(stored), `the position of one of the units: ${stored}`)
        assert.deepStrictEqual(
          [...(yield* read(group, orders0))].sort(),
          nexts.map((next) => `unit-${next}`)
        )
      }).pipe(Effect.provide(layer)))

    it.live("units of records finished out of order: each adds its ranges, side by side; the position moves past those that reach it; a claim returns the rest", () =>
      Effect.gen(function*() {
        const group = newGroup()
        const { epoch } = yield* claim(group, orders0)
        const outOfOrder = (finished: ReadonlyArray<readonly [bigint, bigint]>, next = 0n): CommitUnit => ({
          ...unit(group, orders0, epoch, next),
          finished
        })
        // Nothing stored yet: the first unit's `next` is where the partition began.
        yield* commit(outOfOrder([[12n, 13n]], 10n), write(group, orders0, ["12"]))
        assert.deepStrictEqual(yield* claim(group, orders0), {
          epoch: epoch + 1n,
          position: 10n,
          finished: [[12n, 13n]]
        })
        const owner = epoch + 1n
        const at = (finished: ReadonlyArray<readonly [bigint, bigint]>): CommitUnit => ({
          ...unit(group, orders0, owner, 10n),
          finished
        })
        const contenders: ReadonlyArray<readonly [bigint, bigint]> = [[14n, 15n], [15n, 17n], [20n, 21n]]
        const barrier = yield* barrierOf(contenders.length)
        yield* within(
          "units running side by side",
          Effect.all(
            contenders.map((range) =>
              commit(at([range]), write(group, orders0, [String(range[0])]).pipe(Effect.zipRight(barrier)))
            ),
            { concurrency: "unbounded" }
          )
        )
        assert.strictEqual(yield* position(group, orders0), 10n, "never past the unfinished offset 10")
        // The record at 10 finishes (its range covers 11, which held nothing to read): the position moves past 13.
        yield* commit(at([[10n, 12n]]), write(group, orders0, ["10"]))
        assert.strictEqual(yield* position(group, orders0), 13n)
        const zombie = yield* claim(group, orders0)
        assert.deepStrictEqual(zombie, { epoch: owner + 1n, position: 13n, finished: [[14n, 17n], [20n, 21n]] })
        // A unit of the earlier owner is fenced, whatever ranges it names.
        assertFenced(
          yield* refusal("a unit of an earlier owner", commit(at([[13n, 14n]]), Effect.void)),
          owner,
          owner + 1n
        )
        // A chunk unit moves the position to its next, and past the ranges that reach it.
        yield* commit(unit(group, orders0, zombie.epoch, 14n), write(group, orders0, ["13"]))
        assert.deepStrictEqual(yield* claim(group, orders0), {
          epoch: zombie.epoch + 1n,
          position: 17n,
          finished: [[20n, 21n]]
        })
        assert.deepStrictEqual([...(yield* read(group, orders0))].sort(), ["10", "12", "13", "14", "15", "20"])
      }).pipe(Effect.provide(layer)))

    it.live("rolls back a unit whose work is interrupted", () =>
      Effect.gen(function*() {
        const group = newGroup()
        const { epoch } = yield* claim(group, orders0)
        yield* commitValues(group, orders0, epoch, 2n, ["a"])

        const started = yield* Deferred.make<void>()
        const workInterrupted = yield* Ref.make(false)
        const fiber = yield* Effect.fork(
          commit(
            unit(group, orders0, epoch, 5n),
            write(group, orders0, ["x"]).pipe(
              Effect.zipRight(Deferred.succeed(started, undefined)),
              Effect.zipRight(Effect.never),
              Effect.onInterrupt(() => Ref.set(workInterrupted, true))
            )
          )
        )
        yield* within("the work to start", Deferred.await(started))
        const exit = yield* Fiber.interrupt(fiber)
        assert.isTrue(Exit.isInterrupted(exit))
        assert.isTrue(yield* Ref.get(workInterrupted), "the work was interrupted before the commit gave up")

        assert.strictEqual(yield* position(group, orders0), 2n)
        assert.deepStrictEqual(yield* read(group, orders0), ["a"])

        // Nothing of the interrupted unit holds the partition: the next unit commits.
        yield* within("the next unit", commitValues(group, orders0, epoch, 4n, ["b"]))
        assert.strictEqual(yield* position(group, orders0), 4n)
        assert.deepStrictEqual(yield* read(group, orders0), ["a", "b"])
      }).pipe(Effect.provide(layer)))

    it.effect("keeps the positions and epochs of partitions and groups apart", () =>
      Effect.gen(function*() {
        const first = newGroup()
        const second = newGroup()
        const dashed = TopicPartition.make("orders.v1-eu", 0)
        const store = yield* OffsetStore
        const firstClaims = yield* store.claim(first, [orders0, orders1, dashed])
        assert.deepStrictEqual([...firstClaims.values()].map((claimed) => claimed.epoch), [1n, 1n, 1n])
        yield* commitValues(first, orders0, 1n, 10n, ["first-orders-0"])
        yield* commitValues(first, orders1, 1n, 20n, ["first-orders-1"])
        yield* commitValues(first, dashed, 1n, 5n, ["first-dashed"])
        assert.deepStrictEqual(yield* claim(second, orders0), { epoch: 1n, position: null })
        assert.deepStrictEqual(yield* claim(second, orders0), { epoch: 2n, position: null })
        yield* commitValues(second, orders0, 2n, 30n, ["second-orders-0"])

        const firstPositions = yield* load(first, [orders0, orders1, TopicPartition.make("orders", 2), dashed])
        assert.deepStrictEqual(
          [...firstPositions].sort(([a], [b]) => a.localeCompare(b)),
          [["orders-0", 10n], ["orders-1", 20n], ["orders.v1-eu-0", 5n]]
        )
        assert.deepStrictEqual([...(yield* load(second, [orders0, orders1]))], [["orders-0", 30n]])

        // The second group's claims did not touch the first group's epoch, nor the other way round.
        yield* commitValues(first, orders0, 1n, 11n, ["first-orders-0-again"])
        assertFenced(
          yield* refusal("a unit of another group's epoch", commitValues(second, orders0, 1n, 12n, ["wrong-group"])),
          1n,
          2n
        )
        assert.deepStrictEqual(yield* claim(first, orders1), { epoch: 2n, position: 20n })
        yield* commitValues(first, dashed, 1n, 6n, ["first-dashed-again"])
        assertFenced(
          yield* refusal("a unit of a reclaimed partition", commitValues(first, orders1, 1n, 21n, ["wrong-partition"])),
          1n,
          2n
        )

        assert.strictEqual(yield* position(second, orders0), 30n)
        assert.strictEqual(yield* position(first, orders1), 20n)
        assert.deepStrictEqual(yield* read(first, orders0), ["first-orders-0", "first-orders-0-again"])
        assert.deepStrictEqual(yield* read(first, orders1), ["first-orders-1"])
        assert.deepStrictEqual(yield* read(first, dashed), ["first-dashed", "first-dashed-again"])
        assert.deepStrictEqual(yield* read(second, orders0), ["second-orders-0"])
      }).pipe(Effect.provide(layer)))

    it.effect("stores the last of a run of commits", () =>
      Effect.gen(function*() {
        const group = newGroup()
        const { epoch } = yield* claim(group, orders0)
        const commits = 30
        for (let i = 0; i < commits; i++) {
          yield* commitValues(group, orders0, epoch, BigInt((i + 1) * 2), [`value-${i}`])
        }
        assert.strictEqual(yield* position(group, orders0), BigInt(commits * 2))
        assert.deepStrictEqual(yield* read(group, orders0), Array.from({ length: commits }, (_, i) => `value-${i}`))
      }).pipe(Effect.provide(layer)))

    it.effect("does not claim when it loads", () =>
      Effect.gen(function*() {
        const group = newGroup()
        const { epoch } = yield* claim(group, orders0)
        yield* commitValues(group, orders0, epoch, 4n, ["a"])
        assert.strictEqual(yield* position(group, orders0), 4n)
        assert.strictEqual(yield* position(group, orders0), 4n)
        // Had a load claimed the partition, the owner's next unit would be fenced.
        yield* commitValues(group, orders0, epoch, 5n, ["b"])
        assert.deepStrictEqual(yield* claim(group, orders0), { epoch: epoch + 1n, position: 5n })
        assert.deepStrictEqual(yield* read(group, orders0), ["a", "b"])
      }).pipe(Effect.provide(layer)))
  })
