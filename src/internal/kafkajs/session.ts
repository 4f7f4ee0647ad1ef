/**
 * One member's session on kafkajs: the group (assignment, revocation, loss), `poll`, commits and reads. What kafkajs
 * fetched is kept in `kafkajsFetch.ts`; the JoinGroup hold and the heartbeats during it, and the stable offset reads,
 * live in `kafkajsWire.ts`.
 */
import * as Clock from "effect/Clock"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as FiberId from "effect/FiberId"
import * as Option from "effect/Option"
import * as Queue from "effect/Queue"
import * as Runtime from "effect/Runtime"
import type * as Scope from "effect/Scope"
import { AssignerProtocol, PartitionAssigners } from "kafkajs"
import type { Consumer, EachBatchPayload, LogEntry, PartitionAssigner } from "kafkajs"
import type { CommittedPosition, DriverEvent, DriverSession, PartitionOffsets, SessionOptions } from "../../Driver.js"
import { CommitFailed, DriverError } from "../../KafkaError.js"
import * as OffsetBatch from "../../OffsetBatch.js"
import * as TopicPartition from "../../TopicPartition.js"
import type { ClientConfig } from "./driver.js"
import { commitFailed, describe, driverError, isRebalanceError, isRetriable, makeClient } from "./driver.js"
import type { Entry, RecordsEntry } from "./fetch.js"
import { makeFetch } from "./fetch.js"
import { makeReadWire, makeWire } from "./wire.js"

/** Consumer settings that are fixed for every session of one layer. @internal */
export interface ConsumerSettings {
  readonly client: ClientConfig
  readonly maxWaitTimeInMs: number
  readonly heartbeatInterval: number | undefined
  readonly partitionsConsumedConcurrently: number
  readonly minBytes: number | undefined
  readonly maxBytes: number | undefined
  readonly maxBytesPerPartition: number | undefined
  readonly readUncommitted: boolean
}

interface Revoke {
  readonly partitions: ReadonlyArray<TopicPartition.TopicPartition>
  released: boolean
  readonly timers: Array<ReturnType<typeof setTimeout>>
}

const STATIC_ASSIGNER = "EffectKafkaStaticAssigner"

/** What kafkajs logs (consumerGroup.js `recoverFromOffsetOutOfRange`) when it resets an out-of-range partition. */
const RESET_MESSAGE = "Offset out of range, resetting to default offset"

/** Heartbeat error codes that mean the group went on without this member. */
const GONE = new Set([
  22, // ILLEGAL_GENERATION
  25, // UNKNOWN_MEMBER_ID
  82 // FENCED_INSTANCE_ID
])

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
    // The group's rebalance started up to a heartbeat before this member noticed it; the held JoinGroup must reach the
    // coordinator before the rebalance timeout, or the group goes on without this member.
    const holdLimit = Math.max(0, rebalanceTimeout - heartbeatInterval - 1000)

    // All of the state below is touched from kafkajs callbacks and from the runloop's calls; both run on the one
    // JavaScript thread and never across an `await` while they update it.
    const queue = yield* Queue.unbounded<Entry>()
    const owned = new Map<string, TopicPartition.TopicPartition>()
    /** The group's committed position of owned partitions, as this session last read or wrote it. */
    const committedPositions = new Map<string, bigint>()
    let revoke: Revoke | undefined
    let memberId = ""
    let joined = false
    let closed = false
    let failure: DriverError | undefined
    let crash: unknown
    /**
     * Completed when the member has joined, or when kafkajs crashed without restarting; a crash kafkajs restarts from
     * leaves it open. One per attempt of `connect`.
     */
    let settled = Deferred.unsafeMake<void>(FiberId.none)
    let waitedForRestart = false

    /**
     * Entries queued since the first fetched batch of this turn of the event loop, handed to `poll` at the end of it.
     * kafkajs sends its next fetch only after every batch call of the last one returned, through a chain of promise
     * callbacks; the runloop, woken at once, would handle the records in between (Effect's fibers run on the same
     * microtask queue) and the fetch would wait for it. Handed over a turn later, the records are handled while the
     * broker answers the next fetch. Everything queued meanwhile follows them, in order.
     */
    let deferred: Array<Entry> | undefined
    const flush = () => {
      const entries = deferred ?? []
      deferred = undefined
      for (const entry of entries) queue.unsafeOffer(entry)
    }
    const enqueue = (entry: Entry) => {
      if (deferred !== undefined) {
        deferred.push(entry)
      } else if (entry._tag === "Records") {
        deferred = [entry]
        setImmediate(flush)
      } else {
        queue.unsafeOffer(entry)
      }
    }

    const releaseRevoke = (r: Revoke) => {
      if (r.released) return
      r.released = true
      for (const timer of r.timers) clearTimeout(timer)
      // From here on the partitions may move: commits for them are refused.
      for (const tp of r.partitions) owned.delete(TopicPartition.key(tp))
      wire.release()
    }

    /** The member's partitions are already gone (evicted, or kafkajs restarted): nothing more of them is committed. */
    const lose = () => {
      if (owned.size > 0) {
        enqueue({ _tag: "Control", event: { _tag: "Lost", partitions: sortPartitions(owned.values()) } })
      }
      owned.clear()
      committedPositions.clear()
      fetcher.clear("stale")
    }

    /**
     * kafkajs revokes every partition on a rebalance (eager protocol) and does not say which ones come back, so all
     * owned partitions are revoked. Records not yet returned are dropped: the next owner fetches them again. Until
     * `release`, kafkajs's JoinGroup is held (and the group with it) while this session heartbeats in its place.
     */
    const beginRevoke = () => {
      if (isStatic || revoke !== undefined || closed) return
      const r: Revoke = { partitions: sortPartitions(owned.values()), released: false, timers: [] }
      revoke = r
      fetcher.dropAll("revoke")
      if (r.partitions.length === 0) {
        releaseRevoke(r)
        return
      }
      log("debug", `rebalance: revoking ${r.partitions.map(TopicPartition.key).join(", ")}`)
      const beat = setInterval(() => {
        if (!r.released) wire.heartbeat()
      }, heartbeatInterval)
      const deadline = setTimeout(() => {
        if (r.released) return
        log(
          "warning",
          `revoked partitions were not released within ${holdLimit} ms (the rebalance timeout allows no more); ` +
            "rejoining the group without waiting further"
        )
        releaseRevoke(r)
      }, holdLimit)
      r.timers.push(beat, deadline)
      enqueue({
        _tag: "Control",
        event: { _tag: "Revoked", partitions: r.partitions, release: Effect.sync(() => releaseRevoke(r)) }
      })
    }

    /** kafkajs is about to send a JoinGroup: a rejoin of a member that owns partitions waits for the runloop. */
    const onJoinGroup = (requestMemberId: string): boolean => {
      if (closed || isStatic) return false
      if (requestMemberId === "") {
        // kafkajs forgot its member id (the coordinator did not know it): the partitions were lost, not revoked.
        if (revoke !== undefined) releaseRevoke(revoke)
        else if (joined) lose()
        return false
      }
      if (revoke === undefined && joined && owned.size > 0) beginRevoke()
      return revoke !== undefined && !revoke.released
    }

    const onHeartbeatAnswer = (errorCode: number) => {
      // 27 (REBALANCE_IN_PROGRESS) is the expected answer: the coordinator keeps the member while the group waits.
      log("debug", `heartbeat while holding the rejoin: error code ${errorCode}`)
      if (!GONE.has(errorCode) || revoke === undefined || revoke.released) return
      log("warning", `the group went on without this member (heartbeat error ${errorCode}); rejoining`)
      wire.release()
    }

    const wire = makeWire({
      onJoinGroup,
      onHeartbeatAnswer,
      // Only while kafkajs resets the partition: the rewritten commit keeps kafkajs's own next start at the same
      // out-of-range position, which the partition's suspension (set from the same log line) keeps it from fetching.
      committedPosition: (topic, partition) =>
        fetcher.wasReset(topic, partition) ? committedPositions.get(k(topic, partition)) : undefined
    })

    const onLog = (entry: LogEntry) => {
      if (entry.namespace !== "ConsumerGroup" || entry.log.message !== RESET_MESSAGE) return
      const topic: unknown = entry.log.topic
      const partition: unknown = entry.log.partition
      if (typeof topic === "string" && typeof partition === "number") fetcher.resetLogged(topic, partition)
    }

    const kafka = makeClient(settings.client, { clientId: options.clientId, socketFactory: wire.socketFactory, onLog })
    const consumer: Consumer = kafka.consumer({
      groupId: options.groupId,
      partitionAssigners: [isStatic ? staticAssigner(requested) : PartitionAssigners.roundRobin],
      sessionTimeout,
      rebalanceTimeout,
      heartbeatInterval,
      maxWaitTimeInMs: settings.maxWaitTimeInMs,
      allowAutoTopicCreation: false,
      readUncommitted: options.isolationLevel === undefined
        ? settings.readUncommitted
        : options.isolationLevel === "read_uncommitted",
      ...(settings.minBytes === undefined ? {} : { minBytes: settings.minBytes }),
      ...(settings.maxBytes === undefined ? {} : { maxBytes: settings.maxBytes }),
      ...(settings.maxBytesPerPartition === undefined ? {} : { maxBytesPerPartition: settings.maxBytesPerPartition })
    })
    // kafkajs's admin reads read-committed offsets: the latest offset it gives is the last stable offset.
    const admin = kafka.admin()
    // Committed positions and high watermarks are read through a client of their own, whose socket layer makes the
    // committed reads stable and reads the high watermark (see `makeReadWire`).
    const readWire = makeReadWire()
    const reader = makeClient(settings.client, { clientId: options.clientId, socketFactory: readWire.socketFactory })
      .admin()
    /** One committed read at a time: each says which partitions its OffsetFetch asks for. */
    const reads = yield* Effect.makeSemaphore(1)
    let unstableWarned = false

    /** The log start and the high watermark of each partition of the topic. */
    const watermarks = (topic: string) => reader.fetchTopicOffsets(topic)

    const fetcher = makeFetch({
      consumer,
      enqueue,
      log,
      maxPollRecords: options.maxPollRecords,
      isClosed: () => closed,
      // Kafka answers OFFSET_OUT_OF_RANGE only past the high watermark: a position between the last stable offset
      // and it is in range, and its records come once their transaction ends.
      offsets: async (tp) => {
        const found = (await watermarks(tp.topic)).find((p) => p.partition === tp.partition)
        if (found === undefined) throw new Error(`no partition ${TopicPartition.key(tp)}`)
        return { earliest: BigInt(found.low), latest: BigInt(found.high) }
      }
    })

    const onGroupJoin = (assignment: Record<string, Array<number>>, newMemberId: string) => {
      memberId = newMemberId
      joined = true
      Deferred.unsafeDone(settled, Exit.void)
      if (isStatic) {
        if (owned.size === 0) {
          for (const tp of requested) owned.set(TopicPartition.key(tp), tp)
          fetcher.assign(requested)
          enqueue({ _tag: "Control", event: { _tag: "Assigned", partitions: requested } })
        } else {
          fetcher.restore()
        }
        return
      }
      const next: Array<TopicPartition.TopicPartition> = []
      for (const [topic, partitions] of Object.entries(assignment)) {
        for (const partition of partitions) next.push(TopicPartition.make(topic, partition))
      }
      // A rejoin this session did not see coming (it cannot happen without a JoinGroup, but kafkajs may change).
      if (revoke === undefined) lose()
      else releaseRevoke(revoke)
      revoke = undefined
      owned.clear()
      committedPositions.clear()
      for (const tp of next) owned.set(TopicPartition.key(tp), tp)
      fetcher.assign(next)
      if (next.length > 0) enqueue({ _tag: "Control", event: { _tag: "Assigned", partitions: sortPartitions(next) } })
    }

    /**
     * kafkajs's heartbeat, while records wait for `poll`. A rebalance it reports is thrown back to kafkajs, which
     * rejoins: its JoinGroup is held until the runloop released the partitions.
     */
    const heartbeat = async (payload: EachBatchPayload, entry: RecordsEntry) => {
      try {
        await payload.heartbeat()
      } catch (error) {
        const rebalance = isRebalanceError(error)
        fetcher.finish(entry, rebalance && !isStatic ? "revoke" : "stale")
        if (rebalance) beginRevoke()
        throw error
      }
    }

    const eachBatch = async (payload: EachBatchPayload): Promise<void> => {
      if (closed || !payload.isRunning() || revoke !== undefined) return
      const entry = await fetcher.accept(payload)
      if (entry === undefined) return
      let outcome = await waitAtMost(entry.outcome, tick)
      while (outcome === undefined) {
        if (closed || !payload.isRunning()) {
          fetcher.finish(entry, "close")
          return
        }
        // Records wait here until the runloop polls them; heartbeats keep the partition meanwhile.
        await heartbeat(payload, entry)
        outcome = await waitAtMost(entry.outcome, tick)
      }
      // Taken, or kept by the adapter (read ahead, or while the partition is paused): kafkajs moves past the batch.
      if (outcome === "taken" || outcome === "ahead" || outcome === "pause") fetcher.resolved(entry, payload)
    }

    const poll: Effect.Effect<ReadonlyArray<DriverEvent>, DriverError> = Effect.gen(function*() {
      const deadline = (yield* Clock.currentTimeMillis) + pollTimeout
      let taken: Iterable<Entry> = []
      while (true) {
        if (failure !== undefined) return yield* failure
        const available = yield* Queue.takeAll(queue)
        const events = fetcher.drain([...taken, ...available])
        taken = []
        if (events.length > 0) return events
        const remaining = deadline - (yield* Clock.currentTimeMillis)
        if (remaining <= 0) return []
        const next = yield* Effect.timeoutOption(Queue.take(queue), Duration.millis(remaining))
        if (Option.isNone(next)) return []
        taken = [next.value]
      }
    }).pipe(Effect.withClock(liveClock))

    const commit = (offsets: OffsetBatch.OffsetBatch): Effect.Effect<void, CommitFailed> =>
      Effect.suspend(() => {
        const entries = OffsetBatch.entries(offsets)
        const partitions = entries.map(([tp]) => tp)
        if (closed) {
          return Effect.fail(new CommitFailed({ reason: "UnknownMember", partitions, detail: "the session is closed" }))
        }
        if (failure !== undefined) {
          return Effect.fail(new CommitFailed({ reason: "Other", partitions, detail: failure.reason }))
        }
        if (entries.length === 0) return Effect.void
        // kafkajs commits with its current generation, which the broker accepts for any partition of the group: a
        // partition this member does not own (any more) must be refused here. All or nothing: none is committed.
        const notOwned = partitions.filter((tp) => !owned.has(TopicPartition.key(tp)))
        if (notOwned.length > 0) {
          return Effect.fail(
            new CommitFailed({ reason: "NotOwned", partitions: notOwned, detail: "not assigned to this member" })
          )
        }
        return Effect.tryPromise({
          try: () =>
            consumer.commitOffsets(
              entries.map(([tp, position]) => ({
                topic: tp.topic,
                partition: tp.partition,
                offset: position.toString(),
                metadata: offsets.metadata?.get(TopicPartition.key(tp)) ?? null
              }))
            ),
          catch: (cause) => commitFailed(cause, partitions)
        }).pipe(
          Effect.tap(() =>
            Effect.sync(() => {
              for (const [tp, position] of entries) {
                const key = TopicPartition.key(tp)
                if (owned.has(key)) committedPositions.set(key, position)
              }
            })
          )
        )
      })

    const committedWithMetadata = (
      partitions: ReadonlyArray<TopicPartition.TopicPartition>
    ): Effect.Effect<ReadonlyMap<string, CommittedPosition>, DriverError> =>
      Effect.gen(function*() {
        const out = new Map<string, CommittedPosition>()
        const wanted = byTopic(partitions)
        if (wanted.size === 0) return out
        const only = new Map(Array.from(wanted, ([topic, list]) => [topic, new Set(list)] as const))
        const response = yield* Effect.tryPromise({
          try: () => {
            readWire.only(only)
            return reader.fetchOffsets({ groupId: options.groupId, topics: Array.from(wanted.keys()) })
          },
          catch: driverError("committed")
        }).pipe(
          Effect.ensuring(Effect.sync(() => readWire.only(undefined))),
          reads.withPermits(1)
        )
        if (readWire.stableReads() === false && !unstableWarned) {
          unstableWarned = true
          log(
            "warning",
            "the cluster does not take stable offset reads (OffsetFetch v7, Kafka 2.5 and later): a committed " +
              "position read while a transaction that commits it completes can be the one before"
          )
        }
        for (const { topic, partitions: list } of response) {
          const want = wanted.get(topic)
          for (const { partition, offset, metadata } of list) {
            if (want === undefined || !want.includes(partition)) continue
            const key = k(topic, partition)
            const position = BigInt(offset)
            if (position >= 0n) out.set(key, { position, metadata: metadata ?? "" })
            if (!owned.has(key)) continue
            if (position >= 0n) committedPositions.set(key, position)
            else committedPositions.delete(key)
          }
        }
        return out
      })

    const committed = (
      partitions: ReadonlyArray<TopicPartition.TopicPartition>
    ): Effect.Effect<ReadonlyMap<string, bigint>, DriverError> =>
      Effect.map(committedWithMetadata(partitions), (found) => {
        const out = new Map<string, bigint>()
        for (const [key, { position }] of found) out.set(key, position)
        return out
      })

    const offsets = (
      partitions: ReadonlyArray<TopicPartition.TopicPartition>
    ): Effect.Effect<ReadonlyMap<string, PartitionOffsets>, DriverError> =>
      Effect.gen(function*() {
        const out = new Map<string, PartitionOffsets>()
        for (const [topic, want] of byTopic(partitions)) {
          const [ends, stable] = yield* Effect.all([
            Effect.tryPromise({ try: () => watermarks(topic), catch: driverError("offsets") }),
            Effect.tryPromise({ try: () => admin.fetchTopicOffsets(topic), catch: driverError("offsets") })
          ], { concurrency: 2 })
          for (const partition of want) {
            const end = ends.find((entry) => entry.partition === partition)
            const lso = stable.find((entry) => entry.partition === partition)
            if (end === undefined || lso === undefined) {
              return yield* new DriverError({ operation: "offsets", reason: `no partition ${k(topic, partition)}` })
            }
            const latest = BigInt(end.high)
            // Read side by side, the last stable offset can come from a moment after the high watermark: it is kept
            // at or below it, as it always is at any one moment.
            const lastStable = BigInt(lso.high) < latest ? BigInt(lso.high) : latest
            out.set(k(topic, partition), { earliest: BigInt(end.low), latest, lastStable })
          }
        }
        return out
      })

    const pause = (
      partitions: ReadonlyArray<TopicPartition.TopicPartition>,
      options?: { readonly hold?: boolean | undefined }
    ): Effect.Effect<void> => Effect.sync(() => fetcher.pause(partitions, options?.hold === true))

    const resume = (partitions: ReadonlyArray<TopicPartition.TopicPartition>): Effect.Effect<void> =>
      Effect.sync(() => {
        // Records kept while paused are ready now: a `poll` waiting for the next fetch must not wait for it.
        if (fetcher.resume(partitions)) enqueue({ _tag: "Wake" })
      })

    const closeTimeout = Duration.millis(Math.max(sessionTimeout, 10_000) + settings.maxWaitTimeInMs)
    yield* Effect.addFinalizer(() =>
      Effect.gen(function*() {
        closed = true
        fetcher.clear("close")
        // A held JoinGroup goes out now: kafkajs leaves the group once it has rejoined.
        if (revoke !== undefined) releaseRevoke(revoke)
        // Leaves the group; kafkajs waits for batch calls (released above) and the fetch in flight.
        // Finalizers are uninterruptible: the disconnect must be interruptible for its time limit to hold.
        yield* Effect.tryPromise({ try: () => consumer.disconnect(), catch: driverError("disconnect") }).pipe(
          Effect.interruptible,
          Effect.timeoutOption(closeTimeout),
          Effect.catchAll((error) => Effect.logWarning(`kafkajs consumer did not disconnect cleanly: ${error.reason}`))
        )
        yield* Effect.forEach([admin, reader], (client) =>
          Effect.tryPromise({ try: () => client.disconnect(), catch: driverError("disconnect") }).pipe(
            Effect.interruptible,
            Effect.timeoutOption("5 seconds"),
            Effect.ignore
          ), { concurrency: 2, discard: true })
        yield* Queue.shutdown(queue)
      })
    )

    consumer.on(consumer.events.GROUP_JOIN, (event) => {
      if (!closed) onGroupJoin(event.payload.memberAssignment, event.payload.memberId)
    })
    consumer.on(consumer.events.REBALANCING, () => {
      // Fires before kafkajs rejoins; its JoinGroup is held until the runloop releases.
      if (!closed && joined) beginRevoke()
    })
    consumer.on(consumer.events.START_BATCH_PROCESS, (event) => {
      const { batchSize, firstOffset, lastOffset, partition, topic } = event.payload
      // Only a batch emptied by filtering is announced without any message (runner.js `isEmptyDueToFiltering`).
      if (batchSize === 0) fetcher.emptied(topic, partition, firstOffset ?? null, lastOffset)
    })
    consumer.on(consumer.events.CRASH, (event) => {
      const error: unknown = event.payload.error
      crash = error
      if (closed) return
      fetcher.dropAll("close")
      if (revoke !== undefined) releaseRevoke(revoke)
      revoke = undefined
      if (!isStatic) lose()
      if (!event.payload.restart) {
        failure = new DriverError({
          operation: "poll",
          reason: describe(error),
          retriable: isRetriable(error),
          cause: error
        })
        Deferred.unsafeDone(settled, Exit.void)
        enqueue({ _tag: "Wake" })
      } else if (joined) {
        log("warning", `kafkajs consumer crashed and restarts: ${describe(error)}`)
      } else {
        // Joining while the coordinator loads or moves: `connect` waits for kafkajs's restart (once said is enough).
        log(waitedForRestart ? "debug" : "info", `joining the group failed, kafkajs tries again: ${describe(error)}`)
        waitedForRestart = true
      }
    })

    /**
     * Runs kafkajs's consumer until it has joined the group. Its `run` resolves after the first join, or once a failed
     * join was handled as a crash. A crash on a condition that passes (the coordinator loading the group's offsets on
     * a fresh or restarted broker: GROUP_LOAD_IN_PROGRESS; the coordinator moving or not found yet) must not fail
     * `connect`: a first session would fail where waiting a moment succeeds. kafkajs restarts from the crashes it
     * deems retriable by itself (its `restartOnFailure`), after its retry delay: the session waits for that restart.
     * From the others it does not restart; those this adapter deems retriable (the coordinator not found, which
     * kafkajs gives up on at once) are tried again here, with a backoff. Either way for no longer than the rebalance
     * timeout, the time a join may take; past it, or on a condition that does not pass, `connect` fails with a
     * `DriverError` that says which (retriable ones are retried by the runloop within its `reconnectTimeout`).
     */
    const join = Effect.gen(function*() {
      const deadline = (yield* Clock.currentTimeMillis) + rebalanceTimeout
      for (let attempt = 0;; attempt++) {
        settled = yield* Deferred.make<void>()
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
        if (!joined && failure === undefined && crash !== undefined) {
          const left = deadline - (yield* Clock.currentTimeMillis)
          yield* Deferred.await(settled).pipe(Effect.timeoutOption(Duration.millis(Math.max(0, left))))
        }
        if (joined) return
        const last = crash
        const retriable = last !== undefined && isRetriable(last)
        const left = deadline - (yield* Clock.currentTimeMillis)
        if (!retriable || left <= 0 || failure === undefined) {
          const reason = last === undefined ? "the consumer did not join its group" : describe(last)
          return yield* new DriverError({
            operation: "connect",
            reason: retriable && left <= 0
              ? `the consumer did not join its group within the rebalance timeout (${rebalanceTimeout} ms): ${reason}`
              : reason,
            retriable,
            cause: last
          })
        }
        log("info", `joining the group failed, trying again: ${describe(last)}`)
        failure = undefined
        crash = undefined
        yield* Effect.sleep(Duration.millis(Math.min(left, 250 * 2 ** Math.min(attempt, 4))))
      }
    }).pipe(Effect.withClock(liveClock))

    yield* Effect.tryPromise({ try: () => admin.connect(), catch: driverError("connect") })
    yield* Effect.tryPromise({ try: () => reader.connect(), catch: driverError("connect") })
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
      // The runloop seeks every assigned partition before kafkajs fetches it; `fromBeginning` only decides where
      // kafkajs resets a partition whose position is out of range, which this adapter reports instead.
      try: () => consumer.subscribe({ topics, fromBeginning: true }),
      catch: driverError("subscribe")
    })
    yield* join

    const session: DriverSession = {
      get memberId() {
        return memberId
      },
      poll,
      commit,
      committed,
      committedWithMetadata,
      offsets,
      seek: fetcher.seek,
      pause,
      resume
    }
    return session
  })
