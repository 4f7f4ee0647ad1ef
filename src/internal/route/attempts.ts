/**
 * The failed attempts the route counts of the records it may set aside: how many times a record failed is written
 * into its dead letter.
 *
 * @internal
 */
import type * as Chunk from "effect/Chunk"
import * as Effect from "effect/Effect"
import type { ConsumerRecord } from "../../ConsumerRecord.js"
import * as TopicPartition from "../../TopicPartition.js"
import { failedOffset, type Fatal, HandlerFailure } from "./failures.js"

/**
 * Failed attempts of records not handled or routed yet, by partition key, then offset. A record's count goes when it
 * is handled or routed, and a partition's below its position, or all of them when it is assigned anew.
 */
export type Attempts = Map<string, Map<bigint, number>>

/** The records of `records` no longer fail: their counts go (a partition with none costs a lookup). */
export const succeeded = (
  attempts: Attempts,
  tp: TopicPartition.TopicPartition,
  records: Chunk.Chunk<ConsumerRecord>
) => {
  if (attempts.size === 0) return
  const counts = attempts.get(TopicPartition.key(tp))
  if (counts === undefined) return
  for (const record of records) counts.delete(record.offset)
  if (counts.size === 0) attempts.delete(TopicPartition.key(tp))
}

/** The failed attempts of the record at `offset` of partition `k`, when it failed. */
export const attemptsOf = (attempts: Attempts, k: string, offset: bigint) => attempts.get(k)?.get(offset)

/** The record at `offset` of partition `k` was routed: its count goes. */
export const dropAttempt = (attempts: Attempts, k: string, offset: bigint) => {
  const counts = attempts.get(k)
  if (counts === undefined) return
  counts.delete(offset)
  if (counts.size === 0) attempts.delete(k)
}

/** One more failed attempt of the record at `offset` of partition `k`. */
export const failedOnce = (attempts: Attempts, k: string, offset: bigint) => {
  let counts = attempts.get(k)
  if (counts === undefined) {
    counts = new Map()
    attempts.set(k, counts)
  }
  counts.set(offset, (counts.get(offset) ?? 0) + 1)
}

/** `effect`, a run of the handler on `records`, with its failure counted against the record it names. */
export const counted = <E, R>(
  attempts: Attempts,
  tp: TopicPartition.TopicPartition,
  records: Chunk.Chunk<ConsumerRecord>,
  effect: Effect.Effect<void, HandlerFailure<E> | Fatal, R>
) =>
  Effect.tapError(effect, (failure) =>
    Effect.sync(() => {
      if (!(failure instanceof HandlerFailure)) return
      const offset = failedOffset(failure, records)
      if (offset === undefined) return
      failedOnce(attempts, TopicPartition.key(tp), offset)
    }))

/** The partition's position passed `position`: the counts of the records below it go. */
export const passed = (attempts: Attempts, k: string, position: bigint) => {
  const counts = attempts.get(k)
  if (counts === undefined) return
  for (const offset of counts.keys()) if (offset < position) counts.delete(offset)
  if (counts.size === 0) attempts.delete(k)
}

/** How many records have failed attempts counted. */
export const size = (attempts: Attempts): number => {
  let n = 0
  for (const counts of attempts.values()) n += counts.size
  return n
}
