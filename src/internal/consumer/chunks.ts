/**
 * The worker of a partition whose records are handled in order: each fetched chunk is a unit of the policy, one after
 * another. A retry topic's chunks wait until their records are due; a unit that fails on a record under a policy that
 * rolls it back runs again with that record routed.
 *
 * @internal
 */
import * as Chunk from "effect/Chunk"
import * as Clock from "effect/Clock"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import type { ConsumerRecord } from "../../ConsumerRecord.js"
import { dueOf } from "../../FailureRoute.js"
import type * as TopicPartition from "../../TopicPartition.js"
import { HandlerFailure, retryStepOf } from "../route/router.js"
import {
  abandon,
  type Abandoned,
  failed,
  type Fetched,
  isGivenUp,
  type PartitionState,
  paused,
  type SessionContext,
  stopping,
  type UnitError
} from "./context.js"
import * as Flow from "./flow.js"

/** A chunk without the records an earlier owner finished; past the last such range, chunks are taken whole. */
const withoutFinished = (state: PartitionState, records: Chunk.Chunk<ConsumerRecord>) => {
  const skip = state.skip!
  if (Chunk.isEmpty(records)) return records
  const kept = Chunk.filter(records, (r) => !skip.finishedBefore(r.offset))
  if (skip.passed(Chunk.unsafeLast(records).offset)) state.skip = undefined
  return kept
}

/**
 * A chunk as a unit of the policy. Under a policy that rolls a failed unit back, with a failure route, a unit that
 * failed on a record after its retries runs again with that record routed; when the record is not known (a chunk
 * handler failed), the chunk is taken apart into units of one record.
 */
const processChunk = <E, R, EH, RH>(
  ctx: SessionContext<E, R, EH, RH>,
  state: PartitionState,
  records: Chunk.Chunk<ConsumerRecord>,
  position: bigint
): Effect.Effect<void, UnitError<E> | Abandoned, R> => {
  const { rerun } = ctx
  // A chunk whose every record an earlier owner finished still moves the position, as an empty one does.
  const handled = Chunk.isEmpty(records) ? Effect.void : ctx.chunkWork(records, state.tp)
  return ctx.policy.process(state.tp, records, position, handled, ctx.retry).pipe(
    Effect.catchAll((error) => {
      if (rerun === undefined || !(error instanceof HandlerFailure)) return failed(ctx, state, records, error)
      if (stopping(state)) return abandon(state)
      if (rerun.poison(state.tp, records, error)) return processChunk(ctx, state, records, position)
      return Effect.forEach(Chunk.range(0, Chunk.size(records) - 1), (i) => {
        const next = i + 1 < Chunk.size(records) ? Chunk.unsafeGet(records, i + 1).offset : position
        return processChunk(ctx, state, Chunk.of(Chunk.unsafeGet(records, i)), next)
      }, { discard: true })
    })
  )
}

/** A chunk as a unit; `false` when it was left to the partition's next owner. */
const kept = <E, R, EH, RH>(
  ctx: SessionContext<E, R, EH, RH>,
  state: PartitionState,
  records: Chunk.Chunk<ConsumerRecord>,
  position: bigint
): Effect.Effect<boolean, UnitError<E>, R> => {
  const { telemetry } = ctx
  const unit = processChunk(ctx, state, records, position).pipe(
    Effect.as(true),
    Effect.catchIf(isGivenUp, () => Effect.succeed(false))
  )
  if (telemetry === undefined) return unit
  return telemetry.chunk(
    state.tp,
    records,
    Chunk.size(records),
    Effect.tap(unit, (done) => {
      if (done) telemetry.handled(state.tp, Chunk.size(records))
    })
  )
}

/** Whether the partition is one of the route's retry topics: its records wait until they are due. */
export const retrying = <E, R, EH, RH>(ctx: SessionContext<E, R, EH, RH>, tp: TopicPartition.TopicPartition) =>
  ctx.config.route !== undefined && retryStepOf(ctx.config.route, tp.topic) !== undefined

/**
 * A chunk of a retry topic: the records that are due are handled; at the first that is not, the partition pauses
 * until it is (no handler waits), then goes on. A revoke ends the wait; the rest is left to the next owner. The
 * wait lasts `dueSlack` past the record's due time, so that the records due just after it (routed close together,
 * and written together) are handed over with it, in one unit, rather than each after a wait of its own.
 */
const whenDue = <E, R, EH, RH>(
  ctx: SessionContext<E, R, EH, RH>,
  state: PartitionState,
  records: Chunk.Chunk<ConsumerRecord>,
  position: bigint
): Effect.Effect<boolean, UnitError<E>, R> =>
  Effect.flatMap(Clock.currentTimeMillis, (now) => {
    const at = Chunk.findFirstIndex(records, (record) => (dueOf(record) ?? 0) > now)
    if (Option.isNone(at)) return kept(ctx, state, records, position)
    const waiting = Chunk.unsafeGet(records, at.value)
    const before = at.value === 0
      ? Effect.succeed(true)
      : kept(ctx, state, Chunk.take(records, at.value), waiting.offset)
    return Effect.flatMap(before, (done) =>
      !done ? Effect.succeed(false) : Effect.zipRight(
        waitUntil(ctx, state, dueOf(waiting)! + ctx.dueSlack),
        Effect.suspend(() =>
          stopping(state) ? Effect.succeed(false) : whenDue(ctx, state, Chunk.drop(records, at.value), position)
        )
      ))
  })

/** Holds the partition until `due` (or its revoke), in steps, so that a revoke need not wait for the end. */
const waitUntil = <E, R, EH, RH>(
  ctx: SessionContext<E, R, EH, RH>,
  state: PartitionState,
  due: number
): Effect.Effect<void> =>
  Effect.zipRight(
    Flow.hold(ctx, state),
    Effect.flatMap(Clock.currentTimeMillis, (now) => {
      const step = (left: number): Effect.Effect<void> =>
        left <= 0 || stopping(state) ? Effect.void : Effect.zipRight(
          Effect.sleep(Duration.millis(Math.min(left, 100))),
          Effect.flatMap(Clock.currentTimeMillis, (at) => step(due - at))
        )
      return step(due - now)
    })
  )

/**
 * Chunks one after another, each as it was fetched. The worker takes every chunk waiting at once and handles them in
 * a loop of flatMaps rather than a generator: this runs once per chunk. Forked in the poll loop, the worker runs with
 * the consumer's services, the handler's among them.
 */
export const worker = <E, R, EH, RH>(
  ctx: SessionContext<E, R, EH, RH>,
  state: PartitionState
): Effect.Effect<void, UnitError<E>, R> => {
  type Step = Effect.Effect<void, UnitError<E>, R>
  const retry = retrying(ctx, state.tp)
  const loop: Step = Effect.flatMap(state.queue.takeAll, ([chunks, done]) => next(chunks, 0, done))
  const next = (chunks: Chunk.Chunk<Fetched>, at: number, done: boolean): Step => {
    if (stopping(state) || (done && at === Chunk.size(chunks))) return Effect.void
    if (at === Chunk.size(chunks)) return loop
    const { next: position, records: fetched, rewind } = Chunk.unsafeGet(chunks, at)
    if (rewind) {
      state.skip?.rewind(position)
      return next(chunks, at + 1, done)
    }
    const records = state.skip === undefined ? fetched : withoutFinished(state, fetched)
    return (retry ? whenDue(ctx, state, records, position) : kept(ctx, state, records, position)).pipe(
      Effect.flatMap((kept) => {
        if (!kept) return Effect.void
        ctx.router?.passed(state.tp, position)
        state.outstanding -= Chunk.size(fetched)
        return paused(state)
          ? Effect.zipRight(Flow.resume(ctx, state), Effect.suspend(() => next(chunks, at + 1, done)))
          : next(chunks, at + 1, done)
      })
    )
  }
  return loop
}
