/**
 * A member of a KIP-848 group (`rebalance: "consumer"`), run by the driver itself through the client's exported
 * ConsumerGroupHeartbeat v1 API, because the client's own member acknowledges a revocation in its next heartbeat
 * without waiting for the application, and keeps its epoch private.
 *
 * The broker computes the assignment; each heartbeat says what the member owns, and each answer may carry the
 * member's new assignment (the partitions it may own now: a partition still owned by another member is not in it
 * until that member gave it up). What the answer no longer holds is revoked: handed to the runloop with a `release`,
 * and kept in the member's owned partitions, heartbeat after heartbeat, until released; the heartbeat that leaves it
 * out is the acknowledgement, sent at once. The broker gives the partition to its next owner only then (or when the
 * member's rebalance timeout passed). What the answer adds is assigned at once. Every heartbeat is a full one (the
 * rebalance timeout, the topics and the owned partitions), which the broker always answers with the member's whole
 * assignment: a partition the group gives back while the member still revokes it is released, then taken again from
 * the answer to the acknowledgement.
 *
 * An answer of FENCED_MEMBER_EPOCH or UNKNOWN_MEMBER_ID (the group went on without the member: its session expired)
 * loses everything, and the member joins again with epoch 0. FENCED_INSTANCE_ID and UNRELEASED_INSTANCE_ID (static
 * membership) end the session. A heartbeat that fails otherwise is tried again at the next interval.
 *
 * @internal
 */
import { type Consumer, consumerGroupHeartbeatV1 } from "@platformatic/kafka"
import { DriverError } from "../../KafkaError.js"
import * as TopicPartition from "../../TopicPartition.js"
import { connectCoordinator } from "./commits.js"
import { apiIds, describe } from "./errors.js"

/** What the member tells its session. @internal */
export interface Kip848Events {
  readonly assigned: (partitions: ReadonlyArray<TopicPartition.TopicPartition>) => void
  readonly revoked: (partitions: ReadonlyArray<TopicPartition.TopicPartition>, release: () => void) => void
  readonly lost: (partitions: ReadonlyArray<TopicPartition.TopicPartition>) => void
  readonly failed: (error: DriverError) => void
  readonly log: (level: "debug" | "info" | "warning", message: string) => void
}

/** @internal */
export interface Kip848Settings {
  readonly consumer: Consumer
  readonly groupId: string
  readonly instanceId: string | null
  readonly topics: ReadonlyArray<string>
  readonly rebalanceTimeout: number
}

/** @internal */
export interface Kip848Member {
  readonly memberId: string
  /** The member's epoch now (0 until it joined). */
  readonly epoch: () => number
  /** Resolves once the group answered the first heartbeat; rejects when it cannot be joined. */
  readonly joined: Promise<void>
  /** Stops the heartbeats and leaves the group (a static member only says it is away). */
  readonly leave: () => Promise<void>
}

interface State {
  readonly settings: Kip848Settings
  readonly events: Kip848Events
  readonly memberId: string
  epoch: number
  interval: number
  /** Owned, by key; revoked ones stay until released. */
  readonly owned: Map<string, TopicPartition.TopicPartition>
  readonly revoking: Set<string>
  readonly names: Map<string, string>
  readonly ids: Map<string, string>
  coordinator: number | undefined
  closed: boolean
  /** Ends the wait for the next heartbeat: a release to acknowledge, or the member closing. */
  kick: () => void
  /** A kick that came while a heartbeat was in flight: the next wait ends at once. */
  kicked: boolean
}

const FATAL = [
  "FENCED_INSTANCE_ID",
  "UNRELEASED_INSTANCE_ID",
  "GROUP_AUTHORIZATION_FAILED",
  "UNSUPPORTED_ASSIGNOR",
  "UNSUPPORTED_VERSION",
  "INVALID_REQUEST",
  "GROUP_MAX_SIZE_REACHED"
]
const GONE = ["FENCED_MEMBER_EPOCH", "UNKNOWN_MEMBER_ID"]
const MOVED = ["NOT_COORDINATOR", "COORDINATOR_NOT_AVAILABLE", "COORDINATOR_LOAD_IN_PROGRESS"]

/** Topic ids and names of the subscribed topics, read again when the broker names a topic id not known yet. */
const refreshTopics = async (st: State): Promise<void> => {
  const metadata = await st.settings.consumer.metadata({ topics: [...st.settings.topics], forceUpdate: true })
  for (const [name, topic] of metadata.topics) {
    st.names.set(topic.id, name)
    st.ids.set(name, topic.id)
  }
}

const connection = (st: State) => connectCoordinator(st, st.settings.consumer, "heartbeat")

const ownedByTopic = (st: State) => {
  const byTopic = new Map<string, Array<number>>()
  for (const tp of st.owned.values()) {
    const id = st.ids.get(tp.topic)
    if (id === undefined) continue
    let list = byTopic.get(id)
    if (list === undefined) byTopic.set(id, list = [])
    list.push(tp.partition)
  }
  return Array.from(byTopic, ([topicId, partitions]) => ({ topicId, partitions }))
}

const heartbeat = async (st: State, epoch: number) => {
  const { settings } = st
  return consumerGroupHeartbeatV1.api.async(
    await connection(st),
    settings.groupId,
    st.memberId,
    epoch,
    settings.instanceId,
    null,
    settings.rebalanceTimeout,
    epoch < 0 ? null : [...settings.topics],
    null,
    null,
    epoch < 0 ? null : ownedByTopic(st)
  )
}

/** Takes an answer's assignment: what it no longer holds is revoked, what it adds is assigned. */
const apply = async (st: State, assignment: consumerGroupHeartbeatV1.ConsumerGroupHeartbeatResponseAssignment) => {
  if (assignment.topicPartitions.some((t) => !st.names.has(t.topicId))) await refreshTopics(st)
  const target = new Map<string, TopicPartition.TopicPartition>()
  for (const { partitions, topicId } of assignment.topicPartitions) {
    const name = st.names.get(topicId)
    if (name === undefined) continue
    for (const p of partitions) {
      const tp = TopicPartition.make(name, p)
      target.set(TopicPartition.key(tp), tp)
    }
  }
  const revoked = Array.from(st.owned).filter(([k]) => !target.has(k) && !st.revoking.has(k)).map(([, tp]) => tp)
  const added = Array.from(target).filter(([k]) => !st.owned.has(k)).map(([, tp]) => tp)
  if (revoked.length > 0) {
    const keys = revoked.map(TopicPartition.key)
    for (const k of keys) st.revoking.add(k)
    st.events.revoked(revoked, () => {
      for (const k of keys) {
        if (!st.revoking.delete(k)) continue
        st.owned.delete(k)
      }
      // The heartbeat that leaves them out acknowledges the revoke: sent now, not at the next interval.
      st.kicked = true
      st.kick()
    })
  }
  if (added.length > 0) {
    for (const tp of added) st.owned.set(TopicPartition.key(tp), tp)
    st.events.assigned(added)
  }
}

/** Everything the member owned is gone with its membership; it joins again from epoch 0. */
const loseAll = (st: State, why: string) => {
  const lost = Array.from(st.owned.values())
  st.owned.clear()
  st.revoking.clear()
  st.epoch = 0
  st.events.log("info", `the group went on without this member (${why}); it joins again`)
  if (lost.length > 0) st.events.lost(lost)
}

const wait = (st: State, millis: number) =>
  new Promise<void>((resolve) => {
    if (st.kicked || st.closed) {
      st.kicked = false
      return resolve()
    }
    const timer = setTimeout(done, millis)
    function done() {
      clearTimeout(timer)
      st.kick = () => {}
      st.kicked = false
      resolve()
    }
    st.kick = done
  })

const loop = async (st: State, joined: { resolve: () => void; reject: (e: DriverError) => void }) => {
  let first = true
  while (!st.closed) {
    try {
      const answer = await heartbeat(st, st.epoch)
      if (st.closed) return
      st.epoch = answer.memberEpoch
      if (answer.heartbeatIntervalMs > 0) st.interval = answer.heartbeatIntervalMs
      if (answer.assignment !== null) await apply(st, answer.assignment)
      if (first) {
        first = false
        joined.resolve()
      }
    } catch (error) {
      if (st.closed) return
      const ids = apiIds(error)
      if (ids.some((id) => FATAL.includes(id))) {
        const failure = new DriverError({ operation: "heartbeat", reason: describe(error), cause: error })
        joined.reject(failure)
        st.events.failed(failure)
        return
      }
      if (ids.some((id) => GONE.includes(id))) {
        loseAll(st, ids.join(", "))
        continue
      }
      if (ids.some((id) => MOVED.includes(id)) || ids.length === 0) st.coordinator = undefined
      st.events.log("debug", `a heartbeat failed, trying again: ${describe(error)}`)
    }
    await wait(st, st.interval)
  }
}

/**
 * Starts the member's heartbeats: the first one joins (epoch 0).
 *
 * @internal
 */
export const start = (settings: Kip848Settings, events: Kip848Events): Kip848Member => {
  const st: State = {
    settings,
    events,
    memberId: crypto.randomUUID(),
    epoch: 0,
    interval: 1_000,
    owned: new Map(),
    revoking: new Set(),
    names: new Map(),
    ids: new Map(),
    coordinator: undefined,
    closed: false,
    kick: () => {},
    kicked: false
  }
  let resolve!: () => void
  let reject!: (e: DriverError) => void
  const joined = new Promise<void>((ok, ko) => {
    resolve = ok
    reject = ko
  })
  // Nobody may be listening yet: a refused join is also reported through `failed`.
  joined.catch(() => {})
  const running = refreshTopics(st).then(() => loop(st, { resolve, reject }), (error: unknown) => {
    const failure = new DriverError({ operation: "connect", reason: describe(error), retriable: true, cause: error })
    reject(failure)
    events.failed(failure)
  })
  return {
    memberId: st.memberId,
    epoch: () => st.epoch,
    joined,
    leave: async () => {
      st.closed = true
      st.kick()
      await running
      if (st.epoch <= 0 && st.owned.size === 0) return
      // -1 leaves the group; a static member says -2, "away for now", and keeps its assignment until its session ends.
      await heartbeat(st, settings.instanceId === null ? -1 : -2)
    }
  }
}
