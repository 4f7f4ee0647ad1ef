import * as Chunk from "effect/Chunk"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import type { DriverEvent, RebalanceProtocol } from "../../Driver.js"
import { DriverError } from "../../KafkaError.js"
import * as TopicPartition from "../../TopicPartition.js"
import * as groups from "./groups.js"
import * as memoryLog from "./log.js"
import * as transactions from "./transactions.js"

/**
 * The in-memory broker's state: its logs, group coordinator and transactional producers, and what tells waiting polls
 * that something changed.
 *
 * @internal
 */
export interface Broker {
  readonly logs: memoryLog.Logs
  readonly coordinator: groups.Coordinator
  readonly producers: transactions.Producers
  readonly read: ReturnType<typeof memoryLog.makeReader>
  /** Completed, and replaced by a new one, at every change: a poll with nothing to return waits on it. */
  changed: Deferred.Deferred<void>
  /** A poll changed the groups or the transactions, and has yet to `notify` it. */
  changedPending: boolean
  /** The broker cannot be reached (`InMemoryKafka.unreachable`). */
  down: boolean
  readonly notify: Effect.Effect<void>
  /** `notify`, when a poll changed something (`changedPending`). */
  readonly flushNotify: Effect.Effect<void>
}

/**
 * Builds the broker's state.
 *
 * @internal
 */
export const make = (assignor: groups.Assignor, protocol: RebalanceProtocol): Effect.Effect<Broker> =>
  Effect.gen(function*() {
    const logs = memoryLog.makeLogs()
    const notify = Effect.suspend(() => {
      const previous = broker.changed
      return Deferred.make<void>().pipe(
        Effect.flatMap((next) => {
          broker.changed = next
          return Deferred.succeed(previous, undefined)
        })
      )
    })
    const broker: Broker = {
      logs,
      coordinator: groups.makeCoordinator(assignor, protocol, (topics) => memoryLog.partitionsOf(logs, topics), notify),
      producers: transactions.makeProducers(),
      read: memoryLog.makeReader(),
      changed: yield* Deferred.make<void>(),
      changedPending: false,
      down: false,
      notify,
      flushNotify: Effect.suspend(() => {
        if (!broker.changedPending) return Effect.void
        broker.changedPending = false
        return notify
      })
    }
    return broker
  })

const fetch = (broker: Broker, member: groups.Member): Array<DriverEvent> => {
  const out: Array<DriverEvent> = []
  const group = broker.coordinator.groupOf(member.groupId)
  // Eager: nothing is fetched while the group rebalances. Incremental: what stays is fetched on; what is being given
  // up is not.
  if (member.awaitingRelease || (group.rebalancing && group.protocol === "eager" && !member.static)) return out
  for (const tp of member.assigned) {
    const k = TopicPartition.key(tp)
    if (member.revoking.has(k)) continue
    // A newly assigned partition is fetched only once the runloop has sought it to its start position.
    const position = member.positions.get(k)
    if (position === undefined || member.paused.has(k) || member.outOfRange.has(k)) continue
    const log = memoryLog.logOf(broker.logs, tp)
    if (log === undefined) continue
    const fetched = broker.read(
      log,
      position,
      member.options.maxPollRecords,
      member.options.isolationLevel === "read_uncommitted"
    )
    if (fetched._tag === "Empty") continue
    if (fetched._tag === "OutOfRange") {
      member.outOfRange.add(k)
      out.push({ _tag: "OutOfRange", partition: tp, position })
      continue
    }
    member.positions.set(k, fetched.next)
    member.fetched += Chunk.size(fetched.records)
    out.push({ _tag: "Records", partition: tp, records: fetched.records, from: position, next: fetched.next })
  }
  return out
}

/**
 * One look at what a member has to receive: its pending events, then what it can fetch. The group looks at sessions
 * before this poll counts as the member's heartbeat: a member that was paused past its session learns here that it
 * was evicted.
 *
 * @internal
 */
export const pollOnce = (broker: Broker, member: groups.Member, now: number): Array<DriverEvent> | "lost" => {
  const group = broker.coordinator.groupOf(member.groupId)
  if (groups.expire(broker.coordinator, group, now)) broker.changedPending = true
  if (!member.inGroup) return "lost"
  member.lastHeartbeat = now
  if (transactions.expireTransactions(broker.producers, now)) broker.changedPending = true
  const events = member.pendingEvents
  member.pendingEvents = []
  return events.concat(fetch(broker, member))
}

/**
 * Waits while the member is frozen; a dead member waits forever.
 *
 * @internal
 */
export const whileFrozen = (broker: Broker, member: groups.Member): Effect.Effect<void> =>
  Effect.suspend(() => {
    if (member.dead) return Effect.never
    if (!member.frozen) return Effect.void
    return Deferred.await(broker.changed).pipe(Effect.zipRight(whileFrozen(broker, member)))
  })

/** @internal */
export const unreachableError = (operation: string) =>
  new DriverError({ operation, reason: "the broker cannot be reached", retriable: true })
