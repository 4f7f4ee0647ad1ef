/**
 * One member's session on kafkajs: `connect` makes its clients, follows kafkajs's events and joins the group. The
 * member's states and what moves it between them are listed in `states.ts`, and kept in `member.ts`; what kafkajs
 * fetched is kept in `fetch.ts`; the JoinGroup hold and the heartbeats during it are in `wire.ts`, and the stable
 * offset reads in `readWire.ts`.
 */
import * as Clock from "effect/Clock"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Queue from "effect/Queue"
import * as Runtime from "effect/Runtime"
import type * as Scope from "effect/Scope"
import { PartitionAssigners } from "kafkajs"
import type { Admin, Consumer, EachBatchPayload, LogEntry } from "kafkajs"
import type { DriverSession, SessionOptions } from "../../Driver.js"
import { DriverError } from "../../KafkaError.js"
import * as TopicPartition from "../../TopicPartition.js"
import { staticAssigner } from "./assigner.js"
import { eachBatch, poll } from "./batches.js"
import { commit, committed, committedWithMetadata, offsets, watermarks } from "./commits.js"
import type { ClientConfig } from "./driver.js"
import { makeClient } from "./driver.js"
import { describe, driverError, isRetriable } from "./errors.js"
import { makeFetch } from "./fetch.js"
import {
  beginRevoke,
  enqueue,
  freshMemberState,
  k,
  liveClock,
  type Log,
  onCrash,
  onGroupJoin,
  onHeartbeatAnswer,
  onJoinGroup,
  releaseRevoke,
  type Session
} from "./member.js"
import { planSession, type SessionPlan } from "../shared/sessionPlan.js"
import type { Entry } from "./partitions.js"
import { makeReadWire } from "./readWire.js"
import { memberState } from "./states.js"
import { makeWire } from "./wire.js"

/** kafkajs has no static membership: a session given a `groupInstanceId` is refused, saying where it is kept. */
const refuseStaticMembership = (driver: string, options: SessionOptions): Effect.Effect<void, DriverError> =>
  options.groupInstanceId === undefined
    ? Effect.void
    : Effect.fail(
      new DriverError({
        operation: "connect",
        reason: `${driver} has no static membership (groupInstanceId "${options.groupInstanceId}"); ` +
          "Platformatic.layer keeps it"
      })
    )

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

/** What kafkajs logs (consumerGroup.js `recoverFromOffsetOutOfRange`) when it resets an out-of-range partition. */
const RESET_MESSAGE = "Offset out of range, resetting to default offset"

/** The partition of kafkajs's log line that says it resets the partition to its default offset; `undefined` else. */
const resetOf = (entry: LogEntry): { readonly topic: string; readonly partition: number } | undefined => {
  if (entry.namespace !== "ConsumerGroup" || entry.log.message !== RESET_MESSAGE) return undefined
  const topic: unknown = entry.log.topic
  const partition: unknown = entry.log.partition
  return typeof topic === "string" && typeof partition === "number" ? { topic, partition } : undefined
}

/** What a session is given to join, checked, with the timings it follows. */
interface Plan extends SessionPlan {
  /** How often a waiting eachBatch looks at the session; kafkajs only sends a heartbeat once its interval passed. */
  readonly tick: number
}

const planOf = (settings: ConsumerSettings, options: SessionOptions): Effect.Effect<Plan, DriverError> =>
  Effect.zipRight(
    refuseStaticMembership("kafkajs", options),
    Effect.map(planSession(settings.heartbeatInterval, options), (plan) => ({
      ...plan,
      tick: Math.min(plan.heartbeatInterval, 500)
    }))
  )

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
const join = (s: Session, settings: ConsumerSettings): Effect.Effect<void, DriverError> =>
  Effect.gen(function*() {
    const deadline = (yield* Clock.currentTimeMillis) + s.rebalanceTimeout
    for (let attempt = 0;; attempt++) {
      s.settled = yield* Deferred.make<void>()
      yield* Effect.tryPromise({
        try: () =>
          s.consumer.run({
            autoCommit: false,
            eachBatchAutoResolve: false,
            partitionsConsumedConcurrently: settings.partitionsConsumedConcurrently,
            eachBatch: (payload: EachBatchPayload) => eachBatch(s, payload)
          }),
        catch: driverError("connect")
      })
      if (!s.joined && s.failure === undefined && s.crash !== undefined) {
        const left = deadline - (yield* Clock.currentTimeMillis)
        yield* Deferred.await(s.settled).pipe(Effect.timeoutOption(Duration.millis(Math.max(0, left))))
      }
      if (s.joined) return
      const last = s.crash
      const retriable = last !== undefined && isRetriable(last)
      const left = deadline - (yield* Clock.currentTimeMillis)
      if (!retriable || left <= 0 || s.failure === undefined) {
        const reason = last === undefined ? "the consumer did not join its group" : describe(last)
        return yield* new DriverError({
          operation: "connect",
          reason: retriable && left <= 0
            ? `the consumer did not join its group within the rebalance timeout (${s.rebalanceTimeout} ms): ${reason}`
            : reason,
          retriable,
          cause: last
        })
      }
      s.log("info", `joining the group failed, trying again: ${describe(last)}`)
      s.failure = undefined
      s.crash = undefined
      yield* Effect.sleep(Duration.millis(Math.min(left, 250 * 2 ** Math.min(attempt, 4))))
    }
  }).pipe(Effect.withClock(liveClock))

/** Closes the session: Closed, whatever state the member was in. */
const close = (s: Session, settings: ConsumerSettings): Effect.Effect<void> =>
  Effect.gen(function*() {
    s.closed = true
    s.fetcher.clear("close")
    // A held JoinGroup goes out now: kafkajs leaves the group once it has rejoined.
    if (s.revoke !== undefined) releaseRevoke(s, s.revoke)
    // Leaves the group; kafkajs waits for batch calls (released above) and the fetch in flight.
    // Finalizers are uninterruptible: the disconnect must be interruptible for its time limit to hold.
    const closeTimeout = Duration.millis(Math.max(s.sessionTimeout, 10_000) + settings.maxWaitTimeInMs)
    yield* Effect.tryPromise({ try: () => s.consumer.disconnect(), catch: driverError("disconnect") }).pipe(
      Effect.interruptible,
      Effect.timeoutOption(closeTimeout),
      Effect.catchAll((error) => Effect.logWarning(`kafkajs consumer did not disconnect cleanly: ${error.reason}`))
    )
    yield* Effect.forEach([s.admin, s.reader], (client) =>
      Effect.tryPromise({
        try: () => client.disconnect(),
        catch: driverError("disconnect")
      }).pipe(
        Effect.interruptible,
        Effect.timeoutOption("5 seconds"),
        Effect.ignore
      ), { concurrency: 2, discard: true })
    yield* Queue.shutdown(s.queue)
  })

/** kafkajs's events that move the member (see `states.ts`). */
const follow = (s: Session, consumer: Consumer) => {
  consumer.on(consumer.events.GROUP_JOIN, (event) => {
    if (!s.closed) onGroupJoin(s, event.payload.memberAssignment, event.payload.memberId)
  })
  consumer.on(consumer.events.REBALANCING, () => {
    // Fires before kafkajs rejoins; its JoinGroup is held until the runloop releases.
    const state = memberState(s)
    if (state === "Member" || state === "Failed") beginRevoke(s)
  })
  consumer.on(consumer.events.START_BATCH_PROCESS, (event) => {
    const { batchSize, firstOffset, lastOffset, partition, topic } = event.payload
    // Only a batch emptied by filtering is announced without any message (runner.js `isEmptyDueToFiltering`).
    if (batchSize === 0) s.fetcher.emptied(topic, partition, firstOffset ?? null, lastOffset)
  })
  consumer.on(consumer.events.CRASH, (event) => {
    onCrash(s, event.payload.error, event.payload.restart)
  })
}

/** A `Partitions` subscription names partitions that exist. */
const checkRequested = (admin: Admin, plan: Plan): Effect.Effect<void, DriverError> =>
  Effect.gen(function*() {
    const metadata = yield* Effect.tryPromise({
      try: () => admin.fetchTopicMetadata({ topics: plan.topics }),
      catch: driverError("connect")
    })
    const known = new Set(
      metadata.topics.flatMap((t) => t.partitions.map((p) => k(t.name, p.partitionId)))
    )
    const missing = plan.requested.filter((tp) => !known.has(TopicPartition.key(tp)))
    if (missing.length > 0) {
      return yield* new DriverError({
        operation: "connect",
        reason: `no such partition: ${missing.map(TopicPartition.key).join(", ")}`
      })
    }
  })

/** What the runloop calls of a joined session. */
const driverSession = (s: Session): DriverSession => ({
  get memberId() {
    return s.memberId
  },
  poll: poll(s),
  commit: (batch) => commit(s, batch),
  committed: (partitions) => committed(s, partitions),
  committedWithMetadata: (partitions) => committedWithMetadata(s, partitions),
  offsets: (partitions) => offsets(s, partitions),
  seek: s.fetcher.seek,
  pause: (partitions, options) => Effect.sync(() => s.fetcher.pause(partitions, options?.hold === true)),
  resume: (partitions) =>
    Effect.sync(() => {
      // Records kept while paused are ready now: a `poll` waiting for the next fetch must not wait for it.
      if (s.fetcher.resume(partitions)) enqueue(s, { _tag: "Wake" })
    })
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
    const log: Log = (level, message) =>
      runFork(
        (level === "debug" ? Effect.logDebug : level === "info" ? Effect.logInfo : Effect.logWarning)(message).pipe(
          Effect.annotateLogs({ groupId: options.groupId, clientId: options.clientId })
        )
      )
    const plan = yield* planOf(settings, options)
    const queue = yield* Queue.unbounded<Entry>()

    // The clients' callbacks reach the session through `s`, which exists by the time kafkajs calls them.
    const wire = makeWire({
      onJoinGroup: (memberId) => onJoinGroup(s, memberId),
      onHeartbeatAnswer: (errorCode) => onHeartbeatAnswer(s, errorCode),
      // Only while kafkajs resets the partition: the rewritten commit keeps kafkajs's own next start at the same
      // out-of-range position, which the partition's suspension (set from the same log line) keeps it from fetching.
      committedPosition: (topic, partition) =>
        s.fetcher.wasReset(topic, partition) ? s.committedPositions.get(k(topic, partition)) : undefined
    })
    const onLog = (entry: LogEntry) => {
      const reset = resetOf(entry)
      if (reset !== undefined) s.fetcher.resetLogged(reset.topic, reset.partition)
    }
    const kafka = makeClient(settings.client, { clientId: options.clientId, socketFactory: wire.socketFactory, onLog })
    const consumer: Consumer = kafka.consumer({
      groupId: options.groupId,
      partitionAssigners: [plan.isStatic ? staticAssigner(plan.requested) : PartitionAssigners.roundRobin],
      sessionTimeout: plan.sessionTimeout,
      rebalanceTimeout: plan.rebalanceTimeout,
      heartbeatInterval: plan.heartbeatInterval,
      maxWaitTimeInMs: settings.maxWaitTimeInMs,
      allowAutoTopicCreation: false,
      readUncommitted: options.isolationLevel === undefined
        ? settings.readUncommitted
        : options.isolationLevel === "read_uncommitted",
      ...(settings.minBytes === undefined ? {} : { minBytes: settings.minBytes }),
      ...(settings.maxBytes === undefined ? {} : { maxBytes: settings.maxBytes }),
      ...(settings.maxBytesPerPartition === undefined ? {} : { maxBytesPerPartition: settings.maxBytesPerPartition })
    })
    const admin = kafka.admin()
    const readWire = makeReadWire()
    const reader = makeClient(settings.client, { clientId: options.clientId, socketFactory: readWire.socketFactory })
      .admin()
    const reads = yield* Effect.makeSemaphore(1)

    const fetcher = makeFetch({
      consumer,
      enqueue: (entry) => enqueue(s, entry),
      log,
      maxPollRecords: options.maxPollRecords,
      isClosed: () => s.closed,
      // Kafka answers OFFSET_OUT_OF_RANGE only past the high watermark: a position between the last stable offset
      // and it is in range, and its records come once their transaction ends.
      offsets: async (tp) => {
        const found = (await watermarks({ reader }, tp.topic)).find((p) => p.partition === tp.partition)
        if (found === undefined) throw new Error(`no partition ${TopicPartition.key(tp)}`)
        return { earliest: BigInt(found.low), latest: BigInt(found.high) }
      }
    })

    const s: Session = {
      groupId: options.groupId,
      log,
      isStatic: plan.isStatic,
      requested: plan.requested,
      sessionTimeout: plan.sessionTimeout,
      rebalanceTimeout: plan.rebalanceTimeout,
      heartbeatInterval: plan.heartbeatInterval,
      pollTimeout: plan.pollTimeout,
      tick: plan.tick,
      holdLimit: plan.holdLimit,
      queue,
      ...freshMemberState(),
      wire,
      consumer,
      admin,
      reader,
      readWire,
      reads,
      fetcher
    }

    yield* Effect.addFinalizer(() => close(s, settings))
    follow(s, consumer)

    yield* Effect.tryPromise({ try: () => admin.connect(), catch: driverError("connect") })
    yield* Effect.tryPromise({ try: () => reader.connect(), catch: driverError("connect") })
    if (plan.isStatic) yield* checkRequested(admin, plan)
    yield* Effect.tryPromise({ try: () => consumer.connect(), catch: driverError("connect") })
    yield* Effect.tryPromise({
      // The runloop seeks every assigned partition before kafkajs fetches it; `fromBeginning` only decides where
      // kafkajs resets a partition whose position is out of range, which this adapter reports instead.
      try: () => consumer.subscribe({ topics: plan.topics, fromBeginning: true }),
      catch: driverError("subscribe")
    })
    yield* join(s, settings)
    return driverSession(s)
  })
