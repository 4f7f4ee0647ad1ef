import * as Chunk from "effect/Chunk"
import * as Effect from "effect/Effect"
import type { ConsumerRecord } from "../ConsumerRecord.js"

/**
 * Which records of a partition are handled one after another: all of them (`partition`), those with the same key
 * (`key`; a record without a key is ordered with nothing), or none (`unordered`).
 */
export type Ordering = "partition" | "key" | "unordered"

/** A key's bytes as a string that equals another key's exactly when their bytes do. */
const keyText = (key: Uint8Array): string => {
  let text = ""
  for (let at = 0; at < key.length; at += 4096) {
    text += String.fromCharCode.apply(null, Array.from(key.subarray(at, at + 4096)))
  }
  return text
}

/**
 * A chunk split into lanes: the records of a lane are handled one after another in offset order, lanes side by side.
 * Each lane keeps its records in the chunk's order; lanes come in the order of their first record.
 */
export const lanes = (
  records: Chunk.Chunk<ConsumerRecord>,
  ordering: Exclude<Ordering, "partition">
): ReadonlyArray<Chunk.Chunk<ConsumerRecord>> => {
  if (ordering === "unordered") return Chunk.toReadonlyArray(records).map((r) => Chunk.of(r))
  const byKey = new Map<string, Array<ConsumerRecord>>()
  const out: Array<Array<ConsumerRecord>> = []
  for (const record of records) {
    if (record.key === null) {
      out.push([record])
      continue
    }
    const k = keyText(record.key)
    const lane = byKey.get(k)
    if (lane !== undefined) {
      lane.push(record)
      continue
    }
    const fresh = [record]
    byKey.set(k, fresh)
    out.push(fresh)
  }
  return out.map((lane) => Chunk.unsafeFromArray(lane))
}

/**
 * A chunk handled lane by lane, at most `concurrency` lanes at a time (the caller holds one of the consumer's permits
 * around each handler call, which bounds handlers across partitions). The chunk is done when every lane is; the first
 * failure interrupts the other lanes and fails the chunk, which the policy then retries or ends with as it would a
 * chunk handled in order.
 */
export const concurrently = <E, R>(
  records: Chunk.Chunk<ConsumerRecord>,
  ordering: Exclude<Ordering, "partition">,
  concurrency: number,
  handle: (lane: Chunk.Chunk<ConsumerRecord>) => Effect.Effect<void, E, R>
): Effect.Effect<void, E, R> => {
  const split = lanes(records, ordering)
  if (split.length === 1) return handle(split[0]!)
  return Effect.forEach(split, handle, { concurrency, discard: true })
}
