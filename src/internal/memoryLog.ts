import * as Chunk from "effect/Chunk"
import type { ConsumerRecord } from "../ConsumerRecord.js"
import type { PartitionOffsets } from "../Driver.js"

/**
 * One partition's log as a read-committed consumer sees it. Offsets are not contiguous: a transaction's commit or
 * abort marker takes an offset, an aborted transaction's records take offsets and are never read, compaction removes
 * records and retention (`deleteRecords`) moves `start` up.
 *
 * `records` only grows by `push`. Compaction and deletion replace the array instead of changing it, so that a chunk
 * handed out as a view of it keeps covering what it covered.
 *
 * @internal
 */
export interface PartitionLog {
  /** Readable records, in offset order. */
  records: Array<ConsumerRecord>
  /** The earliest offset still in the log. */
  start: bigint
  /** The offset the next write gets (the high watermark). */
  end: bigint
}

/** @internal */
export interface Topic {
  readonly name: string
  readonly partitions: ReadonlyArray<PartitionLog>
  /** Compaction runs only on topics created compacted (`cleanup.policy=compact`). */
  readonly compacted: boolean
}

/** @internal */
export const makeTopic = (name: string, partitions: number, compacted: boolean): Topic => ({
  name,
  compacted,
  partitions: Array.from({ length: partitions }, () => ({ records: [], start: 0n, end: 0n }))
})

/** @internal */
export const offsets = (log: PartitionLog): PartitionOffsets => ({ earliest: log.start, latest: log.end })

/**
 * The index of the first record at or above `position`. Without gaps that is `position` minus the first offset, which
 * is tried first; with gaps, a binary search.
 */
const lowerBound = (records: ReadonlyArray<ConsumerRecord>, position: bigint): number => {
  if (records.length === 0) return 0
  const guess = Number(position - records[0]!.offset)
  if (guess <= 0) return 0
  if (guess < records.length && records[guess]!.offset === position) return guess
  let low = 0
  let high = records.length
  while (low < high) {
    const mid = (low + high) >>> 1
    if (records[mid]!.offset < position) low = mid + 1
    else high = mid
  }
  return low
}

/**
 * What a fetch at `position` returns: `OutOfRange` when the position is not in the log; nothing when it is at the
 * log's end; else up to `max` records and the position after them. When the fetch reaches the last readable record,
 * it continues at the log's end: the offsets in between hold nothing to read. A fetch that finds only such offsets
 * (a trailing marker, an aborted transaction) returns no record and the log's end.
 *
 * @internal
 */
export type Fetched =
  | { readonly _tag: "OutOfRange" }
  | { readonly _tag: "Empty" }
  | { readonly _tag: "Records"; readonly records: Chunk.Chunk<ConsumerRecord>; readonly next: bigint }

const outOfRange: Fetched = { _tag: "OutOfRange" }
const empty: Fetched = { _tag: "Empty" }

/**
 * Fetched records are views of the log, not copies: a slice of a chunk over the log array as long as it was when the
 * view was made. The array only grows, so what a slice covers never changes. The chunk over the whole array is never
 * handed out, since it wraps the array that grows.
 *
 * @internal
 */
export const makeReader = () => {
  const views = new WeakMap<Array<ConsumerRecord>, Chunk.Chunk<ConsumerRecord>>()
  const slice = (records: Array<ConsumerRecord>, from: number, end: number): Chunk.Chunk<ConsumerRecord> => {
    if (from === 0 && end === records.length) return Chunk.unsafeFromArray(records.slice(from, end))
    let view = views.get(records)
    if (view === undefined || Chunk.size(view) !== records.length) {
      view = Chunk.unsafeFromArray(records)
      views.set(records, view)
    }
    return Chunk.take(Chunk.drop(view, from), end - from)
  }
  return (log: PartitionLog, position: bigint, max: number): Fetched => {
    if (position < log.start || position > log.end) return outOfRange
    const records = log.records
    const from = lowerBound(records, position)
    if (from >= records.length) {
      return position < log.end ? { _tag: "Records", records: Chunk.empty(), next: log.end } : empty
    }
    const end = Math.min(from + max, records.length)
    return {
      _tag: "Records",
      records: slice(records, from, end),
      next: end === records.length ? log.end : records[end - 1]!.offset + 1n
    }
  }
}

/**
 * Appends records (`visible`) or an aborted transaction's records (not visible: they only take offsets), and returns
 * the offsets they got.
 *
 * @internal
 */
export const append = (
  log: PartitionLog,
  make: ReadonlyArray<(offset: bigint) => ConsumerRecord>,
  visible: boolean
): Array<bigint> => {
  const out: Array<bigint> = []
  for (const build of make) {
    const offset = log.end
    if (visible) log.records.push(build(offset))
    log.end = offset + 1n
    out.push(offset)
  }
  return out
}

/**
 * A transaction marker (commit or abort): an offset that holds no record.
 *
 * @internal
 */
export const appendMarker = (log: PartitionLog): void => {
  log.end = log.end + 1n
}

const keyText = (key: Uint8Array): string => {
  let out = ""
  for (let i = 0; i < key.length; i++) out += String.fromCharCode(key[i]!)
  return out
}

/**
 * Keeps only the latest record of each key, as Kafka's log cleaner does; records without a key are kept.
 *
 * @internal
 */
export const compact = (log: PartitionLog): void => {
  const latest = new Map<string, bigint>()
  for (const record of log.records) {
    if (record.key !== null) latest.set(keyText(record.key), record.offset)
  }
  log.records = log.records.filter((record) => record.key === null || latest.get(keyText(record.key)) === record.offset)
}

/**
 * Removes the records below `before`, which becomes the earliest offset (Kafka's DeleteRecords).
 *
 * @internal
 */
export const deleteBefore = (log: PartitionLog, before: bigint): void => {
  if (before <= log.start) return
  log.start = before
  log.records = log.records.filter((record) => record.offset >= before)
}
