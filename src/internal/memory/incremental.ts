/**
 * The incremental rebalances of the in-memory coordinator (`cooperative`, KIP-429, and `consumer`, KIP-848): a sticky
 * target, revokes of only what moves, and partitions handed to their new owners once released.
 *
 * @internal
 */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as TopicPartition from "../../TopicPartition.js"
import { stickyTarget } from "../shared/sticky.js"
import type { Group, Member } from "./groups.js"

/** What the coordinator gives the incremental rebalances. @internal */
export interface Env {
  readonly partitionsOf: (topics: ReadonlyArray<string>) => Array<TopicPartition.TopicPartition>
  /** Wakes the polls that wait for a change. */
  readonly notify: Effect.Effect<void>
}

/** @internal */
export const sortPartitions = (tps: Array<TopicPartition.TopicPartition>) => tps.sort(TopicPartition.compare)

/** Whether the member subscribes to the topic. @internal */
export const subscribes = (member: Member, topic: string) =>
  member.options.subscription._tag === "Topics" && member.options.subscription.topics.includes(topic)

/** The sticky target of the group's members (`stickyTarget`), from what each owns and is not giving up. */
const groupTarget = (group: Group, partitionsOf: Env["partitionsOf"]): Map<string, string> => {
  const active = group.members.filter((m) => !m.static)
  const topicsOf = (m: Member) => m.options.subscription._tag === "Topics" ? m.options.subscription.topics : []
  const allTopics = Array.from(new Set(active.flatMap(topicsOf))).sort()
  return stickyTarget(
    active.map((m) => ({
      id: m.id,
      topics: topicsOf(m),
      keeps: m.assigned.filter((tp) => !m.revoking.has(TopicPartition.key(tp)) && subscribes(m, tp.topic))
    })),
    partitionsOf(allTopics)
  )
}

/** Whose a partition is now: a member that owns it, giving it up or not. */
const ownerOf = (group: Group, key: string): Member | undefined =>
  group.members.find((m) => !m.static && m.assigned.some((tp) => TopicPartition.key(tp) === key))

/**
 * Hands the partitions nobody owns to their target members. `consumer` does it at once; `cooperative`
 * once no member of the group has a partition left to release (its second round), with a new generation.
 */
const grant = (group: Group): void => {
  const { protocol } = group
  const active = group.members.filter((m) => !m.static)
  if (protocol === "cooperative" && active.some((m) => m.revoking.size > 0)) return
  const granted = new Map<string, Array<TopicPartition.TopicPartition>>()
  for (const [k, id] of group.target) {
    if (ownerOf(group, k) !== undefined) continue
    const list = granted.get(id) ?? []
    list.push(TopicPartition.fromKey(k))
    granted.set(id, list)
  }
  if (granted.size === 0 && protocol === "consumer") return
  group.generation++
  group.rebalancing = false
  for (const m of active) {
    m.generation = group.generation
    const fresh = granted.get(m.id)
    if (fresh === undefined) continue
    sortPartitions(fresh)
    m.assigned = sortPartitions([...m.assigned, ...fresh])
    for (const tp of fresh) {
      const k = TopicPartition.key(tp)
      m.positions.delete(k)
      m.outOfRange.delete(k)
      m.paused.delete(k)
    }
    m.pendingEvents.push({ _tag: "Assigned", partitions: fresh })
  }
}

/** A member gives up revoked partitions; they go on to their target owners. */
const releasePartitions = (group: Group, member: Member, keys: ReadonlyArray<string>): boolean => {
  if (member.dead || !member.inGroup) return false
  const gone = new Set(keys.filter((k) => member.revoking.has(k)))
  if (gone.size === 0) return false
  for (const k of gone) {
    member.revoking.delete(k)
    member.positions.delete(k)
    member.outOfRange.delete(k)
    member.paused.delete(k)
  }
  member.assigned = member.assigned.filter((tp) => !gone.has(TopicPartition.key(tp)))
  grant(group)
  return true
}

/**
 * A membership change under `cooperative` or `consumer`: the group's sticky target is computed again, each member is
 * told to give up what moves away from it (it keeps the rest, fetching on), and what nobody owns is handed out.
 *
 * @internal
 */
export const start = (group: Group, now: number, env: Env): void => {
  group.target = groupTarget(group, env.partitionsOf)
  group.rebalancing = true
  for (const m of group.members) {
    if (m.static) continue
    const moving = m.assigned.filter((tp) => {
      const k = TopicPartition.key(tp)
      return !m.revoking.has(k) && group.target.get(k) !== m.id
    })
    if (moving.length === 0) continue
    const keys = moving.map(TopicPartition.key)
    for (const k of keys) m.revoking.add(k)
    m.rebalanceDeadline = now + Duration.toMillis(m.options.rebalanceTimeout)
    const member = m
    m.pendingEvents.push({
      _tag: "Revoked",
      partitions: moving,
      release: Effect.suspend(() => releasePartitions(group, member, keys) ? env.notify : Effect.void)
    })
  }
  grant(group)
}
