/**
 * Where each record of a batch goes: its own partition, its key's, or its topic's sticky partition for the batch.
 */
import * as Effect from "effect/Effect"
import { ProduceFailed } from "../../KafkaError.js"
import type { ProducerRecord } from "../../Producer.js"
import { partitionOfKey } from "../shared/murmur2.js"
import { utf8Encode } from "../shared/utf8.js"
import type { Written } from "./written.js"

/** The records of one topic in a batch, as `makePartitioner` laid them out. @internal */
export interface TopicRecords {
  readonly topic: string
  /** The topic's partition count. */
  readonly count: number
  /** The places in the batch of the topic's records that can be sent, in batch order. */
  readonly indexes: ReadonlyArray<number>
}

/**
 * A batch laid out for sending: per record its partition (`-1` when it cannot be sent: its answer is in `out`); per
 * topic the records to send.
 *
 * @internal
 */
export interface Layout {
  /** The answers of the records that cannot be sent; the transport gives the others theirs. */
  readonly out: Array<Written>
  readonly partitionOf: Array<number>
  readonly topics: ReadonlyArray<TopicRecords>
}

interface TopicLayout extends TopicRecords {
  indexes: Array<number>
  /** In `topics`: a topic is listed once a record of it can be sent. */
  listed: boolean
  /** The partition of this batch's records with neither partition nor key, once one needed it. */
  sticky: number
}

/**
 * Lays out batches: each record's partition is its own, its key's (murmur2, as the Java client) or, for a record with
 * neither, the partition of its topic for this batch (sticky: one per batch, the next one for the next batch).
 * `counts` gives each topic of the batch its partition count, or why it cannot be written; a record naming a
 * partition its topic does not have is refused.
 *
 * @internal
 */
export const makePartitioner = () => {
  const sticky = new Map<string, number>()
  return (batch: ReadonlyArray<ProducerRecord>, counts: ReadonlyMap<string, number | ProduceFailed>): Layout => {
    const n = batch.length
    const out: Array<Written> = new Array(n)
    const partitionOf: Array<number> = new Array(n)
    const byTopic = new Map<string, TopicLayout>()
    const topics: Array<TopicLayout> = []
    let last: TopicLayout | undefined
    // Topics are listed in the order their first record that can be sent comes.
    for (let i = 0; i < n; i++) {
      const record = batch[i]!
      let t = last !== undefined && last.topic === record.topic ? last : byTopic.get(record.topic)
      if (t === undefined) {
        const count = counts.get(record.topic)!
        if (typeof count !== "number") {
          out[i] = count
          partitionOf[i] = -1
          continue
        }
        t = { topic: record.topic, count, indexes: [], listed: false, sticky: -1 }
        byTopic.set(record.topic, t)
      }
      last = t
      let partition: number
      if (record.partition !== undefined) {
        if (record.partition >= t.count) {
          out[i] = new ProduceFailed({
            reason: "UnknownPartition",
            topic: record.topic,
            partition: record.partition,
            detail: `${record.topic} has ${t.count} partition${t.count === 1 ? "" : "s"}`
          })
          partitionOf[i] = -1
          continue
        }
        partition = record.partition
      } else if (record.key !== undefined && record.key !== null) {
        partition = partitionOfKey(typeof record.key === "string" ? utf8Encode(record.key) : record.key, t.count)
      } else {
        if (t.sticky < 0) {
          const next = (sticky.get(t.topic) ?? Math.floor(Math.random() * t.count)) + 1
          sticky.set(t.topic, next)
          t.sticky = next % t.count
        }
        partition = t.sticky
      }
      partitionOf[i] = partition
      if (!t.listed) {
        t.listed = true
        topics.push(t)
      }
      t.indexes.push(i)
    }
    return { out, partitionOf, topics }
  }
}

/** Items grouped by key, each group in the order of `items`. @internal */
export const groupBy = <K, A>(items: Iterable<A>, key: (a: A) => K): Map<K, Array<A>> => {
  const groups = new Map<K, Array<A>>()
  for (const item of items) {
    const k = key(item)
    const group = groups.get(k)
    if (group === undefined) groups.set(k, [item])
    else group.push(item)
  }
  return groups
}

/** How long a topic's partition count is trusted before it is read again (the Java client's `metadata.max.age.ms`). */
const METADATA_MAX_AGE = 5 * 60 * 1000

/** Each topic of a batch, with the highest partition a record of it names (-1 for none). @internal */
export const highestPartitions = (batch: ReadonlyArray<ProducerRecord>): Map<string, number> => {
  const highest = new Map<string, number>()
  let last: string | undefined
  let lastHighest = -1
  for (let i = 0; i < batch.length; i++) {
    const record = batch[i]!
    if (record.topic !== last) {
      if (last !== undefined) highest.set(last, lastHighest)
      last = record.topic
      lastHighest = highest.get(last) ?? -1
    }
    if (record.partition !== undefined && record.partition > lastHighest) lastHighest = record.partition
  }
  if (last !== undefined) highest.set(last, lastHighest)
  return highest
}

/**
 * Runs `send` with the partition count of each topic of the batch, or why the topic cannot be written. A count comes
 * from `cache` unless it is missing, older than five minutes (the Java client's `metadata.max.age.ms`), or below a
 * partition a record names (the topic may have grown): then `read` reads it again (and caches it), before the batch
 * is laid out, so that records for unknown topics or partitions are refused before they are batched with others.
 *
 * @internal
 */
export const withPartitionCounts = <A>(
  batch: ReadonlyArray<ProducerRecord>,
  now: number,
  cache: ReadonlyMap<string, { readonly count: number; readonly at: number }>,
  read: (topic: string, now: number) => Effect.Effect<number | ProduceFailed>,
  send: (known: ReadonlyMap<string, number | ProduceFailed>) => Effect.Effect<A>
): Effect.Effect<A> => {
  const known = new Map<string, number | ProduceFailed>()
  let stale: Array<string> | undefined
  for (const [topic, partition] of highestPartitions(batch)) {
    const cached = cache.get(topic)
    if (cached === undefined || now - cached.at > METADATA_MAX_AGE || partition >= cached.count) {
      ;(stale ??= []).push(topic)
    } else {
      known.set(topic, cached.count)
    }
  }
  if (stale === undefined) return send(known)
  return Effect.forEach(stale, (topic) => Effect.map(read(topic, now), (count) => known.set(topic, count)), {
    discard: true
  }).pipe(Effect.zipRight(Effect.suspend(() => send(known))))
}
