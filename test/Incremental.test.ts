/**
 * Incremental rebalances on the in-memory broker: under `cooperative` and `consumer` a member that joins a group of
 * three takes only its share, the partitions that stay keep their scopes and their handling while the moved ones are
 * revoked, and a moved partition reaches its new owner only after its old owner's revoke ended. `eager` is the
 * contrast: everything is revoked, and nothing is handled until every member released.
 */
import * as FileSystem from "@effect/platform/FileSystem"
import { assert, describe, it } from "@effect/vitest"
import type * as Chunk from "effect/Chunk"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import type { Outcome, Workload } from "../demo/lab.js"
import { runInMemory } from "../demo/stores.js"
import * as CommitPolicy from "../src/CommitPolicy.js"
import type { ConsumerRecord } from "../src/ConsumerRecord.js"
import * as Consumer from "../src/Consumer.js"
import type { RebalanceProtocol } from "../src/Driver.js"
import * as InMemoryKafka from "../src/InMemoryKafka.js"
import * as TopicPartition from "../src/TopicPartition.js"
import { advanceUntil } from "./support/kit.js"

const config = {
  groupId: "g",
  topics: ["t"],
  maxPollRecords: 10,
  rebalanceTimeout: "60 seconds",
  revokeTimeout: "20 seconds"
} as const

const commitAfter = CommitPolicy.commitAfter({ maxBatch: 1, maxInterval: "1 second" })

interface Journal {
  /** In order: "assign a t-0", "revoke-start b t-1", "revoke-end b t-1". */
  readonly events: Array<string>
  /** Per partition, the offsets handled, by whom. */
  readonly handled: Map<number, Array<{ readonly member: string; readonly offset: bigint }>>
}

const member = (name: string, journal: Journal, gate: Deferred.Deferred<void>, holdRevokes: { on: boolean }) =>
  Consumer.run(
    { ...config, clientId: name },
    (records: Chunk.Chunk<ConsumerRecord>) =>
      Effect.sync(() => {
        for (const r of records) {
          const list = journal.handled.get(r.partition) ?? []
          list.push({ member: name, offset: r.offset })
          journal.handled.set(r.partition, list)
        }
      }),
    {
      onAssign: (tp) => Effect.sync(() => journal.events.push(`assign ${name} ${TopicPartition.key(tp)}`)),
      onRevoke: (tp) =>
        Effect.gen(function*() {
          journal.events.push(`revoke-start ${name} ${TopicPartition.key(tp)}`)
          if (holdRevokes.on) yield* Deferred.await(gate)
          journal.events.push(`revoke-end ${name} ${TopicPartition.key(tp)}`)
        })
    }
  ).pipe(Effect.provide(commitAfter), Effect.fork)

const ownership = Effect.flatMap(InMemoryKafka.InMemoryKafka, (kafka) => kafka.members("g"))

const produceOneEach = (from: number) =>
  Effect.forEach(
    [0, 1, 2, 3, 4, 5],
    (partition) => InMemoryKafka.produce("t", [{ value: `v${from}`, partition }]),
    { discard: true }
  )

const handledCount = (journal: Journal, partition: number) => journal.handled.get(partition)?.length ?? 0

/** A fourth member joins three that share six partitions, while the revoking members' `onRevoke` is held. */
const joinOfFourth = (protocol: RebalanceProtocol) =>
  Effect.gen(function*() {
    yield* InMemoryKafka.createTopic("t", 6)
    const journal: Journal = { events: [], handled: new Map() }
    const gate = yield* Deferred.make<void>()
    const hold = { on: false }
    const first = [
      yield* member("a", journal, gate, hold),
      yield* member("b", journal, gate, hold)
    ]
    first.push(yield* member("c", journal, gate, hold))
    yield* advanceUntil(
      "three members own two partitions each",
      Effect.map(ownership, (ms) => ms.length === 3 && ms.every((m) => m.partitions.length === 2))
    )
    // The members' hooks agree with the group: every partition a member owns is open there (a revoke that closed a
    // partition that stays would show here, as a partition the group gives a member whose hooks revoked it).
    yield* Effect.repeatN(Effect.yieldNow(), 2_000)
    const open = new Map<string, string>()
    for (const e of journal.events) {
      const [kind, who, key] = e.split(" ") as [string, string, string]
      if (kind === "assign") open.set(key, who)
      else if (kind === "revoke-start" && open.get(key) === who) open.delete(key)
    }
    const owners = (yield* ownership).flatMap((m) =>
      m.partitions.map((tp) => `${TopicPartition.key(tp)} ${m.memberId.split("-")[0]}`)
    )
    assert.sameMembers(Array.from(open, ([key, who]) => `${key} ${who}`), owners, journal.events.join("\n"))
    yield* produceOneEach(0)
    yield* advanceUntil(
      "the first records are handled",
      Effect.sync(() => [0, 1, 2, 3, 4, 5].every((p) => handledCount(journal, p) === 1)),
      20
    )
    const before = new Map(
      (yield* ownership).flatMap((m) => m.partitions.map((tp) => [TopicPartition.key(tp), m.memberId] as const))
    )
    const eventsBefore = journal.events.length
    hold.on = true
    const d = yield* member("d", journal, gate, hold)
    yield* advanceUntil(
      "the revokes of the join have begun",
      Effect.sync(() => journal.events.slice(eventsBefore).some((e) => e.startsWith("revoke-start")))
    )
    // Let every revoke of this rebalance begin.
    yield* Effect.repeatN(Effect.yieldNow(), 2_000)
    const revoked = journal.events.slice(eventsBefore).filter((e) => e.startsWith("revoke-start"))
      .map((e) => e.split(" ")[2]!)
    // Checked before waiting on the staying partitions: a revoke that took them too fails here, at once.
    if (protocol !== "eager") assert.isAtMost(revoked.length, Math.ceil(6 / 4), journal.events.join("\n"))
    // Records written while the revokes are held: those of partitions that stay are handled meanwhile.
    yield* produceOneEach(1)
    const staying = [0, 1, 2, 3, 4, 5].filter((p) => !revoked.includes(`t-${p}`))
    if (protocol !== "eager") {
      yield* advanceUntil(
        "the staying partitions' new records are handled while the moved ones are held",
        Effect.sync(() => staying.every((p) => handledCount(journal, p) === 2)),
        30
      )
    } else {
      yield* advanceUntil("a few seconds pass", Effect.succeed(false), 3).pipe(Effect.ignore)
    }
    const heldEvents = journal.events.slice(eventsBefore)
    const handledWhileHeld = [0, 1, 2, 3, 4, 5].filter((p) => handledCount(journal, p) === 2)
    const assignedToDWhileHeld = heldEvents.filter((e) => e.startsWith("assign d")).map((e) => e.split(" ")[2]!)
    hold.on = false
    yield* Deferred.succeed(gate, undefined)
    yield* advanceUntil(
      "four members own the six partitions and every record is handled",
      Effect.map(
        ownership,
        (ms) =>
          ms.length === 4 && ms.reduce((n, m) => n + m.partitions.length, 0) === 6 &&
          ms.every((m) => m.partitions.length >= 1) &&
          [0, 1, 2, 3, 4, 5].every((p) => handledCount(journal, p) >= 2)
      )
    )
    const after = journal.events.slice(eventsBefore)
    yield* Fiber.interruptAll([...first, d])
    return { after, before, handledWhileHeld, assignedToDWhileHeld, revoked, staying, journal }
  }).pipe(Effect.provide(InMemoryKafka.layer({ rebalance: protocol })))

describe("incremental rebalances on the in-memory broker", () => {
  for (const protocol of ["cooperative", "consumer"] as const) {
    it.effect(
      `${protocol}: a fourth member revokes at most ceil(6/4) partitions; the others keep their scopes and are handled while the moved ones are held; a moved partition reaches its new owner only after its revoke ended`,
      () =>
        Effect.gen(function*() {
          const o = yield* joinOfFourth(protocol)
          assert.isAtLeast(o.revoked.length, 1, o.after.join("\n"))
          assert.isAtMost(o.revoked.length, Math.ceil(6 / 4), o.after.join("\n"))
          // The staying partitions were handled while the revokes were held, by the members that own them.
          assert.deepStrictEqual(o.handledWhileHeld, o.staying, o.after.join("\n"))
          // Nothing moved reached the new member while its old owner's revoke was held.
          assert.deepStrictEqual(o.assignedToDWhileHeld.filter((k) => o.revoked.includes(k)), [], o.after.join("\n"))
          // Only the moved partitions were revoked and assigned again; each only after its revoke ended.
          const reassigned = o.after.filter((e) => e.startsWith("assign")).map((e) => e.split(" ")[2]!)
          assert.sameMembers(reassigned, o.revoked, o.after.join("\n"))
          for (const key of o.revoked) {
            const ended = o.after.findIndex((e) => e.startsWith("revoke-end") && e.endsWith(` ${key}`))
            const assigned = o.after.findIndex((e) => e.startsWith("assign d") && e.endsWith(` ${key}`))
            assert.isAtLeast(ended, 0, `${key}: ${o.after.join("\n")}`)
            assert.isAbove(assigned, ended, `${key}: ${o.after.join("\n")}`)
          }
          // Every record once: nothing was handled twice across the move (commitAfter commits each record).
          for (const [p, list] of o.journal.handled) {
            assert.deepStrictEqual(
              list.map((h) => h.offset),
              [0n, 1n],
              `t-${p}: ${list.map((h) => `${h.member}@${h.offset}`).join(", ")}`
            )
          }
        })
    )
  }

  it.effect("eager, the contrast: the join revokes all six partitions and nothing is handled until every revoke ended", () =>
    Effect.gen(function*() {
      const o = yield* joinOfFourth("eager")
      assert.strictEqual(o.revoked.length, 6, o.after.join("\n"))
      assert.deepStrictEqual(o.handledWhileHeld, [], o.after.join("\n"))
      assert.deepStrictEqual(o.assignedToDWhileHeld, [], o.after.join("\n"))
    }))
})

const describeOutcome = (protocol: RebalanceProtocol, o: Outcome) =>
  `${o.policy} under ${protocol}: delivered ${o.delivered}, lost ${o.lost}, duplicated ${o.duplicated}, ` +
  `crashes ${o.crashes}, zombies ${o.zombies}, rebalances ${o.rebalances}, generation ${o.generation}`

const workload = {
  records: 4_000,
  partitions: 6,
  consumers: 3,
  crashes: 20,
  crashRate: 0.2,
  rebalances: true,
  maxPollRecords: 25,
  commitEvery: 50
} as const

/** A policy's workload on a broker of its own, as the lab runs it (the memory store for `transactional`). */
const runUnder = (protocol: RebalanceProtocol, w: Workload) =>
  runInMemory({ ...w, rebalance: protocol }, { _tag: "Memory" }).pipe(Effect.provide(FileSystem.layerNoop({})))

describe("every policy keeps its guarantee under incremental rebalances, with crashes", () => {
  for (const protocol of ["cooperative", "consumer"] as const) {
    for (const ordering of ["partition", "key"] as const) {
      it.live(
        `${protocol}, ${ordering} ordering: commitAfter loses nothing, atMostOnce duplicates nothing, transactional and kafkaTransactional (with zombies) do neither`,
        () =>
          Effect.gen(function*() {
            const w = { ...workload, ordering, ...(ordering === "key" ? { keys: 300, concurrency: 16 } : {}) } as const
            const alo = yield* runUnder(protocol, { ...w, policy: "commitAfter", seed: 71 })
            const amo = yield* runUnder(protocol, { ...w, policy: "atMostOnce", seed: 72 })
            const eos = yield* runUnder(protocol, { ...w, policy: "transactional", zombies: 2, seed: 73 })
            const ktx = yield* runUnder(protocol, { ...w, policy: "kafkaTransactional", zombies: 2, seed: 74 })
            for (const o of [alo, amo, eos, ktx]) {
              console.log(describeOutcome(protocol, o))
              assert.strictEqual(o.rebalances, 3, describeOutcome(protocol, o))
              assert.isAtLeast(o.crashes, 5, describeOutcome(protocol, o))
              if (o.policy === "transactional" || o.policy === "kafkaTransactional") {
                assert.isAtLeast(o.zombies, 1, describeOutcome(protocol, o))
              }
            }
            assert.strictEqual(alo.lost, 0, describeOutcome(protocol, alo))
            assert.strictEqual(amo.duplicated, 0, describeOutcome(protocol, amo))
            assert.strictEqual(amo.delivered + amo.lost, w.records, describeOutcome(protocol, amo))
            for (const o of [eos, ktx]) {
              assert.strictEqual(o.lost, 0, describeOutcome(protocol, o))
              assert.strictEqual(o.duplicated, 0, describeOutcome(protocol, o))
              assert.strictEqual(o.delivered, w.records, describeOutcome(protocol, o))
            }
          }),
        { timeout: 120_000 }
      )
    }
  }
})
