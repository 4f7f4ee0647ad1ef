/**
 * The worker of a partition whose records finish out of order (`key` and `unordered` ordering, under a policy that
 * can commit that way). It takes the fetched chunks as they come and puts each record in its lane (its key's, or one
 * of its own); lanes are handled by lane workers, each holding a permit while it works, up to `concurrency` per
 * partition. A lane's records that arrive while it is handled wait in it, and its worker takes them next, so that a
 * key's records are handled in offset order. As records finish, the policy is told of the partition's progress. On
 * revoke the worker takes nothing new: lanes in flight finish, the rest is left to the partition's next owner.
 *
 * @internal
 */
import * as Chunk from "effect/Chunk"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as FiberId from "effect/FiberId"
import type { PolicyInstance } from "../../CommitPolicy.js"
import type { ConsumerRecord } from "../../ConsumerRecord.js"
import { HandlerFailure } from "../route/router.js"
import {
  abandon,
  type Abandoned,
  failed,
  type Fetched,
  givenUp,
  isGivenUp,
  type PartitionState,
  paused,
  type SessionContext,
  stopping,
  type UnitError
} from "./context.js"
import * as Flow from "./flow.js"
import { type Lane, Lanes } from "./lanes.js"
import type { Progress, Range } from "./progress.js"

type OutOfOrder = NonNullable<PolicyInstance["outOfOrder"]>

/** One partition's pipeline: its lanes and the lane workers running on them. */
interface Pipeline<E, R, EH, RH> {
  readonly ctx: SessionContext<E, R, EH, RH>
  readonly state: PartitionState
  readonly progress: Progress
  readonly policy: OutOfOrder
  readonly lanes: Lanes
  running: number
  /** Completed when the last running lane worker ends, while the pipeline drains. */
  idle: Deferred.Deferred<void> | undefined
}

const byOffset = (a: ConsumerRecord, b: ConsumerRecord) => a.offset < b.offset ? -1 : a.offset > b.offset ? 1 : 0

/** The records of a unit's parts, in order. */
function* recordsOf(parts: ReadonlyArray<Chunk.Chunk<ConsumerRecord>>): Generator<ConsumerRecord> {
  for (const part of parts) yield* part
}

/**
 * The records of a lane, or of several lanes one after another when the policy puts many records in a unit (a
 * transaction of the store costs more than a record) and many lanes wait: as many as leave every worker some, up to
 * the policy's bound.
 */
export const takeBatch = (
  lanes: Lanes,
  first: Lane,
  most: number,
  workers: number
): Array<Lane> => {
  const batch = [first]
  if (most <= 1) return batch
  let records = first.records.length
  // Only lanes beyond what the other workers can take: a unit never leaves workers idle to grow.
  const share = Math.floor(lanes.waiting / Math.max(1, workers))
  while (records < most && batch.length <= share) {
    const lane = lanes.take()
    if (lane === undefined) break
    batch.push(lane)
    records += lane.records.length
  }
  return batch
}

/**
 * The workers that can take lanes are the partition's running ones and those the free permits would start; once the
 * permits are all taken (by this partition's workers or others'), the waiting lanes are shared among the running ones:
 * with many partitions, each has a few workers, and their units grow instead of waiting.
 */
const batchOf = <E, R, EH, RH>(p: Pipeline<E, R, EH, RH>, first: Lane): Array<Lane> =>
  takeBatch(
    p.lanes,
    first,
    p.policy.unitRecords ?? 1,
    p.running + Math.min(p.ctx.permits.free(), p.ctx.config.concurrency - p.running)
  )

/**
 * A unit of the policy: the records of `parts`, covering the offset ranges `finished`. With a failure route under a
 * policy that rolls a failed unit back, as a chunk's unit does.
 */
const unit = <E, R, EH, RH>(
  p: Pipeline<E, R, EH, RH>,
  parts: ReadonlyArray<Chunk.Chunk<ConsumerRecord>>,
  finished: ReadonlyArray<Range>,
  indexes: ReadonlyArray<number>
): Effect.Effect<void, UnitError<E> | Abandoned, R> => {
  const { ctx, state, progress } = p
  const { routed, rerun } = ctx
  const tp = state.tp
  const handler = parts.length === 1 ? routed(parts[0]!, tp) : Effect.forEach(parts, (part) =>
    Effect.mapError(
      routed(part, tp),
      // Where a chunk handler failed, for `HandlerFailed`: its part. A rerun needs the record itself.
      (error) =>
        error instanceof HandlerFailure && error.offset === undefined && rerun === undefined
          ? new HandlerFailure(error.error, Chunk.unsafeHead(part).offset, false)
          : error
    ), { discard: true })
  return p.policy.handle(tp, progress.position(), finished, handler, ctx.retry).pipe(
    Effect.catchAll((error) => {
      if (rerun === undefined || !(error instanceof HandlerFailure)) return failed(ctx, state, parts[0]!, error)
      if (stopping(state)) return abandon(state)
      const all = parts.length === 1 ? parts[0]! : Chunk.flatten(Chunk.unsafeFromArray(parts))
      if (rerun.poison(tp, all, error)) return unit(p, parts, finished, indexes)
      return oneByOne(p, all, indexes)
    })
  )
}

/**
 * A failed unit as units of one record each. A record's range starts where the record before it ended, below its own
 * offset after a gap (a marker, an aborted or compacted record): the unit's records and ranges are paired in offset
 * order, each record inside its range.
 */
const oneByOne = <E, R, EH, RH>(
  p: Pipeline<E, R, EH, RH>,
  all: Chunk.Chunk<ConsumerRecord>,
  indexes: ReadonlyArray<number>
): Effect.Effect<void, UnitError<E> | Abandoned, R> => {
  const records = Chunk.toReadonlyArray(all).slice().sort(byOffset)
  return Effect.forEach([...indexes].sort((a, b) => a - b), (index, i) => {
    const range = p.progress.rangeOf(index)
    const record = records[i]
    if (record === undefined || record.offset < range[0] || record.offset >= range[1]) {
      return Effect.dieMessage(
        `${p.state.key}: the unit's records do not match its ranges at [${range[0]}, ${range[1]})`
      )
    }
    return unit(p, [Chunk.of(record)], [range], [index])
  }, { discard: true })
}

/** The offset ranges of a unit's records, adjacent ones joined. */
const rangesOf = (progress: Progress, indexes: ReadonlyArray<number>): Array<Range> => {
  const finished: Array<Range> = []
  for (const index of indexes) {
    const range = progress.rangeOf(index)
    const last = finished[finished.length - 1]
    if (last !== undefined && last[1] === range[0]) finished[finished.length - 1] = [last[0], range[1]]
    else finished.push(range)
  }
  return finished
}

type Step<E, R> = Effect.Effect<void, UnitError<E>, R>

const handleBatch = <E, R, EH, RH>(p: Pipeline<E, R, EH, RH>, batch: Array<Lane>): Step<E, R> => {
  const { ctx, state, progress } = p
  const { telemetry } = ctx
  const tp = state.tp
  // The first lane's arrays are taken as they are (one lane is the common case); each lane gets fresh ones.
  const indexes = batch[0]!.indexes
  const parts: Array<Chunk.Chunk<ConsumerRecord>> = []
  for (let i = 0; i < batch.length; i++) {
    const lane = batch[i]!
    parts.push(Chunk.unsafeFromArray(lane.records))
    if (i > 0) { for (const index of lane.indexes) indexes.push(index) }
    lane.records = []
    lane.indexes = []
  }
  if (batch.length > 1) indexes.sort((a, b) => a - b)
  const first = unit(p, parts, rangesOf(progress, indexes), indexes)
  const traced = telemetry === undefined ? first : telemetry.chunk(tp, recordsOf(parts), indexes.length, first)
  // Records left to the next owner (given up) are not finished here. Two steps and no named closures: this runs once
  // per lane.
  return Effect.flatMap(
    Effect.catchIf(traced, isGivenUp, Effect.succeed),
    (result) => {
      if (result === givenUp) return Effect.void
      telemetry?.handled(tp, indexes.length)
      for (const index of indexes) progress.finish(index)
      ctx.router?.passed(tp, progress.position())
      state.outstanding -= indexes.length
      p.policy.progressed(tp, progress, indexes.length)
      let more: Step<E, R> = lanesStep(p)
      if (batch.length === 1) {
        // A key whose records came meanwhile goes on with them at once.
        const lane = batch[0]!
        if (lane.records.length > 0 && !stopping(state)) more = handleBatch(p, batchOf(p, lane))
        else p.lanes.forget(lane)
      } else {
        for (const lane of batch) p.lanes.handled(lane)
      }
      const resume = Flow.resume(ctx, state)
      return resume === Effect.void ? more : Effect.zipRight(resume, more)
    }
  )
}

/** A lane worker's loop: lanes one after another until none waits, or the partition stops. */
const lanesStep = <E, R, EH, RH>(p: Pipeline<E, R, EH, RH>): Step<E, R> =>
  Effect.suspend(() => {
    const lane = stopping(p.state) ? undefined : p.lanes.take()
    return lane === undefined ? Effect.void : handleBatch(p, batchOf(p, lane))
  })

/** Lane workers started while lanes wait, up to `concurrency` for the partition, each with a permit. */
const start = <E, R, EH, RH>(p: Pipeline<E, R, EH, RH>, laneWorker: Effect.Effect<void, never, R>) => {
  const go: Effect.Effect<void, never, R> = Effect.suspend(() => {
    if (p.lanes.waiting === 0 || p.running >= p.ctx.config.concurrency || stopping(p.state)) return Effect.void
    p.running++
    return Effect.flatMap(p.ctx.permits.forkWithPermit(laneWorker), () => go)
  })
  return go
}

/** Fetched chunks into lanes; records an earlier owner finished are finished at once. */
const dispatch = <E, R, EH, RH>(p: Pipeline<E, R, EH, RH>, chunks: Chunk.Chunk<Fetched>) => {
  const { progress } = p
  let finished = 0
  let moved = false
  for (const { next, records, rewind } of chunks) {
    if (rewind) {
      progress.rewind(next)
      moved = true
      continue
    }
    if (Chunk.isEmpty(records)) {
      progress.add(next, true)
      moved = true
      continue
    }
    const all = Chunk.toReadonlyArray(records)
    for (let i = 0; i < all.length; i++) {
      const record = all[i]!
      const until = i + 1 < all.length ? all[i + 1]!.offset : next
      if (progress.finishedBefore(record.offset)) {
        progress.add(until, true)
        finished++
        moved = true
        continue
      }
      p.lanes.place(record, progress.add(until, false))
    }
  }
  if (finished > 0) p.state.outstanding -= finished
  if (moved) p.policy.progressed(p.state.tp, progress, finished)
}

/** The worker of a partition whose records finish out of order. */
export const worker = <E, R, EH, RH>(
  ctx: SessionContext<E, R, EH, RH>,
  state: PartitionState,
  policy: OutOfOrder
): Effect.Effect<void, never, R> => {
  const progress = state.progress!
  // The route counts records in a row in offset order through the ranges of the records in flight.
  ctx.router?.outOfOrder(state.tp, (offset) => progress.rangeAt(offset))
  const p: Pipeline<E, R, EH, RH> = {
    ctx,
    state,
    progress,
    policy,
    lanes: new Lanes(ctx.config.ordering),
    running: 0,
    idle: undefined
  }
  const laneWorker = lanesStep(p).pipe(
    Effect.catchAllCause(ctx.report),
    Effect.ensuring(Effect.sync(() => {
      p.running--
      if (p.running === 0 && p.idle !== undefined) Deferred.unsafeDone(p.idle, Exit.void)
    }))
  )
  const more = start(p, laneWorker)
  const drain = Effect.suspend(() => {
    if (p.running === 0) return Effect.void
    p.idle = Deferred.unsafeMake<void>(FiberId.none)
    return Deferred.await(p.idle)
  })
  const loop: Effect.Effect<void, never, R> = Effect.flatMap(state.queue.takeAll, ([chunks, done]) => {
    if (!stopping(state)) dispatch(p, chunks)
    if (done || stopping(state)) return drain
    // Records an earlier owner finished leave at once, and may make room; a window grown too wide pauses.
    const room = Flow.roomFor(ctx.config, state)
      ? Flow.resume(ctx, state)
      : (paused(state) ? Effect.void : Flow.pause(ctx, state))
    return Effect.zipRight(Effect.zipRight(room, more), loop)
  })
  return loop
}
