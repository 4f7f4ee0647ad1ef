import * as Chunk from "effect/Chunk"
import * as Effect from "effect/Effect"
import type { ConsumerRecord } from "../../ConsumerRecord.js"
import type { PartitionOffsets } from "../../Driver.js"
import { DriverError } from "../../KafkaError.js"
import type * as TopicPartition from "../../TopicPartition.js"
import { partitionOfKey } from "../shared/murmur2.js"
import { bytes, headerBytes, MemoryRecord, type ProducerRecord } from "./record.js"

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
  /** Records a read-committed consumer can read, in offset order: all below the last stable offset. */
  records: Array<ConsumerRecord>
  /** The earliest offset still in the log. */
  start: bigint
  /** The offset the next write gets (the high watermark). */
  end: bigint
  /**
   * Writes at or above the last stable offset, in offset order: the records of the oldest transaction still open and
   * everything written after its first record. They become readable (or, aborted, never) as transactions end.
   */
  held: Array<Held>
  /**
   * Every data record, those of open and aborted transactions too, as a read-uncommitted consumer reads them. Kept
   * only once the partition has had a transactional write; before that, `records` is the same list.
   */
  uncommitted: Array<ConsumerRecord> | undefined
}

/**
 * A transaction of a transactional producer, as its partitions see it.
 *
 * @internal
 */
export interface Txn {
  state: "open" | "committed" | "aborted"
}

/** @internal */
export interface Held {
  readonly record: ConsumerRecord
  readonly txn: Txn | undefined
}

/**
 * The last stable offset: what a read-committed consumer can read up to. Below it, every transaction has ended.
 *
 * @internal
 */
export const stable = (log: PartitionLog): bigint => log.held.length > 0 ? log.held[0]!.record.offset : log.end

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
  partitions: Array.from({ length: partitions }, () => ({
    records: [],
    start: 0n,
    end: 0n,
    held: [],
    uncommitted: undefined
  }))
})

/**
 * The earliest offset, the end of the log (the high watermark: this broker has one replica, so every write is
 * acknowledged by all of them at once) and the last stable offset.
 *
 * @internal
 */
export const offsets = (log: PartitionLog): PartitionOffsets => ({
  earliest: log.start,
  latest: log.end,
  lastStable: stable(log)
})

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
 * What a fetch at `position` returns: `OutOfRange` when the position is not in the log (below its start, above its
 * end); nothing when it is at or past what the consumer may read (the log's end, or for a read-committed consumer the
 * last stable offset: a position between that and the end waits for the open transaction there to end, without an
 * `OutOfRange`); else up to `max` records and the position after them. When the fetch reaches the last readable
 * record, it continues at that limit: the offsets in between hold nothing to read. A fetch that finds only such
 * offsets (a trailing marker, an aborted transaction) returns no record and the limit.
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
  return (log: PartitionLog, position: bigint, max: number, uncommitted = false): Fetched => {
    if (position < log.start || position > log.end) return outOfRange
    const records = uncommitted ? log.uncommitted ?? log.records : log.records
    // A read-committed consumer reads up to the last stable offset; a read-uncommitted one up to the high watermark.
    const limit = uncommitted ? log.end : stable(log)
    if (position >= limit) return empty
    const from = lowerBound(records, position)
    let end = Math.min(from + max, records.length)
    while (end > from && records[end - 1]!.offset >= limit) end--
    if (from >= end) return { _tag: "Records", records: Chunk.empty(), next: limit }
    return {
      _tag: "Records",
      records: slice(records, from, end),
      next: end === records.length || records[end]!.offset >= limit ? limit : records[end - 1]!.offset + 1n
    }
  }
}

/**
 * Appends records and returns the offsets they got. Behind an open transaction, what is appended waits (`held`) until
 * the transaction ends.
 *
 * @internal
 */
export const append = (
  log: PartitionLog,
  make: ReadonlyArray<(offset: bigint) => ConsumerRecord>
): Array<bigint> => {
  const out: Array<bigint> = []
  for (const build of make) {
    const offset = log.end
    const record = build(offset)
    if (log.held.length > 0) log.held.push({ record, txn: undefined })
    else log.records.push(record)
    log.uncommitted?.push(record)
    log.end = offset + 1n
    out.push(offset)
  }
  return out
}

/**
 * Appends records of an open transaction: a read-committed consumer reads them once `txn` is committed, never if it
 * is aborted; a read-uncommitted one reads them at once.
 *
 * @internal
 */
export const appendTransactional = (
  log: PartitionLog,
  make: ReadonlyArray<(offset: bigint) => ConsumerRecord>,
  txn: Txn
): Array<bigint> => {
  if (log.uncommitted === undefined) log.uncommitted = log.records.concat(log.held.map((h) => h.record))
  const out: Array<bigint> = []
  for (const build of make) {
    const offset = log.end
    const record = build(offset)
    log.held.push({ record, txn })
    log.uncommitted.push(record)
    log.end = offset + 1n
    out.push(offset)
  }
  return out
}

/**
 * A transaction marker (commit or abort): an offset that holds no record. Then what was held behind transactions
 * that have ended becomes readable, up to the oldest transaction still open.
 *
 * @internal
 */
export const appendMarker = (log: PartitionLog): void => {
  log.end = log.end + 1n
  let n = 0
  while (n < log.held.length) {
    const { record, txn } = log.held[n]!
    if (txn !== undefined && txn.state === "open") break
    if (txn === undefined || txn.state === "committed") log.records.push(record)
    n++
  }
  if (n > 0) log.held = log.held.slice(n)
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
  const keep = (record: ConsumerRecord) => record.key === null || latest.get(keyText(record.key)) === record.offset
  log.records = log.records.filter(keep)
  if (log.uncommitted !== undefined) log.uncommitted = log.uncommitted.filter(keep)
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
  if (log.uncommitted !== undefined) log.uncommitted = log.uncommitted.filter((record) => record.offset >= before)
}

/**
 * The broker's topics, and the round robin that spreads records without a key or a partition over any topic's
 * partitions.
 *
 * @internal
 */
export interface Logs {
  readonly topics: Map<string, Topic>
  roundRobin: number
}

/** @internal */
export const makeLogs = (): Logs => ({ topics: new Map(), roundRobin: 0 })

/** @internal */
export const partitionsOf = (logs: Logs, topicNames: ReadonlyArray<string>): Array<TopicPartition.TopicPartition> => {
  const out: Array<TopicPartition.TopicPartition> = []
  for (const topic of topicNames) {
    const found = logs.topics.get(topic)
    if (found !== undefined) found.partitions.forEach((_, partition) => out.push({ topic, partition }))
  }
  return out
}

/** @internal */
export const logOf = (logs: Logs, tp: TopicPartition.TopicPartition): PartitionLog | undefined =>
  logs.topics.get(tp.topic)?.partitions[tp.partition]

/** @internal */
export const topicOf = (logs: Logs, operation: string, topic: string): Effect.Effect<Topic, DriverError> =>
  Effect.suspend(() => {
    const found = logs.topics.get(topic)
    return found === undefined
      ? Effect.fail(new DriverError({ operation, reason: `unknown topic "${topic}"` }))
      : Effect.succeed(found)
  })

/**
 * What `plan` makes of a write: its records' builders by partition, and each record's partition in the order given.
 *
 * @internal
 */
export interface Plan {
  readonly byPartition: Map<number, Array<(offset: bigint) => ConsumerRecord>>
  readonly order: Array<number>
}

/**
 * The records of one write, by partition, as builders that take the offset the log gives them.
 *
 * @internal
 */
export const plan = (
  logs: Logs,
  operation: string,
  topic: Topic,
  records: ReadonlyArray<ProducerRecord>,
  now: number
): Effect.Effect<Plan, DriverError> =>
  Effect.suspend(() => {
    const byPartition = new Map<number, Array<(offset: bigint) => ConsumerRecord>>()
    const order: Array<number> = []
    const count = topic.partitions.length
    for (const r of records) {
      const key = r.key === undefined || r.key === null ? null : bytes(r.key)
      const partition = r.partition ?? (key !== null ? partitionOfKey(key, count) : logs.roundRobin++ % count)
      if (!Number.isInteger(partition) || partition < 0 || partition >= count) {
        return Effect.fail(
          new DriverError({ operation, reason: `topic "${topic.name}" has no partition ${partition}` })
        )
      }
      const headers = r.headers === undefined ? {} : headerBytes(r.headers)
      const value = r.value === null ? null : bytes(r.value)
      let list = byPartition.get(partition)
      if (list === undefined) {
        list = []
        byPartition.set(partition, list)
      }
      const timestamp = r.timestamp ?? now
      list.push((offset) => new MemoryRecord(topic.name, partition, offset, key, value, headers, timestamp))
      order.push(partition)
    }
    return Effect.succeed({ byPartition, order })
  })

/**
 * The offsets of a plan's records in the order they were given, from the offsets each partition gave its records.
 *
 * @internal
 */
export const inOrder = (
  planned: Plan,
  offsets: ReadonlyMap<number, ReadonlyArray<bigint>>
): Array<readonly [partition: number, offset: bigint]> => {
  const taken = new Map<number, number>()
  return planned.order.map((partition) => {
    const at = taken.get(partition) ?? 0
    taken.set(partition, at + 1)
    return [partition, offsets.get(partition)![at]!] as const
  })
}

/**
 * Writes a plan; the offsets come back in the order of the records given.
 *
 * @internal
 */
export const write = (
  topic: Topic,
  planned: Plan,
  transaction: "commit" | "abort" | undefined
): Array<readonly [partition: number, offset: bigint]> => {
  const offsets = new Map<number, Array<bigint>>()
  for (const [partition, builders] of planned.byPartition) {
    const log = topic.partitions[partition]!
    if (transaction === undefined) {
      offsets.set(partition, append(log, builders))
    } else {
      const txn: Txn = { state: "open" }
      offsets.set(partition, appendTransactional(log, builders, txn))
      txn.state = transaction === "commit" ? "committed" : "aborted"
      appendMarker(log)
    }
  }
  return inOrder(planned, offsets)
}
