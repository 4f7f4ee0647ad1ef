/**
 * What the stores on a database server share in a load and a claim: the topics a load reads and the positions it keeps,
 * the partitions in the order a claim locks their rows, and a claimed row as the `Claim` the policy gets.
 */
import type { Claim } from "../../OffsetStore.js"
import * as TopicPartition from "../../TopicPartition.js"
import * as Progress from "../consumer/progress.js"

/**
 * Each partition once, in a fixed order, so that two claims of overlapping partitions lock rows in the same order.
 *
 * @internal
 */
export const inLockOrder = (
  partitions: ReadonlyArray<TopicPartition.TopicPartition>
): ReadonlyArray<TopicPartition.TopicPartition> =>
  [...new Map(partitions.map((tp) => [TopicPartition.key(tp), tp])).values()].sort(TopicPartition.compare)

/**
 * A claimed row, its numbers as text: the new epoch, the stored position (null before anything was stored) and the
 * ranges finished above it (`Progress.encode`d, or null).
 *
 * @internal
 */
export const claimOf = (next: string | null, epoch: string, finishedText: string | null): Claim => {
  const position = next === null ? null : BigInt(next)
  const finished = position === null ? [] : Progress.decode(position, finishedText)
  return { epoch: BigInt(epoch), position, ...(finished.length === 0 ? {} : { finished }) }
}

/** The topics whose rows a load reads (each once). @internal */
export const topicsOf = (partitions: ReadonlyArray<TopicPartition.TopicPartition>): ReadonlyArray<string> => [
  ...new Set(partitions.map((tp) => tp.topic))
]

/**
 * The stored positions of the partitions asked for, from the rows of their topics (topic, partition, next offset as
 * text), keyed by `TopicPartition.key`.
 *
 * @internal
 */
export const positionsAmong = (
  partitions: ReadonlyArray<TopicPartition.TopicPartition>,
  rows: Iterable<readonly [topic: string, partition: number | string, next: string]>
): ReadonlyMap<string, bigint> => {
  const wanted = new Set(partitions.map(TopicPartition.key))
  const positions = new Map<string, bigint>()
  for (const [topic, partition, next] of rows) {
    const key = TopicPartition.key(TopicPartition.make(topic, Number(partition)))
    if (wanted.has(key)) positions.set(key, BigInt(next))
  }
  return positions
}
