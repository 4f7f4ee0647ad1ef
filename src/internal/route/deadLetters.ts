/**
 * Routing a record: the circuit checked at once, then its letter written to the next retry topic or the dead-letter
 * topic, by the unit that routed it or apart from it (`SideWrites`).
 *
 * @internal
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Option from "effect/Option"
import type { ConsumerRecord } from "../../ConsumerRecord.js"
import { deadLetterRecord } from "../../FailureRoute.js"
import { CircuitOpen } from "../../KafkaError.js"
import { Producer, type RecordMetadata } from "../../Producer.js"
import * as TopicPartition from "../../TopicPartition.js"
import * as Attempts from "./attempts.js"
import * as Circuit from "./circuit.js"
import { type PartitionRoute, type RouteContext, stateOf } from "./context.js"
import { Fatal } from "./failures.js"
import { retryStepOf, targetOf } from "./targets.js"

/** The route's writes a unit started, which it waits for before it ends. */
export type Pending = Array<Fiber.RuntimeFiber<void, Fatal>>

/**
 * Routes a record: the circuit is checked at once, and the write is started in a fiber of its own, added to
 * `pending`, so that the unit goes on with its next records meanwhile; the unit ends only once every write it
 * started is acknowledged. Under a policy whose commits wait for the writes, it is queued apart (`SideWrites`),
 * to be written with the records routed around it.
 */
export const park = <E, R>(
  context: RouteContext<E, R>,
  pending: Pending,
  tp: TopicPartition.TopicPartition,
  record: ConsumerRecord,
  error: unknown,
  /** Whether it is one more failure for the circuit: the records of one failed chunk count once. */
  counts = true
): Effect.Effect<void, Fatal> =>
  Effect.suspend(() => {
    const { settings } = context
    const k = TopicPartition.key(tp)
    const state = stateOf(context, k)
    const tries = Math.max(Attempts.attemptsOf(context.attempts, k, record.offset) ?? 1, 1)
    // In a row means in offset order. A record routed again (its unit ran again after a rollback) is not one more;
    // nor is a record of a retry topic, which holds nothing but records that failed before: the circuit watches
    // the consumer's topics.
    const locate = context.locators.get(k)
    const range = locate?.(record.offset)
    const counted = counts && retryStepOf(settings, tp.topic) === undefined
    const row = Circuit.rowOf(state, record.offset, range, counted, settings.maxInARow)
    if (row >= settings.maxInARow) {
      return Effect.fail(
        new Fatal(
          new CircuitOpen({ topic: tp.topic, partition: tp.partition, offset: record.offset, count: row, cause: error })
        )
      )
    }
    Circuit.routed(state, record.offset, range, row)
    if (state.written.has(record.offset)) return Effect.void
    return writeLetter(context, pending, tp, state, record, error, tries)
  })

/**
 * Writes the letter of a record that failed `tries` times: by a fiber of the unit's (`pending`), or apart from it.
 * Once it is acknowledged, the record's count goes and it is logged.
 */
const writeLetter = <E, R>(
  context: RouteContext<E, R>,
  pending: Pending,
  tp: TopicPartition.TopicPartition,
  state: PartitionRoute,
  record: ConsumerRecord,
  error: unknown,
  tries: number
): Effect.Effect<void, Fatal> => {
  const { apart, settings } = context
  const k = TopicPartition.key(tp)
  const written = (metadata: RecordMetadata) =>
    Effect.suspend(() => {
      Attempts.dropAttempt(context.attempts, k, record.offset)
      context.onRouted?.(tp, metadata.topic)
      if (context.mode === "rerun" && !context.unitHoldsWrites) state.written.add(record.offset)
      // A record parked in a retry topic is expected to pass later: only a dead letter asks for attention.
      const log = metadata.topic === settings.topic ? Effect.logWarning : Effect.logDebug
      return log(
        `${k}@${record.offset} failed ${tries} time(s) and was routed to ${metadata.topic}-` +
          `${metadata.partition}@${metadata.offset}`
      )
    })
  const letter = (now: number) => {
    const target = targetOf(settings, tp.topic, now)
    return deadLetterRecord(target.topic, record, error, tries, target.due)
  }
  if (apart !== undefined) return Effect.flatMap(Clock.currentTimeMillis, (now) => apart.start(letter(now), written))
  const write = Effect.all([Effect.serviceOption(Producer), Clock.currentTimeMillis]).pipe(
    Effect.flatMap(([producer, now]) => {
      if (Option.isNone(producer)) return Effect.dieMessage("the failure route needs a Producer")
      return producer.value.send(letter(now))
    }),
    Effect.mapError((error) => new Fatal(error)),
    Effect.flatMap(written)
  )
  return Effect.flatMap(Effect.fork(write), (fiber) =>
    Effect.sync(() => {
      pending.push(fiber)
    }))
}

/**
 * Runs a unit's work with the route's writes it starts, and waits for them all before the unit ends (unless the
 * commits wait for them instead).
 */
export const withPending = <E, R, A, E2, R2>(
  context: RouteContext<E, R>,
  body: (pending: Pending) => Effect.Effect<A, E2, R2>
) =>
  Effect.suspend(() => {
    if (context.apart !== undefined) return body([])
    const pending: Pending = []
    return body(pending).pipe(
      Effect.zipLeft(Effect.suspend(() => Effect.forEach(pending, Fiber.join, { discard: true }))),
      // A unit that failed still lets the writes it started end, so that what was written is known.
      Effect.onError(() => Effect.forEach(pending, Fiber.await, { discard: true }))
    )
  })
