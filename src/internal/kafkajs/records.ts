/**
 * kafkajs's messages as this library's records, and bytes as kafkajs writes them.
 */
import type { KafkaMessage } from "kafkajs"
import { type ConsumerRecord, toPlain } from "../../ConsumerRecord.js"
import type { TopicPartition } from "../../TopicPartition.js"
import { inspectSymbol } from "../shared/inspect.js"

const encoder = new TextEncoder()

/**
 * kafkajs's own `Buffer`, which is a `Uint8Array`, as it is: a view of it would cost a typed array per key and value,
 * the most expensive step of turning a kafkajs message into a record. Records are typed `Uint8Array`, and code written
 * against that works alike on both brokers.
 */
const toBytes = (value: Buffer | string): Uint8Array => typeof value === "string" ? encoder.encode(value) : value

const noHeaders: Readonly<Record<string, Uint8Array>> = Object.freeze({})

const toHeaders = (raw: KafkaMessage["headers"]): Readonly<Record<string, Uint8Array>> => {
  if (raw === undefined) return noHeaders
  let plain = true
  for (const name in raw) {
    const value = raw[name]
    if (typeof value !== "object" || Array.isArray(value)) {
      plain = false
      break
    }
  }
  // kafkajs's own object when every header is a single `Buffer`, as decoded: nothing to convert.
  if (plain) return raw as Readonly<Record<string, Buffer>>
  let headers: Record<string, Uint8Array> | undefined
  for (const name in raw) {
    const value = raw[name]
    if (value === undefined) continue
    // A header repeated in the record arrives as an array; the last value wins, as `lastHeader` does in Java.
    const last = Array.isArray(value) ? value[value.length - 1] : value
    if (last === undefined) continue
    headers ??= {}
    headers[name] = toBytes(last)
  }
  return headers ?? noHeaders
}

/**
 * An offset as kafkajs gives it (decimal text). Below 2^53 the text goes through a `number`, which costs a third of
 * parsing it as a `bigint`; a double at or below `MAX_SAFE_INTEGER` is the exact value.
 */
const toBigInt = (text: string): bigint => {
  const n = +text
  return n <= Number.MAX_SAFE_INTEGER ? BigInt(n) : BigInt(text)
}

/**
 * A record over kafkajs's message: one object of two fields, which reads each field of the record from the message
 * when it is read (the offset and the timestamp are parsed then, on every read). A plain record costs three objects
 * (the record, its `bigint` offset, its timestamp's boxed `number`) and every field converted whether read or not.
 * The fields are getters of the class, not properties of the object: `{ ...record }` and `structuredClone(record)`
 * copy none of them, and a deep equality with a plain object fails; `ConsumerRecord.toPlain` gives the plain record.
 */
class KafkaJsRecord implements ConsumerRecord {
  readonly #tp: TopicPartition
  readonly #message: KafkaMessage
  constructor(tp: TopicPartition, message: KafkaMessage) {
    this.#tp = tp
    this.#message = message
  }
  get topic(): string {
    return this.#tp.topic
  }
  get partition(): number {
    return this.#tp.partition
  }
  get offset(): bigint {
    return toBigInt(this.#message.offset)
  }
  get key(): Uint8Array | null {
    const key = this.#message.key
    return key === null || key === undefined ? null : toBytes(key)
  }
  get value(): Uint8Array | null {
    const value = this.#message.value
    return value === null ? null : toBytes(value)
  }
  get headers(): Readonly<Record<string, Uint8Array>> {
    return toHeaders(this.#message.headers)
  }
  get timestamp(): number {
    return +this.#message.timestamp
  }
  toJSON(): ConsumerRecord {
    return toPlain(this)
  }
  [inspectSymbol](): ConsumerRecord {
    return toPlain(this)
  }
}

/** @internal */
export const toConsumerRecord = (tp: TopicPartition, message: KafkaMessage): ConsumerRecord =>
  new KafkaJsRecord(tp, message)

/** @internal */
export const toBuffer = (value: string | Uint8Array): Buffer | string =>
  typeof value === "string" ? value : Buffer.from(value.buffer, value.byteOffset, value.byteLength)
