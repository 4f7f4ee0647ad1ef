import * as Chunk from "effect/Chunk"
import * as Clock from "effect/Clock"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Queue from "effect/Queue"
import * as Runtime from "effect/Runtime"
import type * as Scope from "effect/Scope"
import { AssignerProtocol, PartitionAssigners } from "kafkajs"
import type { Consumer, EachBatchPayload, KafkaConfig, PartitionAssigner } from "kafkajs"
import type { ConsumerRecord } from "../ConsumerRecord.js"
import type { DriverEvent, DriverSession, SessionOptions } from "../Driver.js"
import { CommitFailed, DriverError } from "../KafkaError.js"
import * as OffsetBatch from "../OffsetBatch.js"
import * as TopicPartition from "../TopicPartition.js"
import { commitFailed, describe, driverError, isRebalanceError, makeClient, toConsumerRecord } from "./kafkajs.js"

/** Consumer settings that are fixed for every session of one layer. @internal */
export interface ConsumerSettings {
  readonly kafka: KafkaConfig
  readonly maxWaitTimeInMs: number
  readonly heartbeatInterval: number | undefined
  readonly partitionsConsumedConcurrently: number
  readonly minBytes: number | undefined
  readonly maxBytes: number | undefined
  readonly maxBytesPerPartition: number | undefined
  readonly readUncommitted: boolean
}

/**
 * Why an `eachBatch` call stopped waiting for the runloop:
 * - `taken`: `poll` returned all its records
 * - `seek`/`stale`: the records are no longer wanted (a seek, or a new generation); kafkajs must not advance
 * - `pause`: the partition was paused; the adapter keeps the records not yet returned (they are handed out first on
 *   resume), so kafkajs advances past the whole batch and fetches nothing of it again
 * - `revoke`: the group is rebalancing; the call must hold until the runloop releases the partitions
 * - `close`: the session is closing
 */
type Outcome = "taken" | "seek" | "stale" | "pause" | "revoke" | "close"

interface RecordsEntry {
  readonly _tag: "Records"
  readonly partition: TopicPartition.TopicPartition
  readonly key: string
  readonly records: ReadonlyArray<ConsumerRecord>
  /** Index of the next record to hand out; records before it were returned by `poll`. */
  next: number
  /** The `eachBatch` call was told its outcome (and may have returned). A paused entry's records still wait. */
  released: boolean
  /** Its records are no longer wanted, or were all returned. */
  done: boolean
  readonly release: (outcome: Outcome) => void
  readonly outcome: Promise<Outcome>
}

type Entry =
  | RecordsEntry
  | { readonly _tag: "Control"; readonly event: DriverEvent }
  | { readonly _tag: "Wake" }

interface Revoke {
  readonly partitions: ReadonlyArray<TopicPartition.TopicPartition>
  /** The rebalance error kafkajs raised in a heartbeat; rethrown when the hold ends so that kafkajs rejoins. */
  readonly error: unknown
  readonly deadline: number
  released: boolean
  readonly release: () => void
  readonly whenReleased: Promise<void>
}

const STATIC_ASSIGNER = "EffectKafkaStaticAssigner"

/**
 * A paused partition keeps up to this many fetched batches before kafkajs is told to stop fetching it. Pausing
 * kafkajs at once would be costly: once every partition is paused, its fetch loop sleeps `maxWaitTime` before it
 * looks again, even if a partition resumes a millisecond later.
 */
const PARKED_BATCHES = 2

/** kafkajs runs on wall-clock time; `poll` waits on it too, even in a test that installs the `TestClock`. */
const liveClock = Clock.make()

const k = (topic: string, partition: number): string => TopicPartition.key(TopicPartition.make(topic, partition))

const sortPartitions = (
  partitions: Iterable<TopicPartition.TopicPartition>
): Array<TopicPartition.TopicPartition> => Array.from(partitions).sort(TopicPartition.compare)

const byTopic = (partitions: Iterable<TopicPartition.TopicPartition>): Map<string, Array<number>> => {
  const out = new Map<string, Array<number>>()
  for (const tp of partitions) {
    const list = out.get(tp.topic)
    if (list === undefined) out.set(tp.topic, [tp.partition])
    else list.push(tp.partition)
  }
  return out
}

const decodeRequested = (userData: Buffer): Array<TopicPartition.TopicPartition> => {
  try {
    const parsed: unknown = JSON.parse(userData.toString("utf8"))
    if (!Array.isArray(parsed)) return []
    const out: Array<TopicPartition.TopicPartition> = []
    for (const item of parsed) {
      if (
        Array.isArray(item) && item.length === 2 && typeof item[0] === "string" && Number.isInteger(item[1])
      ) {
        out.push(TopicPartition.make(item[0], item[1]))
      }
    }
    return out
  } catch {
    return []
  }
}

/**
 * kafkajs has no manual assignment. A `Partitions` subscription joins the group with this assignor, which gives every
 * member exactly the partitions it announced in its join metadata, so nothing is ever moved between members.
 */
const staticAssigner = (requested: ReadonlyArray<TopicPartition.TopicPartition>): PartitionAssigner => () => ({
  name: STATIC_ASSIGNER,
  version: 0,
  protocol: ({ topics }) => ({
    name: STATIC_ASSIGNER,
    metadata: AssignerProtocol.MemberMetadata.encode({
      version: 0,
      topics,
      userData: Buffer.from(JSON.stringify(requested.map((tp) => [tp.topic, tp.partition])), "utf8")
    })
  }),
  assign: ({ members }) =>
    Promise.resolve(members.map(({ memberId, memberMetadata }) => {
      const metadata = AssignerProtocol.MemberMetadata.decode(memberMetadata)
      const assignment: Record<string, Array<number>> = {}
      if (metadata !== null) {
        for (const [topic, partitions] of byTopic(decodeRequested(metadata.userData))) {
          assignment[topic] = partitions
        }
      }
      return {
        memberId,
        memberAssignment: AssignerProtocol.MemberAssignment.encode({
          version: 0,
          assignment,
          userData: Buffer.alloc(0)
        })
      }
    }))
})

const waitAtMost = <A>(promise: Promise<A>, millis: number): Promise<A | undefined> =>
  new Promise((resolve, reject) => {
    const timer = setTimeout(() => resolve(undefined), Math.max(0, millis))
    promise.then(
      (value) => {
        clearTimeout(timer)
        resolve(value)
      },
      (error: unknown) => {
        clearTimeout(timer)
        reject(error)
      }
    )
  })

/**
 * Opens one member's session on kafkajs. See `KafkaJs.layer` for what the adapter guarantees around rebalances.
 *
 * @internal
 */
export const connect = (
  settings: ConsumerSettings,
  options: SessionOptions
): Effect.Effect<DriverSession, DriverError, Scope.Scope> =>
  Effect.gen(function*() {
    const runtime = yield* Effect.runtime<never>()
    const runFork = Runtime.runFork(runtime)
    const log = (level: "debug" | "info" | "warning", message: string) =>
      runFork(
        (level === "debug" ? Effect.logDebug : level === "info" ? Effect.logInfo : Effect.logWarning)(message).pipe(
          Effect.annotateLogs({ groupId: options.groupId, clientId: options.clientId })
        )
      )

    const subscription = options.subscription
    const isStatic = subscription._tag === "Partitions"
    const requested = subscription._tag === "Partitions" ? sortPartitions(subscription.partitions) : []
    const topics = subscription._tag === "Topics"
      ? Array.from(new Set(subscription.topics))
      : Array.from(byTopic(requested).keys())
    if (topics.length === 0) {
      return yield* new DriverError({ operation: "connect", reason: "the subscription names no topic or partition" })
    }
    if (!(options.maxPollRecords >= 1)) {
      return yield* new DriverError({ operation: "connect", reason: "maxPollRecords must be at least 1" })
    }

    const sessionTimeout = Math.round(Duration.toMillis(options.sessionTimeout))
    const rebalanceTimeout = Math.round(Duration.toMillis(options.rebalanceTimeout))
    const pollTimeout = Math.max(0, Math.round(Duration.toMillis(options.pollTimeout)))
    const heartbeatInterval = settings.heartbeatInterval ?? Math.max(100, Math.min(3000, sessionTimeout / 3))
    if (heartbeatInterval >= sessionTimeout) {
      return yield* new DriverError({
        operation: "connect",
        reason: `heartbeatInterval (${heartbeatInterval} ms) must be below the session timeout (${sessionTimeout} ms)`
      })
    }
    // How often a waiting eachBatch looks at the session; kafkajs only sends a heartbeat once its interval passed.
    const tick = Math.min(heartbeatInterval, 500)
    // A held eachBatch must let kafkajs rejoin before the broker's rebalance deadline evicts this member.
    const holdLimit = Math.max(0, rebalanceTimeout - heartbeatInterval - 1000)

    const kafka = makeClient(settings.kafka, options.clientId)
    const consumer: Consumer = kafka.consumer({
      groupId: options.groupId,
      partitionAssigners: [isStatic ? staticAssigner(requested) : PartitionAssigners.roundRobin],
      sessionTimeout,
      rebalanceTimeout,
      heartbeatInterval,
      maxWaitTimeInMs: settings.maxWaitTimeInMs,
      allowAutoTopicCreation: false,
      readUncommitted: settings.readUncommitted,
      ...(settings.minBytes === undefined ? {} : { minBytes: settings.minBytes }),
      ...(settings.maxBytes === undefined ? {} : { maxBytes: settings.maxBytes }),
      ...(settings.maxBytesPerPartition === undefined ? {} : { maxBytesPerPartition: settings.maxBytesPerPartition })
    })
    const admin = kafka.admin()

    // All of the state below is touched from kafkajs callbacks and from the runloop's calls; both run on the one
    // JavaScript thread and never across an `await` while they update it.
    const queue = yield* Queue.unbounded<Entry>()
    // Entries taken from the queue and not yet done, in fetch order; a paused partition's entries wait here.
    let pending: Array<Entry> = []
    const owned = new Map<string, TopicPartition.TopicPartition>()
    /** Partitions the runloop paused: `poll` returns none of their records. */
    const paused = new Set<string>()
    /** Partitions kafkajs was told to pause: it fetches none of their records. */
    const fetchPaused = new Set<string>()
    /** The next offset the runloop expects per partition: after the last record returned, or where it seeked. */
    const positions = new Map<string, bigint>()
    const inflight = new Map<string, Set<RecordsEntry>>()
    let revoke: Revoke | undefined
    let memberId = ""
    let joined = false
    let closed = false
    let failure: DriverError | undefined
    let crash: unknown

    const enqueue = (entry: Entry) => {
      queue.unsafeOffer(entry)
    }

    const release = (entry: RecordsEntry, outcome: Outcome) => {
      if (entry.released) return
      entry.released = true
      entry.release(outcome)
    }

    /** The entry's records are all returned or no longer wanted; its call (if still waiting) learns why. */
    const finish = (entry: RecordsEntry, outcome: Outcome) => {
      entry.done = true
      inflight.get(entry.key)?.delete(entry)
      release(entry, outcome)
    }

    const dropInflight = (key: string | undefined, outcome: Outcome) => {
      for (const [entryKey, entries] of inflight) {
        if (key !== undefined && entryKey !== key) continue
        for (const entry of Array.from(entries)) finish(entry, outcome)
      }
    }

    /** Tells kafkajs to stop or restart fetching a partition, once per change. */
    const setFetching = (key: string, fetching: boolean) => {
      if (fetching ? !fetchPaused.delete(key) : fetchPaused.has(key)) return
      if (!fetching) fetchPaused.add(key)
      const tp = TopicPartition.fromKey(key)
      const partitions = [{ topic: tp.topic, partitions: [tp.partition] }]
      try {
        if (fetching) consumer.resume(partitions)
        else consumer.pause(partitions)
      } catch (error) {
        log("warning", `${fetching ? "resume" : "pause"} of ${key} not applied: ${describe(error)}`)
      }
    }

    /**
     * A paused partition lets its batch calls go (kafkajs would otherwise hold every other partition's next fetch
     * behind them) but keeps their records: they are returned first once the partition resumes. Once it keeps
     * `PARKED_BATCHES` batches, kafkajs stops fetching it.
     */
    const park = (key: string) => {
      const entries = inflight.get(key)
      if (entries === undefined) return
      for (const entry of entries) release(entry, "pause")
      if (entries.size >= PARKED_BATCHES) setFetching(key, false)
    }

    const makeEntry = (
      partition: TopicPartition.TopicPartition,
      key: string,
      records: ReadonlyArray<ConsumerRecord>
    ): RecordsEntry => {
      let resolve: (outcome: Outcome) => void = () => {}
      const outcome = new Promise<Outcome>((r) => {
        resolve = r
      })
      const entry: RecordsEntry = {
        _tag: "Records",
        partition,
        key,
        records,
        next: 0,
        released: false,
        done: false,
        release: resolve,
        outcome
      }
      let set = inflight.get(key)
      if (set === undefined) {
        set = new Set()
        inflight.set(key, set)
      }
      set.add(entry)
      return entry
    }

    const releaseRevoke = (r: Revoke) => {
      if (r.released) return
      r.released = true
      r.release()
    }

    /**
     * kafkajs revokes every partition on a rebalance (eager protocol) and does not say which ones come back, so all
     * owned partitions are revoked. Records not yet returned are dropped: the next owner fetches them again.
     */
    const beginRevoke = (error: unknown) => {
      if (isStatic || revoke !== undefined || closed) return
      let release: () => void = () => {}
      const whenReleased = new Promise<void>((r) => {
        release = r
      })
      const r: Revoke = {
        partitions: sortPartitions(owned.values()),
        error,
        deadline: Date.now() + holdLimit,
        released: false,
        release,
        whenReleased
      }
      revoke = r
      dropInflight(undefined, "revoke")
      if (r.partitions.length === 0) {
        releaseRevoke(r)
        return
      }
      log("debug", `rebalance: revoking ${r.partitions.map(TopicPartition.key).join(", ")}`)
      enqueue({
        _tag: "Control",
        event: { _tag: "Revoked", partitions: r.partitions, release: Effect.sync(() => releaseRevoke(r)) }
      })
    }

    const onGroupJoin = (assignment: Record<string, Array<number>>, newMemberId: string) => {
      memberId = newMemberId
      joined = true
      const next: Array<TopicPartition.TopicPartition> = []
      for (const [topic, partitions] of Object.entries(assignment)) {
        for (const partition of partitions) next.push(TopicPartition.make(topic, partition))
      }
      // Records fetched in the previous generation are stale either way.
      dropInflight(undefined, "stale")
      if (isStatic) {
        // A rejoin gives kafkajs a fresh offset manager that would fetch from the committed offset again; put each
        // partition back where the runloop is and restore its pause.
        for (const tp of requested) {
          const k = TopicPartition.key(tp)
          const position = positions.get(k)
          try {
            if (position !== undefined) consumer.seek({ ...tp, offset: position.toString() })
            if (fetchPaused.has(k)) consumer.pause([{ topic: tp.topic, partitions: [tp.partition] }])
          } catch (error) {
            log("warning", `could not restore ${k} after a rejoin: ${describe(error)}`)
          }
        }
        if (owned.size === 0) {
          for (const tp of requested) owned.set(TopicPartition.key(tp), tp)
          enqueue({ _tag: "Control", event: { _tag: "Assigned", partitions: requested } })
        }
        return
      }
      if (revoke === undefined && owned.size > 0) {
        // kafkajs rejoined without a rebalance notice this adapter could act on (evicted member, metadata change):
        // the partitions may already belong to someone else.
        enqueue({ _tag: "Control", event: { _tag: "Lost", partitions: sortPartitions(owned.values()) } })
      }
      if (revoke !== undefined) releaseRevoke(revoke)
      revoke = undefined
      for (const k of fetchPaused) {
        const tp = TopicPartition.fromKey(k)
        try {
          consumer.resume([{ topic: tp.topic, partitions: [tp.partition] }])
        } catch {
          // the consumer is being stopped; nothing to resume
        }
      }
      fetchPaused.clear()
      paused.clear()
      positions.clear()
      owned.clear()
      for (const tp of next) owned.set(TopicPartition.key(tp), tp)
      if (next.length > 0) enqueue({ _tag: "Control", event: { _tag: "Assigned", partitions: sortPartitions(next) } })
    }

    /** Holds a batch call (and with it kafkajs's rejoin) until the runloop releases the revoked partitions. */
    const holdForRevoke = async (payload: EachBatchPayload): Promise<void> => {
      const r = revoke
      if (r === undefined) return
      while (!r.released && !closed && payload.isRunning()) {
        const remaining = r.deadline - Date.now()
        if (remaining <= 0) {
          log("warning", "revoked partitions were not released before the rebalance deadline; rejoining anyway")
          break
        }
        await waitAtMost(r.whenReleased, Math.min(tick, remaining))
        if (r.released) break
        try {
          // Heartbeats while the group waits keep this member's session alive.
          await payload.heartbeat()
        } catch (error) {
          if (!isRebalanceError(error)) throw error
        }
      }
      if (r.error !== undefined) throw r.error
    }

    const heartbeatOrRevoke = async (payload: EachBatchPayload, entry: RecordsEntry | undefined) => {
      try {
        await payload.heartbeat()
      } catch (error) {
        if (!isStatic && isRebalanceError(error)) {
          beginRevoke(error)
          await holdForRevoke(payload)
          return
        }
        if (entry !== undefined) finish(entry, "stale")
        throw error
      }
    }

    const eachBatch = async (payload: EachBatchPayload): Promise<void> => {
      const { batch } = payload
      if (closed || !payload.isRunning()) return
      if (revoke !== undefined) return holdForRevoke(payload)
      const tp = TopicPartition.make(batch.topic, batch.partition)
      const key = TopicPartition.key(tp)
      // A batch of a paused partition (fetched before the pause) is kept like any other: `drain` parks it.
      if (!owned.has(key) || batch.messages.length === 0) return
      // Offsets only grow within a batch: records below the runloop's position can only be a prefix.
      const position = positions.get(key)
      const messages = batch.messages
      let from = 0
      if (position !== undefined) {
        while (from < messages.length && BigInt(messages[from]!.offset) < position) from++
      }
      const records: Array<ConsumerRecord> = []
      for (let i = from; i < messages.length; i++) records.push(toConsumerRecord(batch.topic, batch.partition, messages[i]!))
      if (records.length === 0) return
      const entry = makeEntry(tp, key, records)
      enqueue(entry)
      let outcome: Outcome | undefined
      while (outcome === undefined) {
        outcome = await waitAtMost(entry.outcome, tick)
        if (outcome !== undefined) break
        if (closed || !payload.isRunning()) {
          finish(entry, "close")
          return
        }
        // Records wait here until the runloop polls them; heartbeats keep the partition meanwhile.
        await heartbeatOrRevoke(payload, entry)
        if (revoke !== undefined) return
      }
      if (outcome === "revoke") return holdForRevoke(payload)
      // Taken, or kept by the adapter while the partition is paused: either way kafkajs moves past the batch.
      if (outcome === "taken" || outcome === "pause") {
        payload.resolveOffset(records[records.length - 1]!.offset.toString())
      }
      if (outcome === "taken") {
        // Heartbeat here rather than after returning: a rebalance noticed inside the batch call can be held.
        await heartbeatOrRevoke(payload, undefined)
      }
    }

    /** Builds the events of one `poll` from what is queued, at most `maxPollRecords` records per partition. */
    const drain = (): Array<DriverEvent> => {
      const out: Array<DriverEvent> = []
      const counts = new Map<string, number>()
      const rest: Array<Entry> = []
      let stop = false
      for (const entry of pending) {
        if (stop) {
          rest.push(entry)
          continue
        }
        if (entry._tag === "Wake") continue
        if (entry._tag === "Control") {
          out.push(entry.event)
          // The runloop reacts (seeks after Assigned, commits after Revoked) before it sees further records.
          stop = true
          continue
        }
        if (entry.done) continue
        if (!owned.has(entry.key)) {
          finish(entry, "stale")
          continue
        }
        if (paused.has(entry.key)) {
          park(entry.key)
          rest.push(entry)
          continue
        }
        const room = options.maxPollRecords - (counts.get(entry.key) ?? 0)
        if (room <= 0) {
          rest.push(entry)
          continue
        }
        const taken = entry.records.slice(entry.next, entry.next + room)
        entry.next += taken.length
        counts.set(entry.key, (counts.get(entry.key) ?? 0) + taken.length)
        positions.set(entry.key, taken[taken.length - 1]!.offset + 1n)
        out.push({ _tag: "Records", partition: entry.partition, records: Chunk.unsafeFromArray(taken) })
        if (entry.next >= entry.records.length) finish(entry, "taken")
        else rest.push(entry)
      }
      pending = rest
      return out
    }

    const takeAvailable = Effect.map(Queue.takeAll(queue), (chunk) => {
      for (const entry of chunk) pending.push(entry)
    })

    const poll: Effect.Effect<ReadonlyArray<DriverEvent>, DriverError> = Effect.gen(function*() {
      const deadline = (yield* Clock.currentTimeMillis) + pollTimeout
      while (true) {
        if (failure !== undefined) return yield* failure
        yield* takeAvailable
        const events = drain()
        if (events.length > 0) return events
        const remaining = deadline - (yield* Clock.currentTimeMillis)
        if (remaining <= 0) return []
        const next = yield* Effect.timeoutOption(Queue.take(queue), Duration.millis(remaining))
        if (Option.isNone(next)) return []
        pending.push(next.value)
      }
    }).pipe(Effect.withClock(liveClock))

    const ownedOnly = (partitions: ReadonlyArray<TopicPartition.TopicPartition>) =>
      partitions.filter((tp) => owned.has(TopicPartition.key(tp)))

    const commit = (offsets: OffsetBatch.OffsetBatch): Effect.Effect<void, CommitFailed> =>
      Effect.suspend(() => {
        if (closed) {
          return Effect.fail(new CommitFailed({ reason: "UnknownMember", retriable: false, detail: "session closed" }))
        }
        if (failure !== undefined) {
          return Effect.fail(new CommitFailed({ reason: "Other", retriable: false, detail: failure.reason }))
        }
        const entries = OffsetBatch.entries(offsets)
        if (entries.length === 0) return Effect.void
        const notOwned = entries.filter(([tp]) => !owned.has(TopicPartition.key(tp)))
        if (notOwned.length > 0) {
          // kafkajs commits with its current generation, which the broker accepts for any partition; a partition
          // that moved to another member must be refused here.
          return Effect.fail(
            new CommitFailed({
              reason: "IllegalGeneration",
              retriable: false,
              detail: `not assigned to this member: ${notOwned.map(([tp]) => TopicPartition.key(tp)).join(", ")}`
            })
          )
        }
        return Effect.tryPromise({
          try: () =>
            consumer.commitOffsets(
              entries.map(([tp, position]) => ({
                topic: tp.topic,
                partition: tp.partition,
                offset: position.toString()
              }))
            ),
          catch: commitFailed
        })
      })

    const committed = (
      partitions: ReadonlyArray<TopicPartition.TopicPartition>
    ): Effect.Effect<ReadonlyMap<string, bigint>, DriverError> =>
      Effect.gen(function*() {
        const out = new Map<string, bigint>()
        const wanted = byTopic(partitions)
        if (wanted.size === 0) return out
        const response = yield* Effect.tryPromise({
          try: () => admin.fetchOffsets({ groupId: options.groupId, topics: Array.from(wanted.keys()) }),
          catch: driverError("committed")
        })
        for (const { topic, partitions: list } of response) {
          const want = wanted.get(topic)
          for (const { partition, offset } of list) {
            if (want === undefined || !want.includes(partition)) continue
            const position = BigInt(offset)
            if (position >= 0n) out.set(k(topic, partition), position)
          }
        }
        return out
      })

    const beginning = (
      partitions: ReadonlyArray<TopicPartition.TopicPartition>
    ): Effect.Effect<ReadonlyMap<string, bigint>, DriverError> =>
      Effect.gen(function*() {
        const out = new Map<string, bigint>()
        for (const [topic, want] of byTopic(partitions)) {
          const offsets = yield* Effect.tryPromise({
            try: () => admin.fetchTopicOffsets(topic),
            catch: driverError("beginning")
          })
          for (const { partition, low } of offsets) {
            if (!want.includes(partition)) continue
            out.set(k(topic, partition), BigInt(low))
          }
        }
        return out
      })

    const seek = (tp: TopicPartition.TopicPartition, position: bigint): Effect.Effect<void, DriverError> =>
      Effect.suspend(() => {
        const key = TopicPartition.key(tp)
        // A partition that moved has a Revoked or Lost event queued; there is nothing to position.
        if (!owned.has(key)) return Effect.void
        if (position < 0n) {
          return Effect.fail(new DriverError({ operation: "seek", reason: `negative position ${position} for ${key}` }))
        }
        positions.set(key, position)
        // The batch already fetched from this very position (the first fetch after an assignment starts at the
        // committed offset, where the runloop usually seeks) is kept, and kafkajs's fetch position is left alone.
        const live = inflight.get(key)
        if (live !== undefined && live.size === 1) {
          const [entry] = live
          if (entry!.records[entry!.next]?.offset === position) return Effect.void
        }
        dropInflight(key, "seek")
        return Effect.try({
          try: () => consumer.seek({ topic: tp.topic, partition: tp.partition, offset: position.toString() }),
          catch: driverError("seek")
        })
      })

    const pause = (partitions: ReadonlyArray<TopicPartition.TopicPartition>): Effect.Effect<void> =>
      Effect.sync(() => {
        for (const tp of ownedOnly(partitions)) {
          const key = TopicPartition.key(tp)
          paused.add(key)
          park(key)
        }
      })

    const resume = (partitions: ReadonlyArray<TopicPartition.TopicPartition>): Effect.Effect<void> =>
      Effect.sync(() => {
        let parked = false
        for (const tp of partitions) {
          const key = TopicPartition.key(tp)
          if (!paused.delete(key)) continue
          if ((inflight.get(key)?.size ?? 0) > 0) parked = true
          setFetching(key, true)
        }
        // Records kept while paused are ready now: a `poll` waiting for the next fetch must not wait for it.
        if (parked) enqueue({ _tag: "Wake" })
      })

    const closeTimeout = Duration.millis(Math.max(sessionTimeout, 10_000) + settings.maxWaitTimeInMs)
    yield* Effect.addFinalizer(() =>
      Effect.gen(function*() {
        closed = true
        dropInflight(undefined, "close")
        if (revoke !== undefined) releaseRevoke(revoke)
        // Leaves the group; kafkajs waits for batch calls (released above) and the fetch in flight.
        // Finalizers are uninterruptible: the disconnect must be interruptible for its time limit to hold.
        yield* Effect.tryPromise({ try: () => consumer.disconnect(), catch: driverError("disconnect") }).pipe(
          Effect.interruptible,
          Effect.timeoutOption(closeTimeout),
          Effect.catchAll((error) => Effect.logWarning(`kafkajs consumer did not disconnect cleanly: ${error.reason}`))
        )
        yield* Effect.tryPromise({ try: () => admin.disconnect(), catch: driverError("disconnect") }).pipe(
          Effect.interruptible,
          Effect.timeoutOption("5 seconds"),
          Effect.ignore
        )
        yield* Queue.shutdown(queue)
      })
    )

    consumer.on(consumer.events.GROUP_JOIN, (event) => {
      if (!closed) onGroupJoin(event.payload.memberAssignment, event.payload.memberId)
    })
    consumer.on(consumer.events.REBALANCING, () => {
      // Only reached when no batch call noticed the rebalance; kafkajs is already rejoining and does not wait.
      beginRevoke(undefined)
    })
    consumer.on(consumer.events.CRASH, (event) => {
      crash = event.payload.error
      if (closed) return
      dropInflight(undefined, "close")
      if (!isStatic && owned.size > 0) {
        enqueue({ _tag: "Control", event: { _tag: "Lost", partitions: sortPartitions(owned.values()) } })
        owned.clear()
        positions.clear()
      }
      if (revoke !== undefined) releaseRevoke(revoke)
      revoke = undefined
      if (!event.payload.restart) {
        const error = event.payload.error
        failure = new DriverError({ operation: "poll", reason: describe(error), cause: error })
        enqueue({ _tag: "Wake" })
      } else {
        log("warning", `kafkajs consumer crashed and restarts: ${describe(event.payload.error)}`)
      }
    })

    yield* Effect.tryPromise({ try: () => admin.connect(), catch: driverError("connect") })
    if (isStatic) {
      const metadata = yield* Effect.tryPromise({
        try: () => admin.fetchTopicMetadata({ topics }),
        catch: driverError("connect")
      })
      const known = new Set(
        metadata.topics.flatMap((t) => t.partitions.map((p) => k(t.name, p.partitionId)))
      )
      const missing = requested.filter((tp) => !known.has(TopicPartition.key(tp)))
      if (missing.length > 0) {
        return yield* new DriverError({
          operation: "connect",
          reason: `no such partition: ${missing.map(TopicPartition.key).join(", ")}`
        })
      }
    }
    yield* Effect.tryPromise({ try: () => consumer.connect(), catch: driverError("connect") })
    yield* Effect.tryPromise({
      // The runloop seeks every assigned partition; `fromBeginning` only matters to a bare kafkajs fetch.
      try: () => consumer.subscribe({ topics, fromBeginning: true }),
      catch: driverError("subscribe")
    })
    yield* Effect.tryPromise({
      try: () =>
        consumer.run({
          autoCommit: false,
          eachBatchAutoResolve: false,
          partitionsConsumedConcurrently: settings.partitionsConsumedConcurrently,
          eachBatch
        }),
      catch: driverError("connect")
    })
    // `run` resolves after the first join, or after kafkajs handled a failed join as a crash.
    if (!joined) {
      return yield* new DriverError({
        operation: "connect",
        reason: crash === undefined ? "the consumer did not join its group" : describe(crash),
        cause: crash
      })
    }

    const session: DriverSession = {
      get memberId() {
        return memberId
      },
      poll,
      commit,
      committed,
      beginning,
      seek,
      pause,
      resume
    }
    return session
  })
