/**
 * @since 0.1.0
 */
import type { TopicPartition } from "./TopicPartition.js"

/**
 * A record as the handler sees it. Offsets are `bigint` because Kafka offsets are int64. Key, value and headers are
 * bytes as the driver has them, without a copy (on kafkajs, its `Buffer`s, which are `Uint8Array`s); read them as
 * `Uint8Array` (`valueString`, `TextDecoder`), and copy them before changing them.
 *
 * Read a record's fields; do not rely on it being a plain object. On kafkajs a record is one small object over
 * kafkajs's message that reads each field when it is read (the offset and the timestamp are parsed then, on every
 * read), so that a record costs nothing for the fields a handler does not read. Its fields are not properties of its
 * own: spreading it (`{ ...record }`), `structuredClone(record)`, `Object.keys` and a deep equality with a plain object
 * do not see them. `toPlain` gives the record as a plain object, for all of those. `JSON.stringify` and Node's
 * `inspect` see the fields as they would on a plain object. The in-memory broker's records are made the same way, so
 * that code which spreads a record fails in its tests as it would on Kafka.
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

/**
 * The record as a plain object with its seven fields as properties of its own: for spreading, `structuredClone` or a
 * deep equality, which see none of the fields of a kafkajs record. The bytes are shared, not copied.
 *
 * @since 0.1.0
 * @category accessors
 */
export const toPlain = (record: ConsumerRecord): ConsumerRecord => ({
  topic: record.topic,
  partition: record.partition,
  offset: record.offset,
  key: record.key,
  value: record.value,
  headers: record.headers,
  timestamp: record.timestamp
})
