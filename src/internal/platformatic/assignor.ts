/**
 * The cooperative-sticky assignor the driver gives @platformatic/kafka (its public `partitionAssigner` option), run
 * by the group's leader. The target is the library's sticky target (`stickyTarget`: every member within one partition
 * of the others, the fewest moves); the client's own assignor leaves a joining member empty-handed while every member
 * is within the ceiling of the even share (6 partitions, 3 members, a fourth joins: 2, 2, 2, 0).
 *
 * The first round of a cooperative rebalance (KIP-429) gives each member its target minus what another member still
 * owns: the owner is told to give it up (its assignment leaves it out), and the new owner gets it in the next round,
 * once the owner rejoined without it.
 *
 * @internal
 */
import type {
  ClusterMetadata,
  ExtendedGroupProtocolSubscription,
  GroupAssignment,
  GroupPartitionsAssignments
} from "@platformatic/kafka"
import * as TopicPartition from "../../TopicPartition.js"
import { stickyTarget } from "../shared/sticky.js"

/**
 * Who owns what, as the members say: the claims of the newest generation count, and a partition two members claim in
 * the same generation is nobody's (neither claim can be trusted).
 */
const ownersOf = (members: ReadonlyArray<ExtendedGroupProtocolSubscription>) => {
  const newest = Math.max(-1, ...members.map((m) => m.generationId ?? -1))
  const claims = new Map<string, Array<string>>()
  const claimed = new Map<string, Array<string>>()
  for (const m of members) {
    for (const owned of m.ownedPartitions ?? []) {
      for (const partition of owned.partitions) {
        const key = TopicPartition.key(TopicPartition.make(owned.topic, partition))
        claimed.set(key, [...(claimed.get(key) ?? []), m.memberId])
        if (newest >= 0 && (m.generationId ?? -1) < newest) continue
        claims.set(key, [...(claims.get(key) ?? []), m.memberId])
      }
    }
  }
  const owner = new Map<string, string>()
  for (const [key, ids] of claims) if (ids.length === 1) owner.set(key, ids[0]!)
  return { owner, claimed }
}

/** @internal */
export const cooperativeStickyAssigner = (
  _leader: string,
  members: Map<string, ExtendedGroupProtocolSubscription>,
  topics: Set<string>,
  metadata: ClusterMetadata
): Array<GroupPartitionsAssignments> => {
  const list = Array.from(members.values())
  const all: Array<TopicPartition.TopicPartition> = []
  for (const topic of Array.from(topics).sort()) {
    const count = metadata.topics.get(topic)?.partitionsCount ?? 0
    if (!list.some((m) => m.topics?.includes(topic))) continue
    for (let p = 0; p < count; p++) all.push(TopicPartition.make(topic, p))
  }
  const { claimed, owner } = ownersOf(list)
  const target = stickyTarget(
    list.map((m) => ({
      id: m.memberId,
      topics: m.topics ?? [],
      keeps: all.filter((tp) => owner.get(TopicPartition.key(tp)) === m.memberId)
    })),
    all
  )
  const out = new Map(list.map((m) => [m.memberId, new Map<string, GroupAssignment>()]))
  for (const tp of all) {
    const key = TopicPartition.key(tp)
    const to = target.get(key)
    if (to === undefined) continue
    // Still claimed by another member: it gives it up in this round, and `to` gets it in the next.
    if ((claimed.get(key) ?? []).some((id) => id !== to)) continue
    const assignments = out.get(to)!
    let topic = assignments.get(tp.topic)
    if (topic === undefined) assignments.set(tp.topic, topic = { topic: tp.topic, partitions: [] })
    topic.partitions.push(tp.partition)
  }
  return Array.from(out, ([memberId, assignments]) => ({ memberId, assignments }))
}
