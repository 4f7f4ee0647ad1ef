/**
 * A partition's life in a session: assigned (its position read or reset, its scope opened, `onAssign`, its worker
 * forked), then revoked (the bounded revoke protocol: in-flight work ends or is interrupted, the final position is
 * committed or stored, `onRevoke` runs and the scope closes; only then is the partition released to the group) or
 * lost (its work interrupted, nothing committed).
 *
 * @internal
 */
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as Mailbox from "effect/Mailbox"
import * as Option from "effect/Option"
import * as Scope from "effect/Scope"
import type { PolicyError } from "../../CommitPolicy.js"
import type { PartitionOffsets } from "../../Driver.js"
import { DriverError, OffsetOutOfRange, WorkerStuck } from "../../KafkaError.js"
import * as TopicPartition from "../../TopicPartition.js"
import * as Chunks from "./chunks.js"
import { type Fetched, type PartitionState, type SessionContext, within } from "./context.js"
import * as Pipeline from "./pipeline.js"
import { Progress } from "./progress.js"

const keysOf = (states: ReadonlyArray<PartitionState>) => states.map((s) => s.key).join(", ")

/** Where a partition starts when its position is missing or out of its log, as `offsetReset` says. */
export const reset = <E, R, EH, RH>(
  ctx: SessionContext<E, R, EH, RH>,
  tp: TopicPartition.TopicPartition,
  position: bigint | null,
  range: PartitionOffsets
): Effect.Effect<bigint, OffsetOutOfRange> => {
  const { offsetReset } = ctx.config
  if (offsetReset === "none") {
    return Effect.fail(
      new OffsetOutOfRange({ ...tp, position, earliest: range.earliest, latest: range.latest })
    )
  }
  // The latest a read_committed consumer can read is the last stable offset, as the Java client resets to.
  const target = offsetReset === "earliest" ? range.earliest : ctx.reachable(range)
  if (position === null) return Effect.succeed(target)
  return Effect.as(
    Effect.logWarning(
      `position ${position} of ${TopicPartition.key(tp)} is out of its log (offsets ${range.earliest} to ` +
        `${range.latest}): starting at the ${offsetReset}, ${target}` +
        (position < range.earliest ? `; ${range.earliest - position} offsets were removed unread` : "")
    ),
    target
  )
}

const startPosition = <E, R, EH, RH>(
  ctx: SessionContext<E, R, EH, RH>,
  tp: TopicPartition.TopicPartition,
  position: bigint | undefined,
  range: PartitionOffsets | undefined
): Effect.Effect<bigint, OffsetOutOfRange | DriverError> => {
  if (range === undefined) {
    return Effect.fail(
      new DriverError({ operation: "offsets", reason: `no offsets for ${TopicPartition.key(tp)}`, retriable: true })
    )
  }
  if (position !== undefined && position >= range.earliest && position <= range.latest) {
    return Effect.succeed(position)
  }
  return reset(ctx, tp, position ?? null, range)
}

/** Waits for the stuck workers of partitions assigned again, bounded: two workers never run on one partition. */
const awaitStuck = <E, R, EH, RH>(
  ctx: SessionContext<E, R, EH, RH>,
  fresh: ReadonlyArray<TopicPartition.TopicPartition>
): Effect.Effect<void, WorkerStuck> =>
  Effect.forEach(fresh, (tp) => {
    const stuck = ctx.abandoned.get(TopicPartition.key(tp))
    if (stuck === undefined) return Effect.void
    return Effect.flatMap(within(Fiber.await(stuck), ctx.config.revokeTimeout), (done) => {
      if (Option.isNone(done)) return Effect.fail(new WorkerStuck(tp))
      ctx.abandoned.delete(TopicPartition.key(tp))
      return Effect.void
    })
  }, { discard: true })

/** Partitions given to the member: each gets its position, its scope, `onAssign` in it, and its worker. */
export const assign = <E, R, EH, RH>(
  ctx: SessionContext<E, R, EH, RH>,
  partitions: ReadonlyArray<TopicPartition.TopicPartition>
) =>
  Effect.gen(function*() {
    const { session, policy, telemetry, owned, guard } = ctx
    const fresh = partitions.filter((tp) => !owned.has(TopicPartition.key(tp)))
    if (fresh.length === 0) return
    yield* awaitStuck(ctx, fresh)
    const positions = yield* policy.assign(fresh)
    telemetry?.rebalance("assigned", fresh)
    const ranges = yield* session.offsets(fresh)
    // A partition paused by an earlier owner state must fetch again.
    yield* guard(session.resume(fresh))
    for (const tp of fresh) {
      const key = TopicPartition.key(tp)
      const position = yield* startPosition(ctx, tp, positions.get(key), ranges.get(key))
      yield* guard(session.seek(tp, position))
      telemetry?.started(tp, position)
      // Records an earlier owner finished out of order above the position are not handled again.
      const finishedBefore = policy.finishedOnAssign?.(tp) ?? []
      ctx.router?.reset(tp)
      // A retry topic's partition is read in order, whatever the ordering: its records wait until they are due.
      const inOrder = ctx.outOfOrder === undefined || Chunks.retrying(ctx, tp)
      const state: PartitionState = {
        tp,
        key,
        scope: yield* Scope.make(),
        queue: yield* Mailbox.make<Fetched>(),
        lock: yield* Effect.makeSemaphore(1),
        next: position,
        skips: 0,
        outstanding: 0,
        phase: "fetching",
        worker: undefined,
        progress: inOrder ? undefined : new Progress(position, finishedBefore),
        skip: inOrder && finishedBefore.length > 0 ? new Progress(position, finishedBefore) : undefined,
        revoking: false
      }
      owned.set(key, state)
      if (ctx.hooks.onAssign !== undefined) {
        yield* ctx.hooks.onAssign(tp).pipe(Scope.extend(state.scope))
      }
      state.worker = yield* (inOrder ? Chunks.worker(ctx, state) : Pipeline.worker(ctx, state, ctx.outOfOrder!)).pipe(
        Effect.catchAllCause(ctx.report),
        Effect.forkIn(state.scope)
      )
    }
  })

/** Interrupts a worker and waits for it, bounded; one that does not stop is left behind, and remembered. */
const interrupt = <E, R, EH, RH>(
  ctx: SessionContext<E, R, EH, RH>,
  state: PartitionState,
  fiber: Fiber.RuntimeFiber<void>,
  phase: string
) =>
  Effect.gen(function*() {
    const { stepTimeout } = ctx.config
    yield* Fiber.interruptFork(fiber)
    if (Option.isSome(yield* within(Fiber.await(fiber), stepTimeout))) return
    ctx.abandoned.add(state.key, fiber)
    yield* Effect.logWarning(
      `${phase}: the work of ${state.key} did not stop within ${Duration.format(stepTimeout)} of its ` +
        "interruption (it is in an uninterruptible region): it is left to end on its own, and nothing it does " +
        "is committed any more"
    )
  })

/** The worker ends its current chunk, or is interrupted past revokeTimeout. */
const stopWorker = <E, R, EH, RH>(ctx: SessionContext<E, R, EH, RH>, state: PartitionState, phase: string) =>
  Effect.gen(function*() {
    const { revokeTimeout } = ctx.config
    state.phase = "stopping"
    yield* state.queue.shutdown
    const fiber = state.worker
    if (fiber === undefined) return
    // A crash meanwhile ends the wait at once: what the crashed member would still do never lands anyway.
    const done = yield* within(Effect.raceFirst(Fiber.await(fiber), Deferred.await(ctx.crash.signal)), revokeTimeout)
    if (Option.isSome(done) || ctx.crash.crashed) return
    yield* Effect.logWarning(
      `${phase}: the work of ${state.key} outlived revokeTimeout (${Duration.format(revokeTimeout)}); interrupting it`
    )
    yield* interrupt(ctx, state, fiber, phase)
  })

/** The partition is gone: its worker is interrupted at once. */
const interruptWorker = <E, R, EH, RH>(ctx: SessionContext<E, R, EH, RH>, state: PartitionState, phase: string) =>
  Effect.gen(function*() {
    state.phase = "stopping"
    yield* state.queue.shutdown
    if (state.worker !== undefined) yield* interrupt(ctx, state, state.worker, phase)
  })

/** `onRevoke`, then the partition's scope closes: each bounded, partitions side by side. */
const closePartitions = <E, R, EH, RH>(
  ctx: SessionContext<E, R, EH, RH>,
  states: ReadonlyArray<PartitionState>,
  phase: string
): Effect.Effect<void, EH, Exclude<RH, Scope.Scope>> =>
  Effect.forEach(states, (state) =>
    Effect.gen(function*() {
      const { stepTimeout } = ctx.config
      const { onRevoke } = ctx.hooks
      const hook = onRevoke === undefined
        ? Exit.succeed(Option.some(undefined))
        : yield* Effect.exit(within(Scope.extend(onRevoke(state.tp), state.scope), stepTimeout))
      if (Exit.isSuccess(hook) && Option.isNone(hook.value)) {
        yield* Effect.logWarning(
          `${phase}: onRevoke of ${state.key} did not finish within ${Duration.format(stepTimeout)}; ` +
            "going on without it"
        )
      }
      ctx.owned.delete(state.key)
      ctx.router?.reset(state.tp)
      if (Option.isNone(yield* within(Scope.close(state.scope, Exit.void), stepTimeout))) {
        yield* Effect.logWarning(
          `${phase}: the finalizers of ${state.key}'s scope did not finish within ` +
            `${Duration.format(stepTimeout)}; going on without them`
        )
      }
      if (Exit.isFailure(hook)) return yield* hook
    }), { concurrency: "unbounded", discard: true })

const ownedStates = <E, R, EH, RH>(
  ctx: SessionContext<E, R, EH, RH>,
  partitions: ReadonlyArray<TopicPartition.TopicPartition>
) =>
  partitions.flatMap((tp) => {
    const state = ctx.owned.get(TopicPartition.key(tp))
    return state === undefined || state.revoking ? [] : [state]
  })

/** The owned partitions that are not in `partitions` and not being revoked: those that stay. */
export const staying = <E, R, EH, RH>(
  ctx: SessionContext<E, R, EH, RH>,
  partitions: ReadonlyArray<TopicPartition.TopicPartition>
): ReadonlyArray<PartitionState> => {
  const moving = new Set(partitions.map(TopicPartition.key))
  return Array.from(ctx.owned.values()).filter((s) => !s.revoking && !moving.has(s.key))
}

/** Whether a revoke of some partitions runs beside the poll loop. */
export const revokingAny = <E, R, EH, RH>(ctx: SessionContext<E, R, EH, RH>): boolean => {
  for (const s of ctx.owned.values()) if (s.revoking) return true
  return false
}

/**
 * Revoke: in-flight work ends (or is interrupted past revokeTimeout), the final positions are committed or stored,
 * onRevoke runs and the partition scopes close, and only then are the partitions released to the group (by the
 * caller, after this). Every step is bounded; together they fit in rebalanceTimeout. A missed deadline is logged and
 * the revoke goes on.
 */
export const revoke = <E, R, EH, RH>(
  ctx: SessionContext<E, R, EH, RH>,
  partitions: ReadonlyArray<TopicPartition.TopicPartition>,
  phase: string
): Effect.Effect<void, PolicyError | EH, Exclude<RH, Scope.Scope>> =>
  Effect.suspend(() => revokeStates(ctx, ownedStates(ctx, partitions), phase))

/**
 * An incremental revoke: the partitions are revoked (as `revoke` does) on a fiber of their own, beside the poll loop,
 * so that the partitions that stay go on being fetched and handled; `release` runs once it has ended. The session's
 * scope waits for it before the session leaves, and a failure ends the session.
 */
export const revokeBeside = <E, R, EH, RH>(
  ctx: SessionContext<E, R, EH, RH>,
  partitions: ReadonlyArray<TopicPartition.TopicPartition>,
  release: Effect.Effect<void>
): Effect.Effect<void, never, Exclude<RH, Scope.Scope>> =>
  Effect.suspend(() => {
    const states = ownedStates(ctx, partitions)
    for (const s of states) s.revoking = true
    return Effect.uninterruptible(revokeStates(ctx, states, "revoke")).pipe(
      Effect.zipRight(ctx.guard(release)),
      Effect.catchAllCause(ctx.report),
      Effect.forkIn(ctx.scope),
      Effect.asVoid
    )
  })

const revokeStates = <E, R, EH, RH>(
  ctx: SessionContext<E, R, EH, RH>,
  states: ReadonlyArray<PartitionState>,
  phase: string
): Effect.Effect<void, PolicyError | EH, Exclude<RH, Scope.Scope>> =>
  Effect.gen(function*() {
    const { telemetry, crash } = ctx
    if (states.length === 0) return
    if (telemetry !== undefined) {
      telemetry.rebalance("revoked", states.map((s) => s.tp))
      for (const s of states) telemetry.forget(s.tp)
    }
    yield* Effect.forEach(states, (s) => stopWorker(ctx, s, phase), { concurrency: "unbounded", discard: true })
    if (crash.crashed) return
    const committed = yield* Effect.exit(
      within(ctx.policy.revoke(states.map((s) => s.tp)), ctx.config.stepTimeout)
    )
    if (Exit.isSuccess(committed) && Option.isNone(committed.value)) {
      yield* Effect.logWarning(
        `${phase}: the final commit of ${keysOf(states)} did not finish within ` +
          `${Duration.format(ctx.config.stepTimeout)}; their next owner repeats what was handled since the last commit`
      )
    }
    if (crash.crashed) return
    yield* closePartitions(ctx, states, phase)
    if (Exit.isFailure(committed)) return yield* committed
  })

/** Lost: the partitions belong to others already; their work is interrupted and nothing is committed. */
export const lose = <E, R, EH, RH>(
  ctx: SessionContext<E, R, EH, RH>,
  partitions: ReadonlyArray<TopicPartition.TopicPartition>,
  phase: string
): Effect.Effect<void, EH, Exclude<RH, Scope.Scope>> =>
  Effect.gen(function*() {
    const { telemetry } = ctx
    const states = ownedStates(ctx, partitions)
    if (telemetry !== undefined) {
      telemetry.rebalance("lost", states.map((s) => s.tp))
      for (const s of states) telemetry.forget(s.tp)
    }
    yield* Effect.forEach(states, (s) => interruptWorker(ctx, s, phase), { concurrency: "unbounded", discard: true })
    yield* ctx.policy.lost(states.map((s) => s.tp))
    yield* closePartitions(ctx, states, phase)
  })
