/**
 * @since 0.1.0
 */
/**
 * A partition of a topic: the unit of order, of assignment and of committed position.
 *
 * @since 0.1.0
 * @category models
 */
export interface TopicPartition {
  readonly topic: string
  readonly partition: number
}

/**
 * @since 0.1.0
 * @category constructors
 */
export const make = (topic: string, partition: number): TopicPartition => ({ topic, partition })

/**
 * A string key for a partition, `topic-partition` as Kafka tools print it; used to key maps.
 *
 * @example
 * ```ts
 * import { TopicPartition } from "effect-kafka-delivery"
 *
 * const key = TopicPartition.key(TopicPartition.make("orders", 3))
 * assert.strictEqual(key, "orders-3")
 * assert.deepStrictEqual(TopicPartition.fromKey(key), { topic: "orders", partition: 3 })
 * ```
 *
 * @since 0.1.0
 * @category keys
 */
export const key = (tp: TopicPartition): string => `${tp.topic}-${tp.partition}`

/**
 * Parses a key made by {@link key} back into a partition.
 *
 * @since 0.1.0
 * @category keys
 */
export const fromKey = (key: string): TopicPartition => {
  const at = key.lastIndexOf("-")
  return { topic: key.slice(0, at), partition: Number(key.slice(at + 1)) }
}

/**
 * @since 0.1.0
 * @category equivalence
 */
export const equals = (self: TopicPartition, that: TopicPartition): boolean =>
  self.topic === that.topic && self.partition === that.partition

/**
 * Orders partitions by topic, then partition number.
 *
 * @since 0.1.0
 * @category ordering
 */
export const compare = (self: TopicPartition, that: TopicPartition): number =>
  self.topic < that.topic ? -1 : self.topic > that.topic ? 1 : self.partition - that.partition
