/**
 * A record as the producer sees it before it is sent: its size as the batcher counts it, and the failures it can meet
 * without the cluster (refused, its topic unknown, the producer closed).
 */
import { ProduceFailed } from "../../KafkaError.js"
import type { ProducerRecord } from "../../Producer.js"
import { utf8Length } from "../shared/utf8.js"

/** Per-record overhead in a record batch (length, attributes, deltas, varint lengths), as an estimate. */
const RECORD_OVERHEAD = 21

const byteLength = (bytes: Uint8Array | string | null): number =>
  bytes === null ? 0 : typeof bytes === "string" ? utf8Length(bytes) : bytes.length

/** A record's bytes as the batcher counts them. @internal */
export const sizeOf = (record: ProducerRecord): number => {
  let size = RECORD_OVERHEAD + byteLength(record.key ?? null) + byteLength(record.value)
  if (record.headers !== undefined) {
    for (const name in record.headers) {
      const value = record.headers[name]
      if (value !== undefined) size += utf8Length(name) + byteLength(value) + 2
    }
  }
  return size
}

/** A record that cannot be sent at all, whatever the cluster says: refused before it is batched. @internal */
export const refuse = (record: ProducerRecord, size: number, maxRequestSize: number): ProduceFailed | undefined => {
  if (typeof record.topic !== "string" || record.topic.length === 0) {
    return new ProduceFailed({ reason: "UnknownTopic", topic: String(record.topic), detail: "the topic name is empty" })
  }
  if (record.partition !== undefined && (!Number.isInteger(record.partition) || record.partition < 0)) {
    return new ProduceFailed({
      reason: "UnknownPartition",
      topic: record.topic,
      detail: `partition must be a non-negative integer, got ${record.partition}`
    })
  }
  if (size > maxRequestSize) {
    return new ProduceFailed({
      reason: "RecordTooLarge",
      topic: record.topic,
      ...(record.partition === undefined ? {} : { partition: record.partition }),
      detail: `the record is ${size} bytes, more than maxRequestSize (${maxRequestSize})`
    })
  }
  return undefined
}

/** A topic that does not exist. @internal */
export const unknownTopic = (topic: string) =>
  new ProduceFailed({
    reason: "UnknownTopic",
    topic,
    code: "UNKNOWN_TOPIC_OR_PARTITION",
    detail: `topic "${topic}" does not exist`
  })

/** A record that was not written because the producer is shut down. @internal */
export const closed = (record: ProducerRecord, detail: string) =>
  new ProduceFailed({
    reason: "Closed",
    topic: record.topic,
    ...(record.partition === undefined ? {} : { partition: record.partition }),
    detail
  })
