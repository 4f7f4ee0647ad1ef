/**
 * The semantics lab's workload on the in-memory broker: produce records, consume them under one commit policy with
 * crashes injected and members joining and leaving, then count what the handler saw.
 */
import * as Cause from "effect/Cause"
import * as Chunk from "effect/Chunk"
import * as Clock from "effect/Clock"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import * as Stream from "effect/Stream"
import * as Data from "effect/Data"
import * as Codec from "../src/Codec.js"
import * as CommitPolicy from "../src/CommitPolicy.js"
import * as Consumer from "../src/Consumer.js"
import type { ConsumerRecord } from "../src/ConsumerRecord.js"
import { Driver, type RebalanceProtocol } from "../src/Driver.js"
import * as FailureRoute from "../src/FailureRoute.js"
import { Crashed, type CrashPoint, crashPoints } from "../src/Faults.js"
import * as InMemoryKafka from "../src/InMemoryKafka.js"
import * as Observability from "../src/Observability.js"
import { type DecodeFailed, RecordFailed, TransactionFailed } from "../src/KafkaError.js"
import * as OffsetStore from "../src/OffsetStore.js"
import * as Producer from "../src/Producer.js"
import type { Transaction } from "../src/OffsetStore.js"
import type * as TopicPartition from "../src/TopicPartition.js"

export type PolicyName = "atMostOnce" | "autoCommit" | "commitAfter" | "transactional" | "kafkaTransactional"

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
  /** How the in-memory broker's group moves partitions when members join and leave. Default `eager`. */
  readonly rebalance?: RebalanceProtocol
  readonly maxPollRecords?: number
  readonly commitEvery?: number
  /** Time the handler spends on each chunk, as I/O would. */
  readonly handlerMillis?: number
  /** Which records of a partition are handled one after another (the consumer's `ordering`). Default `partition`. */
  readonly ordering?: Consumer.Config["ordering"]
  /** Handler calls in flight under `key` and `unordered` ordering. */
  readonly concurrency?: number
  /** Records get keys `k0` to `k<keys - 1>`, in turn; without it they have none. */
  readonly keys?: number
  /**
   * Most zombies in the run: a member that stalls in the middle of a unit of work (frozen: no poll, no heartbeat)
   * until the group has given its partition to another member, then wakes and tries to commit. Members get a short
   * session when there are zombies. `transactional` and `kafkaTransactional` only.
   */
  readonly zombies?: number
  /**
   * Share of poison records, chosen at random from the seed: half do not decode (bytes that are not UTF-8), half
   * decode and are refused by the handler (under the exactly-once policies, after it wrote its result). With any, the
   * consumer dead-letters them (`FailureRoute.deadLetter`) to the topic's `-dlq` topic. Default 0.
   */
  readonly poisonRate?: number
  /** With poison records: they go through retry topics with these waits (milliseconds) before the dead-letter topic. */
  readonly retryDelays?: ReadonlyArray<number>
  /** Keeps the run's topic and group apart from earlier runs with the same policy and seed, in a store that lasts. */
  readonly runId?: string
  /** Told, while the run goes on, how far the group's stored positions have got. */
  readonly onProgress?: (progress: Progress) => void
}

/** How far a run has got: records below the group's stored positions, out of all produced. */
export interface Progress {
  readonly stored: number
  readonly records: number
  readonly crashes: number
  readonly rebalances: number
  /** The group's lag over all partitions, from the members' latest reports; with `Observability` only. */
  readonly lag?: number
}

/** A partition's lag at the end of a run, as its owner reported it after the last record was stored. */
export interface FinalLag {
  readonly partition: number
  readonly lag: number
}

export interface Outcome {
  readonly policy: PolicyName
  readonly produced: number
  /** Poison records among those produced (see `Workload.poisonRate`). */
  readonly poison: number
  /** Records in the dead-letter topic, once each. */
  readonly deadLettered: number
  /** Dead-letter records beyond the first of a record (a crash between the dead-letter write and the position). */
  readonly deadLetterRepeats: number
  /** Records both handled and dead-lettered: never for the exactly-once policies. */
  readonly handledAndDeadLettered: number
  /** Records in the dead-letter topic that were not poison, or poison records that were handled. */
  readonly misrouted: number
  /**
   * Records handed to the handler, counting repeats (for `transactional`: results committed with positions; for
   * `kafkaTransactional`: records in the output topic, read `read_committed`).
   */
  readonly delivered: number
  /** Records neither handled nor dead-lettered. */
  readonly lost: number
  readonly duplicated: number
  readonly crashes: number
  readonly rebalances: number
  /** The group's generation at the end: every join, leave and crash moved it on by one. */
  readonly generation: number
  /** Members that found, on commit, that another member had moved their partition on, and started again. */
  readonly fenced: number
  /** Members that stalled mid-unit until their partition had moved to another member (see `Workload.zombies`). */
  readonly zombies: number
  readonly elapsedMillis: number
  /**
   * What the membership changes of a run on a real broker moved: members that joined or went (joins, restarts,
   * leaves, kills, evictions), the partitions their rebalances revoked from members that stayed in the group, and
   * the partitions assigned, counted from the moment the first members shared every partition. A partition lost with
   * a killed member is not counted as revoked.
   */
  readonly moves?: { readonly changes: number; readonly revoked: number; readonly assigned: number }
  /**
   * Each partition's lag once every record was handled, as the members reported it (`Observability.lag`); with
   * `Observability` only.
   */
  readonly finalLag?: ReadonlyArray<FinalLag>
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
  /**
   * Records handed to a handler, whether or not it lived to finish them: how far the run has come, for the
   * checkpoints (a policy that loses records under crashes delivers fewer than it goes through).
   */
  handed: number
  /** Progress points at which the handler waits until the workload has made its move (a member joins or leaves). */
  readonly checkpoints: Array<Checkpoint>
}

export interface Checkpoint {
  readonly at: number
  readonly reached: Deferred.Deferred<void>
  readonly moved: Deferred.Deferred<void>
}

export const makeTally = (checkpoints: Array<Checkpoint> = []): Tally => ({
  counts: new Map(),
  delivered: 0,
  handed: 0,
  checkpoints
})

/** Waits at a checkpoint the tally has just passed, so that rebalances happen mid-stream, not after it. */
export const atCheckpoint = (tally: Tally) =>
  Effect.suspend(() => {
    const next = tally.checkpoints[0]
    if (next === undefined || Math.max(tally.delivered, tally.handed) < next.at) return Effect.void
    tally.checkpoints.shift()
    return Deferred.succeed(next.reached, undefined).pipe(Effect.zipRight(Deferred.await(next.moved)))
  })

export const recordKey = (r: { readonly partition: number; readonly offset: bigint }) => `${r.partition}@${r.offset}`

/** The topic a run with poison records dead-letters them to. */
export const deadLetterTopic = (topic: string) => `${topic}-dlq`

/** A poison record that decodes: the handler refuses it. */
const refusedPrefix = "refuse-"

class Refused extends Data.TaggedError("Refused")<{ readonly record: string }> {
  override get message() {
    return `record ${this.record} is refused by the handler`
  }
}

/**
 * The handler of a run: records decoded as UTF-8 first when the run has poison records, and refused when they say
 * so, before `handle` (`refuseAfter`: after it, as a handler that wrote something and then failed).
 */
const withPoison = <E, R>(
  workload: Workload,
  handle: (records: Chunk.Chunk<ConsumerRecord>, partition: TopicPartition.TopicPartition) => Effect.Effect<void, E, R>,
  refuseAfter: boolean
): Consumer.Handler<E | RecordFailed<Refused> | DecodeFailed, R> => {
  if ((workload.poisonRate ?? 0) === 0) return handle
  return Consumer.decodedChunk({ value: Codec.string }, (decoded, partition) => {
    const records = Chunk.map(decoded, (d) => d.record)
    const at = Chunk.findFirstIndex(decoded, (d) => d.value.startsWith(refusedPrefix))
    if (at._tag === "None") return handle(records, partition)
    const refused = Chunk.unsafeGet(records, at.value)
    // The handler says which record it failed on; those before it are handled.
    const fail = Effect.fail(
      new RecordFailed<Refused>({ offset: refused.offset, cause: new Refused({ record: recordKey(refused) }) })
    )
    return refuseAfter
      ? Effect.zipRight(handle(records, partition), fail)
      : at.value === 0
      ? fail
      : Effect.zipRight(handle(Chunk.take(records, at.value), partition), fail)
  })
}

/** The run's failure route: dead letters when it has poison records. */
const routeOf = (workload: Workload, topic: string) =>
  (workload.poisonRate ?? 0) === 0
    ? {}
    : workload.retryDelays === undefined || workload.retryDelays.length === 0
    ? { onFailure: FailureRoute.deadLetter({ topic: deadLetterTopic(topic) }) }
    : { onFailure: FailureRoute.retryTopics(workload.retryDelays, { deadLetter: { topic: deadLetterTopic(topic) } }) }

export const tallyAll = (tally: Tally, records: Chunk.Chunk<ConsumerRecord>) =>
  Effect.sync(() => {
    for (const r of records) {
      const k = recordKey(r)
      tally.counts.set(k, (tally.counts.get(k) ?? 0) + 1)
      tally.delivered++
    }
  }).pipe(Effect.zipRight(atCheckpoint(tally)))

/** Policy layers for the in-memory lab (the exactly-once policies have plans of their own). */
export const policyLayer = (name: Exclude<PolicyName, "transactional" | "kafkaTransactional">, commitEvery: number) => {
  switch (name) {
    case "atMostOnce":
      return CommitPolicy.atMostOnce()
    case "autoCommit":
      return CommitPolicy.autoCommit({ interval: "20 millis" })
    case "commitAfter":
      return CommitPolicy.commitAfter({ maxBatch: commitEvery, maxInterval: "20 millis" })
  }
}

export interface Plan<R = never> {
  /** Consumes as one member until interrupted; dies with `Crashed` when a crash is injected. */
  readonly member: (
    groupId: string,
    topic: string,
    /** The member's place among the workload's consumers: a member started again after a crash takes its place. */
    slot: number
  ) => Effect.Effect<never, unknown, Driver | InMemoryKafka.InMemoryKafka | R>
  /** The stored positions that say how far the group has got, keyed by `TopicPartition.key`. */
  readonly positions: (
    groupId: string,
    partitions: ReadonlyArray<TopicPartition.TopicPartition>
  ) => Effect.Effect<ReadonlyMap<string, bigint>, unknown, InMemoryKafka.InMemoryKafka | R>
  /** Deliveries, read after the run. */
  readonly tally: (groupId: string, topic: string) => Effect.Effect<Tally, unknown, R>
}

export type MakePlan<R> = (
  workload: Workload,
  shouldCrash: (point: CrashPoint, memberId: string) => boolean,
  checkpoints: Array<Checkpoint>,
  zombies: Zombies
) => Plan<R>

/**
 * Whether the next unit of work should be a zombie's (one at a time), whose member it is, and, once the zombie has
 * tried its commit, whether it was one.
 */
export interface Zombies {
  readonly wanted: () => boolean
  readonly stalls: (memberId: string) => void
  readonly done: (made: boolean) => void
}

/** A short session when zombies are wanted, so that the group evicts a stalled member quickly. */
const sessionOf = (workload: Workload): Pick<Consumer.Config, "sessionTimeout"> =>
  (workload.zombies ?? 0) > 0 ? { sessionTimeout: "400 millis" } : {}

/** How far a group has got on some partitions: stored or committed positions, keyed by `TopicPartition.key`. */
type PositionsOf<R> = (
  groupId: string,
  partitions: ReadonlyArray<TopicPartition.TopicPartition>
) => Effect.Effect<ReadonlyMap<string, bigint>, unknown, R>

/**
 * Makes the member that owns `partition` a zombie, from inside its handler, in the middle of a unit of work that
 * started at `from`: the member stops polling and heartbeating until the group has evicted it, another member has
 * claimed the partition and stored its way past `from`, then its handler returns and its unit goes on to commit,
 * while the member itself stays paused a moment longer (it would otherwise learn from its next poll that it was
 * evicted, and give the unit up before it tries to commit). The store must refuse that unit: its results are already
 * there, from the new owner.
 */
const stall = <R>(
  groupId: string,
  partition: TopicPartition.TopicPartition,
  from: bigint,
  zombies: Zombies,
  positions: PositionsOf<R>
) =>
  Effect.flatMap(InMemoryKafka.InMemoryKafka, (kafka) => {
    let frozen: string | undefined
    let handedOver = false
    return Effect.gen(function*() {
      const owner = (yield* kafka.members(groupId)).find((m) =>
        m.partitions.some((p) => p.topic === partition.topic && p.partition === partition.partition)
      )
      if (owner === undefined) return
      zombies.stalls(owner.memberId)
      yield* kafka.freeze(owner.memberId)
      frozen = owner.memberId
      const key = `${partition.topic}-${partition.partition}`
      const movedOn = yield* positions(groupId, [partition]).pipe(
        Effect.catchAll(() => Effect.succeed(new Map<string, bigint>())),
        Effect.repeat({ schedule: Schedule.spaced("10 millis"), until: (at) => (at.get(key) ?? 0n) > from }),
        Effect.timeoutOption("10 seconds")
      )
      // The unit commits (or is refused) while the member is still paused; the run does not end before it has.
      handedOver = true
      yield* Effect.forkDaemon(
        Effect.sleep("1 second").pipe(
          Effect.zipRight(kafka.thaw(owner.memberId)),
          Effect.zipRight(Effect.sync(() => zombies.done(Option.isSome(movedOn))))
        )
      )
    }).pipe(
      Effect.onExit(() =>
        handedOver
          ? Effect.void
          : Effect.zipRight(
            frozen === undefined ? Effect.void : kafka.thaw(frozen),
            Effect.sync(() => zombies.done(false))
          )
      )
    )
  })

/** The plan for the three Kafka-committed policies: deliveries counted in the handler. */
export const kafkaPlan: MakePlan<never> = (workload, shouldCrash, checkpoints) => {
  const tally = makeTally(checkpoints)
  const policy = policyLayer(
    workload.policy as Exclude<PolicyName, "transactional" | "kafkaTransactional">,
    workload.commitEvery ?? 100
  )
  return {
    member: (groupId, topic) => {
      // The member's process: once it dies, its handlers stop where they are (what a handler would still do after
      // the crash, such as counting its chunk, never happens), as a process killed mid-handler does.
      let dead = false
      const alive = <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.suspend(() => dead ? Effect.never : effect)
      return Consumer.run(
        {
          groupId,
          topics: [topic],
          maxPollRecords: workload.maxPollRecords ?? 50,
          retry: Schedule.recurs(0),
          ...orderingOf(workload),
          ...routeOf(workload, topic)
        },
        withPoison(workload, (records) =>
          Effect.zipRight(
            Effect.sync(() => {
              tally.handed += Chunk.size(records)
            }),
            paced(workload, alive(tallyAll(tally, records)))
          ), false)
      ).pipe(
        Effect.provide(Layer.mergeAll(
          policy,
          InMemoryKafka.layerFaults((point, memberId) => {
            const dies = shouldCrash(point, memberId)
            if (dies) dead = true
            return dies
          }),
          InMemoryKafka.layerProducer()
        ))
      )
    },
    positions: (groupId) => Effect.map(InMemoryKafka.InMemoryKafka, (k) => k.committed(groupId)).pipe(Effect.flatten),
    tally: () => Effect.succeed(tally)
  }
}

/**
 * How the exactly-once handler writes its results into the store's transaction, and how they are read back.
 */
export interface ResultSink<R> {
  readonly write: (records: Chunk.Chunk<ConsumerRecord>) => Effect.Effect<void, unknown, Transaction | R>
  readonly read: (groupId: string) => Effect.Effect<ReadonlyArray<string>, unknown, R>
}

/** Results through `OffsetStore.append`, for the memory and file stores. */
export const appendSink: ResultSink<OffsetStore.Results> = {
  write: (records) => OffsetStore.append(Chunk.toReadonlyArray(Chunk.map(records, recordKey))),
  read: (groupId) => Effect.map(OffsetStore.results(groupId), (rs) => rs.map(String))
}

/** Deliveries counted from the keys (`partition@offset`) of the results read back. */
const countKeys = (keys: Iterable<string>): Tally => {
  const tally = makeTally()
  for (const k of keys) {
    tally.counts.set(k, (tally.counts.get(k) ?? 0) + 1)
    tally.delivered++
  }
  return tally
}

/**
 * What follows the handler's writes in a unit of the exactly-once plans: maybe a zombie, then the progress count.
 */
const afterUnit = <R>(
  groupId: string,
  partition: TopicPartition.TopicPartition,
  records: Chunk.Chunk<ConsumerRecord>,
  zombies: Zombies,
  progress: Tally,
  positions: PositionsOf<R>
) =>
  Effect.suspend(() =>
    zombies.wanted() ? stall(groupId, partition, Chunk.unsafeHead(records).offset, zombies, positions) : Effect.void
  ).pipe(
    Effect.zipRight(Effect.sync(() => (progress.delivered += Chunk.size(records)))),
    Effect.zipRight(atCheckpoint(progress))
  )

/** The consumer settings of the exactly-once plans: no handler retries, a short session when zombies are wanted. */
const exactlyOnceConfig = (
  workload: Workload,
  groupId: string,
  topic: string
): Consumer.AnyConfig => ({
  groupId,
  topics: [topic],
  maxPollRecords: workload.maxPollRecords ?? 50,
  retry: Schedule.recurs(0),
  ...sessionOf(workload),
  ...orderingOf(workload),
  ...routeOf(workload, topic)
})

/** The workload's ordering and concurrency, as consumer settings. */
const orderingOf = (workload: Workload): Pick<Consumer.Config, "ordering" | "concurrency"> => ({
  ...(workload.ordering === undefined ? {} : { ordering: workload.ordering }),
  ...(workload.concurrency === undefined ? {} : { concurrency: workload.concurrency })
})

/**
 * The handler's time per chunk, as I/O would take it, before its write. Without `handlerMillis` the handler still
 * yields once, as any handler that does I/O does: the consumer's other fibers (a commit, another partition's worker)
 * run while a chunk is in the handler, and a crash there leaves the chunk unhandled.
 */
const paced = <A, E, R>(workload: Workload, write: Effect.Effect<A, E, R>) =>
  Effect.zipRight(
    workload.handlerMillis === undefined ? Effect.yieldNow() : Effect.sleep(workload.handlerMillis),
    write
  )

const storedPositions = (groupId: string, partitions: ReadonlyArray<TopicPartition.TopicPartition>) =>
  Effect.flatMap(OffsetStore.OffsetStore, (store) => store.load(groupId, partitions))

const committedPositions = (groupId: string) =>
  Effect.flatMap(InMemoryKafka.InMemoryKafka, (kafka) => kafka.committed(groupId))

/** The topic a `kafkaTransactional` run writes its results to. */
export const outputTopic = (topic: string) => `${topic}-out`

/**
 * Every record of a topic as a `read_committed` consumer reads it (through the `Driver`), from offset 0 to each
 * partition's last stable offset.
 */
export const readCommitted = (topic: string, partitions: number) =>
  Effect.gen(function*() {
    const driver = yield* Driver
    const tps = Array.from({ length: partitions }, (_, partition) => ({ topic, partition }))
    const session = yield* driver.connect({
      groupId: `${topic}-audit-${crypto.randomUUID()}`,
      clientId: `${topic}-audit`,
      subscription: { _tag: "Partitions", partitions: tps },
      maxPollRecords: 10_000,
      pollTimeout: Duration.millis(50),
      sessionTimeout: Duration.seconds(30),
      rebalanceTimeout: Duration.seconds(30),
      isolationLevel: "read_committed"
    })
    const offsets = yield* session.offsets(tps)
    const positions = new Map<string, bigint>()
    const out: Array<ConsumerRecord> = []
    const done = () =>
      tps.every((tp) => {
        const k = `${tp.topic}-${tp.partition}`
        return (positions.get(k) ?? -1n) >= offsets.get(k)!.latest
      })
    while (!done()) {
      for (const event of yield* session.poll) {
        if (event._tag === "Assigned") {
          for (const tp of event.partitions) {
            yield* session.seek(tp, 0n)
            positions.set(`${tp.topic}-${tp.partition}`, 0n)
          }
        } else if (event._tag === "Records") {
          positions.set(`${event.partition.topic}-${event.partition.partition}`, event.next)
          for (const r of event.records) out.push(r)
        }
      }
    }
    return out
  }).pipe(Effect.scoped)

const decoder = new TextDecoder()

/** The value of a poison record that does not decode: bytes that are not UTF-8. */
const notUtf8 = new Uint8Array([0xff, 0xfe, 0xfd])

/**
 * The plan for `kafkaTransactional`: the handler produces one record per input record (its key the input's
 * partition and offset) into the output topic, in the chunk's Kafka transaction with the input positions; deliveries
 * are the output topic's records, read `read_committed`.
 */
export const kafkaTransactionalPlan: MakePlan<Driver> = (workload, shouldCrash, checkpoints, zombies) => {
  const progress = makeTally(checkpoints)
  return {
    member: (groupId, topic, slot) =>
      Effect.gen(function*() {
        const kafka = yield* InMemoryKafka.InMemoryKafka
        const out = outputTopic(topic)
        yield* kafka.createTopic(out, workload.partitions)
        return yield* Consumer.run(
          exactlyOnceConfig(workload, groupId, topic),
          withPoison(workload, (records, partition) =>
            Producer.sendAll(Chunk.map(records, (r) => ({
              topic: out,
              partition: r.partition,
              key: recordKey(r),
              value: recordKey(r)
            }))).pipe(
              (sent) => paced(workload, sent),
              // A zombie's transaction holds its records and goes on to commit after its partition has moved on.
              Effect.zipRight(afterUnit(groupId, partition, records, zombies, progress, committedPositions))
            ), true)
        ).pipe(
          Effect.provide(Layer.mergeAll(
            // The member's transactional producer is named by its place: started again after a crash, it ends the
            // transaction its predecessor left open.
            CommitPolicy.kafkaTransactional({ instanceId: `member-${slot}` }).pipe(
              Layer.provide(InMemoryKafka.layerTransactionalProducers())
            ),
            InMemoryKafka.layerFaults((point, memberId) => shouldCrash(point, memberId))
          ))
        )
      }),
    positions: committedPositions,
    tally: (_, topic) =>
      Effect.map(
        readCommitted(outputTopic(topic), workload.partitions),
        (records) => countKeys(records.map((r) => r.value === null ? "" : decoder.decode(r.value)))
      )
  }
}

/** The plan for `transactional`: deliveries are the results committed with positions in the offset store. */
export const transactionalPlan =
  <R>(sink: ResultSink<R>): MakePlan<OffsetStore.OffsetStore | R> => (workload, shouldCrash, checkpoints, zombies) => {
    const progress = makeTally(checkpoints)
    return {
      member: (groupId, topic) =>
        Consumer.run(
          exactlyOnceConfig(workload, groupId, topic),
          withPoison(workload, (records, partition) =>
            paced(workload, sink.write(records)).pipe(
              // A zombie's unit has written its results and goes on to commit after its partition has moved on.
              Effect.zipRight(afterUnit(groupId, partition, records, zombies, progress, storedPositions))
            ), true)
        ).pipe(
          Effect.provide(Layer.mergeAll(
            CommitPolicy.transactional(),
            InMemoryKafka.layerFaults((point, memberId) => shouldCrash(point, memberId)),
            InMemoryKafka.layerProducer()
          ))
        ),
      positions: storedPositions,
      tally: (groupId) => Effect.map(sink.read(groupId), countKeys)
    }
  }

/**
 * Runs a workload to the end: every partition's stored position reaches the end of the topic, then the members stop
 * cleanly. Members that crash are replaced at once.
 */
export const runWorkload = <R = never>(workload: Workload, makePlan?: MakePlan<R>) =>
  Effect.scoped(Effect.gen(function*() {
    const kafka = yield* InMemoryKafka.InMemoryKafka
    const rng = random(workload.seed)
    const topic = `lab-${workload.policy}-${workload.seed}${workload.runId === undefined ? "" : `-${workload.runId}`}`
    const groupId = `${topic}-group`
    yield* kafka.createTopic(topic, workload.partitions)
    const poisonRate = workload.poisonRate ?? 0
    if (poisonRate > 0) {
      yield* kafka.createTopic(deadLetterTopic(topic), workload.partitions)
      for (let step = 0; step < (workload.retryDelays ?? []).length; step++) {
        yield* kafka.createTopic(FailureRoute.retryTopic(topic, step), workload.partitions)
      }
    }
    // Poison records are chosen by a generator of their own: the same seed crashes at the same points with or without.
    const poisonRng = random(workload.seed ^ 0x5bd1e995)
    const poison = new Set<string>()
    const batch = 10_000
    for (let at = 0; at < workload.records; at += batch) {
      const n = Math.min(batch, workload.records - at)
      const kinds = Array.from({ length: n }, () => poisonRate > 0 && poisonRng() < poisonRate)
      const written = yield* kafka.produce(
        topic,
        Array.from({ length: n }, (_, i) => ({
          value: !kinds[i] ? String(at + i) : (at + i) % 2 === 0 ? `${refusedPrefix}${at + i}` : notUtf8,
          partition: (at + i) % workload.partitions,
          ...(workload.keys === undefined ? {} : { key: `k${(at + i) % workload.keys}` })
        }))
      )
      written.forEach(([partition, offset], i) => {
        if (kinds[i]) poison.add(recordKey({ partition, offset }))
      })
    }
    const end = yield* kafka.endOffsets(topic)
    let crashes = 0
    const allowed = new Set(workload.crashPoints ?? crashPoints)
    let stalling = false
    /** The member being made a zombie: it must live to try its commit. */
    let zombie: string | undefined
    const shouldCrash = (point: CrashPoint, memberId: string) => {
      if (memberId === zombie || crashes >= workload.crashes || !allowed.has(point) || rng() >= workload.crashRate) {
        return false
      }
      crashes++
      return true
    }
    // Zombies are wanted one at a time, until as many as asked for were made.
    let zombies = 0
    const zombieMaker = {
      wanted: () => {
        if (stalling || zombies >= (workload.zombies ?? 0) || rng() >= 0.05) return false
        stalling = true
        return true
      },
      stalls: (memberId: string) => {
        zombie = memberId
      },
      done: (made: boolean) => {
        stalling = false
        zombie = undefined
        if (made) zombies++
      }
    }
    // Members join at a quarter and at half of the records, and one leaves at three quarters.
    const checkpoints: Array<Checkpoint> = []
    if (workload.rebalances === true) {
      for (const share of [1, 2, 3]) {
        checkpoints.push({
          at: Math.floor((workload.records * share) / 4),
          reached: yield* Deferred.make<void>(),
          moved: yield* Deferred.make<void>()
        })
      }
    }
    const moves = [...checkpoints]
    // With observability: the latest lag the members reported of each partition.
    const observability = yield* Effect.serviceOption(Observability.Observability)
    const lagOf = new Map<number, { readonly lag: bigint; readonly at: number }>()
    if (Option.isSome(observability)) {
      yield* Observability.lag({ groupId }).pipe(
        Stream.runForEach((snapshot) =>
          Effect.sync(() => {
            for (const p of snapshot.partitions) {
              const known = lagOf.get(p.partition)
              if (known === undefined || known.at <= snapshot.at) {
                lagOf.set(p.partition, { lag: p.lag, at: snapshot.at })
              }
            }
          })
        ),
        Effect.provideService(Observability.Observability, observability.value),
        Effect.forkScoped
      )
    }
    const totalLag = () => {
      let total = 0n
      for (const { lag } of lagOf.values()) total += lag
      return Number(total)
    }
    const plan: Plan<R> = (makePlan ?? (kafkaPlan as MakePlan<R>))(workload, shouldCrash, checkpoints, zombieMaker)
    const partitions = end.map((_, partition) => ({ topic, partition }))
    const start = yield* Clock.currentTimeMillis

    // A member that crashes is replaced, as a process supervisor would restart it.
    let fenced = 0
    const supervised = (slot: number) =>
      Effect.gen(function*() {
        while (true) {
          const exit = yield* Effect.exit(plan.member(groupId, topic, slot))
          // A fenced member has lost its partition to another; like a crashed one, it is started again and rejoins.
          if (isFenced(exit)) fenced++
          else if (!isCrash(exit)) return yield* exit
        }
      })

    const members = yield* Effect.forEach(
      Array.from({ length: workload.consumers }, (_, slot) => slot),
      (slot) => Effect.fork(supervised(slot))
    )

    const done = Effect.gen(function*() {
      const positions = yield* plan.positions(groupId, partitions)
      if (workload.onProgress !== undefined) {
        let stored = 0
        end.forEach((e, p) => {
          const at = positions.get(`${topic}-${p}`) ?? 0n
          stored += Number(at < e ? at : e)
        })
        workload.onProgress({
          stored,
          records: workload.records,
          crashes,
          rebalances,
          ...(Option.isSome(observability) ? { lag: totalLag() } : {})
        })
      }
      // A zombie being made still has its commit to try: the run is not over before it has.
      if (stalling || !end.every((e, p) => (positions.get(`${topic}-${p}`) ?? 0n) >= e)) return false
      // Records on their way through retry topics are not done either.
      for (let step = 0; step < (workload.retryDelays ?? []).length; step++) {
        const retry = FailureRoute.retryTopic(topic, step)
        const ends = yield* kafka.endOffsets(retry)
        const at = yield* plan.positions(groupId, ends.map((_, partition) => ({ topic: retry, partition })))
        if (!ends.every((e, p) => e === 0n || (at.get(`${retry}-${p}`) ?? 0n) >= e)) return false
      }
      return true
    })
    let rebalances = 0
    const extras: Array<Fiber.RuntimeFiber<unknown, unknown>> = []
    const rebalancer = yield* Effect.fork(Effect.forEach(moves, (checkpoint, i) =>
      Effect.gen(function*() {
        yield* Deferred.await(checkpoint.reached)
        if (i < 2) extras.push(yield* Effect.forkDaemon(supervised(workload.consumers + i)))
        rebalances++
        yield* Deferred.succeed(checkpoint.moved, undefined)
        // Leaving waits for the member's in-flight work, which may be the handler that waited here: let it go first.
        if (i === 2) yield* Fiber.interrupt(extras.shift()!)
      })))
    yield* Effect.addFinalizer(() => Fiber.interruptAll(extras))
    while (!(yield* done)) {
      const failed = yield* Effect.forEach([...members, ...extras], (f) => f.poll).pipe(
        Effect.map((polls) => polls.find((p) => Option.isSome(p)))
      )
      if (failed !== undefined && Option.isSome(failed)) {
        const exit = failed.value
        return yield* Exit.isFailure(exit) ? Effect.failCause(exit.cause) : Effect.dieMessage("a member stopped")
      }
      yield* Effect.sleep("2 millis")
    }
    yield* Fiber.interrupt(rebalancer)
    for (const checkpoint of moves) yield* Deferred.succeed(checkpoint.moved, undefined)
    // Every record is stored: each partition's owner reports its lag once more, from what it committed or stored.
    let finalLag: Array<FinalLag> | undefined
    let lagWait = 0
    if (Option.isSome(observability)) {
      const doneAt = yield* Clock.currentTimeMillis
      const reported = () => end.every((_, p) => (lagOf.get(p)?.at ?? 0) > doneAt)
      const interval = Duration.toMillis(observability.value.lagInterval)
      for (let waited = 0; !reported() && waited < 20 * interval + 5_000; waited += 5) yield* Effect.sleep("5 millis")
      finalLag = end.map((_, partition) => ({ partition, lag: Number(lagOf.get(partition)?.lag ?? -1n) }))
      // The wait for the reports is not the run's.
      lagWait = (yield* Clock.currentTimeMillis) - doneAt
    }
    yield* Fiber.interruptAll([...members, ...extras])
    const elapsedMillis = (yield* Clock.currentTimeMillis) - start - lagWait
    const tally = yield* plan.tally(groupId, topic)
    const letters = new Map<string, number>()
    if (poisonRate > 0) {
      for (const record of yield* readCommitted(deadLetterTopic(topic), workload.partitions)) {
        const letter = FailureRoute.deadLettered(record)
        const k = letter === undefined || letter.topic !== topic ? "?" : recordKey(letter)
        letters.set(k, (letters.get(k) ?? 0) + 1)
      }
    }
    let lost = 0
    let duplicated = 0
    let handledAndDeadLettered = 0
    let deadLetterRepeats = 0
    let misrouted = letters.get("?") ?? 0
    for (let p = 0; p < end.length; p++) {
      for (let o = 0n; o < end[p]!; o++) {
        const k = `${p}@${o}`
        const n = tally.counts.get(k) ?? 0
        const dead = letters.get(k) ?? 0
        if (n === 0 && dead === 0) lost++
        if (n > 0) duplicated += n - 1
        if (dead > 0) deadLetterRepeats += dead - 1
        if (n > 0 && dead > 0) handledAndDeadLettered++
        if ((dead > 0 && !poison.has(k)) || (n > 0 && poison.has(k))) misrouted++
      }
    }
    return {
      policy: workload.policy,
      produced: workload.records,
      poison: poison.size,
      deadLettered: [...letters.keys()].filter((k) => k !== "?").length,
      deadLetterRepeats,
      handledAndDeadLettered,
      misrouted,
      delivered: tally.delivered,
      lost,
      duplicated,
      crashes,
      rebalances,
      generation: yield* kafka.generation(groupId),
      fenced,
      zombies,
      elapsedMillis,
      ...(finalLag === undefined ? {} : { finalLag })
    } satisfies Outcome
  }))

/** Whether a member ended because a crash was injected. */
/** Whether a member ended because the offset store refused its commit: another member had moved on. */
export const isFenced = (exit: Exit.Exit<unknown, unknown>): boolean =>
  Exit.isFailure(exit) && Chunk.some(
    Cause.failures(exit.cause),
    (e) => e instanceof OffsetStore.Fenced || (e instanceof TransactionFailed && e.reason === "Fenced")
  )

export const isCrash = (exit: Exit.Exit<unknown, unknown>): boolean =>
  Exit.isFailure(exit) && Chunk.some(Cause.defects(exit.cause), (d) => d instanceof Crashed)
