/**
 * @since 0.1.0
 */
import { dual } from "effect/Function"
import * as TopicPartition from "./TopicPartition.js"

/**
 * Positions to commit, one per partition. Merging keeps the highest position per partition, so commits requested
 * out of order never move a partition backwards.
 *
 * @since 0.1.0
 * @category models
 */
export interface OffsetBatch {
  readonly positions: ReadonlyMap<string, bigint>
  /**
   * Metadata committed with a partition's position (the offset commit's metadata string), by partition key. It
   * belongs to its position: a batch that moves a partition to a higher position drops the metadata of the lower one.
   */
  readonly metadata?: ReadonlyMap<string, string>
}

/**
 * @since 0.1.0
 * @category constructors
 */
export const empty: OffsetBatch = { positions: new Map() }

/**
 * @since 0.1.0
 * @category constructors
 */
export const of = (tp: TopicPartition.TopicPartition, position: bigint): OffsetBatch => ({
  positions: new Map([[TopicPartition.key(tp), position]])
})

/**
 * @since 0.1.0
 * @category constructors
 */
export const fromIterable = (
  entries: Iterable<readonly [TopicPartition.TopicPartition, bigint]>
): OffsetBatch => {
  let batch = empty
  for (const [tp, position] of entries) batch = add(batch, tp, position)
  return batch
}

/**
 * Adds a position, keeping the highest one for the partition.
 *
 * @since 0.1.0
 * @category combinators
 */
export const add: {
  (tp: TopicPartition.TopicPartition, position: bigint): (self: OffsetBatch) => OffsetBatch
  (self: OffsetBatch, tp: TopicPartition.TopicPartition, position: bigint): OffsetBatch
} = dual(3, (self: OffsetBatch, tp: TopicPartition.TopicPartition, position: bigint): OffsetBatch => {
  const k = TopicPartition.key(tp)
  const current = self.positions.get(k)
  if (current !== undefined && current >= position) return self
  const positions = new Map(self.positions)
  positions.set(k, position)
  if (self.metadata === undefined || !self.metadata.has(k)) return withMetadata(positions, self.metadata)
  const metadata = new Map(self.metadata)
  metadata.delete(k)
  return withMetadata(positions, metadata)
})

const withMetadata = (
  positions: ReadonlyMap<string, bigint>,
  metadata: ReadonlyMap<string, string> | undefined
): OffsetBatch => metadata === undefined || metadata.size === 0 ? { positions } : { positions, metadata }

/**
 * A position with the metadata to commit with it.
 *
 * @since 0.1.0
 * @category constructors
 */
export const ofMetadata = (tp: TopicPartition.TopicPartition, position: bigint, metadata: string): OffsetBatch => ({
  positions: new Map([[TopicPartition.key(tp), position]]),
  metadata: new Map([[TopicPartition.key(tp), metadata]])
})

/**
 * The metadata a batch commits with a partition's position, if the batch carries some.
 *
 * @since 0.1.0
 * @category accessors
 */
export const metadataOf = (self: OffsetBatch, tp: TopicPartition.TopicPartition): string | undefined =>
  self.metadata?.get(TopicPartition.key(tp))

/**
 * Merges two batches, keeping the highest position per partition.
 *
 * @example
 * ```ts
 * import { OffsetBatch, TopicPartition } from "effect-kafka-delivery"
 *
 * const p0 = TopicPartition.make("orders", 0)
 * const p1 = TopicPartition.make("orders", 1)
 * const merged = OffsetBatch.merge(OffsetBatch.of(p0, 10n), OffsetBatch.fromIterable([[p0, 7n], [p1, 3n]]))
 * assert.strictEqual(OffsetBatch.get(merged, p0), 10n)
 * assert.strictEqual(OffsetBatch.get(merged, p1), 3n)
 * ```
 *
 * @since 0.1.0
 * @category combinators
 */
export const merge: {
  (that: OffsetBatch): (self: OffsetBatch) => OffsetBatch
  (self: OffsetBatch, that: OffsetBatch): OffsetBatch
} = dual(2, (self: OffsetBatch, that: OffsetBatch): OffsetBatch => {
  if (that.positions.size === 0) return self
  if (self.positions.size === 0) return that
  const positions = new Map(self.positions)
  const metadata = new Map(self.metadata ?? [])
  for (const [k, position] of that.positions) {
    const current = positions.get(k)
    if (current !== undefined && position <= current) continue
    positions.set(k, position)
    const text = that.metadata?.get(k)
    if (text === undefined) metadata.delete(k)
    else metadata.set(k, text)
  }
  return withMetadata(positions, metadata)
})

/**
 * Drops the given partitions from the batch.
 *
 * @since 0.1.0
 * @category combinators
 */
export const without: {
  (tps: Iterable<TopicPartition.TopicPartition>): (self: OffsetBatch) => OffsetBatch
  (self: OffsetBatch, tps: Iterable<TopicPartition.TopicPartition>): OffsetBatch
} = dual(2, (self: OffsetBatch, tps: Iterable<TopicPartition.TopicPartition>): OffsetBatch => {
  const positions = new Map(self.positions)
  const metadata = new Map(self.metadata ?? [])
  for (const tp of tps) {
    positions.delete(TopicPartition.key(tp))
    metadata.delete(TopicPartition.key(tp))
  }
  return withMetadata(positions, metadata)
})

/**
 * @since 0.1.0
 * @category accessors
 */
export const get = (self: OffsetBatch, tp: TopicPartition.TopicPartition): bigint | undefined =>
  self.positions.get(TopicPartition.key(tp))

/**
 * @since 0.1.0
 * @category accessors
 */
export const isEmpty = (self: OffsetBatch): boolean => self.positions.size === 0

/**
 * @since 0.1.0
 * @category accessors
 */
export const entries = (self: OffsetBatch): Array<readonly [TopicPartition.TopicPartition, bigint]> =>
  Array.from(self.positions, ([k, position]) => [TopicPartition.fromKey(k), position] as const)
