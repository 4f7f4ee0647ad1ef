/**
 * The producer's records as the messages kafkajs sends: each names its partition, chosen by the producer.
 */
import type { Message, TopicMessages } from "kafkajs"
import type { ProducerRecord } from "../../Producer.js"
import type * as producer from "../producer/producer.js"

/** Bytes as kafkajs writes them: a string as it is (kafkajs encodes it into the request), bytes as a `Buffer`. */
const toKafka = (bytes: Uint8Array | string): Buffer | string =>
  typeof bytes === "string" || Buffer.isBuffer(bytes)
    ? bytes
    : Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength)

const isKafkaBytes = (bytes: Uint8Array | string | null | undefined): boolean =>
  bytes === undefined || bytes === null || typeof bytes === "string" || Buffer.isBuffer(bytes)

/** A record kafkajs can take as its message as it is: strings or `Buffer`s, no timestamp (kafkajs ignores `topic`). */
const isMessage = (record: ProducerRecord): record is ProducerRecord & Message =>
  record.timestamp === undefined && isKafkaBytes(record.value) && isKafkaBytes(record.key) &&
  (record.headers === undefined || Object.values(record.headers).every(isKafkaBytes))

/** The message kafkajs sends for a record: the record itself when it names its partition and kafkajs can take it. */
const toMessage = (record: ProducerRecord, partition: number): Message => {
  if (record.partition === partition && isMessage(record)) return record
  const message: Message = {
    partition,
    key: record.key === undefined || record.key === null ? null : toKafka(record.key),
    value: record.value === null ? null : toKafka(record.value)
  }
  if (record.headers !== undefined) {
    const headers: Record<string, Buffer | string> = {}
    for (const name in record.headers) {
      const value = record.headers[name]
      if (value !== undefined) headers[name] = toKafka(value)
    }
    message.headers = headers
  }
  if (record.timestamp !== undefined) message.timestamp = String(record.timestamp)
  return message
}

/** kafkajs's partitioner is never asked: every message names its partition. @internal */
export const explicitPartition = () => ({ message }: { readonly message: Message }) => message.partition ?? 0

/**
 * Per topic its messages in the order sent (so, per partition, its records in that order). A batch of one topic whose
 * records kafkajs can all take as they are is its own messages (kafkajs only reads them).
 *
 * @internal
 */
export const messagesOf = (batch: ReadonlyArray<ProducerRecord>, { partitionOf, topics }: producer.Layout) => {
  const topicMessages: Array<TopicMessages> = new Array(topics.length)
  for (let t = 0; t < topics.length; t++) {
    const { indexes, topic } = topics[t]!
    // Places that are all of the batch are 0 to n - 1, so a record's message goes at its own place.
    const all = indexes.length === batch.length
    let messages: Array<Message> | undefined
    for (let j = 0; j < indexes.length; j++) {
      const i = indexes[j]!
      const record = batch[i]!
      const message = toMessage(record, partitionOf[i]!)
      if (messages === undefined) {
        if (all && (message as unknown) === record) continue
        messages = new Array(indexes.length)
        for (let k = 0; k < j; k++) messages[k] = batch[indexes[k]!] as unknown as Message
      }
      messages[j] = message
    }
    topicMessages[t] = { topic, messages: messages ?? (batch as unknown as Array<Message>) }
  }
  return topicMessages
}
