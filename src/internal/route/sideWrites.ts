/**
 * The route's writes apart from the units that routed their records (`SideWrites`), batched into one `sendAll`.
 *
 * @internal
 */
import * as Cause from "effect/Cause"
import * as Clock from "effect/Clock"
import type * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Option from "effect/Option"
import { ProduceFailed } from "../../KafkaError.js"
import { Producer, type ProducerRecord, type RecordMetadata } from "../../Producer.js"
import { Fatal } from "./failures.js"

/**
 * The route's writes apart from the units that routed their records, under a policy whose commits wait for them
 * (`PolicyInstance.awaitsRoutes`): a unit goes on, and a commit, once it has taken the positions it carries, waits
 * for every record routed so far to be acknowledged. A write that failed stays failed: no later commit passes it.
 *
 * Routed records are written together, with one `sendAll`: the first of them waits up to `maxWait` for others
 * (or less, when a commit needs them first), so that failures coming one after another cost one request per batch
 * rather than one per record, and no fiber per record. A record not written yet holds no commit back that it is not
 * part of, and is written again by the partition's next owner should this member stop before writing it: no commit
 * passed it.
 */
export interface SideWrites {
  /** Queues a routed record; `written` runs once it is acknowledged. */
  readonly start: (
    record: ProducerRecord,
    written: (metadata: RecordMetadata) => Effect.Effect<void>
  ) => Effect.Effect<void>
  /**
   * Writes every record routed so far and waits for them: `undefined` when all were acknowledged, else the first
   * failure.
   */
  readonly settled: Effect.Effect<Fatal | undefined>
  /**
   * When the session has ended (after its last commit): writes what is still queued and lets the writes in flight
   * end, for up to `patience`, so that a record routed just before a failure ended the consumer is not left
   * half-sent; then stops the rest. With no patience (a crash), what was not handed to the producer is dropped.
   */
  readonly close: (patience: Duration.Duration) => Effect.Effect<void>
}

interface Queued {
  readonly record: ProducerRecord
  readonly written: (metadata: RecordMetadata) => Effect.Effect<void>
}

export const makeSideWrites = (maxWait: Duration.Duration): SideWrites => {
  let queue: Array<Queued> = []
  /** When the oldest record of `queue` was queued. */
  let since = 0
  let producer: Context.Tag.Service<typeof Producer> | undefined
  /** The batches handed to the producer and not answered yet. */
  const inFlight = new Set<Fiber.RuntimeFiber<void>>()
  let timer: Fiber.RuntimeFiber<void> | undefined
  /** A timer fiber will write the queue. */
  let armed = false
  let closed = false
  let failed: Fatal | undefined
  const waitMillis = Duration.toMillis(maxWait)

  const write = (batch: ReadonlyArray<Queued>, send: Context.Tag.Service<typeof Producer>["sendAll"]) =>
    Effect.matchCauseEffect(send(batch.map((queued) => queued.record)), {
      onSuccess: (metadata) => Effect.forEach(batch, (queued, i) => queued.written(metadata[i]!), { discard: true }),
      onFailure: (cause) =>
        Effect.sync(() => {
          const failure = Cause.failureOption(cause)
          failed ??= new Fatal(
            Option.isSome(failure) ? failure.value : new ProduceFailed({
              reason: "Other",
              topic: batch[0]!.record.topic,
              detail: `the write ended without an answer: ${Cause.pretty(cause)}`
            })
          )
        })
    })

  /** Hands what is queued to the producer, in a fiber of its own. */
  const flush: Effect.Effect<void> = Effect.suspend(() => {
    if (queue.length === 0 || producer === undefined) return Effect.void
    const batch = queue
    queue = []
    return Effect.flatMap(Effect.forkDaemon(write(batch, producer.sendAll)), (fiber) =>
      Effect.sync(() => {
        inFlight.add(fiber)
        fiber.addObserver(() => inFlight.delete(fiber))
      }))
  })

  /** Writes the queue once its oldest record has waited `maxWait`, unless a commit did first. */
  const tick: Effect.Effect<void> = Effect.flatMap(Clock.currentTimeMillis, (now) => {
    if (queue.length === 0 || closed) {
      armed = false
      return Effect.void
    }
    const left = since + waitMillis - now
    if (left > 0) return Effect.zipRight(Effect.sleep(Duration.millis(left)), tick)
    armed = false
    return flush
  })

  return {
    start: (record, written) =>
      Effect.suspend(() => {
        if (producer === undefined) {
          return Effect.flatMap(Effect.serviceOption(Producer), (found) => {
            if (Option.isNone(found)) return Effect.dieMessage("the failure route needs a Producer")
            producer = found.value
            return Effect.suspend(() => enqueue(record, written))
          })
        }
        return enqueue(record, written)
      }),
    settled: Effect.suspend(() => {
      if (failed !== undefined) return Effect.succeed(failed)
      return Effect.zipRight(
        flush,
        Effect.suspend(() => {
          if (inFlight.size === 0) return Effect.succeed(failed)
          return Effect.map(Effect.forEach(Array.from(inFlight), Fiber.await, { discard: true }), () => failed)
        })
      )
    }),
    close: (patience) =>
      Effect.suspend(() => {
        closed = true
        const stopTimer = timer === undefined ? Effect.void : Fiber.interrupt(timer)
        if (Duration.toMillis(patience) <= 0) queue = []
        return Effect.zipRight(
          Effect.zipRight(stopTimer, flush),
          Effect.suspend(() => {
            if (inFlight.size === 0) return Effect.void
            const fibers = Array.from(inFlight)
            return Effect.zipRight(
              Effect.timeoutOption(Effect.forEach(fibers, Fiber.await, { discard: true }), patience),
              Fiber.interruptAll(fibers)
            )
          })
        )
      })
  }

  function enqueue(record: ProducerRecord, written: Queued["written"]): Effect.Effect<void> {
    if (closed) return Effect.void
    return Effect.flatMap(Clock.currentTimeMillis, (now) => {
      if (queue.length === 0) since = now
      queue.push({ record, written })
      if (armed) return Effect.void
      armed = true
      return Effect.flatMap(Effect.forkDaemon(tick), (fiber) =>
        Effect.sync(() => {
          timer = fiber
        }))
    })
  }
}
