/**
 * The semantics lab's workload on the in-memory broker: produce records, consume them under one commit policy with
 * crashes injected and members joining and leaving, then count what the handler saw.
 */
import * as Cause from "effect/Cause"
import * as Chunk from "effect/Chunk"
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import * as CommitPolicy from "../src/CommitPolicy.js"
import * as Consumer from "../src/Consumer.js"
import type { ConsumerRecord } from "../src/ConsumerRecord.js"
import type { Driver } from "../src/Driver.js"
import { Crashed, type CrashPoint, crashPoints } from "../src/Faults.js"
import * as InMemoryKafka from "../src/InMemoryKafka.js"
import type * as TopicPartition from "../src/TopicPartition.js"

export type PolicyName = "atMostOnce" | "autoCommit" | "commitAfter" | "transactional"

export interface Workload {
  readonly policy: PolicyName
  readonly records: number
  readonly partitions: number
  readonly consumers: number
  /** Most crashes injected in the run. */
  readonly crashes: number
  /** Chance that a member dies at an allowed crash point. */
  readonly crashRate: number
  readonly crashPoints?: ReadonlyArray<CrashPoint>
  readonly seed: number
  /** Extra members join and leave while records flow. */
  readonly rebalances?: boolean
  readonly maxPollRecords?: number
  readonly commitEvery?: number
}

export interface Outcome {
  readonly policy: PolicyName
  readonly produced: number
  /** Records handed to the handler, counting repeats (for `transactional`: results committed with positions). */
  readonly delivered: number
  readonly lost: number
  readonly duplicated: number
  readonly crashes: number
  readonly rebalances: number
  readonly elapsedMillis: number
}

/** A small seeded generator (mulberry32), so that a run is reproducible from its seed. */
export const random = (seed: number) => {
  let a = seed >>> 0
  return () => {
    a = (a + 0x6d2b79f5) >>> 0
    let t = a
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

/** Where delivered records are counted. */
export interface Tally {
  readonly counts: Map<string, number>
  delivered: number
}

export const recordKey = (r: { readonly partition: number; readonly offset: bigint }) => `${r.partition}@${r.offset}`

const tallyAll = (tally: Tally, records: Chunk.Chunk<ConsumerRecord>) =>
  Effect.sync(() => {
    for (const r of records) {
      const k = recordKey(r)
      tally.counts.set(k, (tally.counts.get(k) ?? 0) + 1)
      tally.delivered++
    }
  })

/** Policy layers for the in-memory lab (transactional is given its store by the caller). */
export const policyLayer = (name: Exclude<PolicyName, "transactional">, commitEvery: number) => {
  switch (name) {
    case "atMostOnce":
      return CommitPolicy.atMostOnce
    case "autoCommit":
      return CommitPolicy.autoCommit({ interval: "20 millis" })
    case "commitAfter":
      return CommitPolicy.commitAfter({ maxBatch: commitEvery, maxInterval: "20 millis" })
  }
}

export interface Plan {
  /** Consumes as one member until interrupted; dies with `Crashed` when a crash is injected. */
  readonly member: (groupId: string, topic: string) => Effect.Effect<never, unknown, Driver | InMemoryKafka.InMemoryKafka>
  /** The stored positions that say how far the group has got, keyed by `TopicPartition.key`. */
  readonly positions: (groupId: string) => Effect.Effect<ReadonlyMap<string, bigint>, unknown, InMemoryKafka.InMemoryKafka>
  /** Deliveries, read after the run. */
  readonly tally: Effect.Effect<Tally, unknown>
}

/** The plan for the three Kafka-committed policies: deliveries counted in the handler. */
export const kafkaPlan = (
  workload: Workload,
  shouldCrash: (point: CrashPoint, partitions: ReadonlyArray<TopicPartition.TopicPartition>) => boolean
): Plan => {
  const tally: Tally = { counts: new Map(), delivered: 0 }
  const policy = policyLayer(workload.policy as Exclude<PolicyName, "transactional">, workload.commitEvery ?? 100)
  return {
    member: (groupId, topic) =>
      Consumer.run(
        { groupId, topics: [topic], maxPollRecords: workload.maxPollRecords ?? 50, retry: Schedule.recurs(0) },
        (records) => tallyAll(tally, records)
      ).pipe(
        Effect.provide(Layer.merge(policy, InMemoryKafka.layerFaults((point, _, tps) => shouldCrash(point, tps))))
      ),
    positions: (groupId) =>
      Effect.map(InMemoryKafka.InMemoryKafka, (k) => k.committed(groupId)).pipe(Effect.flatten),
    tally: Effect.succeed(tally)
  }
}

/**
 * Runs a workload to the end: every partition's stored position reaches the end of the topic, then the members stop
 * cleanly. Members that crash are replaced at once.
 */
export const runWorkload = (workload: Workload, makePlan?: typeof kafkaPlan) =>
  Effect.gen(function*() {
    const kafka = yield* InMemoryKafka.InMemoryKafka
    const rng = random(workload.seed)
    const topic = `lab-${workload.policy}-${workload.seed}`
    const groupId = `${topic}-group`
    yield* kafka.createTopic(topic, workload.partitions)
    const batch = 10_000
    for (let at = 0; at < workload.records; at += batch) {
      const n = Math.min(batch, workload.records - at)
      yield* kafka.produce(topic, Array.from({ length: n }, (_, i) => ({ value: String(at + i), partition: (at + i) % workload.partitions })))
    }
    const end = yield* kafka.endOffsets(topic)
    let crashes = 0
    const allowed = new Set(workload.crashPoints ?? crashPoints)
    const shouldCrash = (point: CrashPoint) => {
      if (crashes >= workload.crashes || !allowed.has(point) || rng() >= workload.crashRate) return false
      crashes++
      return true
    }
    const plan = (makePlan ?? kafkaPlan)(workload, shouldCrash)
    const start = yield* Clock.currentTimeMillis

    // A member that crashes is replaced, as a process supervisor would restart it.
    const supervised = Effect.gen(function*() {
      while (true) {
        const exit = yield* Effect.exit(plan.member(groupId, topic))
        if (!isCrash(exit)) return yield* exit
      }
    })

    const members = yield* Effect.forEach(
      Array.from({ length: workload.consumers }),
      () => Effect.fork(supervised)
    )

    const done = Effect.gen(function*() {
      const positions = yield* plan.positions(groupId)
      return end.every((e, p) => (positions.get(`${topic}-${p}`) ?? 0n) >= e)
    })
    const progress = Effect.gen(function*() {
      const t = yield* plan.tally
      return t.delivered
    })

    let rebalances = 0
    const extras: Array<Fiber.RuntimeFiber<unknown, unknown>> = []
    while (!(yield* done)) {
      const failed = yield* Effect.forEach(members, (f) => f.poll).pipe(
        Effect.map((polls) => polls.find((p) => Option.isSome(p)))
      )
      if (failed !== undefined && Option.isSome(failed)) return yield* failed.value
      if (workload.rebalances === true) {
        const seen = yield* progress
        const step = Math.floor(workload.records / 4)
        if (rebalances === 0 && seen >= step) {
          extras.push(yield* Effect.fork(supervised))
          rebalances++
        } else if (rebalances === 1 && seen >= 2 * step) {
          extras.push(yield* Effect.fork(supervised))
          rebalances++
        } else if (rebalances === 2 && seen >= 3 * step) {
          yield* Fiber.interrupt(extras.shift()!)
          rebalances++
        }
      }
      yield* Effect.sleep("2 millis")
    }
    yield* Fiber.interruptAll([...members, ...extras])
    const elapsedMillis = (yield* Clock.currentTimeMillis) - start
    const tally = yield* plan.tally
    let lost = 0
    let duplicated = 0
    for (let p = 0; p < end.length; p++) {
      for (let o = 0n; o < end[p]!; o++) {
        const n = tally.counts.get(`${p}@${o}`) ?? 0
        if (n === 0) lost++
        else duplicated += n - 1
      }
    }
    return {
      policy: workload.policy,
      produced: workload.records,
      delivered: tally.delivered,
      lost,
      duplicated,
      crashes,
      rebalances,
      elapsedMillis
    } satisfies Outcome
  })

/** Whether a member ended because a crash was injected. */
export const isCrash = (exit: Exit.Exit<unknown, unknown>): boolean =>
  Exit.isFailure(exit) && Chunk.some(Cause.defects(exit.cause), (d) => d instanceof Crashed)
