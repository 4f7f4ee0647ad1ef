/**
 * One member's session on kafkajs, as state (`Session`), and what moves the member between the states of `states.ts`:
 * kafkajs's group events, the JoinGroup requests its socket layer sees, the heartbeats of a hold, crashes.
 */
import * as Clock from "effect/Clock"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as FiberId from "effect/FiberId"
import type * as Queue from "effect/Queue"
import type { Admin, Consumer } from "kafkajs"
import { DriverError } from "../../KafkaError.js"
import * as TopicPartition from "../../TopicPartition.js"
import { describe, isRetriable } from "./errors.js"
import type { Fetch } from "./fetch.js"
import type { Entry } from "./partitions.js"
import type { ReadWire } from "./readWire.js"
import { memberState, type Revoke } from "./states.js"
import type { Wire } from "./wire.js"

/** @internal */
export type Log = (level: "debug" | "info" | "warning", message: string) => void

/**
 * Everything of one session: its settings, the kafkajs clients, and the state that kafkajs callbacks and the
 * runloop's calls share. Both run on the one JavaScript thread and never across an `await` while they update it.
 *
 * @internal
 */
export interface Session {
  readonly groupId: string
  readonly log: Log
  /** A `Partitions` subscription: the member is given exactly `requested`, and never revokes. */
  readonly isStatic: boolean
  readonly requested: ReadonlyArray<TopicPartition.TopicPartition>
  readonly sessionTimeout: number
  readonly rebalanceTimeout: number
  readonly heartbeatInterval: number
  readonly pollTimeout: number
  /** How often a waiting eachBatch looks at the session; kafkajs only sends a heartbeat once its interval passed. */
  readonly tick: number
  /**
   * The group's rebalance started up to a heartbeat before this member noticed it; the held JoinGroup must reach the
   * coordinator before the rebalance timeout, or the group goes on without this member.
   */
  readonly holdLimit: number
  readonly queue: Queue.Queue<Entry>
  readonly owned: Map<string, TopicPartition.TopicPartition>
  /** The group's committed position of owned partitions, as this session last read or wrote it. */
  readonly committedPositions: Map<string, bigint>
  revoke: Revoke | undefined
  memberId: string
  joined: boolean
  closed: boolean
  failure: DriverError | undefined
  crash: unknown
  /**
   * Completed when the member has joined, or when kafkajs crashed without restarting; a crash kafkajs restarts from
   * leaves it open. One per attempt of `connect`.
   */
  settled: Deferred.Deferred<void>
  waitedForRestart: boolean
  /**
   * Entries queued since the first fetched batch of this turn of the event loop, handed to `poll` at the end of it.
   * kafkajs sends its next fetch only after every batch call of the last one returned, through a chain of promise
   * callbacks; the runloop, woken at once, would handle the records in between (Effect's fibers run on the same
   * microtask queue) and the fetch would wait for it. Handed over a turn later, the records are handled while the
   * broker answers the next fetch. Everything queued meanwhile follows them, in order.
   */
  deferred: Array<Entry> | undefined
  readonly wire: Wire
  readonly consumer: Consumer
  /** kafkajs's admin reads read-committed offsets: the latest offset it gives is the last stable offset. */
  readonly admin: Admin
  /**
   * Committed positions and high watermarks are read through a client of their own, whose socket layer makes the
   * committed reads stable and reads the high watermark (see `makeReadWire`).
   */
  readonly reader: Admin
  readonly readWire: ReadWire
  /** One committed read at a time: each says which partitions its OffsetFetch asks for. */
  readonly reads: Effect.Semaphore
  unstableWarned: boolean
  readonly fetcher: Fetch
}

/**
 * A new member's state: nothing owned or committed yet, not joined, no revoke under way. Every session starts from it
 * (and the tests of the state table too).
 *
 * @internal
 */
export const freshMemberState = () => ({
  owned: new Map<string, TopicPartition.TopicPartition>(),
  committedPositions: new Map<string, bigint>(),
  revoke: undefined,
  memberId: "",
  joined: false,
  closed: false,
  failure: undefined,
  crash: undefined,
  settled: Deferred.unsafeMake<void>(FiberId.none),
  waitedForRestart: false,
  deferred: undefined,
  unstableWarned: false
})

/**
 * kafkajs runs on wall-clock time; `poll` waits on it too, even in a test that installs the `TestClock`.
 *
 * @internal
 */
export const liveClock = Clock.make()

/** Heartbeat error codes that mean the group went on without this member. */
const GONE = new Set([
  22, // ILLEGAL_GENERATION
  25, // UNKNOWN_MEMBER_ID
  82 // FENCED_INSTANCE_ID
])

/** @internal */
export const k = (topic: string, partition: number): string => TopicPartition.key(TopicPartition.make(topic, partition))

/** @internal */
export const sortPartitions = (
  partitions: Iterable<TopicPartition.TopicPartition>
): Array<TopicPartition.TopicPartition> => Array.from(partitions).sort(TopicPartition.compare)

export { byTopic } from "../shared/topics.js"

const flush = (s: Session) => {
  const entries = s.deferred ?? []
  s.deferred = undefined
  for (const entry of entries) s.queue.unsafeOffer(entry)
}

/** Queues an entry for `poll` (see `Session.deferred`). @internal */
export const enqueue = (s: Session, entry: Entry) => {
  if (s.deferred !== undefined) {
    s.deferred.push(entry)
  } else if (entry._tag === "Records") {
    s.deferred = [entry]
    setImmediate(() => flush(s))
  } else {
    s.queue.unsafeOffer(entry)
  }
}

/** Holding -> Released. @internal */
export const releaseRevoke = (s: Session, r: Revoke) => {
  if (r.released) return
  r.released = true
  for (const timer of r.timers) clearTimeout(timer)
  // From here on the partitions may move: commits for them are refused.
  for (const tp of r.partitions) s.owned.delete(TopicPartition.key(tp))
  s.wire.release()
}

/**
 * The member's partitions are already gone (evicted, or kafkajs restarted): nothing more of them is committed.
 *
 * @internal
 */
export const lose = (s: Session) => {
  if (s.owned.size > 0) {
    enqueue(s, { _tag: "Control", event: { _tag: "Lost", partitions: sortPartitions(s.owned.values()) } })
  }
  s.owned.clear()
  s.committedPositions.clear()
  s.fetcher.clear("stale")
}

/**
 * kafkajs revokes every partition on a rebalance (eager protocol) and does not say which ones come back, so all
 * owned partitions are revoked. Records not yet returned are dropped: the next owner fetches them again. Until
 * `release`, kafkajs's JoinGroup is held (and the group with it) while this session heartbeats in its place.
 *
 * Member -> Holding (Released when no partition is owned).
 *
 * @internal
 */
export const beginRevoke = (s: Session) => {
  if (s.isStatic || s.revoke !== undefined || s.closed) return
  const r: Revoke = { partitions: sortPartitions(s.owned.values()), released: false, timers: [] }
  s.revoke = r
  s.fetcher.dropAll("revoke")
  if (r.partitions.length === 0) {
    releaseRevoke(s, r)
    return
  }
  s.log("debug", `rebalance: revoking ${r.partitions.map(TopicPartition.key).join(", ")}`)
  const beat = setInterval(() => {
    if (!r.released) s.wire.heartbeat()
  }, s.heartbeatInterval)
  const deadline = setTimeout(() => {
    if (r.released) return
    s.log(
      "warning",
      `revoked partitions were not released within ${s.holdLimit} ms (the rebalance timeout allows no more); ` +
        "rejoining the group without waiting further"
    )
    releaseRevoke(s, r)
  }, s.holdLimit)
  r.timers.push(beat, deadline)
  enqueue(s, {
    _tag: "Control",
    event: { _tag: "Revoked", partitions: r.partitions, release: Effect.sync(() => releaseRevoke(s, r)) }
  })
}

/**
 * kafkajs is about to send a JoinGroup: a rejoin of a member that owns partitions waits for the runloop. Answers
 * whether the request is held.
 *
 * @internal
 */
export const onJoinGroup = (s: Session, requestMemberId: string): boolean => {
  if (s.isStatic) return false
  const state = memberState(s)
  if (state === "Closed") return false
  if (requestMemberId === "") {
    // kafkajs forgot its member id (the coordinator did not know it): the partitions were lost, not revoked.
    if (s.revoke !== undefined) releaseRevoke(s, s.revoke)
    else if (state === "Member" || state === "Failed") lose(s)
    return false
  }
  if ((state === "Member" || state === "Failed") && s.owned.size > 0) beginRevoke(s)
  return memberState(s) === "Holding"
}

/** @internal */
export const onHeartbeatAnswer = (s: Session, errorCode: number) => {
  // 27 (REBALANCE_IN_PROGRESS) is the expected answer: the coordinator keeps the member while the group waits.
  s.log("debug", `heartbeat while holding the rejoin: error code ${errorCode}`)
  if (!GONE.has(errorCode) || s.revoke === undefined || s.revoke.released) return
  s.log("warning", `the group went on without this member (heartbeat error ${errorCode}); rejoining`)
  s.wire.release()
}

/**
 * kafkajs joined the group (GROUP_JOIN) with `assignment`: Joining or Released -> Member.
 *
 * @internal
 */
export const onGroupJoin = (s: Session, assignment: Record<string, Array<number>>, newMemberId: string) => {
  s.memberId = newMemberId
  s.joined = true
  Deferred.unsafeDone(s.settled, Exit.void)
  if (s.isStatic) {
    if (s.owned.size === 0) {
      for (const tp of s.requested) s.owned.set(TopicPartition.key(tp), tp)
      s.fetcher.assign(s.requested)
      enqueue(s, { _tag: "Control", event: { _tag: "Assigned", partitions: s.requested } })
    } else {
      s.fetcher.restore()
    }
    return
  }
  const next: Array<TopicPartition.TopicPartition> = []
  for (const [topic, partitions] of Object.entries(assignment)) {
    for (const partition of partitions) next.push(TopicPartition.make(topic, partition))
  }
  // A rejoin this session did not see coming (it cannot happen without a JoinGroup, but kafkajs may change).
  if (s.revoke === undefined) lose(s)
  else releaseRevoke(s, s.revoke)
  s.revoke = undefined
  s.owned.clear()
  s.committedPositions.clear()
  for (const tp of next) s.owned.set(TopicPartition.key(tp), tp)
  s.fetcher.assign(next)
  if (next.length > 0) enqueue(s, { _tag: "Control", event: { _tag: "Assigned", partitions: sortPartitions(next) } })
}

/**
 * kafkajs's consumer crashed (CRASH); `restart` says whether kafkajs starts it again. Without a restart the member is
 * Failed; with one it rejoins, and what it owned is lost.
 *
 * @internal
 */
export const onCrash = (s: Session, error: unknown, restart: boolean) => {
  s.crash = error
  if (s.closed) return
  s.fetcher.dropAll("close")
  if (s.revoke !== undefined) releaseRevoke(s, s.revoke)
  s.revoke = undefined
  if (!s.isStatic) lose(s)
  if (!restart) {
    s.failure = new DriverError({
      operation: "poll",
      reason: describe(error),
      retriable: isRetriable(error),
      cause: error
    })
    Deferred.unsafeDone(s.settled, Exit.void)
    enqueue(s, { _tag: "Wake" })
  } else if (s.joined) {
    s.log("warning", `kafkajs consumer crashed and restarts: ${describe(error)}`)
  } else {
    // Joining while the coordinator loads or moves: `connect` waits for kafkajs's restart (once said is enough).
    s.log(s.waitedForRestart ? "debug" : "info", `joining the group failed, kafkajs tries again: ${describe(error)}`)
    s.waitedForRestart = true
  }
}
