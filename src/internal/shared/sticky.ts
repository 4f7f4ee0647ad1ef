/**
 * The sticky target of a group's members, the same for every incremental rebalance the library runs or assigns (the
 * in-memory coordinator, the cooperative-sticky assignor of the @platformatic/kafka driver).
 *
 * @internal
 */
import * as TopicPartition from "../../TopicPartition.js"

/** A member as the target sees it: what it subscribes to, and what it owns and may keep. @internal */
export interface StickyMember {
  readonly id: string
  readonly topics: ReadonlyArray<string>
  readonly keeps: ReadonlyArray<TopicPartition.TopicPartition>
}

/**
 * Each member keeps what it owns up to its share; what is left over, or owned by nobody, goes to the members below
 * their share, fewest first. The shares differ by at most one, and the members that own the most get the larger ones,
 * so that the fewest partitions move. Members are taken in the order of their ids: the same input gives the same
 * target. Returns the owner's id per `TopicPartition.key`.
 *
 * @internal
 */
export const stickyTarget = (
  members: ReadonlyArray<StickyMember>,
  all: ReadonlyArray<TopicPartition.TopicPartition>
): Map<string, string> => {
  const active = [...members].sort((a, b) => a.id < b.id ? -1 : a.id > b.id ? 1 : 0)
  const target = new Map<string, string>()
  if (active.length === 0) return target
  const subscribes = (m: StickyMember, topic: string) => m.topics.includes(topic)
  const byOwned = [...active].sort((a, b) => b.keeps.length - a.keeps.length)
  const base = Math.floor(all.length / active.length)
  const extra = all.length % active.length
  const share = new Map(byOwned.map((m, i) => [m.id, base + (i < extra ? 1 : 0)]))
  const count = new Map(active.map((m) => [m.id, 0]))
  const exists = new Set(all.map(TopicPartition.key))
  for (const m of active) {
    for (const tp of [...m.keeps].sort(TopicPartition.compare)) {
      const k = TopicPartition.key(tp)
      if (!subscribes(m, tp.topic) || !exists.has(k) || target.has(k) || count.get(m.id)! >= share.get(m.id)!) {
        continue
      }
      target.set(k, m.id)
      count.set(m.id, count.get(m.id)! + 1)
    }
  }
  for (const tp of all) {
    const k = TopicPartition.key(tp)
    if (target.has(k)) continue
    let to: StickyMember | undefined
    for (const m of active) {
      if (!subscribes(m, tp.topic)) continue
      if (to === undefined) to = m
      else {
        const below = count.get(m.id)! < share.get(m.id)!
        const toBelow = count.get(to.id)! < share.get(to.id)!
        if ((below && !toBelow) || (below === toBelow && count.get(m.id)! < count.get(to.id)!)) to = m
      }
    }
    if (to === undefined) continue
    target.set(k, to.id)
    count.set(to.id, count.get(to.id)! + 1)
  }
  return target
}
