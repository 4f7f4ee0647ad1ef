import { assert, describe, it } from "@effect/vitest"
import * as Chunk from "effect/Chunk"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as FastCheck from "effect/FastCheck"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as TestClock from "effect/TestClock"
import {
  appendSink,
  isCrash,
  kafkaTransactionalPlan,
  type Outcome,
  runWorkload,
  transactionalPlan,
  type Workload
} from "../demo/lab.js"
import * as CommitPolicy from "../src/CommitPolicy.js"
import * as Consumer from "../src/Consumer.js"
import { type CrashPoint, crashPoints } from "../src/Faults.js"
import * as InMemoryKafka from "../src/InMemoryKafka.js"
import * as OffsetStore from "../src/OffsetStore.js"
import { settled } from "./support/kit.js"

const run = (workload: Workload) => runWorkload(workload).pipe(Effect.provide(InMemoryKafka.layer()))

const base = {
  records: 3_000,
  partitions: 6,
  consumers: 2,
  crashes: 12,
  crashRate: 0.25,
  rebalances: true,
  maxPollRecords: 40,
  commitEvery: 100
} as const

const describeOutcome = (o: Outcome) =>
  `${o.policy}: delivered ${o.delivered}, lost ${o.lost}, duplicated ${o.duplicated}, crashes ${o.crashes}, rebalances ${o.rebalances}, generation ${o.generation}`

describe("delivery guarantees under crashes at each point, with members joining and leaving", () => {
  for (const point of crashPoints) {
    it.live(`commitAfter loses nothing when members die at ${point}`, () =>
      Effect.gen(function*() {
        const outcome = yield* run({
          ...base,
          policy: "commitAfter",
          crashPoints: [point],
          commitEvery: 20,
          // Commits are fewer than chunks (one in flight carries all positions handled meanwhile): crash more often
          // at a commit point so that as many crashes land there.
          crashRate: point === "beforeCommit" || point === "afterCommit" ? 0.9 : base.crashRate,
          seed: 21 + crashPoints.indexOf(point)
        })
        assert.isAtLeast(outcome.crashes, base.crashes / 2, describeOutcome(outcome))
        assert.strictEqual(outcome.lost, 0, describeOutcome(outcome))
        assert.isAtLeast(outcome.delivered, base.records)
        assert.strictEqual(outcome.rebalances, 3, describeOutcome(outcome))
      }))

    it.live(`atMostOnce duplicates nothing when members die at ${point}`, () =>
      Effect.gen(function*() {
        const outcome = yield* run({
          ...base,
          policy: "atMostOnce",
          crashPoints: [point],
          seed: 12 + crashPoints.indexOf(point)
        })
        assert.isAtLeast(outcome.crashes, base.crashes / 2, describeOutcome(outcome))
        assert.strictEqual(outcome.duplicated, 0, describeOutcome(outcome))
        assert.strictEqual(outcome.delivered + outcome.lost, base.records)
        assert.strictEqual(outcome.rebalances, 3, describeOutcome(outcome))
      }))
  }

  it.live("where each policy pays: atMostOnce loses records to crashes after its commit, commitAfter repeats records handled before its commit", () =>
    Effect.gen(function*() {
      const amo = yield* run({ ...base, policy: "atMostOnce", crashPoints: ["afterCommit", "beforeHandler"], seed: 3 })
      const alo = yield* run({ ...base, policy: "commitAfter", crashPoints: ["afterHandler", "beforeCommit"], seed: 3 })
      assert.isAbove(amo.lost, 0, describeOutcome(amo))
      assert.isAbove(alo.duplicated, 0, describeOutcome(alo))
    }))

  it.live("rebalances alone (no crash) neither lose nor duplicate under commitAfter", () =>
    Effect.gen(function*() {
      const outcome = yield* run({ ...base, policy: "commitAfter", crashes: 0, seed: 5 })
      // Two more members join and one leaves: a generation each.
      assert.strictEqual(outcome.rebalances, 3)
      assert.isAtLeast(outcome.generation, 1 + outcome.rebalances, describeOutcome(outcome))
      assert.strictEqual(outcome.lost, 0, describeOutcome(outcome))
      assert.strictEqual(outcome.duplicated, 0, describeOutcome(outcome))
    }))

  it.live.prop(
    "property: for random crash points, batch sizes, member counts and orderings, commitAfter never loses, atMostOnce never duplicates, transactional (memory store) does neither",
    {
      seed: FastCheck.integer({ min: 1, max: 1_000_000 }),
      consumers: FastCheck.integer({ min: 1, max: 4 }),
      partitions: FastCheck.integer({ min: 1, max: 8 }),
      maxPollRecords: FastCheck.integer({ min: 1, max: 64 }),
      commitEvery: FastCheck.integer({ min: 1, max: 300 }),
      points: FastCheck.subarray([...crashPoints], { minLength: 1 }),
      crashes: FastCheck.integer({ min: 0, max: 15 }),
      rebalances: FastCheck.boolean(),
      ordering: FastCheck.constantFrom("partition" as const, "key" as const, "unordered" as const),
      keys: FastCheck.integer({ min: 1, max: 200 }),
      concurrency: FastCheck.integer({ min: 1, max: 32 })
    },
    (
      {
        commitEvery,
        concurrency,
        consumers,
        crashes,
        keys,
        maxPollRecords,
        ordering,
        partitions,
        points,
        rebalances,
        seed
      }
    ) =>
      Effect.gen(function*() {
        const workload = {
          records: 1_500,
          partitions,
          consumers,
          crashes,
          crashRate: 0.1,
          crashPoints: points as ReadonlyArray<CrashPoint>,
          rebalances,
          maxPollRecords,
          commitEvery,
          seed,
          ordering,
          keys,
          concurrency
        }
        const alo = yield* run({ ...workload, policy: "commitAfter" })
        const amo = yield* run({ ...workload, policy: "atMostOnce" })
        const eos = yield* runWorkload({ ...workload, policy: "transactional" }, transactionalPlan(appendSink)).pipe(
          Effect.provide(Layer.merge(InMemoryKafka.layer(), OffsetStore.layerMemory))
        )
        assert.strictEqual(eos.lost, 0, describeOutcome(eos))
        assert.strictEqual(eos.duplicated, 0, describeOutcome(eos))
        assert.strictEqual(alo.lost, 0, describeOutcome(alo))
        assert.strictEqual(amo.duplicated, 0, describeOutcome(amo))
        assert.strictEqual(amo.delivered + amo.lost, workload.records, describeOutcome(amo))
      }),
    { fastCheck: { numRuns: 25 }, timeout: 120_000 }
  )
})

describe("poison records dead-lettered under crashes and rebalances", () => {
  const withPoison = (o: Outcome) =>
    `${describeOutcome(o)}, poison ${o.poison}, dead-lettered ${o.deadLettered} (repeats ${o.deadLetterRepeats}), ` +
    `both ${o.handledAndDeadLettered}, misrouted ${o.misrouted}`

  it.live.prop(
    "property: every record is handled or dead-lettered (commitAfter, transactional, kafkaTransactional), none is both under the exactly-once policies, and only poison is dead-lettered, straight or through retry topics",
    {
      seed: FastCheck.integer({ min: 1, max: 1_000_000 }),
      poisonRate: FastCheck.double({ min: 0.01, max: 0.3, noNaN: true }),
      consumers: FastCheck.integer({ min: 1, max: 3 }),
      partitions: FastCheck.integer({ min: 1, max: 6 }),
      maxPollRecords: FastCheck.integer({ min: 1, max: 40 }),
      points: FastCheck.subarray([...crashPoints], { minLength: 1 }),
      crashes: FastCheck.integer({ min: 0, max: 10 }),
      rebalances: FastCheck.boolean(),
      ordering: FastCheck.constantFrom("partition" as const, "key" as const),
      keys: FastCheck.integer({ min: 1, max: 50 }),
      retries: FastCheck.boolean()
    },
    (
      { consumers, crashes, keys, maxPollRecords, ordering, partitions, points, poisonRate, rebalances, retries, seed }
    ) =>
      Effect.gen(function*() {
        const workload = {
          records: 600,
          partitions,
          consumers,
          crashes,
          crashRate: 0.1,
          crashPoints: points as ReadonlyArray<CrashPoint>,
          rebalances,
          maxPollRecords,
          commitEvery: 20,
          seed,
          ordering,
          keys,
          poisonRate,
          // Through two retry topics (waits of 5 and 20 ms) before the dead-letter topic, or straight there.
          ...(retries ? { retryDelays: [5, 20] } : {})
        }
        const alo = yield* run({ ...workload, policy: "commitAfter" })
        assert.isAbove(alo.poison, 0, withPoison(alo))
        assert.strictEqual(alo.lost, 0, withPoison(alo))
        assert.strictEqual(alo.misrouted, 0, withPoison(alo))
        assert.strictEqual(alo.deadLettered, alo.poison, withPoison(alo))

        const eos = yield* runWorkload({ ...workload, policy: "transactional" }, transactionalPlan(appendSink)).pipe(
          Effect.provide(Layer.merge(InMemoryKafka.layer(), OffsetStore.layerMemory))
        )
        for (const o of [eos]) {
          assert.strictEqual(o.lost, 0, withPoison(o))
          assert.strictEqual(o.duplicated, 0, withPoison(o))
          assert.strictEqual(o.handledAndDeadLettered, 0, withPoison(o))
          assert.strictEqual(o.misrouted, 0, withPoison(o))
          assert.strictEqual(o.deadLettered, o.poison, withPoison(o))
        }
        const ktx = yield* runWorkload({ ...workload, policy: "kafkaTransactional" }, kafkaTransactionalPlan).pipe(
          Effect.provide(InMemoryKafka.layer())
        )
        assert.strictEqual(ktx.lost, 0, withPoison(ktx))
        assert.strictEqual(ktx.duplicated, 0, withPoison(ktx))
        assert.strictEqual(ktx.handledAndDeadLettered, 0, withPoison(ktx))
        assert.strictEqual(ktx.misrouted, 0, withPoison(ktx))
        assert.strictEqual(ktx.deadLetterRepeats, 0, withPoison(ktx))
        assert.strictEqual(ktx.deadLettered, ktx.poison, withPoison(ktx))
      }),
    // A chunk with many poison records is run again once per poison record found (the handler reports the first),
    // so runs with a high poison rate take seconds each: 30-50 s for the twelve runs on an idle 2-core machine, and
    // more than twice that beside the other test files.
    { fastCheck: { numRuns: 12 }, timeout: 300_000 }
  )
})

describe("autoCommit behaves as kafka-clients' enable.auto.commit does", () => {
  const setup = (records: number) =>
    Effect.gen(function*() {
      yield* InMemoryKafka.createTopic("auto", 1)
      yield* InMemoryKafka.produce("auto", Array.from({ length: records }, (_, i) => ({ value: String(i) })))
    })

  it.effect("it commits records that were fetched but not handled: a crash then loses them", () =>
    Effect.gen(function*() {
      yield* setup(100)
      const handled: Array<bigint> = []
      const stuck = yield* Deferred.make<void>()
      let crashNow = false
      const first = yield* Consumer.run(
        { groupId: "g", topics: ["auto"], maxPollRecords: 10, bufferSize: 50 },
        (records) =>
          Effect.gen(function*() {
            // The first chunk takes long; meanwhile the poll loop fetches more and auto-commits their positions.
            if (Chunk.unsafeHead(records).offset === 0n) yield* Deferred.await(stuck)
            for (const r of records) handled.push(r.offset)
          })
      ).pipe(
        Effect.provide(
          Layer.merge(CommitPolicy.autoCommit({ interval: "5 seconds" }), InMemoryKafka.layerFaults(() => crashNow))
        ),
        Effect.fork
      )
      yield* settled(
        "fetched ahead",
        Effect.map(InMemoryKafka.InMemoryKafka, (k) => k.members("g")).pipe(
          Effect.flatten,
          Effect.flatMap((ms) =>
            ms.length === 0
              ? Effect.succeed(0)
              : Effect.flatMap(InMemoryKafka.InMemoryKafka, (k) => k.fetchedCount(ms[0]!.memberId))
          ),
          Effect.map((n) => n >= 50)
        )
      )
      yield* TestClock.adjust("5 seconds")
      yield* settled(
        "auto commit",
        Effect.map(InMemoryKafka.committed("g"), (b) => (b.positions.get("auto-0") ?? 0n) >= 50n)
      )
      // The process dies before the handler finishes the first chunk.
      crashNow = true
      yield* Deferred.succeed(stuck, undefined)
      const exit = yield* Fiber.await(first)
      assert.isTrue(isCrash(exit), String(exit))
      // A new member starts from the auto-committed position: the first chunk (0..9) was handled before the
      // process died, the buffered records 10..49 never were.
      const second = yield* Consumer.run(
        { groupId: "g", topics: ["auto"], maxPollRecords: 10 },
        (records) =>
          Effect.sync(() => {
            for (const r of records) handled.push(r.offset)
          })
      ).pipe(Effect.provide(CommitPolicy.autoCommit({ interval: "5 seconds" })), Effect.fork)
      yield* settled("the rest handled", Effect.sync(() => handled.includes(99n)))
      yield* Fiber.interrupt(second)
      const lost = Array.from({ length: 100 }, (_, i) => BigInt(i)).filter((o) => !handled.includes(o))
      assert.deepStrictEqual(lost, Array.from({ length: 40 }, (_, i) => BigInt(i + 10)))
    }).pipe(Effect.provide(InMemoryKafka.layer())))

  it.effect("it commits only on its interval: a crash after handling and before the next commit duplicates", () =>
    Effect.gen(function*() {
      yield* setup(30)
      const handled: Array<bigint> = []
      let crashNow = false
      const first = yield* Consumer.run(
        { groupId: "g", topics: ["auto"], maxPollRecords: 10 },
        (records) =>
          Effect.sync(() => {
            for (const r of records) handled.push(r.offset)
          })
      ).pipe(
        Effect.provide(
          Layer.merge(
            CommitPolicy.autoCommit({ interval: "5 seconds" }),
            InMemoryKafka.layerFaults((point) => crashNow && point === "afterHandler")
          )
        ),
        Effect.fork
      )
      yield* settled("handled", Effect.sync(() => handled.length === 30))
      assert.strictEqual((yield* InMemoryKafka.committed("g")).positions.size, 0)
      yield* InMemoryKafka.produce("auto", [{ value: "30" }])
      crashNow = true
      const exit = yield* Fiber.await(first)
      assert.isTrue(Exit.isFailure(exit) && isCrash(exit))
      const second = yield* Consumer.run(
        { groupId: "g", topics: ["auto"], maxPollRecords: 10 },
        (records) =>
          Effect.sync(() => {
            for (const r of records) handled.push(r.offset)
          })
      ).pipe(Effect.provide(CommitPolicy.autoCommit({ interval: "5 seconds" })), Effect.fork)
      yield* settled("handled again", Effect.sync(() => handled.length >= 61))
      yield* Fiber.interrupt(second)
      const counts = new Map<bigint, number>()
      for (const o of handled) counts.set(o, (counts.get(o) ?? 0) + 1)
      // Nothing had been committed: every record handled before the crash was handled again.
      assert.strictEqual([...counts.values()].filter((n) => n === 2).length, 31)
    }).pipe(Effect.provide(InMemoryKafka.layer())))

  it.live("measured over a crash workload, it both loses and duplicates", () =>
    Effect.gen(function*() {
      const outcomes = yield* Effect.forEach([1, 2, 3, 4], (seed) =>
        run({
          ...base,
          records: 4_000,
          policy: "autoCommit",
          crashes: 20,
          crashRate: 0.05,
          seed,
          maxPollRecords: 20,
          handlerMillis: 1
        }))
      const lost = outcomes.reduce((n, o) => n + o.lost, 0)
      const duplicated = outcomes.reduce((n, o) => n + o.duplicated, 0)
      assert.isAbove(duplicated, 0, outcomes.map(describeOutcome).join("\n"))
      assert.isAbove(lost, 0, outcomes.map(describeOutcome).join("\n"))
    }))
})
