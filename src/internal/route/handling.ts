/**
 * The handler run with the route around it: what was handled goes out of the circuit's row, and a record that keeps
 * failing is set aside, within its unit (`inPlace`, `once`) or when its unit runs again (`rerun`).
 *
 * @internal
 */
import * as Chunk from "effect/Chunk"
import * as Effect from "effect/Effect"
import type { ConsumerRecord } from "../../ConsumerRecord.js"
import * as TopicPartition from "../../TopicPartition.js"
import * as Attempts from "./attempts.js"
import * as Circuit from "./circuit.js"
import type { RouteContext } from "./context.js"
import { park, type Pending, withPending } from "./deadLetters.js"
import { failedOffset, type Fatal, HandlerFailure, indexOf, retryable, type Work } from "./failures.js"

/** The handler on `records`, its failure counted against the record it names. */
const counted = <E, R>(
  context: RouteContext<E, R>,
  records: Chunk.Chunk<ConsumerRecord>,
  tp: TopicPartition.TopicPartition
) => Attempts.counted(context.attempts, tp, records, context.work(records, tp))

/** Records up to `upTo` were handled: failures below them are no longer in a row. */
const handled = <E, R>(context: RouteContext<E, R>, tp: TopicPartition.TopicPartition, upTo: bigint) =>
  Effect.sync(() => {
    const state = context.partitions.get(TopicPartition.key(tp))
    if (state !== undefined) Circuit.handled(state, upTo)
  })

const lastOf = (records: Chunk.Chunk<ConsumerRecord>) => Chunk.unsafeLast(records).offset

/** Every record of `records` was handled. */
const handledAll = <E, R>(
  context: RouteContext<E, R>,
  tp: TopicPartition.TopicPartition,
  records: Chunk.Chunk<ConsumerRecord>
) =>
  Effect.zipRight(
    Effect.sync(() => Attempts.succeeded(context.attempts, tp, records)),
    handled(context, tp, lastOf(records))
  )

const errorOf = <E>(failure: HandlerFailure<E> | Fatal) =>
  failure instanceof HandlerFailure ? Effect.succeed(failure) : Effect.fail(failure)

// inPlace and once: the unit goes on past a record that keeps failing, which is routed in it.
const inPlaceIn = <E, R>(
  context: RouteContext<E, R>,
  pending: Pending,
  records: Chunk.Chunk<ConsumerRecord>,
  tp: TopicPartition.TopicPartition
): Effect.Effect<void, HandlerFailure<E> | Fatal, R> =>
  Effect.matchEffect(counted(context, records, tp), {
    onSuccess: () => {
      Attempts.succeeded(context.attempts, tp, records)
      return handled(context, tp, lastOf(records))
    },
    onFailure: (failure) =>
      Effect.flatMap(errorOf(failure), (failure) => salvage(context, pending, records, tp, failure))
  })

/** The handler under `inPlace` and `once`. */
export const inPlace = <E, R>(context: RouteContext<E, R>): Work<E, R> => (records, tp) =>
  withPending(context, (pending) => inPlaceIn(context, pending, records, tp))

const single = <E, R>(
  context: RouteContext<E, R>,
  pending: Pending,
  record: ConsumerRecord,
  tp: TopicPartition.TopicPartition,
  first: HandlerFailure<E>
) => {
  if (context.mode === "once" || !retryable(first)) return park(context, pending, tp, record, first.error)
  const one = Chunk.of(record)
  // The schedule's retries after the failure already seen, which counts as its first attempt.
  let replayed = false
  const attempt = Effect.suspend(() => {
    if (replayed) return counted(context, one, tp)
    replayed = true
    return Effect.fail(first)
  })
  return Effect.catchAll(
    Effect.zipLeft(
      context.retry(attempt),
      Effect.zipRight(
        Effect.sync(() => Attempts.succeeded(context.attempts, tp, one)),
        handled(context, tp, record.offset)
      )
    ),
    (failure) => Effect.flatMap(errorOf(failure), (failure) => park(context, pending, tp, record, failure.error))
  )
}

const salvage = <E, R>(
  context: RouteContext<E, R>,
  pending: Pending,
  records: Chunk.Chunk<ConsumerRecord>,
  tp: TopicPartition.TopicPartition,
  failure: HandlerFailure<E>
): Effect.Effect<void, HandlerFailure<E> | Fatal, R> => {
  const offset = failedOffset(failure, records)
  if (offset === undefined) {
    // A chunk handler failed without saying on which record. At most once, none may be handed again: each is
    // routed. Else each is handled alone, and the ones that still fail are routed.
    return Effect.forEach(
      records,
      (record, i) =>
        context.mode === "once"
          ? park(context, pending, tp, record, failure.error, i === 0)
          : Effect.matchEffect(counted(context, Chunk.of(record), tp), {
            onSuccess: () => {
              Attempts.succeeded(context.attempts, tp, Chunk.of(record))
              return handled(context, tp, record.offset)
            },
            onFailure: (again) => Effect.flatMap(errorOf(again), (again) => single(context, pending, record, tp, again))
          }),
      { discard: true }
    )
  }
  const at = indexOf(records, offset)
  if (at < 0) return Effect.fail(failure)
  const record = Chunk.unsafeGet(records, at)
  const before = at === 0
    ? Effect.void
    : failure.handledBefore
    ? handled(context, tp, Chunk.unsafeGet(records, at - 1).offset)
    : inPlaceIn(context, pending, Chunk.take(records, at), tp)
  const routed = Effect.zipRight(before, single(context, pending, record, tp, failure))
  // The rest is a slice of the same records (a view, not a copy), however many records of the chunk fail.
  return at + 1 === Chunk.size(records)
    ? routed
    : Effect.zipRight(routed, Effect.suspend(() => inPlaceIn(context, pending, Chunk.drop(records, at + 1), tp)))
}

// rerun: records marked in an earlier attempt of their unit are routed; the others are handled.
export const rerun = <E, R>(context: RouteContext<E, R>): Work<E, R> => (records, tp) => {
  const state = context.partitions.get(TopicPartition.key(tp))
  if (state === undefined || state.poisoned.size === 0) {
    return Effect.zipLeft(counted(context, records, tp), handledAll(context, tp, records))
  }
  return withPending(context, (pending) =>
    Effect.suspend(() => {
      const steps: Array<Effect.Effect<void, HandlerFailure<E> | Fatal, R>> = []
      let run: Array<ConsumerRecord> = []
      const flush = () => {
        if (run.length === 0) return
        const part = Chunk.unsafeFromArray(run)
        steps.push(Effect.zipLeft(counted(context, part, tp), handledAll(context, tp, part)))
        run = []
      }
      for (const record of records) {
        if (state.poisoned.has(record.offset)) {
          flush()
          steps.push(park(context, pending, tp, record, state.poisoned.get(record.offset)))
        } else {
          run.push(record)
        }
      }
      flush()
      return Effect.forEach(steps, (step) => step, { discard: true })
    }))
}
