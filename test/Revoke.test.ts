/**
 * Every step of a revoke and of a shutdown has a deadline: waiting for in-flight work (revokeTimeout), waiting for
 * interrupted work to stop, the final commit, onRevoke and the partition's finalizers (a quarter each of what is left
 * of rebalanceTimeout). A missed deadline is logged with the partition and the step, and the member goes on.
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
import { WorkerStuck } from "../src/KafkaError.js"
import { advanceUntil, inMemoryWrapping, logCollector, settled } from "./support/kit.js"

// Steps after the wait for in-flight work get (20 - 8) / 4 = 3 seconds each.
const config = {
  groupId: "g",
  topics: ["t"],
  maxPollRecords: 5,
  rebalanceTimeout: "20 seconds",
  revokeTimeout: "8 seconds"
} as const

const commitAfter = CommitPolicy.commitAfter({ maxBatch: 5, maxInterval: "1 second" })

const produce = (perPartition: number, from = 0) =>
  Effect.forEach([0, 1], (partition) =>
    InMemoryKafka.produce(
      "t",
      Array.from({ length: perPartition }, (_, i) => ({ value: String(from + i), partition }))
    ), { discard: true })

const ownership = Effect.flatMap(InMemoryKafka.InMemoryKafka, (kafka) => kafka.members("g")).pipe(
  Effect.map((members) => members.map((m) => m.partitions.map((p) => p.partition)))
)

/** The members of the group own one partition each. */
const split = Effect.map(ownership, (owned) => owned.length === 2 && owned.every((ps) => ps.length === 1))

/** A driver whose commits never answer while `hang.on` is set, as a coordinator that stopped answering would. */
const hangingCommits = (hang: { on: boolean }) =>
  inMemoryWrapping((session) => ({
    commit: (offsets) => Effect.suspend(() => hang.on ? Effect.never : session.commit(offsets))
  }))

/** Stops consumers whose shutdown waits on deadlines: the clock moves until they are gone. */
const stop = (...fibers: ReadonlyArray<Fiber.RuntimeFiber<unknown, unknown>>) =>
  Effect.gen(function*() {
    const stopping = yield* Effect.fork(Fiber.interruptAll(fibers))
    for (let i = 0; i < 20 && (yield* Fiber.poll(stopping))._tag === "None"; i++) {
      yield* Effect.repeatN(Effect.yieldNow(), 100)
      yield* TestClock.adjust("3 seconds")
    }
    yield* Fiber.join(stopping)
  })

describe("bounded revokes", () => {
  it.effect("an onRevoke that never ends: the revoke goes on after its deadline, and says which partition and step", () => {
    const logs = logCollector()
    return Effect.gen(function*() {
      yield* InMemoryKafka.createTopic("t", 2)
      yield* produce(10)
      const handled = new Map<string, Array<bigint>>()
      const handler =
        (name: string) => (records: Chunk.Chunk<{ readonly partition: number; readonly offset: bigint }>) =>
          Effect.sync(() => {
            const list = handled.get(name) ?? []
            for (const r of records) list.push(BigInt(r.partition * 1000) + r.offset)
            handled.set(name, list)
          })
      const a = yield* Consumer.run(config, handler("a"), { onRevoke: () => Effect.never }).pipe(
        Effect.provide(commitAfter),
        Effect.fork
      )
      yield* settled("a handled everything", Effect.sync(() => (handled.get("a")?.length ?? 0) === 20))
      const b = yield* Consumer.run(config, handler("b")).pipe(Effect.provide(commitAfter), Effect.fork)
      yield* settled("a is in its revoke", Effect.sync(() => logs.lines.length >= 0))
      yield* TestClock.adjust("3 seconds")
      yield* settled("the partitions are split", split)
      assert.isTrue(
        logs.lines.some((l) => l.startsWith("WARN") && /revoke: onRevoke of t-[01] did not finish within 3s/.test(l)),
        logs.lines.join("\n")
      )
      // A goes on with the partition it kept.
      assert.isTrue((yield* Fiber.poll(a))._tag === "None")
      yield* produce(5, 10)
      yield* settled(
        "both members handle the new records",
        Effect.sync(() => (handled.get("a")?.length ?? 0) + (handled.get("b")?.length ?? 0) === 30)
      )
      assert.isAbove(handled.get("a")!.length, 20)
      yield* stop(b, a)
    }).pipe(Effect.provide(InMemoryKafka.layer()), Effect.provide(logs.layer))
  })

  it.effect("a partition finalizer that never ends: the revoke goes on after its deadline, naming the scope", () => {
    const logs = logCollector()
    return Effect.gen(function*() {
      yield* InMemoryKafka.createTopic("t", 2)
      yield* produce(10)
      let handled = 0
      const a = yield* Consumer.run(config, (records) => Effect.sync(() => (handled += Chunk.size(records))), {
        onAssign: () => Effect.addFinalizer(() => Effect.never)
      }).pipe(Effect.provide(commitAfter), Effect.fork)
      yield* settled("a handled everything", Effect.sync(() => handled === 20))
      const b = yield* Consumer.run(config, () => Effect.void).pipe(Effect.provide(commitAfter), Effect.fork)
      yield* Effect.repeatN(Effect.yieldNow(), 100)
      yield* TestClock.adjust("3 seconds")
      yield* settled("the partitions are split", split)
      assert.isTrue(
        logs.lines.some((l) => /revoke: the finalizers of t-[01]'s scope did not finish within 3s/.test(l)),
        logs.lines.join("\n")
      )
      assert.isTrue((yield* Fiber.poll(a))._tag === "None")
      yield* stop(b, a)
    }).pipe(Effect.provide(InMemoryKafka.layer()), Effect.provide(logs.layer))
  })

  it.effect("a final commit that never answers: the partitions are released after its deadline, and the warning says what is repeated", () => {
    const logs = logCollector()
    const hang = { on: false }
    return Effect.gen(function*() {
      const kafka = yield* InMemoryKafka.InMemoryKafka
      yield* kafka.createTopic("t", 2)
      yield* produce(10)
      let handled = 0
      const a = yield* Consumer.run(config, (records) => Effect.sync(() => (handled += Chunk.size(records)))).pipe(
        Effect.provide(CommitPolicy.commitAfter({ maxBatch: 1_000, maxInterval: "1 hour" })),
        Effect.fork
      )
      yield* settled("a handled everything", Effect.sync(() => handled === 20))
      hang.on = true
      const b = yield* Consumer.run(config, () => Effect.void).pipe(Effect.provide(commitAfter), Effect.fork)
      yield* Effect.repeatN(Effect.yieldNow(), 100)
      yield* TestClock.adjust("3 seconds")
      yield* settled("the partitions are split", split)
      hang.on = false
      assert.isTrue(
        logs.lines.some((l) =>
          /revoke: the final commit of t-0, t-1 did not finish within 3s; their next owner repeats/.test(l)
        ),
        logs.lines.join("\n")
      )
      // Nothing was committed: the final commit never answered.
      assert.strictEqual((yield* kafka.committed("g")).size, 0)
      assert.isTrue((yield* Fiber.poll(a))._tag === "None")
      yield* stop(b, a)
    }).pipe(Effect.provide(hangingCommits(hang)), Effect.provide(logs.layer))
  })

  it.effect("work stuck in an uninterruptible region is interrupted, then left behind; the partition coming back ends the member with WorkerStuck", () => {
    const logs = logCollector()
    return Effect.gen(function*() {
      yield* InMemoryKafka.createTopic("t", 2)
      yield* produce(10)
      const stuck = yield* Deferred.make<void>()
      let handled = 0
      // Partition 1's first chunk never ends, and cannot be interrupted.
      const a = yield* Consumer.run(config, (records, tp) =>
        tp.partition === 1
          ? Effect.zipRight(Deferred.succeed(stuck, undefined), Effect.uninterruptible(Effect.never))
          : Effect.sync(() => (handled += Chunk.size(records)))).pipe(Effect.provide(commitAfter), Effect.fork)
      yield* Deferred.await(stuck)
      yield* settled("a handled partition 0", Effect.sync(() => handled === 10))
      // B joins and gets partition 1 (range: the second member gets the second partition). A's revoke waits 8 s for
      // the stuck work, 3 s more after interrupting it, and 3 s for the partition's scope, which waits for it too.
      const b = yield* Consumer.run(config, () => Effect.void).pipe(Effect.provide(commitAfter), Effect.fork)
      yield* advanceUntil("the partitions are split", split, 20)
      const warned = (pattern: RegExp) => logs.lines.some((l) => pattern.test(l))
      assert.isTrue(
        warned(/revoke: the work of t-1 outlived revokeTimeout \(8s\); interrupting it/),
        logs.lines.join("\n")
      )
      assert.isTrue(
        warned(
          /revoke: the work of t-1 did not stop within 3s of its interruption \(it is in an uninterruptible region\)/
        ),
        logs.lines.join("\n")
      )
      assert.deepStrictEqual(yield* ownership, [[0], [1]])
      // A goes on with partition 0.
      yield* InMemoryKafka.produce("t", [{ value: "x", partition: 0 }])
      yield* settled("a handles its partition", Effect.sync(() => handled === 11))
      // B leaves: partition 1 comes back to A while its old worker is still stuck.
      yield* stop(b)
      yield* advanceUntil("A ends", Effect.map(Fiber.poll(a), (exit) => exit._tag === "Some"), 20)
      const exit = yield* Fiber.await(a)
      assert.isTrue(
        Exit.isFailure(exit) && exit.cause._tag === "Fail" && exit.cause.error instanceof WorkerStuck,
        String(exit)
      )
      if (Exit.isFailure(exit) && exit.cause._tag === "Fail" && exit.cause.error instanceof WorkerStuck) {
        assert.strictEqual(exit.cause.error.topic, "t")
        assert.strictEqual(exit.cause.error.partition, 1)
      }
    }).pipe(Effect.provide(InMemoryKafka.layer()), Effect.provide(logs.layer))
  })

  it.effect("a shutdown whose onRevoke never ends finishes after the deadline and says so", () => {
    const logs = logCollector()
    return Effect.gen(function*() {
      yield* InMemoryKafka.createTopic("t", 2)
      yield* produce(10)
      let handled = 0
      const a = yield* Consumer.run(config, (records) => Effect.sync(() => (handled += Chunk.size(records))), {
        onRevoke: () => Effect.never
      }).pipe(Effect.provide(CommitPolicy.commitAfter({ maxBatch: 1_000, maxInterval: "1 hour" })), Effect.fork)
      yield* settled("a handled everything", Effect.sync(() => handled === 20))
      const stopping = yield* Effect.fork(Fiber.interrupt(a))
      yield* Effect.repeatN(Effect.yieldNow(), 100)
      yield* TestClock.adjust("3 seconds")
      yield* Fiber.join(stopping)
      assert.isTrue(
        logs.lines.some((l) => /shutdown: onRevoke of t-0 did not finish within 3s/.test(l)),
        logs.lines.join("\n")
      )
      // The final commit happened before onRevoke: the positions are stored.
      assert.deepStrictEqual(
        [...(yield* InMemoryKafka.committed("g")).positions].sort(),
        [["t-0", 10n], ["t-1", 10n]]
      )
    }).pipe(Effect.provide(InMemoryKafka.layer()), Effect.provide(logs.layer))
  })
})
