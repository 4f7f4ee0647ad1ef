/**
 * A partition's fetched record batches as the library's records: the offsets from the fetch position on, without
 * the records of aborted transactions (read committed) nor the transaction markers, and the offset after the last
 * batch, where the next fetch starts.
 */
import { type ConsumerRecord, toPlain } from "../../ConsumerRecord.js"
import { inspectSymbol } from "../shared/inspect.js"

/** A fetched record as @platformatic/kafka decodes it (its `KafkaRecord`). @internal */
export interface RawRecord {
  readonly attributes: number
  readonly timestampDelta: bigint
  readonly offsetDelta: number
  readonly key: Uint8Array | null
  readonly value: Uint8Array | null
  readonly headers: ReadonlyArray<readonly [Uint8Array | null, Uint8Array | null]>
}

/** A fetched record batch as @platformatic/kafka decodes it (its `RecordsBatch`). @internal */
export interface RawBatch {
  readonly firstOffset: bigint
  readonly attributes: number
  readonly lastOffsetDelta: number
  readonly firstTimestamp: bigint
  readonly maxTimestamp: bigint
  readonly producerId: bigint
  readonly records: ReadonlyArray<RawRecord>
}

/** An aborted transaction a fetch response lists: its producer and its first offset. @internal */
export interface AbortedTransaction {
  readonly producerId: bigint
  readonly firstOffset: bigint
}

const LOG_APPEND_TIME = 0x08
const TRANSACTIONAL = 0x10
const CONTROL = 0x20

const noHeaders: Readonly<Record<string, Uint8Array>> = Object.freeze({})
const empty = new Uint8Array(0)
const decoder = new TextDecoder()

const toHeaders = (raw: RawRecord["headers"]): Readonly<Record<string, Uint8Array>> => {
  if (raw.length === 0) return noHeaders
  const headers: Record<string, Uint8Array> = {}
  // A header repeated in the record: the last value wins, as `lastHeader` does in Java.
  for (const [name, value] of raw) if (name !== null) headers[decoder.decode(name)] = value ?? empty
  return headers
}

/** Whether a control batch is an abort marker: its record's key is (version, type) with type 0. */
const isAbortMarker = (batch: RawBatch): boolean => {
  const key = batch.records[0]?.key
  return key !== null && key !== undefined && key.length >= 4 && ((key[2]! << 8) | key[3]!) === 0
}

/**
 * A record over the client's decoded record: the fields are getters of the class, read from it when they are read,
 * not properties of the object, as on the other drivers: `{ ...record }` copies none of them;
 * `ConsumerRecord.toPlain` gives the plain record.
 */
class PlatformaticRecord implements ConsumerRecord {
  readonly #topic: string
  readonly #partition: number
  readonly #offset: bigint
  readonly #record: RawRecord
  readonly #timestamp: number
  constructor(topic: string, partition: number, offset: bigint, record: RawRecord, timestamp: number) {
    this.#topic = topic
    this.#partition = partition
    this.#offset = offset
    this.#record = record
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
    return this.#record.key
  }
  get value(): Uint8Array | null {
    return this.#record.value
  }
  get headers(): Readonly<Record<string, Uint8Array>> {
    return toHeaders(this.#record.headers)
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

/** What one partition's fetch gave: its records from `from` on, and where the next fetch starts. @internal */
export interface Fetched {
  readonly records: Array<ConsumerRecord>
  /** The offset after the last batch; `undefined` when the fetch held no batch at or past `from`. */
  readonly next: bigint | undefined
}

/**
 * The records of a partition's batches at offsets from `from` on. Read committed, the batches of a producer's aborted
 * transaction are left out (as the Java consumer does: a producer is aborting from its aborted transaction's first
 * offset until its abort marker), so that a response cut before the marker cannot hand them over.
 *
 * @internal
 */
export const toRecords = (
  topic: string,
  partition: number,
  from: bigint,
  batches: ReadonlyArray<RawBatch>,
  aborted: ReadonlyArray<AbortedTransaction> | null,
  readCommitted: boolean
): Fetched => {
  const records: Array<ConsumerRecord> = []
  let next: bigint | undefined
  const pending = readCommitted && aborted !== null && aborted.length > 0
    ? [...aborted].sort((a, b) => (a.firstOffset < b.firstOffset ? -1 : a.firstOffset > b.firstOffset ? 1 : 0))
    : []
  const aborting = new Set<bigint>()
  for (const batch of batches) {
    const last = batch.firstOffset + BigInt(batch.lastOffsetDelta)
    if (last < from) continue
    next = next === undefined || last + 1n > next ? last + 1n : next
    while (pending.length > 0 && pending[0]!.firstOffset <= last) aborting.add(pending.shift()!.producerId)
    if ((batch.attributes & CONTROL) !== 0) {
      if (isAbortMarker(batch)) aborting.delete(batch.producerId)
      continue
    }
    if (readCommitted && (batch.attributes & TRANSACTIONAL) !== 0 && aborting.has(batch.producerId)) continue
    const logAppend = (batch.attributes & LOG_APPEND_TIME) !== 0
    for (const record of batch.records) {
      const offset = batch.firstOffset + BigInt(record.offsetDelta)
      if (offset < from) continue
      records.push(
        new PlatformaticRecord(
          topic,
          partition,
          offset,
          record,
          Number(logAppend ? batch.maxTimestamp : batch.firstTimestamp + record.timestampDelta)
        )
      )
    }
  }
  return { records, next }
}
