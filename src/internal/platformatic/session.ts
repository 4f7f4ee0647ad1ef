/**
 * One member's session on @platformatic/kafka. The client keeps the membership (JoinGroup, SyncGroup, heartbeats,
 * rejoining when the group rebalances); the session follows it through the client's public API:
 *
 * - `consumer:group:join` says what the member owns after each join: `Assigned`.
 * - Before every JoinGroup the client asks `protocolsMetadata` for the member's user data, and waits for it. A member
 *   that owns partitions and is still in the group (its `memberId` kept) is rejoining because the group rebalances:
 *   the session hands `Revoked` to the runloop and answers only after `release`, so that no other member gets the
 *   partitions before their final commit. While it waits it keeps the member's session with heartbeats of its own
 *   (Heartbeat v4 on the coordinator, which answers REBALANCE_IN_PROGRESS and keeps the member). A member whose
 *   `memberId` the client dropped (UNKNOWN_MEMBER_ID: its session expired) has lost them: `Lost`.
 * - Under `cooperative` (the cooperative-sticky assignor) a rebalance's first JoinGroup keeps every partition; the
 *   SyncGroup's answer takes away those that move, and the client joins a second time to hand them over. The hook is
 *   asked before that second join: the session hands `Revoked` for the partitions taken away only, and holds the join
 *   as above. The partitions that stay go on being fetched and committed throughout.
 * - Records are fetched by `fetcher.ts`.
 */
import { Buffer } from "node:buffer"
import { ConnectionPool, Consumer, heartbeatV4 } from "@platformatic/kafka"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as FiberId from "effect/FiberId"
import * as Runtime from "effect/Runtime"
import type * as Scope from "effect/Scope"
import type { DriverEvent, DriverSession, SessionOptions } from "../../Driver.js"
import { DriverError } from "../../KafkaError.js"
import * as TopicPartition from "../../TopicPartition.js"
import { planSession, type SessionPlan } from "../shared/sessionPlan.js"
import * as commits from "./commits.js"
import type { ClientOptions } from "./config.js"
import { cooperativeStickyAssigner } from "./assignor.js"
import { apiIds, describe, driverError, isRetriable, isUnknownTopic } from "./errors.js"
import { type Fetcher, makeFetcher } from "./fetcher.js"
import * as kip848 from "./kip848.js"

/** Consumer settings that are fixed for every session of one layer. @internal */
export interface ConsumerSettings {
  readonly client: ClientOptions
  readonly maxWaitTime: number
  readonly heartbeatInterval: number | undefined
  readonly minBytes: number
  readonly maxBytes: number
  readonly maxBytesPerPartition: number
  readonly readUncommitted: boolean
  readonly rebalance: "eager" | "cooperative" | "consumer"
}

interface Session {
  readonly consumer: Consumer
  readonly group: commits.Group
  readonly fetcher: Fetcher
  readonly events: Array<DriverEvent>
  signal: Deferred.Deferred<void>
  joined: boolean
  closed: boolean
  failure: DriverError | undefined
  /** The revoke held in `protocolsMetadata`, until `release`. */
  held: (() => void) | undefined
  /** A newer member joined with this member's instance id (FENCED_INSTANCE_ID). */
  fenced: DriverError | undefined
  /** Under `consumer` (KIP-848): the member the driver runs. */
  member: kip848.Kip848Member | undefined
  readonly log: (level: "debug" | "info" | "warning", message: string) => void
}

const wake = (s: Session) => Deferred.unsafeDone(s.signal, Exit.void)

const push = (s: Session, event: DriverEvent) => {
  s.events.push(event)
  wake(s)
}

const sorted = (tps: ReadonlyArray<TopicPartition.TopicPartition>) => [...tps].sort(TopicPartition.compare)

const ownedList = (s: Session) => sorted(Array.from(s.fetcher.partitions.values(), (p) => p.tp))

/** What the client says the member owns after a join. */
const onJoin = (s: Session, assignments: ReadonlyArray<{ topic: string; partitions: ReadonlyArray<number> }>) => {
  const assigned = sorted(
    assignments.flatMap(({ partitions, topic }) => partitions.map((p) => TopicPartition.make(topic, p)))
  )
  const keys = new Set(assigned.map(TopicPartition.key))
  // Owned before and not handed back through a revoke: gone with the membership.
  const gone = ownedList(s).filter((tp) => !keys.has(TopicPartition.key(tp)))
  if (gone.length > 0) {
    s.fetcher.remove(gone)
    push(s, { _tag: "Lost", partitions: gone })
  }
  s.joined = true
  const fresh = assigned.filter((tp) => !s.fetcher.partitions.has(TopicPartition.key(tp)))
  s.fetcher.add(fresh)
  push(s, { _tag: "Assigned", partitions: fresh })
}

/** Heartbeats of the session's own while the rejoin is held; resolves when the member is no longer in the group. */
const heartbeatWhileHeld = async (s: Session, interval: number, until: Promise<void>): Promise<void> => {
  const { consumer } = s
  const generation = consumer.generationId
  const memberId = consumer.memberId
  if (memberId === null) return
  let done = false
  void until.then(() => {
    done = true
  })
  while (!done && !s.closed) {
    let timer: ReturnType<typeof setTimeout> | undefined
    await Promise.race([until, new Promise((resolve) => timer = setTimeout(resolve, interval))])
    clearTimeout(timer)
    if (done || s.closed) return
    try {
      const connection = await commits.connectCoordinator({ coordinator: undefined }, consumer, "heartbeat")
      await heartbeatV4.api.async(connection, consumer.groupId, generation, memberId, consumer.groupInstanceId)
    } catch (error) {
      const ids = apiIds(error)
      if (ids.includes("REBALANCE_IN_PROGRESS")) continue
      if (
        ids.includes("UNKNOWN_MEMBER_ID") || ids.includes("ILLEGAL_GENERATION") || ids.includes("FENCED_INSTANCE_ID")
      ) {
        s.log("info", `the member left the group while its revoke was held: ${describe(error)}`)
        return
      }
      s.log("debug", `a heartbeat while the revoke is held failed: ${describe(error)}`)
    }
  }
}

/**
 * What a JoinGroup about to be sent revokes. Eager: everything the member owns. Cooperative: what the last SyncGroup
 * took away (owned, and not in the client's assignment any more); nothing on a rebalance's first JoinGroup, which
 * keeps every partition.
 */
const revokedBy = (s: Session, owned: ReadonlyArray<TopicPartition.TopicPartition>, cooperative: boolean) => {
  if (!cooperative) return owned
  const kept = new Set(
    (s.consumer.assignments ?? []).flatMap(({ partitions, topic }) =>
      partitions.map((p) => TopicPartition.key(TopicPartition.make(topic, p)))
    )
  )
  return owned.filter((tp) => !kept.has(TopicPartition.key(tp)))
}

/**
 * The client's `protocolsMetadata` hook, called before every JoinGroup: holds a rebalance's rejoin until the runloop
 * released the revoked partitions (or until the hold limit, past which the group would go on without the member).
 * Under `cooperative` the client calls it before the second JoinGroup of a rebalance that took partitions away, with
 * its assignment already the new one: the partitions that stay are neither stopped nor handed back.
 */
const holdRejoin = (s: Session, plan: Plan, cooperative: boolean) => async (): Promise<Buffer> => {
  // A member a newer one fenced (same instance id) must not join again: that would fence the newer one in turn.
  if (s.fenced !== undefined) throw s.fenced
  const owned = ownedList(s)
  if (!s.joined || s.closed || owned.length === 0) return Buffer.alloc(0)
  if (s.consumer.memberId === null) {
    s.fetcher.remove(owned)
    push(s, { _tag: "Lost", partitions: owned })
    return Buffer.alloc(0)
  }
  const revoked = revokedBy(s, owned, cooperative)
  if (revoked.length === 0) return Buffer.alloc(0)
  // Owned until released: their commits are still the member's, but nothing more is fetched or handed over.
  for (const tp of revoked) s.fetcher.stop(tp)
  let release!: () => void
  const released = new Promise<void>((resolve) => {
    release = resolve
  })
  s.held = release
  push(s, {
    _tag: "Revoked",
    partitions: revoked,
    release: Effect.sync(() => release())
  })
  let timer: ReturnType<typeof setTimeout> | undefined
  const limit = new Promise<void>((resolve) => {
    timer = setTimeout(resolve, plan.holdLimit)
  })
  const until = Promise.race([released, limit])
  await Promise.race([until, heartbeatWhileHeld(s, plan.heartbeatInterval, until)])
  // The limit's timer must not keep the process alive once the revoke was released.
  clearTimeout(timer)
  s.held = undefined
  s.fetcher.remove(revoked)
  return Buffer.alloc(0)
}

type Plan = SessionPlan

/** Every topic exists, and every partition a `Partitions` subscription names. */
const checkTopics = (consumer: Consumer, plan: Plan): Effect.Effect<void, DriverError> =>
  Effect.gen(function*() {
    const metadata = yield* Effect.tryPromise({
      try: () => consumer.metadata({ topics: plan.topics, autocreateTopics: false, retries: 0 }),
      catch: (cause) =>
        isUnknownTopic(cause)
          ? new DriverError({
            operation: "connect",
            reason: `no such topic: ${plan.topics.join(", ")} (${describe(cause)})`,
            cause
          })
          : driverError("connect")(cause)
    })
    const missing = plan.topics.filter((t) => !metadata.topics.has(t))
    if (missing.length > 0) {
      return yield* new DriverError({ operation: "connect", reason: `no such topic: ${missing.join(", ")}` })
    }
    const absent = plan.requested.filter((tp) => (metadata.topics.get(tp.topic)?.partitionsCount ?? 0) <= tp.partition)
    if (absent.length > 0) {
      return yield* new DriverError({
        operation: "connect",
        reason: `no such partition: ${absent.map(TopicPartition.key).join(", ")}`
      })
    }
  })

/**
 * Joins the group. The client retries the conditions that pass (the coordinator loading the group, moving); past
 * its retries they are tried again here, within the rebalance timeout, the time a join may take.
 */
const join = (s: Session, plan: Plan): Effect.Effect<void, DriverError> =>
  Effect.gen(function*() {
    const deadline = Date.now() + plan.rebalanceTimeout
    for (let attempt = 0;; attempt++) {
      const result = yield* Effect.either(Effect.tryPromise({
        try: () =>
          s.consumer.joinGroup({
            sessionTimeout: plan.sessionTimeout,
            rebalanceTimeout: plan.rebalanceTimeout,
            heartbeatInterval: plan.heartbeatInterval
          }),
        catch: driverError("connect")
      }))
      if (result._tag === "Right") return
      const error = result.left
      const left = deadline - Date.now()
      if (!error.retriable || left <= 0) return yield* error
      s.log("info", `joining the group failed, trying again: ${error.reason}`)
      yield* Effect.sleep(Duration.millis(Math.min(left, 250 * 2 ** Math.min(attempt, 4))))
    }
  })

/** Under `consumer` (KIP-848): the driver's own member joins, and tells the session what it owns. */
const joinKip848 = (s: Session, plan: Plan, options: SessionOptions): Effect.Effect<void, DriverError> =>
  Effect.gen(function*() {
    const member = kip848.start({
      consumer: s.consumer,
      groupId: options.groupId,
      instanceId: options.groupInstanceId ?? null,
      topics: plan.topics,
      rebalanceTimeout: plan.rebalanceTimeout
    }, {
      assigned: (partitions) => {
        s.joined = true
        s.fetcher.add(partitions)
        push(s, { _tag: "Assigned", partitions: sorted(partitions) })
      },
      revoked: (partitions, release) => {
        // Owned until released: their commits are still the member's, but nothing more is fetched or handed over.
        for (const tp of partitions) s.fetcher.stop(tp)
        push(s, {
          _tag: "Revoked",
          partitions: sorted(partitions),
          release: Effect.sync(() => {
            s.fetcher.remove(partitions)
            release()
          })
        })
      },
      lost: (partitions) => {
        s.fetcher.remove(partitions)
        push(s, { _tag: "Lost", partitions: sorted(partitions) })
      },
      failed: (error) => {
        if (s.closed) return
        s.failure ??= error
        wake(s)
      },
      log: s.log
    })
    s.member = member
    yield* Effect.tryPromise({ try: () => member.joined, catch: driverError("connect") }).pipe(
      Effect.timeoutFail({
        duration: Duration.millis(plan.rebalanceTimeout),
        onTimeout: () =>
          new DriverError({
            operation: "connect",
            reason: `the group did not answer a KIP-848 join within ${plan.rebalanceTimeout} ms`,
            retriable: true
          })
      })
    )
    // A member the group gives nothing yet (its partitions are still being revoked elsewhere) hears of them later.
    s.joined = true
  })

const close = (s: Session, pool: ConnectionPool): Effect.Effect<void> =>
  Effect.gen(function*() {
    s.closed = true
    s.held?.()
    s.fetcher.close()
    wake(s)
    const step = (what: string, f: () => Promise<unknown>) =>
      Effect.tryPromise({ try: f, catch: driverError(what) }).pipe(
        Effect.interruptible,
        Effect.timeoutOption("10 seconds"),
        Effect.catchAll((error) => Effect.logWarning(`@platformatic/kafka ${what} failed: ${error.reason}`))
      )
    const member = s.member
    if (member !== undefined) {
      yield* step("leaveGroup", () => member.leave())
      yield* step("close", () => s.consumer.close(true))
      yield* step("close", () => pool.close())
      return
    }
    const leave = () =>
      new Promise<void>((resolve, reject) =>
        s.consumer.leaveGroup(true, (error) => error === null || error === undefined ? resolve() : reject(error))
      )
    if (s.consumer.groupInstanceId !== null) {
      // A static member (KIP-345) does not leave: its partitions wait for it until its session expires, and a restart
      // within it gets them back without a rebalance. The client's leaveGroup and close send LeaveGroup with the member
      // id and without the instance id, which removes a static member, and have no option not to. They send nothing
      // for a consumer without a member id (its public field): the id is cleared, then leaveGroup ends the client's
      // membership (no more heartbeats or rejoins) without a request.
      s.consumer.memberId = null
      yield* step("leaveGroup", leave)
    } else if (s.joined && !s.group.isStatic) {
      yield* step("leaveGroup", leave)
    }
    yield* step("close", () => s.consumer.close(true))
    yield* step("close", () => pool.close())
  })

/** How long a fetch may keep failing before `poll` says so (the runloop then reconnects, or ends). */
const failingLimit = (plan: Plan) => Math.max(plan.sessionTimeout, 10_000)

const poll = (s: Session, plan: Plan): Effect.Effect<ReadonlyArray<DriverEvent>, DriverError> =>
  Effect.gen(function*() {
    const deadline = Date.now() + plan.pollTimeout
    for (;;) {
      if (s.failure !== undefined) return yield* s.failure
      // A fresh signal before looking: a wake from here on ends the wait below.
      if (yield* Deferred.isDone(s.signal)) {
        s.signal = Deferred.unsafeMake<void>(FiberId.none)
      }
      const events = s.events.splice(0)
      const records = s.fetcher.take()
      if (events.length > 0 || records.length > 0) return events.concat(records)
      const failing = s.fetcher.failing()
      if (failing !== undefined && Date.now() - failing.since > failingLimit(plan)) {
        return yield* new DriverError({
          operation: "fetch",
          reason: `fetching has failed for ${Date.now() - failing.since} ms: ${describe(failing.error)}`,
          retriable: isRetriable(failing.error),
          cause: failing.error
        })
      }
      s.fetcher.start()
      const left = deadline - Date.now()
      if (left <= 0) return []
      yield* Deferred.await(s.signal).pipe(Effect.timeoutOption(Duration.millis(left)))
    }
  })

const driverSession = (s: Session, plan: Plan): DriverSession => ({
  get memberId() {
    return s.group.isStatic
      ? `static-${s.consumer.clientId}`
      : s.member?.memberId ?? s.consumer.memberId ?? ""
  },
  ...(s.group.isStatic ? {} : {
    groupMetadata: () => {
      const { generation, instanceId, memberId } = s.group.identity()
      return {
        groupId: s.group.groupId,
        generationId: generation,
        memberId,
        ...(instanceId === null ? {} : { groupInstanceId: instanceId })
      }
    }
  }),
  poll: poll(s, plan),
  commit: (batch) => commits.commit(s.group, batch),
  committed: (partitions) => commits.committed(s.group, partitions),
  committedWithMetadata: (partitions) => commits.committedWithMetadata(s.group, partitions),
  offsets: (partitions) => commits.offsets(s.consumer, partitions),
  seek: (partition, position) =>
    s.fetcher.seek(partition, position)
      ? Effect.sync(() => wake(s))
      : Effect.fail(
        new DriverError({
          operation: "seek",
          reason: `${TopicPartition.key(partition)} is not assigned to this member`
        })
      ),
  pause: (partitions) =>
    Effect.sync(() => {
      for (const tp of partitions) {
        const state = s.fetcher.partitions.get(TopicPartition.key(tp))
        if (state !== undefined) state.paused = true
      }
    }),
  resume: (partitions) =>
    Effect.sync(() => {
      for (const tp of partitions) {
        const state = s.fetcher.partitions.get(TopicPartition.key(tp))
        if (state !== undefined) state.paused = false
      }
      wake(s)
    })
})

/**
 * Opens one member's session on @platformatic/kafka. See `Platformatic.layer` for what it guarantees around
 * rebalances.
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
    const log: Session["log"] = (level, message) =>
      runFork(
        (level === "debug" ? Effect.logDebug : level === "info" ? Effect.logInfo : Effect.logWarning)(message).pipe(
          Effect.annotateLogs({ groupId: options.groupId, clientId: options.clientId })
        )
      )
    const plan = yield* planSession(settings.heartbeatInterval, options)
    const readCommitted = options.isolationLevel === undefined
      ? !settings.readUncommitted
      : options.isolationLevel === "read_committed"
    const consumer = new Consumer({
      ...settings.client,
      clientId: options.clientId,
      groupId: options.groupId,
      ...(options.groupInstanceId === undefined ? {} : { groupInstanceId: options.groupInstanceId }),
      sessionTimeout: plan.sessionTimeout,
      rebalanceTimeout: plan.rebalanceTimeout,
      heartbeatInterval: plan.heartbeatInterval,
      autocreateTopics: false,
      isolationLevel: readCommitted ? 1 : 0,
      // Version 3 of the subscription carries the owned partitions and the generation in their own fields.
      ...(settings.rebalance === "cooperative"
        ? { protocols: [{ name: "cooperative-sticky", version: 3 }], partitionAssigner: cooperativeStickyAssigner }
        : { protocols: [{ name: "roundrobin", version: 1 }] }),
      protocolsMetadata: (_protocols, _topics, _metadata, _callback) => hold()
    })
    const pool = new ConnectionPool(options.clientId, settings.client)
    const fetcher = makeFetcher({
      consumer,
      pool,
      settings: {
        maxWaitTime: settings.maxWaitTime,
        minBytes: settings.minBytes,
        maxBytes: settings.maxBytes,
        maxBytesPerPartition: settings.maxBytesPerPartition,
        readCommitted,
        maxPollRecords: options.maxPollRecords
      },
      wake: () => wake(s),
      log: (message) => log("debug", message)
    })
    const s: Session = {
      consumer,
      group: {
        consumer,
        groupId: options.groupId,
        isStatic: plan.isStatic,
        owns: (key) => fetcher.partitions.has(key),
        isClosed: () => s.closed,
        identity: () =>
          s.member === undefined
            ? commits.classicIdentity(consumer)()
            : {
              generation: s.member.epoch(),
              memberId: s.member.memberId,
              instanceId: options.groupInstanceId ?? null
            },
        coordinator: undefined
      },
      fetcher,
      events: [],
      signal: Deferred.unsafeMake<void>(FiberId.none),
      joined: false,
      closed: false,
      failure: undefined,
      held: undefined,
      fenced: undefined,
      member: undefined,
      log
    }
    const hold = holdRejoin(s, plan, settings.rebalance === "cooperative")
    yield* Effect.addFinalizer(() => close(s, pool))

    consumer.on("consumer:group:join", (payload) => {
      if (!s.closed) onJoin(s, payload.assignments ?? [])
    })
    consumer.on("consumer:heartbeat:error", (payload: { readonly error?: unknown }) => {
      if (s.closed || s.fenced !== undefined || !apiIds(payload.error).includes("FENCED_INSTANCE_ID")) return
      s.fenced = new DriverError({
        operation: "heartbeat",
        reason: `FENCED_INSTANCE_ID: a newer member joined group ${options.groupId} with instance id ` +
          `"${options.groupInstanceId}"`,
        cause: payload.error
      })
      s.failure ??= s.fenced
      wake(s)
    })
    consumer.on("error", (error: unknown) => {
      if (s.closed || s.failure !== undefined) return
      s.failure = driverError("rejoin")(error)
      wake(s)
    })

    yield* checkTopics(consumer, plan)
    if (plan.isStatic) {
      s.joined = true
      fetcher.add(plan.requested)
      s.events.push({ _tag: "Assigned", partitions: plan.requested })
    } else if (settings.rebalance === "consumer") {
      yield* joinKip848(s, plan, options)
    } else {
      consumer.topics.trackAll(...plan.topics)
      yield* join(s, plan)
    }
    return driverSession(s, plan)
  })
