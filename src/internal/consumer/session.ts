/**
 * One session of a consumer: one membership of the group. Its fiber polls the driver and hands each event on in
 * order: assignments and revokes to the partition lifecycle (`partitions.ts`), records to the partitions' workers
 * (`chunks.ts`, `pipeline.ts`), which the flow (`flow.ts`) pauses and resumes. Any part ends the session through one
 * deferred failure; a crash injected by `Faults` ends it at once and silences the rest.
 *
 * @internal
 */
import * as Cause from "effect/Cause"
import * as Chunk from "effect/Chunk"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as Option from "effect/Option"
import type * as Scope from "effect/Scope"
import type { PolicyContext, PolicyError } from "../../CommitPolicy.js"
import type { DriverEvent, DriverSession } from "../../Driver.js"
import { Crashed } from "../../Faults.js"
import { DriverError, type OffsetOutOfRange, PartitionsLost, type WorkerStuck } from "../../KafkaError.js"
import * as TopicPartition from "../../TopicPartition.js"
import { makeRouter, makeSideWrites, retryable, type Work } from "../route/router.js"
import { retryAfterFailure } from "../shared/retry.js"
import { makeConsumer } from "../telemetry/telemetry.js"
import {
  type Crash,
  type Environment,
  type Failure,
  fenced,
  type Hooks,
  membershipGone,
  Reconnect,
  Rejoin,
  type Resolved,
  type RouteError,
  type RunError,
  type SessionContext,
  sideWritesWait,
  staleMembership,
  stopping
} from "./context.js"
import * as Flow from "./flow.js"
import { lagReports } from "./lag.js"
import { concurrently } from "./ordering.js"
import * as Partitions from "./partitions.js"

type LoopError<EH> = PolicyError | OffsetOutOfRange | WorkerStuck | PartitionsLost | EH

/**
 * Runs when called, in the poll loop: the bookkeeping and the hand-over to the worker are synchronous, and an effect
 * is returned only for what needs one (a seek, the policy's `delivered`, a pause).
 */
const enqueue = <E, R, EH, RH>(
  ctx: SessionContext<E, R, EH, RH>,
  event: Extract<DriverEvent, { _tag: "Records" }>
): Effect.Effect<void, DriverError> => {
  const state = ctx.owned.get(TopicPartition.key(event.partition))
  if (state === undefined || stopping(state)) return Effect.void
  // Offsets are not contiguous (transaction markers, aborted and compacted records): the driver says where a
  // fetch started, and a fetch from the expected position is taken whatever its first offset. One that started
  // past it skipped offsets: the partition is sought back, a few times, then the driver is reported broken.
  if (event.from > state.next) {
    state.skips++
    if (state.skips > 3) {
      return Effect.fail(
        new DriverError({
          operation: "poll",
          reason: `fetches of ${state.key} keep starting at ${event.from}, past the position ${state.next}: ` +
            "the driver skips offsets"
        })
      )
    }
    return Effect.zipRight(
      Effect.logWarning(`a fetch of ${state.key} started at ${event.from}, past ${state.next}; seeking back`),
      ctx.guard(ctx.session.seek(event.partition, state.next))
    )
  }
  state.skips = 0
  const records = event.from === state.next
    ? event.records
    : Chunk.filter(event.records, (r) => r.offset >= state.next)
  if (event.next <= state.next) return Effect.void
  state.next = event.next
  // A fetch with nothing to read (a late transaction marker, an aborted transaction) still moves the position:
  // it goes to the worker as an empty chunk, in its place, so that the policy commits or stores it in order.
  state.outstanding += Chunk.size(records)
  ctx.telemetry?.received(state.tp, Chunk.size(records))
  state.queue.unsafeOffer({ records, next: event.next })
  const delivered = ctx.policy.delivered(event.partition, event.next)
  if (state.phase !== "fetching" || Flow.roomFor(ctx.config, state)) return delivered
  return delivered === Effect.void ? Flow.pause(ctx, state) : Effect.zipRight(delivered, Flow.pause(ctx, state))
}

const outOfRange = <E, R, EH, RH>(
  ctx: SessionContext<E, R, EH, RH>,
  event: Extract<DriverEvent, { _tag: "OutOfRange" }>
) =>
  Effect.gen(function*() {
    const state = ctx.owned.get(TopicPartition.key(event.partition))
    if (state === undefined || stopping(state)) return
    const ranges = yield* ctx.session.offsets([event.partition])
    const range = ranges.get(state.key)
    if (range === undefined) {
      return yield* new DriverError({ operation: "offsets", reason: `no offsets for ${state.key}`, retriable: true })
    }
    const position = yield* Partitions.reset(ctx, event.partition, event.position, range)
    // Back below where the partition had come (its log was cut back): what was fetched from `position` on is not
    // the log any more, and what finished of it must not move the position past the records written there now.
    if (position < state.next) state.queue.unsafeOffer({ records: Chunk.empty(), next: position, rewind: true })
    state.next = position
    yield* ctx.guard(ctx.session.seek(event.partition, position))
  })

const handle = <E, R, EH, RH>(
  ctx: SessionContext<E, R, EH, RH>,
  event: DriverEvent
): Effect.Effect<void, LoopError<EH> | DriverError, R | Exclude<RH, Scope.Scope>> => {
  switch (event._tag) {
    case "Assigned":
      return Partitions.assign(ctx, event.partitions)
    case "Revoked":
      // Some partitions stay (an incremental rebalance): the moved ones are revoked beside the poll loop, so that
      // those that stay are neither paused nor kept waiting.
      if (Partitions.staying(ctx, event.partitions).length > 0 || Partitions.revokingAny(ctx)) {
        return Partitions.revokeBeside(ctx, event.partitions, event.release)
      }
      return Effect.uninterruptible(Partitions.revoke(ctx, event.partitions, "revoke")).pipe(
        Effect.zipRight(ctx.guard(event.release))
      )
    case "Lost":
      return Effect.uninterruptible(Partitions.lose(ctx, event.partitions, "lost")).pipe(
        Effect.zipRight(
          ctx.config.rejoin || event.partitions.length === 0
            ? Effect.void
            : Effect.fail(new PartitionsLost({ partitions: event.partitions }))
        )
      )
    case "Records":
      return enqueue(ctx, event)
    case "OutOfRange":
      return outOfRange(ctx, event)
  }
}

/**
 * The events of one poll in order; an event is looked at only once the effects of those before it have run. Records
 * that need no effect are handed over without building one.
 */
const handleFrom = <E, R, EH, RH>(
  ctx: SessionContext<E, R, EH, RH>,
  events: ReadonlyArray<DriverEvent>,
  from: number
): ReturnType<typeof handle<E, R, EH, RH>> => {
  for (let i = from; i < events.length; i++) {
    const effect = handle(ctx, events[i]!)
    if (effect === Effect.void) continue
    if (i + 1 === events.length) return effect
    return Effect.zipRight(effect, Effect.suspend(() => handleFrom(ctx, events, i + 1)))
  }
  return Effect.void
}

/**
 * Leaving cleanly revokes everything owned first, so that the last positions are committed or stored. A session that
 * ends because the cluster cannot be reached, or to rejoin, loses its partitions instead: nothing it would commit could
 * land. A crashed member does nothing of the sort: its workers just stop, as they would with the process.
 */
const leave = <E, R, EH, RH>(ctx: SessionContext<E, R, EH, RH>) => (exit: Exit.Exit<unknown, unknown>) =>
  Effect.suspend(() => {
    const stopWorkers = Effect.forEach(
      ctx.owned.values(),
      (s) => s.worker === undefined ? Effect.void : Fiber.interruptFork(s.worker),
      { discard: true }
    )
    if (ctx.crash.crashed) return stopWorkers
    const all = Array.from(ctx.owned.values(), (s) => s.tp)
    if (all.length === 0) return Effect.void
    const leaving: Effect.Effect<void, PolicyError | EH, Exclude<RH, Scope.Scope>> =
      Exit.isFailure(exit) && membershipGone(exit.cause)
        ? Partitions.lose(ctx, all, "rejoin")
        : Partitions.revoke(ctx, all, "shutdown")
    return leaving.pipe(
      Effect.catchAllCause((cause) =>
        ctx.crash.crashed
          ? stopWorkers
          : Cause.isInterruptedOnly(cause)
          ? Effect.void
          : Effect.logWarning(
            "the revoke on shutdown failed; the partitions' next owners repeat what was " +
              "handled since their last commit",
            cause
          )
      )
    )
  })

/**
 * The crash point of an injected fault. Without injected faults it is a constant no-op: no effect is built per chunk.
 * A crash ends the session wherever it happens (in a worker, in the poll loop, in a bounded step of a revoke): the
 * session's failure is completed with it at once.
 */
const crashPoint = <F>(
  env: Environment,
  session: DriverSession,
  crash: Crash,
  failure: Deferred.Deferred<never, F>
): PolicyContext["crashAt"] => {
  const { faults } = env
  if (Option.isNone(faults)) return () => Effect.void
  return (point, partitions) =>
    Effect.suspend(() => crash.crashed ? Effect.never : faults.value.crashAt(point, session.memberId, partitions)).pipe(
      Effect.flatMap((dies): Effect.Effect<void> => {
        if (!dies) return Effect.void
        crash.crashed = true
        const crashed = new Crashed({ memberId: session.memberId, point })
        return Deferred.succeed(crash.signal, undefined).pipe(
          Effect.zipRight(Deferred.die(failure, crashed)),
          Effect.zipRight(Effect.die(crashed))
        )
      })
    )
}

/** Connects, makes the policy's instance and the route, and puts the session's parts together. */
const makeContext = <E, R, EH, RH>(
  config: Resolved,
  handler: Work<E, R>,
  hooks: Hooks<EH, RH>,
  env: Environment,
  failure: Deferred.Deferred<never, Failure<E, EH>>
) =>
  Effect.gen(function*() {
    const sessionScope = yield* Effect.scope
    const session: DriverSession = yield* env.driver.connect(config.session)
    const telemetry = Option.isNone(env.observability)
      ? undefined
      : makeConsumer(env.observability.value, config.session.groupId, yield* Effect.clock)
    // Handler calls timed and their failures counted, with observability.
    const work: Work<E, R> = telemetry === undefined || !telemetry.settings.metrics
      ? handler
      : (records, tp) => telemetry.call(tp, records, handler(records, tp))
    const crash: Crash = { crashed: false, signal: yield* Deferred.make<void>() }
    // After a crash nothing reaches the outside any more; the consumer ends with `Crashed` through `failure`.
    // Only an injected fault crashes a member, so without faults there is nothing to check.
    const guard = Option.isNone(env.faults)
      ? <A, E1, R1>(effect: Effect.Effect<A, E1, R1>): Effect.Effect<A, E1, R1> => effect
      : <A, E1, R1>(effect: Effect.Effect<A, E1, R1>): Effect.Effect<A, E1, R1> =>
        Effect.suspend(() => crash.crashed ? Effect.never : effect)
    const report = (cause: Cause.Cause<Failure<E, EH>>) =>
      Cause.isInterruptedOnly(cause) ? Effect.void : Deferred.failCause(failure, cause)

    // The route's writes that units do not wait for, under a policy whose commits do. Added before the revoke on
    // shutdown, this finalizer runs after it: that revoke's commit waits for the writes; any still in flight (the
    // consumer ended without committing them) are let end, for as long as a reconnect could take.
    const sideWrites = makeSideWrites(sideWritesWait(config.route))
    yield* Effect.addFinalizer(() =>
      crash.crashed ? sideWrites.close(Duration.zero) : sideWrites.close(config.reconnectTimeout)
    )
    const acknowledged: Effect.Effect<boolean> = config.route === undefined
      ? Effect.succeed(true)
      : Effect.flatMap(sideWrites.settled, (failed) =>
        failed === undefined
          ? Effect.succeed(true)
          : Effect.as(Deferred.fail(failure, failed.error as RouteError<E>), false))

    const policy = yield* env.commitPolicy.make({
      groupId: config.session.groupId,
      session: telemetry === undefined ? session : telemetry.session(session),
      crashAt: crashPoint(env, session, crash, failure),
      guard,
      fork: (effect) => effect.pipe(Effect.catchAllCause(report), Effect.forkIn(sessionScope), Effect.asVoid),
      reconnectTimeout: config.reconnectTimeout,
      routed: acknowledged,
      observe: telemetry === undefined ? (_kind, _partition, _next, unit) => unit : telemetry.unit
    })
    // A failed handler is retried on the same chunk; a policy's failure (a refused commit, a fence) is not its to
    // retry, nor is a record that did not decode.
    const retryOptions = { schedule: config.retry, retryable }
    const retry = <E2, R2>(effect: Effect.Effect<void, E2, R2>) => retryAfterFailure(effect, retryOptions)
    // With a failure route, records that keep failing are routed instead of ending the consumer.
    const router = config.route === undefined ? undefined : makeRouter(
      config.route,
      policy.failedRecords ?? "inPlace",
      policy.unitHoldsWrites === true,
      work,
      retry,
      policy.awaitsRoutes === true ? sideWrites : undefined,
      telemetry?.routed
    )
    const routed = router === undefined ? work : router.work
    const { ordering, concurrency } = config
    // Records finish out of order, across chunks, when the ordering allows it and the policy can commit that way.
    const outOfOrder = ordering === "partition" ? undefined : policy.outOfOrder
    const ctx: SessionContext<E, R, EH, RH> = {
      config,
      hooks,
      session,
      policy,
      telemetry,
      owned: new Map(),
      scope: sessionScope,
      abandoned: env.abandoned,
      permits: env.permits,
      crash,
      guard,
      report,
      router,
      rerun: router !== undefined && policy.failedRecords === "rerun" ? router : undefined,
      routed,
      // A policy that handles a chunk as a unit: the chunk's records side by side, as the ordering allows.
      chunkWork: ordering === "partition" || outOfOrder !== undefined
        ? routed
        : (records, tp) => concurrently(records, ordering, env.permits, concurrency, (lane) => routed(lane, tp)),
      retry,
      outOfOrder,
      // Half the writes' wait: a retry is handed over at most 50 ms, or a twentieth of the shortest delay, after it
      // is due.
      dueSlack: Duration.toMillis(sideWritesWait(config.route)) / 2,
      reachable: (offsets) => config.session.isolationLevel === "read_uncommitted" ? offsets.latest : offsets.lastStable
    }
    return ctx
  })

/** A session, until it fails: with a `Reconnect` or a `Rejoin` when a new one must begin. */
export const runSession = <E, R, EH, RH>(
  config: Resolved,
  handler: Work<E, R>,
  hooks: Hooks<EH, RH>,
  env: Environment
): Effect.Effect<
  never,
  RunError | Failure<E, EH> | Reconnect | Rejoin,
  R | Exclude<RH, Scope.Scope>
> =>
  Effect.scoped(Effect.gen(function*() {
    const failure = yield* Deferred.make<never, Failure<E, EH>>()
    const ctx = yield* makeContext(config, handler, hooks, env, failure)
    yield* Effect.addFinalizer(leave(ctx))
    if (ctx.telemetry !== undefined) {
      yield* lagReports(ctx.telemetry, ctx.session, ctx.owned, yield* Effect.scope, ctx.reachable)
    }
    const loop = ctx.guard(ctx.session.poll).pipe(
      Effect.flatMap((events) => {
        env.connected()
        return handleFrom(ctx, events, 0)
      }),
      Effect.zipRight(ctx.policy.polled),
      Effect.forever
    )
    return yield* Effect.raceFirst(loop, Deferred.await(failure))
  })).pipe(
    Effect.mapError((error) =>
      error instanceof DriverError && error.retriable
        ? new Reconnect(error)
        : config.rejoin && (staleMembership(error) || fenced(error))
        ? new Rejoin(error)
        : error
    )
  )
