/**
 * Incremental rebalances on the real broker (@platformatic/kafka): a fourth member joins three that share six
 * partitions while records flow into every partition. Under `cooperative` (KIP-429) and `consumer` (KIP-848) the join
 * revokes only the partitions the new member gets, and the partitions that stay are handled throughout it; under
 * `eager`, in the same run, the join revokes all six and each waits for the whole group. The longest pause per partition across the join
 * is measured under both. Static membership (KIP-345): members killed with SIGKILL and restarted with the same instance
 * id get their partitions back with no rebalance of the others.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Effect from "effect/Effect"
import { runRealWorkload } from "../demo/cluster/run.js"
import * as Fiber from "effect/Fiber"
import { inject } from "vitest"
import * as CommitPolicy from "../src/CommitPolicy.js"
import * as Consumer from "../src/Consumer.js"
import * as KafkaJs from "../src/KafkaJs.js"
import * as Platformatic from "../src/Platformatic.js"
import * as Producer from "../src/Producer.js"
import { eventually } from "./support/kit.js"

const brokers = process.env.KAFKA_BROKERS || inject("kafkaBrokers")
const databaseUrl = process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test"
const unique = (prefix: string) => `${prefix}-${crypto.randomUUID().slice(0, 8)}`
const PARTITIONS = [0, 1, 2, 3, 4, 5]
/** Longer than a KIP-848 heartbeat: a revocation acknowledged before the revoke ended shows as a partition assigned early. */
const REVOKE_MILLIS = 1_500

interface Journal {
  /** Per partition: when each record was handled, and its offset. */
  readonly handled: Map<number, Array<{ readonly at: number; readonly offset: bigint }>>
  /** In order: what each member's hooks saw. */
  readonly events: Array<
    { readonly at: number; readonly kind: "assign" | "revoke" | "revoke-end"; member: string; partition: number }
  >
}

type Protocol = "eager" | "cooperative" | "consumer"

const member = (rebalance: Protocol, topic: string, groupId: string, name: string, journal: Journal) =>
  Consumer.run(
    {
      groupId,
      clientId: name,
      topics: [topic],
      maxPollRecords: 50,
      sessionTimeout: "6 seconds",
      rebalanceTimeout: "30 seconds",
      revokeTimeout: "15 seconds"
    },
    (records, tp) =>
      Effect.sync(() => {
        const list = journal.handled.get(tp.partition) ?? []
        const at = Date.now()
        for (const r of records) list.push({ at, offset: r.offset })
        journal.handled.set(tp.partition, list)
      }),
    {
      onAssign: (tp) =>
        Effect.sync(() =>
          journal.events.push({ at: Date.now(), kind: "assign", member: name, partition: tp.partition })
        ),
      // A revoke takes a while, as one that flushes what the partition's handler kept would.
      onRevoke: (tp) =>
        Effect.sync(() =>
          journal.events.push({ at: Date.now(), kind: "revoke", member: name, partition: tp.partition })
        )
          .pipe(
            Effect.zipRight(Effect.sleep(REVOKE_MILLIS)),
            Effect.zipRight(
              Effect.sync(() =>
                journal.events.push({ at: Date.now(), kind: "revoke-end", member: name, partition: tp.partition })
              )
            )
          )
    }
  ).pipe(
    Effect.provide(CommitPolicy.commitAfter({ maxBatch: 50, maxInterval: "200 millis" })),
    Effect.provide(
      Platformatic.layer({ brokers: brokers.split(","), clientId: name, maxWaitTime: "100 millis", rebalance })
    ),
    Effect.fork
  )

/** Who owns what, from the hooks. */
const owners = (journal: Journal) => {
  const owner = new Map<number, string>()
  for (const e of journal.events) {
    if (e.kind === "assign") owner.set(e.partition, e.member)
    else if (e.kind === "revoke" && owner.get(e.partition) === e.member) owner.delete(e.partition)
  }
  return owner
}

/** The longest time without a record handled on the partition, from `from` to `to`. */
const longestPause = (journal: Journal, partition: number, from: number, to: number) => {
  const times = (journal.handled.get(partition) ?? []).map((h) => h.at)
  let last = Math.max(from, ...times.filter((t) => t <= from))
  let longest = 0
  for (const t of times) {
    if (t <= from || t > to) continue
    longest = Math.max(longest, t - last)
    last = t
  }
  return Math.max(longest, to - last)
}

const joinOfFourth = (rebalance: Protocol) =>
  Effect.gen(function*() {
    const topic = unique(`join-${rebalance}`)
    const groupId = `${topic}-group`
    yield* KafkaJs.createTopic(brokers, topic, PARTITIONS.length)
    const journal: Journal = { handled: new Map(), events: [] }
    // One record per partition every 20 ms, for as long as the join takes.
    let produced = 0
    const producer = yield* Effect.fork(
      Effect.forever(
        Producer.sendAll(PARTITIONS.map((partition) => ({ topic, partition, value: String(produced) }))).pipe(
          Effect.tap(() => Effect.sync(() => produced += PARTITIONS.length)),
          Effect.zipRight(Effect.sleep("20 millis"))
        )
      ).pipe(Effect.provide(Platformatic.layerProducer({ brokers: brokers.split(","), clientId: `${topic}-p` })))
    )
    const first = [
      yield* member(rebalance, topic, groupId, "a", journal),
      yield* member(rebalance, topic, groupId, "b", journal),
      yield* member(rebalance, topic, groupId, "c", journal)
    ]
    const settled = (members: number) =>
      Effect.sync(() => {
        const owner = owners(journal)
        const counts = new Map<string, number>()
        for (const m of owner.values()) counts.set(m, (counts.get(m) ?? 0) + 1)
        return owner.size === PARTITIONS.length && counts.size === members
      })
    yield* eventually("three members share the six partitions", settled(3), "60 seconds")
    // Records flow on every partition for a second before the join.
    const flowing = Date.now()
    yield* eventually(
      "records are handled on every partition",
      Effect.sync(() => PARTITIONS.every((p) => (journal.handled.get(p) ?? []).some((h) => h.at > flowing + 1_000))),
      "30 seconds"
    )
    const before = owners(journal)
    const eventsBefore = journal.events.length
    const joinedAt = Date.now()
    const d = yield* member(rebalance, topic, groupId, "d", journal)
    // Under cooperative and consumer, more revokes than the new member's share end the wait at once: the assertions below say why.
    const tooMany = Effect.sync(() =>
      rebalance !== "eager" &&
      journal.events.slice(eventsBefore).filter((e) => e.kind === "revoke").length > Math.ceil(6 / 4)
    )
    yield* eventually(
      "four members share the six partitions",
      Effect.zipWith(settled(4), tooMany, (a, b) => a || b),
      "60 seconds"
    ).pipe(
      Effect.tapError(() => Effect.sync(() => console.log(rebalance, JSON.stringify(journal.events))))
    )
    const settledAt = Date.now()
    // Every partition handled again after the group settled: the pauses below end by then.
    yield* eventually(
      "records are handled on every partition after the join",
      Effect.sync(() => PARTITIONS.every((p) => (journal.handled.get(p) ?? []).some((h) => h.at > settledAt + 500))),
      "30 seconds"
    )
    const measuredTo = Date.now()
    yield* Fiber.interrupt(producer)
    // Every record produced is handled before the members leave.
    yield* eventually(
      "every record produced is handled",
      Effect.sync(() => PARTITIONS.reduce((n, p) => n + (journal.handled.get(p)?.length ?? 0), 0) >= produced),
      "30 seconds"
    )
    yield* Fiber.interruptAll([...first, d])
    // The join's events: those of the members leaving at the end are not the join's.
    const during = journal.events.slice(eventsBefore).filter((e) => e.at <= measuredTo)
    const revoked = during.filter((e) => e.kind === "revoke" && e.member !== "d").map((e) => e.partition)
    const reassigned = during.filter((e) => e.kind === "assign").map((e) => `${e.member} ${e.partition}`)
    const pauses = new Map(PARTITIONS.map((p) => [p, longestPause(journal, p, joinedAt, measuredTo)] as const))
    // Every event since the join, the members' leaving included: a revoke of the join may end after the measuring.
    const all = journal.events.slice(eventsBefore)
    return { before, during, all, revoked, reassigned, pauses, journal, produced, joinMillis: settledAt - joinedAt }
  })

if (brokers) {
  describe("incremental rebalances on the real broker (@platformatic/kafka)", () => {
    it.live(
      "a fourth member joins three on six partitions: cooperative and consumer (KIP-848) revoke at most ceil(6/4) and the partitions that stay are not paused; eager revokes all six and pauses each (same run)",
      () =>
        Effect.gen(function*() {
          const eager = yield* joinOfFourth("eager")
          const incremental = [
            ["cooperative", yield* joinOfFourth("cooperative")],
            ["consumer", yield* joinOfFourth("consumer")]
          ] as const
          const line = (name: string, o: typeof eager, which: ReadonlyArray<number>) =>
            `${name}: ${o.revoked.length} revoked, assigned ${
              JSON.stringify(o.reassigned)
            }, join ${o.joinMillis} ms, ` +
            `longest pause per partition ${JSON.stringify(Object.fromEntries(which.map((p) => [p, o.pauses.get(p)])))}`
          console.log([
            line("eager", eager, PARTITIONS),
            ...incremental.flatMap(([name, o]) => [
              line(`${name}, staying`, o, PARTITIONS.filter((p) => !o.revoked.includes(p))),
              line(`${name}, moved`, o, o.revoked)
            ])
          ].join("\n"))
          // Eager: all six revoked and assigned again.
          assert.strictEqual(eager.revoked.length, 6, JSON.stringify(eager.during))
          const eagerShortest = Math.min(...PARTITIONS.map((p) => eager.pauses.get(p)!))
          for (const [name, o] of incremental) {
            const detail = `${name}: ${JSON.stringify(o.during)}`
            const moved = o.revoked
            // Only what the new member gets is revoked, and only that is assigned again, to it.
            assert.isAtLeast(moved.length, 1, detail)
            assert.isAtMost(moved.length, Math.ceil(6 / 4), detail)
            assert.sameMembers(o.reassigned, moved.map((p) => `d ${p}`), detail)
            for (const p of moved) {
              const revokeEnd = o.all.find((e) => e.kind === "revoke-end" && e.partition === p)?.at ?? Infinity
              const assigned = o.during.find((e) => e.kind === "assign" && e.partition === p)!.at
              assert.isAtLeast(
                assigned,
                revokeEnd,
                `${name}, t-${p}: assigned to d before its old owner's revoke ended`
              )
            }
            // The partitions that stay: no pause longer than a poll's wait, and shorter than every eager pause.
            for (const p of PARTITIONS.filter((p) => !moved.includes(p))) {
              const pause = o.pauses.get(p)!
              assert.isBelow(pause, 1_000, `${name}: t-${p} stayed with its owner and paused ${pause} ms`)
              assert.isBelow(pause, eagerShortest, `${name}, t-${p}: ${pause} ms, eager's shortest ${eagerShortest} ms`)
            }
          }
          // Each record handled once under each: every revoke's final commit landed before the new owner read.
          for (const [name, o] of [["eager", eager] as const, ...incremental]) {
            let total = 0
            for (const [p, list] of o.journal.handled) {
              const offsets = list.map((h) => h.offset)
              assert.strictEqual(new Set(offsets).size, offsets.length, `${name}, t-${p}: a record handled twice`)
              total += offsets.length
            }
            assert.strictEqual(total, o.produced)
          }
        }),
      180_000
    )
  })

  describe("static membership on the real broker (@platformatic/kafka)", () => {
    it.live(
      "members killed with SIGKILL and restarted with the same instance id get their partitions back with no rebalance of the others; without an instance id each kill rebalances the group (same run)",
      () =>
        Effect.gen(function*() {
          const run = (staticMembership: boolean, seed: number) =>
            runRealWorkload({
              policy: "transactional",
              records: 6_000,
              partitions: 6,
              consumers: 3,
              kills: 4,
              seed,
              brokers,
              databaseUrl,
              driver: "platformatic",
              sessionTimeoutMillis: 10_000,
              staticMembership,
              settleFirst: true
            })
          const [fixed, dynamic] = yield* Effect.all([run(true, 5001), run(false, 5002)], { concurrency: 2 })
          const line = (name: string, o: typeof fixed) =>
            `${name}: kills ${o.crashes}, membership changes ${o.moves?.changes}, revoked ${o.moves?.revoked}, ` +
            `assigned again ${o.moves?.assigned}, lost ${o.lost}, duplicated ${o.duplicated}, unexpected exits ` +
            `${o.unexpectedExits}, ${(o.elapsedMillis / 1000).toFixed(1)} s`
          console.log(`${line("static", fixed)}\n${line("dynamic", dynamic)}`)
          for (const o of [fixed, dynamic]) {
            assert.strictEqual(o.crashes, 4, line("run", o))
            assert.strictEqual(o.unexpectedExits, 0, line("run", o))
            assert.strictEqual(o.lost, 0, line("run", o))
            assert.strictEqual(o.duplicated, 0, line("run", o))
          }
          // Static: no member that stayed gave anything up; only the restarted members were assigned (their own).
          assert.strictEqual(fixed.moves!.revoked, 0, line("static", fixed))
          assert.isAtLeast(fixed.moves!.assigned, 4, line("static", fixed))
          // Dynamic: each kill and restart moved partitions away from members that stayed.
          assert.isAtLeast(dynamic.moves!.revoked, 4, line("dynamic", dynamic))
        }),
      { timeout: 10 * 60_000 }
    )
  })
}
