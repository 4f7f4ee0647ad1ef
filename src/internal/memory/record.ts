import { type ConsumerRecord, toPlain } from "../../ConsumerRecord.js"
import type { ProducerRecord as TopicRecord } from "../../Producer.js"
import { inspectSymbol } from "../shared/inspect.js"
import { utf8EncodeInto, utf8Length } from "../shared/utf8.js"

/**
 * A record to produce to a topic given apart: the `Producer`'s record without its topic.
 *
 * @internal
 */
export type ProducerRecord = Omit<TopicRecord, "topic">

const encoder = new TextEncoder()

/** @internal */
export const bytes = (value: Uint8Array | string): Uint8Array =>
  typeof value === "string" ? encoder.encode(value) : value

/**
 * A record's headers as bytes: string values are encoded into one array, each header a view of its part of it (a
 * dead letter's eight headers are one allocation, not eight).
 *
 * @internal
 */
export const headerBytes = (given: Readonly<Record<string, Uint8Array | string>>): Record<string, Uint8Array> => {
  const entries = Object.entries(given)
  let size = 0
  for (const [, value] of entries) if (typeof value === "string") size += utf8Length(value)
  const all = new Uint8Array(size)
  const headers: Record<string, Uint8Array> = {}
  let at = 0
  for (const [name, value] of entries) {
    if (typeof value !== "string") {
      headers[name] = value
      continue
    }
    const end = utf8EncodeInto(value, all, at)
    headers[name] = all.subarray(at, end)
    at = end
  }
  return headers
}

/**
 * A record of the in-memory broker. Its fields are read through getters, as a kafkajs record's are, so that code
 * which spreads, clones or compares whole records (which sees none of the fields of either) fails in tests on the
 * in-memory broker as it would on Kafka, rather than pass there and break in production. `ConsumerRecord.toPlain`
 * gives the plain object.
 *
 * @internal
 */
export class MemoryRecord implements ConsumerRecord {
  readonly #topic: string
  readonly #partition: number
  readonly #offset: bigint
  readonly #key: Uint8Array | null
  readonly #value: Uint8Array | null
  readonly #headers: Readonly<Record<string, Uint8Array>>
  readonly #timestamp: number
  constructor(
    topic: string,
    partition: number,
    offset: bigint,
    key: Uint8Array | null,
    value: Uint8Array | null,
    headers: Readonly<Record<string, Uint8Array>>,
    timestamp: number
  ) {
    this.#topic = topic
    this.#partition = partition
    this.#offset = offset
    this.#key = key
    this.#value = value
    this.#headers = headers
    this.#timestamp = timestamp
  }
  get topic(): string {
    return this.#topic
  }
  get partition(): number {
    return this.#partition
  }
  get offset(): bigint {
    return this.#offset
  }
  get key(): Uint8Array | null {
    return this.#key
  }
  get value(): Uint8Array | null {
    return this.#value
  }
  get headers(): Readonly<Record<string, Uint8Array>> {
    return this.#headers
  }
  get timestamp(): number {
    return this.#timestamp
  }
  toJSON(): ConsumerRecord {
    return toPlain(this)
  }
  [inspectSymbol](): ConsumerRecord {
    return toPlain(this)
  }
}
