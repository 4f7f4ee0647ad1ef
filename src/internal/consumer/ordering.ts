import * as Chunk from "effect/Chunk"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import type { ConsumerRecord } from "../../ConsumerRecord.js"
import type { Permits } from "./permits.js"

/**
 * Which records of a partition are handled one after another: all of them (`partition`), those with the same key
 * (`key`; a record without a key is ordered with nothing), or none (`unordered`).
 */
export type Ordering = "partition" | "key" | "unordered"

/** A key's bytes as a string that equals another key's exactly when their bytes do. */
export const keyText = (key: Uint8Array): string => {
  let text = ""
  for (let i = 0; i < key.length; i++) text += String.fromCharCode(key[i]!)
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
 * A chunk handled lane by lane, lanes side by side: worker fibers take the lanes in turn (with many keys a lane is a
 * record or two, and a fiber per lane would cost more than its records), each holding one of the consumer's `permits`
 * while it works, which bounds the handler calls in flight over all partitions. A worker is started only once a
 * permit is there, up to `concurrency` per chunk, and only while lanes are left. The chunk is done when every lane
 * is; a failure ends it with the first failure met, the other workers interrupted, and the policy then retries the
 * chunk or ends with it as it would a chunk handled in order.
 */
export const concurrently = <E, R>(
  records: Chunk.Chunk<ConsumerRecord>,
  ordering: Exclude<Ordering, "partition">,
  permits: Permits,
  concurrency: number,
  handle: (lane: Chunk.Chunk<ConsumerRecord>) => Effect.Effect<void, E, R>
): Effect.Effect<void, E, R> => {
  const split = lanes(records, ordering)
  // Each run starts from the first lane: the policy runs the effect again to retry the chunk.
  return Effect.suspend(() => {
    let next = 0
    const work: Effect.Effect<void, E, R> = Effect.suspend(() =>
      next >= split.length ? Effect.void : Effect.zipRight(handle(split[next++]!), work)
    )
    if (split.length === 1) return permits.withPermit(work)
    const workers: Array<Fiber.RuntimeFiber<void, E>> = []
    const start: Effect.Effect<void, never, R> = Effect.suspend(() =>
      next >= split.length || workers.length >= concurrency
        ? Effect.void
        : Effect.flatMap(permits.forkWithPermit(work), (fiber) => {
          workers.push(fiber)
          return start
        })
    )
    return Effect.zipRight(start, Effect.forEach(workers, Fiber.join, { discard: true })).pipe(
      Effect.onExit((exit) => Exit.isSuccess(exit) ? Effect.void : Fiber.interruptAll(workers))
    )
  })
}
