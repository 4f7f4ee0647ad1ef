/**
 * What the stores on a database server share in a claim: the partitions in the order their rows are locked, and a
 * claimed row as the `Claim` the policy gets.
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
