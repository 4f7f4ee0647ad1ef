import * as Clock from "effect/Clock"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import type * as Scope from "effect/Scope"
import type { CommittedPosition, DriverEvent, DriverSession, PartitionOffsets, SessionOptions } from "../../Driver.js"
import { CommitFailed, DriverError } from "../../KafkaError.js"
import type * as OffsetBatch from "../../OffsetBatch.js"
import * as TopicPartition from "../../TopicPartition.js"
import { type Broker, pollOnce, unreachableError, whileFrozen } from "./broker.js"
import * as groups from "./groups.js"
import * as memoryLog from "./log.js"
import * as transactions from "./transactions.js"

/**
 * A session of the `Driver` on the in-memory broker: a new member of its group, heartbeating until the scope closes,
 * when it leaves the group (a member with an instance id stays in it, silent, until its session expires).
 *
 * @internal
 */
export const connect = (
  broker: Broker,
  options: SessionOptions
): Effect.Effect<DriverSession, DriverError, Scope.Scope> =>
  Effect.gen(function*() {
    const { coordinator, notify } = broker
    if (broker.down) return yield* unreachableError("connect")
    const subscribed = options.subscription._tag === "Topics"
      ? options.subscription.topics
      : options.subscription.partitions.map((tp) => tp.topic)
    for (const topic of subscribed) {
      if (!broker.logs.topics.has(topic)) {
        return yield* new DriverError({ operation: "subscribe", reason: `unknown topic "${topic}"` })
      }
    }
    const now = yield* Clock.currentTimeMillis
    const member = groups.newMember(coordinator, options, now)
    coordinator.members.set(member.id, member)
    groups.join(coordinator, member, now)
    yield* notify

    const heartbeat = Effect.gen(function*() {
      if (member.dead || member.frozen || broker.down) return
      const t = yield* Clock.currentTimeMillis
      member.lastHeartbeat = t
      if (groups.expire(coordinator, coordinator.groupOf(member.groupId), t)) yield* notify
    })
    yield* heartbeat.pipe(
      Effect.repeat(Schedule.spaced(Duration.millis(Math.max(1, Duration.toMillis(options.sessionTimeout) / 3)))),
      Effect.forkScoped
    )

    yield* Effect.addFinalizer(() =>
      Effect.gen(function*() {
        if (member.dead) return
        if (member.instanceId !== undefined && member.inGroup) {
          // A member with an instance id does not leave: its partitions wait for it until its session expires.
          member.dead = true
          member.frozen = true
          return
        }
        const t = yield* Clock.currentTimeMillis
        groups.evict(coordinator, member, t)
        coordinator.members.delete(member.id)
        yield* notify
      })
    )

    return makeSession(broker, member, options)
  })

const makeSession = (broker: Broker, member: groups.Member, options: SessionOptions): DriverSession => {
  const committedWithMetadata = makeCommittedRead(broker, member)
  const reachableOr = <A>(operation: string, f: () => A): Effect.Effect<A, DriverError> =>
    Effect.suspend(() => broker.down ? Effect.fail(unreachableError(operation)) : Effect.succeed(f()))
  return {
    get memberId() {
      return member.id
    },
    ...(member.static ? {} : {
      groupMetadata: () => ({
        groupId: options.groupId,
        generationId: member.generation,
        memberId: member.id,
        ...(member.instanceId === undefined ? {} : { groupInstanceId: member.instanceId })
      })
    }),
    poll: makePoll(broker, member, options),
    commit: makeCommit(broker, member),
    committed: (tps) =>
      Effect.map(committedWithMetadata(tps), (found) => {
        const out = new Map<string, bigint>()
        for (const [k, { position }] of found) out.set(k, position)
        return out
      }),
    committedWithMetadata,
    offsets: (tps) =>
      reachableOr("offsets", () => {
        const out = new Map<string, PartitionOffsets>()
        for (const tp of tps) {
          const log = memoryLog.logOf(broker.logs, tp)
          if (log !== undefined) out.set(TopicPartition.key(tp), memoryLog.offsets(log))
        }
        return out
      }),
    seek: (tp, position) =>
      Effect.sync(() => {
        if (member.assigned.some((a) => TopicPartition.equals(a, tp))) {
          const k = TopicPartition.key(tp)
          member.positions.set(k, position)
          member.outOfRange.delete(k)
        }
      }),
    pause: (tps) =>
      Effect.sync(() => {
        for (const tp of tps) member.paused.add(TopicPartition.key(tp))
      }),
    resume: (tps) =>
      Effect.suspend(() => {
        for (const tp of tps) member.paused.delete(TopicPartition.key(tp))
        return broker.notify
      })
  }
}

const makePoll = (
  broker: Broker,
  member: groups.Member,
  options: SessionOptions
): Effect.Effect<ReadonlyArray<DriverEvent>, DriverError> => {
  const { coordinator, flushNotify } = broker

  const poll: Effect.Effect<ReadonlyArray<DriverEvent>, DriverError> = Effect.clockWith((clock) => {
    // The common case, a member that is neither dead nor frozen and has something to return, takes no
    // generator and no extra steps: it runs once per poll loop turn.
    if (member.dead || member.frozen || broker.down) return slowPoll
    const wake = broker.changed
    const first = pollOnce(broker, member, clock.unsafeCurrentTimeMillis())
    if (first === "lost" || first.length === 0 || broker.changedPending) {
      return Effect.zipRight(flushNotify, afterFirst(wake, first))
    }
    return Effect.succeed(first)
  })

  const slowPoll: Effect.Effect<ReadonlyArray<DriverEvent>, DriverError> = Effect.gen(function*() {
    yield* whileFrozen(broker, member)
    if (broker.down) return yield* unreachableError("poll")
    const wake = broker.changed
    const first = pollOnce(broker, member, yield* Clock.currentTimeMillis)
    yield* flushNotify
    return yield* afterFirst(wake, first)
  })

  // What follows the first look: a lost member rejoins; an empty poll waits for a change, up to the poll timeout.
  const afterFirst = (
    wake: Deferred.Deferred<void>,
    first: Array<DriverEvent> | "lost"
  ): Effect.Effect<ReadonlyArray<DriverEvent>, DriverError> =>
    Effect.gen(function*() {
      if (first === "lost") return yield* lostAndRejoin
      if (first.length > 0) return first
      const woke = yield* Deferred.await(wake).pipe(Effect.timeoutOption(options.pollTimeout))
      if (Option.isNone(woke)) return []
      yield* whileFrozen(broker, member)
      if (broker.down) return yield* unreachableError("poll")
      const t2 = yield* Clock.currentTimeMillis
      const second = pollOnce(broker, member, t2)
      yield* flushNotify
      if (second === "lost") return yield* lostAndRejoin
      return second
    })

  // An evicted member learns that its partitions are gone, then joins again as a new member, as a Kafka
  // consumer does when its next request is answered with UNKNOWN_MEMBER_ID.
  const lostAndRejoin = Effect.gen(function*() {
    if (member.fenced) {
      // Kafka answers FENCED_INSTANCE_ID, which no rejoin can cure: the newer member keeps the id.
      return yield* new DriverError({
        operation: "poll",
        reason: `FENCED_INSTANCE_ID: a newer member joined group ${member.groupId} with instance id ` +
          `"${member.instanceId}"`
      })
    }
    const lost = member.assigned
    member.assigned = []
    member.positions = new Map()
    member.outOfRange = new Set()
    member.pendingEvents = []
    const t = yield* Clock.currentTimeMillis
    coordinator.members.delete(member.id)
    member.id = `${options.clientId}-${coordinator.nextMemberId()}`
    coordinator.members.set(member.id, member)
    groups.join(coordinator, member, t)
    yield* broker.notify
    return [{ _tag: "Lost", partitions: lost }] as ReadonlyArray<DriverEvent>
  })

  return poll
}

const makeCommit = (
  broker: Broker,
  member: groups.Member
): (offsets: OffsetBatch.OffsetBatch) => Effect.Effect<void, CommitFailed> => {
  const commitNow = (offsets: OffsetBatch.OffsetBatch): Effect.Effect<void, CommitFailed> => {
    if (broker.down) {
      const partitions = Array.from(offsets.positions.keys(), TopicPartition.fromKey)
      return Effect.fail(
        new CommitFailed({ reason: "Disconnected", partitions, detail: "the broker cannot be reached" })
      )
    }
    const group = broker.coordinator.groupOf(member.groupId)
    const refused = groups.refuseCommit(member, group, offsets)
    if (refused !== undefined) return Effect.fail(refused)
    groups.commitPositions(group, offsets)
    return Effect.void
  }

  // A commit runs once per batch of handled records: without a generator, and in one step when the member is
  // neither frozen nor dead.
  return (offsets) =>
    Effect.suspend(() =>
      member.dead || member.frozen
        ? Effect.zipRight(whileFrozen(broker, member), Effect.suspend(() => commitNow(offsets)))
        : commitNow(offsets)
    )
}

// A stable read, as with `require_stable` on Kafka: a position that an open transaction is about to commit
// is not answered with the one before it.
const makeCommittedRead = (broker: Broker, member: groups.Member) =>
(
  tps: ReadonlyArray<TopicPartition.TopicPartition>
): Effect.Effect<ReadonlyMap<string, CommittedPosition>, DriverError> =>
  Effect.clockWith((clock) => {
    if (broker.down) return Effect.fail(unreachableError("committed"))
    // A transaction past its timeout is aborted first, as the broker would have by now.
    const expired = transactions.expireTransactions(broker.producers, clock.unsafeCurrentTimeMillis())
    const read = (): Effect.Effect<ReadonlyMap<string, CommittedPosition>, DriverError> => {
      const group = broker.coordinator.groupOf(member.groupId)
      const out = new Map<string, CommittedPosition>()
      for (const tp of tps) {
        const k = TopicPartition.key(tp)
        const pending = transactions.pendingOffsetCommit(broker.producers, member.groupId, k)
        if (pending !== undefined) {
          return Effect.fail(
            new DriverError({
              operation: "committed",
              reason: `UNSTABLE_OFFSET_COMMIT: the open transaction of producer "${pending}" commits a ` +
                `position of ${k} for group "${member.groupId}"; read again once it has ended`,
              retriable: true
            })
          )
        }
        const position = group.committed.get(k)
        if (position !== undefined) out.set(k, { position, metadata: group.metadata.get(k) ?? "" })
      }
      return Effect.succeed(out)
    }
    return expired ? Effect.zipRight(broker.notify, Effect.suspend(read)) : read()
  })
