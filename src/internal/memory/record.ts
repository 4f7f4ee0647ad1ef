import { type ConsumerRecord, toPlain } from "../../ConsumerRecord.js"
import { inspectSymbol } from "../shared/inspect.js"

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
