/**
 * @since 0.1.0
 */
import type { TopicPartition } from "./TopicPartition.js"

/**
 * A record as the handler sees it. Offsets are `bigint` because Kafka offsets are int64. Key, value and headers are
 * bytes as the driver has them, without a copy (on kafkajs, its `Buffer`s, which are `Uint8Array`s); read them as
 * `Uint8Array` (`valueString`, `TextDecoder`), and copy them before changing them.
 *
 * @since 0.1.0
 * @category models
 */
export interface ConsumerRecord {
  readonly topic: string
  readonly partition: number
  readonly offset: bigint
  readonly key: Uint8Array | null
  readonly value: Uint8Array | null
  readonly headers: Readonly<Record<string, Uint8Array>>
  readonly timestamp: number
}

/**
 * The position to commit once this record is processed: the next offset to read. This is the one place the library
 * adds 1 to an offset.
 *
 * @since 0.1.0
 * @category positions
 */
export const nextPosition = (record: ConsumerRecord): bigint => record.offset + 1n

/**
 * @since 0.1.0
 * @category accessors
 */
export const topicPartition = (record: ConsumerRecord): TopicPartition => ({
  topic: record.topic,
  partition: record.partition
})

const decoder = new TextDecoder()

/**
 * The value decoded as UTF-8, or `null` for a tombstone.
 *
 * @since 0.1.0
 * @category accessors
 */
export const valueString = (record: ConsumerRecord): string | null =>
  record.value === null ? null : decoder.decode(record.value)

/**
 * The key decoded as UTF-8, or `null` when the record has no key.
 *
 * @since 0.1.0
 * @category accessors
 */
export const keyString = (record: ConsumerRecord): string | null =>
  record.key === null ? null : decoder.decode(record.key)
