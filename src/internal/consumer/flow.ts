/**
 * Whether a partition fetches: the transitions between `fetching`, `paused` and `held` (see `Phase`). Records fetched
 * and not handled, and under out-of-order finishing the window behind them, stay bounded: past the bound the partition
 * pauses, and it resumes once its worker made room.
 *
 * @internal
 */
import * as Effect from "effect/Effect"
import type { DriverSession } from "../../Driver.js"
import { type PartitionState, paused, type Resolved, windowPerBuffer } from "./context.js"

/** Whether the partition may fetch more: records not finished, and the window behind them, stay bounded. */
export const roomFor = (config: Resolved, state: PartitionState): boolean =>
  state.outstanding + config.session.maxPollRecords <= config.bufferSize &&
  (state.progress === undefined ||
    state.progress.window + config.session.maxPollRecords <= windowPerBuffer * config.bufferSize)

/** What the flow of a session's partitions needs of it. */
export interface FlowContext {
  readonly config: Resolved
  readonly session: DriverSession
  readonly guard: <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>
}

const resumable = (ctx: FlowContext, state: PartitionState) => paused(state) && roomFor(ctx.config, state)

/** `fetching` to `paused`, when the partition has no room. */
export const pause = (ctx: FlowContext, state: PartitionState): Effect.Effect<void> =>
  state.lock.withPermits(1)(Effect.suspend(() => {
    if (state.phase !== "fetching" || roomFor(ctx.config, state)) return Effect.void
    state.phase = "paused"
    return ctx.session.pause([state.tp])
  }))

/** `fetching` or `paused` to `held`: the driver is told the partition stays paused for a while. */
export const hold = (ctx: FlowContext, state: PartitionState): Effect.Effect<void> =>
  state.lock.withPermits(1)(Effect.suspend(() => {
    if (state.phase === "held" || state.phase === "stopping") return Effect.void
    state.phase = "held"
    return ctx.guard(ctx.session.pause([state.tp], { hold: true }))
  }))

/**
 * `paused` or `held` to `fetching`, when the partition has room again. Checked before the lock too: under key ordering
 * a paused partition asks after every record, and it stays paused until its window has room.
 */
export const resume = (ctx: FlowContext, state: PartitionState): Effect.Effect<void> =>
  !resumable(ctx, state) ? Effect.void : state.lock.withPermits(1)(Effect.suspend(() => {
    if (!resumable(ctx, state)) return Effect.void
    state.phase = "fetching"
    return ctx.guard(ctx.session.resume([state.tp]))
  }))
