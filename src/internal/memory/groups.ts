import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import type { DriverEvent, RebalanceProtocol, SessionOptions } from "../../Driver.js"
import { CommitFailed, type CommitFailureReason } from "../../KafkaError.js"
import type * as OffsetBatch from "../../OffsetBatch.js"
import * as TopicPartition from "../../TopicPartition.js"
import * as incremental from "./incremental.js"

/** @internal */
export type Assignor = "range" | "roundRobin"

/**
 * One member of a group, as the coordinator sees it, with the fetch state of its session.
 *
 * @internal
 */
export interface Member {
  id: string
  readonly groupId: string
  readonly options: SessionOptions
  /** `options.sessionTimeout` in millis, decoded once: every poll checks it. */
  readonly sessionMillis: number
  /** A `Partitions` subscription: assigned what it asked for, outside the group's rebalances. */
  readonly static: boolean
  /** Static membership (KIP-345): the member's instance id. */
  readonly instanceId: string | undefined
  /** A later member joined with the same instance id: this one is fenced. */
  fenced: boolean
  generation: number
  assigned: Array<TopicPartition.TopicPartition>
  /** Fetch positions; a partition has none until the runloop seeks it. */
  positions: Map<string, bigint>
  /** Partitions whose position was found out of range and reported: not fetched until sought again. */
  outOfRange: Set<string>
  paused: Set<string>
  pendingEvents: Array<DriverEvent>
  /** Eager: the member was told to give up everything it owns and has not released it yet. */
  awaitingRelease: boolean
  /** Incremental: the partitions the member was told to give up and still owns, until it releases them. */
  revoking: Set<string>
  rebalanceDeadline: number
  lastHeartbeat: number
  inGroup: boolean
  dead: boolean
  frozen: boolean
  fetched: number
}

/** @internal */
export interface Group {
  readonly id: string
  readonly protocol: RebalanceProtocol
  members: Array<Member>
  generation: number
  rebalancing: boolean
  /** Incremental: where each partition is to go (member id per partition key), since the last membership change. */
  target: Map<string, string>
  readonly committed: Map<string, bigint>
  /** The metadata committed with a position, when it had any. */
  readonly metadata: Map<string, string>
  /** Commit refusals injected by a test: each refuses one commit with this reason. */
  readonly refusals: Array<CommitFailureReason>
}

const sortPartitions = incremental.sortPartitions

/**
 * The group coordinator: membership, rebalances, session and rebalance deadlines, committed offsets. `notify` tells
 * waiting polls that a release changed the groups.
 *
 * Rebalances follow `protocol`:
 * - `eager`: every member releases everything, then the group assigns anew (`assignor`).
 * - `cooperative` (KIP-429): the group computes a sticky target; members give up only the partitions that move and
 *   keep fetching the others; once every revoked partition is released, a second round hands them to their new
 *   owners.
 * - `consumer` (KIP-848): the same sticky target, but partition by partition: a partition goes to its new owner as
 *   soon as its old owner released it, with no round for the whole group.
 *
 * @internal
 */
export const makeCoordinator = (
  assignor: Assignor,
  protocol: RebalanceProtocol,
  partitionsOf: (topics: ReadonlyArray<string>) => Array<TopicPartition.TopicPartition>,
  notify: Effect.Effect<void>
) => {
  const groups = new Map<string, Group>()
  const members = new Map<string, Member>()
  let memberSeq = 0

  const groupOf = (id: string): Group => {
    let group = groups.get(id)
    if (group === undefined) {
      group = {
        id,
        protocol,
        members: [],
        generation: 0,
        rebalancing: false,
        target: new Map(),
        committed: new Map(),
        metadata: new Map(),
        refusals: []
      }
      groups.set(id, group)
    }
    return group
  }

  const assign = (group: Group): void => {
    const active = group.members.filter((m) => !m.static)
    const ids = active.map((m) => m.id).sort()
    const byId = new Map(active.map((m) => [m.id, [] as Array<TopicPartition.TopicPartition>]))
    const allTopics = Array.from(
      new Set(active.flatMap((m) => m.options.subscription._tag === "Topics" ? m.options.subscription.topics : []))
    ).sort()
    if (assignor === "range") {
      for (const topic of allTopics) {
        const subscribers = ids.filter((id) => incremental.subscribes(members.get(id)!, topic))
        const tps = partitionsOf([topic])
        const per = Math.floor(tps.length / Math.max(1, subscribers.length))
        const extra = tps.length % Math.max(1, subscribers.length)
        let at = 0
        subscribers.forEach((id, i) => {
          const n = per + (i < extra ? 1 : 0)
          byId.get(id)!.push(...tps.slice(at, at + n))
          at += n
        })
      }
    } else {
      let i = 0
      for (const tp of partitionsOf(allTopics)) {
        for (let tries = 0; tries < ids.length; tries++) {
          const id = ids[(i + tries) % ids.length]!
          if (incremental.subscribes(members.get(id)!, tp.topic)) {
            byId.get(id)!.push(tp)
            i = (i + tries + 1) % ids.length
            break
          }
        }
      }
    }
    group.generation++
    group.rebalancing = false
    for (const m of active) {
      const tps = sortPartitions(byId.get(m.id) ?? [])
      m.generation = group.generation
      m.assigned = tps
      m.positions = new Map()
      m.outOfRange = new Set()
      m.paused = new Set()
      m.pendingEvents.push({ _tag: "Assigned", partitions: tps })
    }
  }

  const maybeCompleteRebalance = (group: Group): void => {
    if (group.rebalancing && group.members.every((m) => m.static || !m.awaitingRelease)) assign(group)
  }

  const release = (member: Member, generation: number): boolean => {
    if (member.dead || !member.inGroup || member.generation !== generation || !member.awaitingRelease) return false
    member.awaitingRelease = false
    member.assigned = []
    member.positions = new Map()
    maybeCompleteRebalance(groupOf(member.groupId))
    return true
  }

  // A release that lands may complete the rebalance: the polls waiting for the new assignment are woken.
  const releaseEffect = (member: Member, generation: number): Effect.Effect<void> =>
    release(member, generation) ? notify : Effect.void

  const startRebalance = (group: Group, now: number) => {
    if (protocol !== "eager") return incremental.start(group, now, { partitionsOf, notify })
    group.rebalancing = true
    for (const m of group.members) {
      if (m.static) continue
      if (m.assigned.length > 0 && !m.awaitingRelease) {
        m.awaitingRelease = true
        m.rebalanceDeadline = now + Duration.toMillis(m.options.rebalanceTimeout)
        const generation = m.generation
        const member = m
        m.pendingEvents.push({
          _tag: "Revoked",
          partitions: [...m.assigned],
          release: Effect.suspend(() => releaseEffect(member, generation))
        })
      }
    }
    maybeCompleteRebalance(group)
  }

  return { groups, members, groupOf, assign, release, startRebalance, protocol, nextMemberId: () => ++memberSeq }
}

/** @internal */
export type Coordinator = ReturnType<typeof makeCoordinator>

/**
 * A new member for a session, not yet in its group: it has a position in no partition, and its last heartbeat is now.
 *
 * @internal
 */
export const newMember = (coordinator: Coordinator, options: SessionOptions, now: number): Member => ({
  id: `${options.clientId}-${coordinator.nextMemberId()}`,
  groupId: options.groupId,
  options,
  sessionMillis: Duration.toMillis(options.sessionTimeout),
  static: options.subscription._tag === "Partitions",
  instanceId: options.groupInstanceId,
  fenced: false,
  generation: 0,
  assigned: [],
  positions: new Map(),
  outOfRange: new Set(),
  paused: new Set(),
  pendingEvents: [],
  awaitingRelease: false,
  revoking: new Set(),
  rebalanceDeadline: 0,
  lastHeartbeat: now,
  inGroup: false,
  dead: false,
  frozen: false,
  fetched: 0
})

/**
 * Removes a member from its group without a revoke: its partitions move at once.
 *
 * @internal
 */
export const evict = (coordinator: Coordinator, member: Member, now: number): void => {
  if (!member.inGroup) return
  member.inGroup = false
  member.awaitingRelease = false
  member.revoking = new Set()
  const group = coordinator.groupOf(member.groupId)
  group.members = group.members.filter((m) => m !== member)
  if (!member.static) coordinator.startRebalance(group, now)
}

/**
 * Evicts the members whose session expired, or who have not released their partitions by their rebalance deadline.
 * Whether any was evicted.
 *
 * @internal
 */
export const expire = (coordinator: Coordinator, group: Group, now: number): boolean => {
  let any = false
  for (const m of [...group.members]) {
    // A member in the middle of a revoke polls no more until it has released, but its driver goes on heartbeating
    // (unless it is frozen): the rebalance deadline bounds it instead.
    const revoking = m.awaitingRelease || m.revoking.size > 0
    const sessionExpired = now - m.lastHeartbeat > m.sessionMillis && (m.frozen || !revoking)
    const releaseExpired = (m.awaitingRelease || m.revoking.size > 0) && now > m.rebalanceDeadline
    if (sessionExpired || releaseExpired) {
      evict(coordinator, m, now)
      any = true
    }
  }
  return any
}

/**
 * A member with an instance id takes the place of the group's member with the same id (KIP-345): with its assignment
 * and generation, and no rebalance, unless the other is in the middle of one (then it is evicted, and the newcomer
 * joins as any member does). The other is fenced either way. Whether the place was taken.
 */
const replaceStatic = (coordinator: Coordinator, group: Group, member: Member, now: number): boolean => {
  const old = group.members.find((m) => m !== member && m.instanceId === member.instanceId)
  if (member.instanceId === undefined || old === undefined) return false
  old.fenced = true
  const settled = group.protocol === "eager"
    ? !group.rebalancing && !old.awaitingRelease
    : old.revoking.size === 0
  if (!settled) {
    evict(coordinator, old, now)
    return false
  }
  old.inGroup = false
  group.members = group.members.map((m) => m === old ? member : m)
  member.inGroup = true
  member.lastHeartbeat = now
  member.generation = old.generation
  member.assigned = [...old.assigned]
  for (const [k, id] of group.target) if (id === old.id) group.target.set(k, member.id)
  member.pendingEvents.push({ _tag: "Assigned", partitions: member.assigned })
  return true
}

/**
 * A member joins its group: a static member is assigned what it asked for at once, a member with an instance id takes
 * its earlier self's place (`replaceStatic`), any other starts a rebalance.
 *
 * @internal
 */
export const join = (coordinator: Coordinator, member: Member, now: number): void => {
  const group = coordinator.groupOf(member.groupId)
  if (replaceStatic(coordinator, group, member, now)) return
  member.inGroup = true
  member.lastHeartbeat = now
  group.members.push(member)
  if (member.static) {
    const s = member.options.subscription
    member.assigned = s._tag === "Partitions" ? [...s.partitions].sort(TopicPartition.compare) : []
    member.generation = -1
    member.pendingEvents.push({ _tag: "Assigned", partitions: member.assigned })
  } else {
    coordinator.startRebalance(group, now)
  }
}

/**
 * Refuses a commit the way a broker and a careful client do, or returns `undefined` when it may land: an evicted
 * member's, a stale generation's, an injected refusal, and partitions the member does not own (the broker itself
 * would take those from a member of the current generation; refusing them keeps a late commit from moving another
 * owner's position).
 *
 * @internal
 */
export const refuseCommit = (
  member: Member,
  group: Group,
  offsets: OffsetBatch.OffsetBatch
): CommitFailed | undefined => {
  const all = Array.from(offsets.positions.keys(), TopicPartition.fromKey)
  const injected = group.refusals.shift()
  if (injected !== undefined) {
    return new CommitFailed({ reason: injected, partitions: all, detail: "refused by InMemoryKafka.refuseCommits" })
  }
  if (member.fenced) {
    return new CommitFailed({
      reason: "Other",
      partitions: all,
      detail: `FENCED_INSTANCE_ID: a newer member joined with instance id "${member.instanceId}"`
    })
  }
  if (!member.inGroup) return new CommitFailed({ reason: "UnknownMember", partitions: all, detail: member.id })
  // Incremental protocols keep a member's partitions across generations: what it owns, it may commit.
  if (!member.static && group.protocol === "eager" && member.generation !== group.generation) {
    return new CommitFailed({
      reason: "IllegalGeneration",
      partitions: all,
      detail: `member generation ${member.generation}, group generation ${group.generation}`
    })
  }
  const owns = new Set(member.assigned.map(TopicPartition.key))
  const foreign = all.filter((tp) => !owns.has(TopicPartition.key(tp)))
  if (foreign.length > 0) {
    return new CommitFailed({ reason: "NotOwned", partitions: foreign, detail: `not assigned to ${member.id}` })
  }
  return undefined
}

/**
 * Lands a commit that was not refused: the positions, and the metadata committed with them (an empty one removes
 * what an earlier commit left).
 *
 * @internal
 */
export const commitPositions = (group: Group, offsets: OffsetBatch.OffsetBatch): void => {
  for (const [k, position] of offsets.positions) {
    group.committed.set(k, position)
    const metadata = offsets.metadata?.get(k)
    if (metadata === undefined || metadata === "") group.metadata.delete(k)
    else group.metadata.set(k, metadata)
  }
}
