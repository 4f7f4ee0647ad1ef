import * as Cause from "effect/Cause"
import * as Chunk from "effect/Chunk"
import * as Clock from "effect/Clock"
import type * as Context from "effect/Context"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as FiberId from "effect/FiberId"
import * as Mailbox from "effect/Mailbox"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import * as Scope from "effect/Scope"
import { CommitPolicy, type PolicyContext, type PolicyError, type PolicyInstance } from "../../CommitPolicy.js"
import type { ConsumerRecord } from "../../ConsumerRecord.js"
import {
  Driver,
  type DriverEvent,
  type DriverSession,
  type PartitionOffsets,
  type SessionOptions
} from "../../Driver.js"
import { dueOf } from "../../FailureRoute.js"
import { Crashed, Faults } from "../../Faults.js"
import {
  type CircuitOpen,
  CommitFailed,
  type InvalidConfig,
  DriverError,
  HandlerFailed,
  OffsetOutOfRange,
  PartitionsLost,
  type ProduceFailed,
  type RecordNotInChunk,
  TransactionFailed,
  WorkerStuck
} from "../../KafkaError.js"
import { metrics, Observability, type PartitionLag } from "../../Observability.js"
import { Fenced } from "../../OffsetStore.js"
import * as TopicPartition from "../../TopicPartition.js"
import { concurrently, keyText, type Ordering } from "./ordering.js"
import * as Permits from "./permits.js"
import { Progress, type Range } from "./progress.js"
import { retryAfterFailure } from "../shared/retry.js"
import * as StuckWorkers from "./stuckWorkers.js"
import {
  HandlerFailure,
  makeRouter,
  retryable,
  retryStepOf,
  makeSideWrites,
  Fatal,
  type RouteSettings,
  type Work
} from "../route/router.js"
import { type ConsumerTelemetry, makeConsumer } from "../telemetry/telemetry.js"

/** Where a partition starts when it has no position, or one outside its log. */
export type OffsetReset = "earliest" | "latest" | "none"

/** Consumer settings after validation. */
export interface Resolved {
  readonly session: SessionOptions
  readonly bufferSize: number
  readonly revokeTimeout: Duration.Duration
  /** The bound of each later step of a revoke: interrupting work, the final commit, `onRevoke`, the finalizers. */
  readonly stepTimeout: Duration.Duration
  readonly retry: Schedule.Schedule<unknown, unknown>
  readonly offsetReset: OffsetReset
  readonly reconnectTimeout: Duration.Duration
  readonly rejoin: boolean
  /** Which records of a partition are handled one after another. */
  readonly ordering: Ordering
  /** Under `key` and `unordered` ordering, the most handler calls in flight over all partitions. */
  readonly concurrency: number
  /** Where records that keep failing go; none: the consumer stops. */
  readonly route: RouteSettings | undefined
}

/**
 * How many records of a partition may lie between its lowest unfinished offset and the last one fetched, as a multiple
 * of `bufferSize`, when records finish out of order: past it the partition is paused, so that one slow key cannot make
 * the window (and what a crash repeats) grow without bound.
 */
const windowPerBuffer = 10

export interface Hooks<E, R> {
  readonly onAssign?: (partition: TopicPartition.TopicPartition) => Effect.Effect<void, E, R | Scope.Scope>
  readonly onRevoke?: (partition: TopicPartition.TopicPartition) => Effect.Effect<void, E, R | Scope.Scope>
}

export type RunError = InvalidConfig | PolicyError | OffsetOutOfRange | PartitionsLost | WorkerStuck

/**
 * How a handler's failure ends a consumer besides `HandlerFailed`: the dead-letter write failed, the route's circuit
 * opened, or the handler named a record that is not in its chunk.
 */
export type RouteError<E> = ProduceFailed | CircuitOpen<E> | RecordNotInChunk<E>

export { HandlerFailure, type Work } from "../route/router.js"

/**
 * How long a routed record waits for others to be written with it, under a policy whose commits wait for the writes:
 * 100 ms, or a tenth of the route's shortest retry delay when that is less (a retry is held back by at most a tenth of
 * its delay). A commit writes what waits at once.
 */
const sideWritesWait = (route: RouteSettings | undefined): Duration.Duration =>
  Duration.millis(Math.min(100, ...(route?.delays ?? []).map((delay) => delay / 10)))

/** A unit given up because its partition is being revoked (see `abandon`). */
class Abandoned {
  readonly _tag = "Abandoned"
}
const givenUp = new Abandoned()
const isGivenUp = (error: unknown): error is Abandoned => error === givenUp

/** The session must end and a new one begin: the cluster could not be reached. */
class Reconnect {
  constructor(readonly cause: DriverError) {}
}

/**
 * The session must end and a new one begin at once: the member's membership is stale. The offset store fenced a unit
 * (another member claimed the partition), or the group refused a commit because the member's generation or member id
 * is no longer the group's (evicted, or the coordinator lost track of it): the client may take long to notice.
 */
class Rejoin {
  constructor(readonly cause: Fenced | CommitFailed | TransactionFailed) {}
}

/** Another member owns the partition now: the offset store or the Kafka transaction coordinator fenced a unit. */
const fenced = (error: unknown): error is Fenced | TransactionFailed =>
  error instanceof Fenced || (error instanceof TransactionFailed && error.reason === "Fenced")

/** A commit refused because the member's generation or member id is not the group's any more. */
const staleMembership = (error: unknown): error is CommitFailed =>
  error instanceof CommitFailed && (error.reason === "IllegalGeneration" || error.reason === "UnknownMember")

interface Fetched {
  readonly records: Chunk.Chunk<ConsumerRecord>
  /** Where the partition continues after these records (past offsets that held nothing to read). */
  readonly next: bigint
  /**
   * No records: the partition starts again at `next`, below where it had come (its log was cut back). Handed to the
   * worker in its place among the chunks, so that what was fetched before it is forgotten before what comes after.
   */
  readonly rewind?: true
}

interface PartitionState {
  readonly tp: TopicPartition.TopicPartition
  readonly key: string
  readonly scope: Scope.CloseableScope
  /** Fetched chunks waiting for the worker. A mailbox: a worker that waits costs a callback, not a deferred. */
  readonly queue: Mailbox.Mailbox<Fetched>
  readonly lock: Effect.Semaphore
  /** Where the next fetch must start: a fetch from below it is a re-fetch (its records below are dropped). */
  next: bigint
  /** Fetches in a row that started past `next` (a driver that skipped offsets): the partition is sought back. */
  skips: number
  /** Records fetched and not yet handled; fetching pauses before it can pass `bufferSize`. */
  outstanding: number
  paused: boolean
  /** Paused until a retry topic's next record is due (the driver was told it stays paused for a while). */
  held: boolean
  stopping: boolean
  worker: Fiber.RuntimeFiber<void> | undefined
  /** When records finish out of order: the lowest unfinished offset and the ranges finished above it. */
  readonly progress: Progress | undefined
  /** When chunks are units: the ranges an earlier owner finished out of order, whose records are left out. */
  skip: Progress | undefined
}

/** Records of one key (or one record without a key, or any one record when unordered) waiting to be handled. */
interface Lane {
  readonly key: string | undefined
  records: Array<ConsumerRecord>
  indexes: Array<number>
}

/**
 * `effect` for at most `duration`; past it, `None`, and the effect is interrupted without waiting for it (it may sit
 * in an uninterruptible region; then it is left to end in the background). It runs in a fiber of its own, so that the
 * bound holds inside a finalizer too.
 */
const within = <A, E, R>(effect: Effect.Effect<A, E, R>, duration: Duration.Duration) =>
  Effect.disconnect(Effect.interruptible(Effect.timeoutOption(Effect.disconnect(effect), duration)))

const keysOf = (states: ReadonlyArray<PartitionState>) => states.map((s) => s.key).join(", ")

const byOffset = (a: ConsumerRecord, b: ConsumerRecord) => a.offset < b.offset ? -1 : a.offset > b.offset ? 1 : 0

/** The records of a unit's parts, in order. */
function* recordsOf(parts: ReadonlyArray<Chunk.Chunk<ConsumerRecord>>): Generator<ConsumerRecord> {
  for (const part of parts) yield* part
}

/**
 * With observability: at once and then every `lagInterval`, on a fiber of its own (off the poll loop), the owned
 * partitions' latest offsets against the positions committed or stored, as the lag gauges and a snapshot; the
 * buffered records and paused partitions are sampled with them. When the session ends, a snapshot that owns nothing.
 */
const lagReports = (
  telemetry: ConsumerTelemetry,
  session: DriverSession,
  owned: ReadonlyMap<string, PartitionState>,
  scope: Scope.Scope,
  reachable: (offsets: PartitionOffsets) => bigint
): Effect.Effect<void> => {
  const { settings } = telemetry
  const snapshot = (partitions: ReadonlyArray<PartitionLag>) =>
    settings.report({
      groupId: telemetry.groupId,
      memberId: session.memberId,
      at: telemetry.clock.unsafeCurrentTimeMillis(),
      partitions
    })
  const report = Effect.suspend(() => {
    const states = Array.from(owned.values()).filter((s) => !s.stopping)
    if (states.length === 0) return snapshot([])
    return Effect.flatMap(session.offsets(states.map((s) => s.tp)), (read) => {
      const partitions: Array<PartitionLag> = []
      let paused = 0
      for (const state of states) {
        if (state.paused) paused++
        const offsets = read.get(state.key)
        if (offsets === undefined) continue
        const latest = reachable(offsets)
        const position = telemetry.positions.get(state.key) ?? latest
        const lag = latest > position ? latest - position : 0n
        partitions.push({ ...state.tp, position, latest, lag })
        if (settings.metrics) {
          const { labels } = telemetry.partition(state.tp).set
          metrics.lag.unsafeUpdate(Number(lag), labels)
          metrics.bufferedRecords.unsafeUpdate(state.outstanding, labels)
        }
      }
      if (settings.metrics) metrics.pausedPartitions.unsafeUpdate(paused, telemetry.group.labels)
      return snapshot(partitions)
    })
  }).pipe(Effect.catchAll((error) => Effect.logDebug("the partitions' latest offsets could not be read for the lag", error)))
  return Effect.zipRight(
    Scope.addFinalizer(scope, snapshot([])),
    Effect.asVoid(Effect.forkIn(Effect.repeat(report, Schedule.spaced(settings.lagInterval)), scope))
  )
}

/**
 * Runs a consumer until it fails or is interrupted. A session (one membership of the group) has one fiber that polls
 * the driver and owns assignment; each partition has a worker fiber in a scope of its own that ends on revoke; the
 * policy decides the commits. When the cluster cannot be reached, or a fenced unit shows that a partition moved on,
 * the session ends and a new one begins, for as long as `reconnectTimeout` allows.
 */
export const run = <E, R, EH, RH>(
  config: Resolved,
  work: Work<E, R>,
  hooks: Hooks<EH, RH>
): Effect.Effect<
  never,
  RunError | HandlerFailed<E> | RouteError<E> | EH,
  Driver | CommitPolicy | R | Exclude<RH, Scope.Scope>
> =>
  Effect.flatMap(Effect.serviceOption(Observability), (observability) => {
    const body = consume(config, work, hooks, observability)
    if (Option.isNone(observability) || !observability.value.spans) return body
    return Effect.withSpan(body, "kafka.consumer", {
      attributes: {
        "messaging.system": "kafka",
        "messaging.consumer.group.name": config.session.groupId,
        "messaging.client.id": config.session.clientId
      },
      captureStackTrace: false
    })
  })

const consume = <E, R, EH, RH>(
  config: Resolved,
  work: Work<E, R>,
  hooks: Hooks<EH, RH>,
  observability: Option.Option<Context.Tag.Service<typeof Observability>>
): Effect.Effect<
  never,
  RunError | HandlerFailed<E> | RouteError<E> | EH,
  Driver | CommitPolicy | R | Exclude<RH, Scope.Scope>
> =>
  Effect.gen(function*() {
    const driver = yield* Driver
    const commitPolicy = yield* CommitPolicy
    const faults = yield* Effect.serviceOption(Faults)
    /** Workers of revoked partitions that did not stop when interrupted, by partition. */
    const abandoned = StuckWorkers.make()
    const reconnectSchedule = Schedule.exponential(Duration.millis(100)).pipe(
      Schedule.union(Schedule.spaced(Duration.seconds(5))),
      Schedule.upTo(config.reconnectTimeout)
    )
    // One backoff per run of failed sessions; a session that polls starts the next run afresh.
    let backoff: Schedule.ScheduleDriver<unknown, unknown> | undefined

    const session = runSession(config, work, hooks, {
      driver,
      commitPolicy,
      faults,
      abandoned,
      observability,
      permits: Permits.make(config.concurrency),
      connected: () => {
        backoff = undefined
      }
    })

    const reconnect = (error: Reconnect): Effect.Effect<void, DriverError> =>
      Effect.gen(function*() {
        const current = backoff ?? (yield* Schedule.driver(reconnectSchedule))
        backoff = current
        yield* Effect.logWarning(`${error.cause.message}; reconnecting`)
        yield* Effect.mapError(current.next(error), () => error.cause)
      })

    while (true) {
      const failed = yield* Effect.flip(session)
      if (failed instanceof Rejoin) {
        yield* Effect.logWarning(`${failed.cause.message}: giving up every partition and rejoining the group`)
        continue
      }
      if (failed instanceof Reconnect) {
        yield* reconnect(failed)
        continue
      }
      return yield* Effect.fail(failed)
    }
  })

interface Environment {
  readonly driver: Context.Tag.Service<Driver>
  readonly commitPolicy: Context.Tag.Service<CommitPolicy>
  readonly faults: Option.Option<Context.Tag.Service<Faults>>
  readonly abandoned: StuckWorkers.StuckWorkers
  /** When provided: metrics, spans and lag. */
  readonly observability: Option.Option<Context.Tag.Service<typeof Observability>>
  /** Bounds the handler calls in flight over all partitions under `key` and `unordered` ordering. */
  readonly permits: Permits.Permits
  /** The session polled: the cluster can be reached. */
  readonly connected: () => void
}

const runSession = <E, R, EH, RH>(
  config: Resolved,
  handler: Work<E, R>,
  hooks: Hooks<EH, RH>,
  env: Environment
): Effect.Effect<never, RunError | HandlerFailed<E> | RouteError<E> | EH | Reconnect | Rejoin, R | Exclude<RH, Scope.Scope>> =>
  Effect.scoped(Effect.gen(function*() {
    const { abandoned, faults } = env
    type Failure = HandlerFailed<E> | RouteError<E> | PolicyError | OffsetOutOfRange | PartitionsLost | WorkerStuck | Rejoin | EH
    type HookNeeds = Exclude<RH, Scope.Scope>
    type LoopError = PolicyError | OffsetOutOfRange | WorkerStuck | PartitionsLost | EH
    const failure = yield* Deferred.make<never, Failure>()
    const sessionScope = yield* Effect.scope
    const session: DriverSession = yield* env.driver.connect(config.session)
    const telemetry: ConsumerTelemetry | undefined = Option.isNone(env.observability)
      ? undefined
      : makeConsumer(env.observability.value, config.session.groupId, yield* Effect.clock)
    // Handler calls timed and their failures counted, with observability.
    const work: Work<E, R> = telemetry === undefined || !telemetry.settings.metrics
      ? handler
      : (records, tp) => telemetry.call(tp, records, handler(records, tp))
    let crashed = false
    const crashSignal = yield* Deferred.make<void>()

    // After a crash nothing reaches the outside any more; the consumer ends with `Crashed` through `failure`.
    // Only an injected fault crashes a member, so without faults there is nothing to check.
    const guard = Option.isNone(faults)
      ? <A, E1, R1>(effect: Effect.Effect<A, E1, R1>): Effect.Effect<A, E1, R1> => effect
      : <A, E1, R1>(effect: Effect.Effect<A, E1, R1>): Effect.Effect<A, E1, R1> =>
        Effect.suspend(() => crashed ? Effect.never : effect)

    // Without injected faults a crash point is a constant no-op: no effect is built per chunk. A crash ends the
    // session wherever it happens (in a worker, in the poll loop, in a bounded step of a revoke): the session's
    // failure is completed with it at once.
    const crashAt: PolicyContext["crashAt"] = Option.isNone(faults) ? () => Effect.void : (point, partitions) =>
      Effect.suspend(() => crashed ? Effect.never : faults.value.crashAt(point, session.memberId, partitions)).pipe(
        Effect.flatMap((dies) => {
          if (!dies) return Effect.void
          crashed = true
          const crash = new Crashed({ memberId: session.memberId, point })
          return Deferred.succeed(crashSignal, undefined).pipe(
            Effect.zipRight(Deferred.die(failure, crash)),
            Effect.zipRight(Effect.die(crash))
          )
        })
      )

    const report = (cause: Cause.Cause<Failure>) =>
      Cause.isInterruptedOnly(cause) ? Effect.void : Deferred.failCause(failure, cause)

    const fork = (effect: Effect.Effect<void, PolicyError>) =>
      effect.pipe(Effect.catchAllCause(report), Effect.forkIn(sessionScope), Effect.asVoid)

    // The route's writes that units do not wait for, under a policy whose commits do. Added before the revoke on
    // shutdown, this finalizer runs after it: that revoke's commit waits for the writes; any still in flight (the
    // consumer ended without committing them) are let end, for as long as a reconnect could take.
    const sideWrites = makeSideWrites(sideWritesWait(config.route))
    // Half the writes' wait: a retry is handed over at most 50 ms, or a twentieth of the shortest delay, after it is due.
    const dueSlack = Duration.toMillis(sideWritesWait(config.route)) / 2
    yield* Effect.addFinalizer(() => crashed ? sideWrites.close(Duration.zero) : sideWrites.close(config.reconnectTimeout))
    const acknowledged: Effect.Effect<boolean> = config.route === undefined
      ? Effect.succeed(true)
      : Effect.flatMap(sideWrites.settled, (failed) =>
        failed === undefined
          ? Effect.succeed(true)
          : Effect.as(Deferred.fail(failure, failed.error as RouteError<E>), false))

    const policyContext: PolicyContext = {
      groupId: config.session.groupId,
      session: telemetry === undefined ? session : telemetry.session(session),
      crashAt,
      guard,
      fork,
      reconnectTimeout: config.reconnectTimeout,
      routed: acknowledged,
      observe: telemetry === undefined ? (_kind, _partition, _next, unit) => unit : telemetry.unit
    }
    const policy: PolicyInstance = yield* env.commitPolicy.make(policyContext)
    const owned = new Map<string, PartitionState>()
    const maxPoll = config.session.maxPollRecords
    const { ordering, concurrency } = config
    /** The latest offset the consumer can read: the last stable offset under read_committed, else the high watermark. */
    const reachable = (offsets: PartitionOffsets) =>
      config.session.isolationLevel === "read_uncommitted" ? offsets.latest : offsets.lastStable
    const { permits } = env
    // Records finish out of order, across chunks, when the ordering allows it and the policy can commit that way.
    const outOfOrder = ordering === "partition" ? undefined : policy.outOfOrder
    const maxWindow = windowPerBuffer * config.bufferSize
    /** Whether the partition may fetch more: records not finished, and the window behind them, stay bounded. */
    const roomFor = (state: PartitionState) =>
      state.outstanding + maxPoll <= config.bufferSize &&
      (state.progress === undefined || state.progress.window + maxPoll <= maxWindow)
    // A failed handler is retried on the same chunk; a policy's failure (a refused commit, a fence) is not its to retry,
    // nor is a record that did not decode.
    const retryOptions = { schedule: config.retry, retryable }
    const retry = <E2, R2>(effect: Effect.Effect<void, E2, R2>) => retryAfterFailure(effect, retryOptions)

    // With a failure route, records that keep failing are routed instead of ending the consumer.
    const router = config.route === undefined
      ? undefined
      : makeRouter(
        config.route,
        policy.failedRecords ?? "inPlace",
        policy.unitHoldsWrites === true,
        work,
        retry,
        policy.awaitsRoutes === true ? sideWrites : undefined,
        telemetry?.routed
      )
    const routed = router === undefined ? work : router.work
    const rerun = router !== undefined && policy.failedRecords === "rerun" ? router : undefined

    // A policy that handles a chunk as a unit: the chunk's records side by side, as the ordering allows.
    const chunkWork: Work<E, R> = ordering === "partition" || outOfOrder !== undefined
      ? routed
      : (records, tp) => concurrently(records, ordering, permits, concurrency, (lane) => routed(lane, tp))

    const resumable = (state: PartitionState) => state.paused && !state.stopping && roomFor(state)
    // Checked before the lock too: under key ordering a paused partition asks after every record, and it stays paused
    // until its window has room.
    const maybeResume = (state: PartitionState): Effect.Effect<void> =>
      !resumable(state) ? Effect.void : state.lock.withPermits(1)(Effect.suspend(() => {
        if (!resumable(state)) return Effect.void
        state.paused = false
        state.held = false
        return guard(session.resume([state.tp]))
      }))

    const failed = (
      state: PartitionState,
      records: Chunk.Chunk<ConsumerRecord>,
      error: HandlerFailure<E> | Fatal | PolicyError
    ): Effect.Effect<void, HandlerFailed<E> | RouteError<E> | PolicyError | Rejoin> => {
      if (error instanceof Fatal) return Effect.fail(error.error as RouteError<E>)
      if (error instanceof HandlerFailure) {
        return Effect.fail(
          new HandlerFailed<E>({
            topic: state.tp.topic,
            partition: state.tp.partition,
            offset: error.offset ?? Chunk.unsafeHead(records).offset,
            cause: error.error
          })
        )
      }
      if (fenced(error)) {
        // A unit fenced while its partition is being revoked was rolled back, and the partition's next owner handles
        // its records: nothing is lost, and this member goes on with its other partitions.
        if (state.stopping) return Effect.logDebug(`${state.key}: a unit fenced during the revoke was rolled back`)
        return Effect.fail(config.rejoin ? new Rejoin(error) : error)
      }
      return Effect.fail(error)
    }

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
    const processChunk = (
      state: PartitionState,
      records: Chunk.Chunk<ConsumerRecord>,
      position: bigint
    ): Effect.Effect<void, HandlerFailed<E> | RouteError<E> | PolicyError | Rejoin | Abandoned, R> => {
      // A chunk whose every record an earlier owner finished still moves the position, as an empty one does.
      const handled = Chunk.isEmpty(records) ? Effect.void : chunkWork(records, state.tp)
      return policy.process(state.tp, records, position, handled, retry).pipe(
        Effect.catchAll((error) => {
          if (rerun === undefined || !(error instanceof HandlerFailure)) return failed(state, records, error)
          if (state.stopping) return abandon(state)
          if (rerun.poison(state.tp, records, error)) return processChunk(state, records, position)
          return Effect.forEach(Chunk.range(0, Chunk.size(records) - 1), (i) => {
            const next = i + 1 < Chunk.size(records) ? Chunk.unsafeGet(records, i + 1).offset : position
            return processChunk(state, Chunk.of(Chunk.unsafeGet(records, i)), next)
          }, { discard: true })
        })
      )
    }

    // A unit rolled back while its partition is revoked: its records, and every one after them, are left to the
    // partition's next owner, which handles (and routes) them. Nothing after it may move the position.
    const abandon = (state: PartitionState) =>
      Effect.zipRight(
        Effect.logDebug(`${state.key}: a failed unit is left to the partition's next owner`),
        Effect.fail(givenUp)
      )

    /** A chunk as a unit; `false` when it was left to the partition's next owner. */
    const kept = (state: PartitionState, records: Chunk.Chunk<ConsumerRecord>, position: bigint) => {
      const unit = processChunk(state, records, position).pipe(
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
    const retrying = (tp: TopicPartition.TopicPartition) =>
      config.route !== undefined && retryStepOf(config.route, tp.topic) !== undefined

    /**
     * A chunk of a retry topic: the records that are due are handled; at the first that is not, the partition pauses
     * until it is (no handler waits), then goes on. A revoke ends the wait; the rest is left to the next owner. The
     * wait lasts `dueSlack` past the record's due time, so that the records due just after it (routed close together,
     * and written together) are handed over with it, in one unit, rather than each after a wait of its own.
     */
    const whenDue = (
      state: PartitionState,
      records: Chunk.Chunk<ConsumerRecord>,
      position: bigint
    ): Effect.Effect<boolean, HandlerFailed<E> | RouteError<E> | PolicyError | Rejoin, R> =>
      Effect.flatMap(Clock.currentTimeMillis, (now) => {
        const at = Chunk.findFirstIndex(records, (record) => (dueOf(record) ?? 0) > now)
        if (Option.isNone(at)) return kept(state, records, position)
        const waiting = Chunk.unsafeGet(records, at.value)
        const before = at.value === 0 ? Effect.succeed(true) : kept(state, Chunk.take(records, at.value), waiting.offset)
        return Effect.flatMap(before, (done) =>
          !done ? Effect.succeed(false) : Effect.zipRight(
            waitUntil(state, dueOf(waiting)! + dueSlack),
            Effect.suspend(() =>
              state.stopping ? Effect.succeed(false) : whenDue(state, Chunk.drop(records, at.value), position)
            )
          ))
      })

    /** Pauses the partition until `due` (or its revoke), in steps, so that a revoke need not wait for the end. */
    const waitUntil = (state: PartitionState, due: number): Effect.Effect<void> =>
      Effect.zipRight(
        state.lock.withPermits(1)(Effect.suspend(() => {
          if (state.held) return Effect.void
          state.paused = true
          state.held = true
          return guard(session.pause([state.tp], { hold: true }))
        })),
        Effect.flatMap(Clock.currentTimeMillis, (now) => {
          const step = (left: number): Effect.Effect<void> =>
            left <= 0 || state.stopping ? Effect.void : Effect.zipRight(
              Effect.sleep(Duration.millis(Math.min(left, 100))),
              Effect.flatMap(Clock.currentTimeMillis, (at) => step(due - at))
            )
          return step(due - now)
        })
      )

    // Chunks one after another, each as it was fetched. The worker takes every chunk waiting at once and handles
    // them in a loop of flatMaps rather than a generator: this runs once per chunk.
    // Forked in the poll loop, the worker runs with the consumer's services, the handler's among them.
    const worker = (state: PartitionState): Effect.Effect<void, HandlerFailed<E> | RouteError<E> | PolicyError | Rejoin, R> => {
      type Step = Effect.Effect<void, HandlerFailed<E> | RouteError<E> | PolicyError | Rejoin, R>
      const loop: Step = Effect.flatMap(state.queue.takeAll, ([chunks, done]) => next(chunks, 0, done))
      const next = (chunks: Chunk.Chunk<Fetched>, at: number, done: boolean): Step => {
        if (state.stopping || (done && at === Chunk.size(chunks))) return Effect.void
        if (at === Chunk.size(chunks)) return loop
        const { next: position, records: fetched, rewind } = Chunk.unsafeGet(chunks, at)
        if (rewind) {
          state.skip?.rewind(position)
          return next(chunks, at + 1, done)
        }
        const records = state.skip === undefined ? fetched : withoutFinished(state, fetched)
        return (retrying(state.tp) ? whenDue(state, records, position) : kept(state, records, position)).pipe(
          Effect.flatMap((kept) => {
            if (!kept) return Effect.void
            router?.passed(state.tp, position)
            state.outstanding -= Chunk.size(fetched)
            return state.paused
              ? Effect.zipRight(maybeResume(state), Effect.suspend(() => next(chunks, at + 1, done)))
              : next(chunks, at + 1, done)
          })
        )
      }
      return loop
    }

    // Records finishing out of order. The worker takes the fetched chunks as they come and puts each record in its
    // lane (its key's, or one of its own); lanes are handled by worker fibers, each holding a permit while it works,
    // up to `concurrency` per partition. A lane's records that arrive while it is handled wait in it, and its worker
    // takes them next, so that a key's records are handled in offset order. As records finish, the policy is told of
    // the partition's progress. On revoke the worker takes nothing new: lanes in flight finish, the rest is left to
    // the partition's next owner.
    const pipelineWorker = (
      state: PartitionState,
      policyOf: NonNullable<PolicyInstance["outOfOrder"]>
    ): Effect.Effect<void, never, R> => {
      const tp = state.tp
      const progress = state.progress!
      // The route counts records in a row in offset order through the ranges of the records in flight.
      router?.outOfOrder(tp, (offset) => progress.rangeAt(offset))
      const byKey = new Map<string, Lane>()
      let ready: Array<Lane | undefined> = []
      let readyAt = 0
      let running = 0
      let idle: Deferred.Deferred<void> | undefined

      const take = (): Lane | undefined => {
        if (readyAt === ready.length) {
          if (readyAt > 0) {
            ready = []
            readyAt = 0
          }
          return undefined
        }
        const lane = ready[readyAt]!
        ready[readyAt++] = undefined
        return lane
      }

      type Step = Effect.Effect<void, HandlerFailed<E> | RouteError<E> | PolicyError | Rejoin, R>
      // The records of a lane, or of several lanes one after another when the policy puts many records in a unit (a
      // transaction of the store costs more than a record) and many lanes wait: as many as leave every worker some,
      // up to the policy's bound.
      const takeBatch = (first: Lane): Array<Lane> => {
        const batch = [first]
        const most = policyOf.unitRecords ?? 1
        if (most <= 1) return batch
        let records = first.records.length
        // Only lanes beyond what the other workers can take: a unit never leaves workers idle to grow. The workers
        // that can take lanes are the partition's running ones and those the free permits would start; once the
        // permits are all taken (by this partition's workers or others'), the waiting lanes are shared among the
        // running ones: with many partitions, each has a few workers, and their units grow instead of waiting.
        const workers = running + Math.min(permits.free(), concurrency - running)
        const share = Math.floor((ready.length - readyAt) / Math.max(1, workers))
        while (records < most && batch.length <= share) {
          const lane = take()
          if (lane === undefined) break
          batch.push(lane)
          records += lane.records.length
        }
        return batch
      }

      // A unit of the policy: the records of `parts`, covering the offset ranges `finished`. With a failure route
      // under a policy that rolls a failed unit back, as `processChunk` does.
      const unit = (
        parts: ReadonlyArray<Chunk.Chunk<ConsumerRecord>>,
        finished: ReadonlyArray<Range>,
        indexes: ReadonlyArray<number>
      ): Effect.Effect<void, HandlerFailed<E> | RouteError<E> | PolicyError | Rejoin | Abandoned, R> => {
        const handler = parts.length === 1 ? routed(parts[0]!, tp) : Effect.forEach(parts, (part) =>
          Effect.mapError(
            routed(part, tp),
            // Where a chunk handler failed, for `HandlerFailed`: its part. A rerun needs the record itself.
            (error) =>
              error instanceof HandlerFailure && error.offset === undefined && rerun === undefined
                ? new HandlerFailure(error.error, Chunk.unsafeHead(part).offset, false)
                : error
          ), { discard: true })
        return policyOf.handle(tp, progress.position(), finished, handler, retry).pipe(
          Effect.catchAll((error) => {
            if (rerun === undefined || !(error instanceof HandlerFailure)) return failed(state, parts[0]!, error)
            if (state.stopping) return abandon(state)
            const all = parts.length === 1 ? parts[0]! : Chunk.flatten(Chunk.unsafeFromArray(parts))
            if (rerun.poison(tp, all, error)) return unit(parts, finished, indexes)
            // A unit of one record each. A record's range starts where the record before it ended, below its own
            // offset after a gap (a marker, an aborted or compacted record): the unit's records and ranges are paired
            // in offset order, each record inside its range.
            const records = Chunk.toReadonlyArray(all).slice().sort(byOffset)
            return Effect.forEach([...indexes].sort((a, b) => a - b), (index, i) => {
              const range = progress.rangeOf(index)
              const record = records[i]
              if (record === undefined || record.offset < range[0] || record.offset >= range[1]) {
                return Effect.dieMessage(
                  `${state.key}: the unit's records do not match its ranges at [${range[0]}, ${range[1]})`
                )
              }
              return unit([Chunk.of(record)], [range], [index])
            }, { discard: true })
          })
        )
      }

      const handleBatch = (batch: Array<Lane>): Step => {
        // The first lane's arrays are taken as they are (one lane is the common case); each lane gets fresh ones.
        const indexes = batch[0]!.indexes
        const parts: Array<Chunk.Chunk<ConsumerRecord>> = []
        for (let i = 0; i < batch.length; i++) {
          const lane = batch[i]!
          parts.push(Chunk.unsafeFromArray(lane.records))
          if (i > 0) for (const index of lane.indexes) indexes.push(index)
          lane.records = []
          lane.indexes = []
        }
        if (batch.length > 1) indexes.sort((a, b) => a - b)
        const finished: Array<Range> = []
        for (const index of indexes) {
          const range = progress.rangeOf(index)
          const last = finished[finished.length - 1]
          if (last !== undefined && last[1] === range[0]) finished[finished.length - 1] = [last[0], range[1]]
          else finished.push(range)
        }
        const first = unit(parts, finished, indexes)
        const traced = telemetry === undefined
          ? first
          : telemetry.chunk(tp, recordsOf(parts), indexes.length, first)
        // Records left to the next owner (given up) are not finished here. Two steps and no named closures: this
        // runs once per lane.
        return Effect.flatMap(
          Effect.catchIf(traced, isGivenUp, Effect.succeed),
          (result) => {
            if (result === givenUp) return Effect.void
            telemetry?.handled(tp, indexes.length)
            for (const index of indexes) progress.finish(index)
            router?.passed(tp, progress.position())
            state.outstanding -= indexes.length
            policyOf.progressed(tp, progress, indexes.length)
            let more: Step = lanes
            if (batch.length === 1) {
              // A key whose records came meanwhile goes on with them at once.
              const lane = batch[0]!
              if (lane.records.length > 0 && !state.stopping) more = handleBatch(takeBatch(lane))
              else if (lane.key !== undefined) byKey.delete(lane.key)
            } else {
              for (const lane of batch) {
                if (lane.records.length > 0) ready.push(lane)
                else if (lane.key !== undefined) byKey.delete(lane.key)
              }
            }
            const resume = maybeResume(state)
            return resume === Effect.void ? more : Effect.zipRight(resume, more)
          }
        )
      }
      const lanes: Step = Effect.suspend(() => {
        const lane = state.stopping ? undefined : take()
        return lane === undefined ? Effect.void : handleBatch(takeBatch(lane))
      })
      const laneWorker = lanes.pipe(
        Effect.catchAllCause(report),
        Effect.ensuring(Effect.sync(() => {
          running--
          if (running === 0 && idle !== undefined) Deferred.unsafeDone(idle, Exit.void)
        }))
      )
      const start: Effect.Effect<void, never, R> = Effect.suspend(() => {
        if (readyAt === ready.length || running >= concurrency || state.stopping) return Effect.void
        running++
        return Effect.flatMap(permits.forkWithPermit(laneWorker), () => start)
      })

      const place = (record: ConsumerRecord, index: number) => {
        if (ordering === "key" && record.key !== null) {
          const key = keyText(record.key)
          const lane = byKey.get(key)
          if (lane !== undefined) {
            lane.records.push(record)
            lane.indexes.push(index)
            return
          }
          const fresh: Lane = { key, records: [record], indexes: [index] }
          byKey.set(key, fresh)
          ready.push(fresh)
          return
        }
        ready.push({ key: undefined, records: [record], indexes: [index] })
      }

      const dispatch = (chunks: Chunk.Chunk<Fetched>) => {
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
            place(record, progress.add(until, false))
          }
        }
        if (finished > 0) state.outstanding -= finished
        if (moved) policyOf.progressed(tp, progress, finished)
      }

      const drain = Effect.suspend(() => {
        if (running === 0) return Effect.void
        idle = Deferred.unsafeMake<void>(FiberId.none)
        return Deferred.await(idle)
      })

      const loop: Effect.Effect<void, never, R> = Effect.flatMap(state.queue.takeAll, ([chunks, done]) => {
        if (!state.stopping) dispatch(chunks)
        if (done || state.stopping) return drain
        // Records an earlier owner finished leave at once, and may make room; a window grown too wide pauses.
        const room = roomFor(state) ? maybeResume(state) : (state.paused ? Effect.void : pause(state))
        return Effect.zipRight(Effect.zipRight(room, start), loop)
      })
      return loop
    }

    /** Where a partition starts when its position is missing or out of its log, as `offsetReset` says. */
    const reset = (
      tp: TopicPartition.TopicPartition,
      position: bigint | null,
      range: PartitionOffsets
    ): Effect.Effect<bigint, OffsetOutOfRange> => {
      if (config.offsetReset === "none") {
        return Effect.fail(
          new OffsetOutOfRange({ ...tp, position, earliest: range.earliest, latest: range.latest })
        )
      }
      // The latest a read_committed consumer can read is the last stable offset, as the Java client resets to.
      const target = config.offsetReset === "earliest" ? range.earliest : reachable(range)
      if (position === null) return Effect.succeed(target)
      return Effect.as(
        Effect.logWarning(
          `position ${position} of ${TopicPartition.key(tp)} is out of its log (offsets ${range.earliest} to ` +
            `${range.latest}): starting at the ${config.offsetReset}, ${target}` +
            (position < range.earliest ? `; ${range.earliest - position} offsets were removed unread` : "")
        ),
        target
      )
    }

    const startPosition = (
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
      return reset(tp, position ?? null, range)
    }

    const assign = (partitions: ReadonlyArray<TopicPartition.TopicPartition>) =>
      Effect.gen(function*() {
        const fresh = partitions.filter((tp) => !owned.has(TopicPartition.key(tp)))
        if (fresh.length === 0) return
        for (const tp of fresh) {
          const stuck = abandoned.get(TopicPartition.key(tp))
          if (stuck === undefined) continue
          if (Option.isNone(yield* within(Fiber.await(stuck), config.revokeTimeout))) {
            return yield* new WorkerStuck(tp)
          }
          abandoned.delete(TopicPartition.key(tp))
        }
        const positions = yield* policy.assign(fresh)
        telemetry?.rebalance("assigned", fresh)
        const ranges = yield* session.offsets(fresh)
        // A partition paused by an earlier owner state must fetch again.
        yield* guard(session.resume(fresh))
        for (const tp of fresh) {
          const key = TopicPartition.key(tp)
          const position = yield* startPosition(tp, positions.get(key), ranges.get(key))
          yield* guard(session.seek(tp, position))
          telemetry?.started(tp, position)
          // Records an earlier owner finished out of order above the position are not handled again.
          const finishedBefore = policy.finishedOnAssign?.(tp) ?? []
          router?.reset(tp)
          // A retry topic's partition is read in order, whatever the ordering: its records wait until they are due.
          const inOrder = outOfOrder === undefined || retrying(tp)
          const state: PartitionState = {
            tp,
            key,
            scope: yield* Scope.make(),
            queue: yield* Mailbox.make<Fetched>(),
            lock: yield* Effect.makeSemaphore(1),
            next: position,
            skips: 0,
            outstanding: 0,
            paused: false,
            held: false,
            stopping: false,
            worker: undefined,
            progress: inOrder ? undefined : new Progress(position, finishedBefore),
            skip: inOrder && finishedBefore.length > 0 ? new Progress(position, finishedBefore) : undefined
          }
          owned.set(key, state)
          if (hooks.onAssign !== undefined) {
            yield* hooks.onAssign(tp).pipe(Scope.extend(state.scope))
          }
          state.worker = yield* (inOrder ? worker(state) : pipelineWorker(state, outOfOrder!)).pipe(
            Effect.catchAllCause(report),
            Effect.forkIn(state.scope)
          )
        }
      })

    /** Interrupts a worker and waits for it, bounded; one that does not stop is left behind, and remembered. */
    const interrupt = (state: PartitionState, fiber: Fiber.RuntimeFiber<void>, phase: string) =>
      Effect.gen(function*() {
        yield* Fiber.interruptFork(fiber)
        if (Option.isSome(yield* within(Fiber.await(fiber), config.stepTimeout))) return
        abandoned.add(state.key, fiber)
        yield* Effect.logWarning(
          `${phase}: the work of ${state.key} did not stop within ${Duration.format(config.stepTimeout)} of its ` +
            "interruption (it is in an uninterruptible region): it is left to end on its own, and nothing it does " +
            "is committed any more"
        )
      })

    /** The worker ends its current chunk, or is interrupted past revokeTimeout. */
    const stopWorker = (state: PartitionState, phase: string) =>
      Effect.gen(function*() {
        state.stopping = true
        yield* state.queue.shutdown
        const fiber = state.worker
        if (fiber === undefined) return
        // A crash meanwhile ends the wait at once: what the crashed member would still do never lands anyway.
        const done = yield* within(
          Effect.raceFirst(Fiber.await(fiber), Deferred.await(crashSignal)),
          config.revokeTimeout
        )
        if (Option.isSome(done) || crashed) return
        yield* Effect.logWarning(
          `${phase}: the work of ${state.key} outlived revokeTimeout (${Duration.format(config.revokeTimeout)}); ` +
            "interrupting it"
        )
        yield* interrupt(state, fiber, phase)
      })

    /** The partition is gone: its worker is interrupted at once. */
    const interruptWorker = (state: PartitionState, phase: string) =>
      Effect.gen(function*() {
        state.stopping = true
        yield* state.queue.shutdown
        if (state.worker !== undefined) yield* interrupt(state, state.worker, phase)
      })

    /** `onRevoke`, then the partition's scope closes: each bounded, partitions side by side. */
    const closePartitions = (
      states: ReadonlyArray<PartitionState>,
      phase: string
    ): Effect.Effect<void, EH, HookNeeds> =>
      Effect.forEach(states, (state) =>
        Effect.gen(function*() {
          const hook = hooks.onRevoke === undefined
            ? Exit.succeed(Option.some(undefined))
            : yield* Effect.exit(within(Scope.extend(hooks.onRevoke(state.tp), state.scope), config.stepTimeout))
          if (Exit.isSuccess(hook) && Option.isNone(hook.value)) {
            yield* Effect.logWarning(
              `${phase}: onRevoke of ${state.key} did not finish within ${Duration.format(config.stepTimeout)}; ` +
                "going on without it"
            )
          }
          owned.delete(state.key)
          router?.reset(state.tp)
          if (Option.isNone(yield* within(Scope.close(state.scope, Exit.void), config.stepTimeout))) {
            yield* Effect.logWarning(
              `${phase}: the finalizers of ${state.key}'s scope did not finish within ` +
                `${Duration.format(config.stepTimeout)}; going on without them`
            )
          }
          if (Exit.isFailure(hook)) return yield* hook
        }), { concurrency: "unbounded", discard: true })

    const ownedStates = (partitions: ReadonlyArray<TopicPartition.TopicPartition>) =>
      partitions.flatMap((tp) => {
        const state = owned.get(TopicPartition.key(tp))
        return state === undefined ? [] : [state]
      })

    // Revoke: in-flight work ends (or is interrupted past revokeTimeout), the final positions are committed or
    // stored, onRevoke runs and the partition scopes close, and only then are the partitions released to the group.
    // Every step is bounded; together they fit in rebalanceTimeout. A missed deadline is logged and the revoke goes on.
    const revoke = (
      partitions: ReadonlyArray<TopicPartition.TopicPartition>,
      phase: string
    ): Effect.Effect<void, PolicyError | EH, HookNeeds> =>
      Effect.gen(function*() {
        const states = ownedStates(partitions)
        if (states.length === 0) return
        if (telemetry !== undefined) {
          telemetry.rebalance("revoked", states.map((s) => s.tp))
          for (const s of states) telemetry.forget(s.tp)
        }
        yield* Effect.forEach(states, (s) => stopWorker(s, phase), { concurrency: "unbounded", discard: true })
        if (crashed) return
        const committed = yield* Effect.exit(within(policy.revoke(states.map((s) => s.tp)), config.stepTimeout))
        if (Exit.isSuccess(committed) && Option.isNone(committed.value)) {
          yield* Effect.logWarning(
            `${phase}: the final commit of ${keysOf(states)} did not finish within ` +
              `${Duration.format(config.stepTimeout)}; their next owner repeats what was handled since the last commit`
          )
        }
        if (crashed) return
        yield* closePartitions(states, phase)
        if (Exit.isFailure(committed)) return yield* committed
      })

    const lose = (
      partitions: ReadonlyArray<TopicPartition.TopicPartition>,
      phase: string
    ): Effect.Effect<void, EH, HookNeeds> =>
      Effect.gen(function*() {
        const states = ownedStates(partitions)
        if (telemetry !== undefined) {
          telemetry.rebalance("lost", states.map((s) => s.tp))
          for (const s of states) telemetry.forget(s.tp)
        }
        yield* Effect.forEach(states, (s) => interruptWorker(s, phase), { concurrency: "unbounded", discard: true })
        yield* policy.lost(states.map((s) => s.tp))
        yield* closePartitions(states, phase)
      })

    const pause = (state: PartitionState) =>
      state.lock.withPermits(1)(Effect.suspend(() => {
        if (state.paused || roomFor(state)) return Effect.void
        state.paused = true
        return session.pause([state.tp])
      }))

    // Runs when called, in the poll loop: the bookkeeping and the hand-over to the worker are synchronous, and an
    // effect is returned only for what needs one (a seek, the policy's `delivered`, a pause).
    const enqueue = (event: Extract<DriverEvent, { _tag: "Records" }>): Effect.Effect<void, DriverError> => {
      const state = owned.get(TopicPartition.key(event.partition))
      if (state === undefined || state.stopping) return Effect.void
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
          guard(session.seek(event.partition, state.next))
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
      telemetry?.received(state.tp, Chunk.size(records))
      state.queue.unsafeOffer({ records, next: event.next })
      const delivered = policy.delivered(event.partition, event.next)
      if (state.paused || roomFor(state)) return delivered
      return delivered === Effect.void ? pause(state) : Effect.zipRight(delivered, pause(state))
    }

    const outOfRange = (event: Extract<DriverEvent, { _tag: "OutOfRange" }>) =>
      Effect.gen(function*() {
        const state = owned.get(TopicPartition.key(event.partition))
        if (state === undefined || state.stopping) return
        const ranges = yield* session.offsets([event.partition])
        const range = ranges.get(state.key)
        if (range === undefined) {
          return yield* new DriverError({ operation: "offsets", reason: `no offsets for ${state.key}`, retriable: true })
        }
        const position = yield* reset(event.partition, event.position, range)
        // Back below where the partition had come (its log was cut back): what was fetched from `position` on is not
        // the log any more, and what finished of it must not move the position past the records written there now.
        if (position < state.next) state.queue.unsafeOffer({ records: Chunk.empty(), next: position, rewind: true })
        state.next = position
        yield* guard(session.seek(event.partition, position))
      })

    const handle = (event: DriverEvent): Effect.Effect<void, LoopError, R | HookNeeds> => {
      switch (event._tag) {
        case "Assigned":
          return assign(event.partitions)
        case "Revoked":
          return Effect.uninterruptible(revoke(event.partitions, "revoke")).pipe(Effect.zipRight(guard(event.release)))
        case "Lost":
          return Effect.uninterruptible(lose(event.partitions, "lost")).pipe(
            Effect.zipRight(
              config.rejoin || event.partitions.length === 0
                ? Effect.void
                : Effect.fail(new PartitionsLost({ partitions: event.partitions }))
            )
          )
        case "Records":
          return enqueue(event)
        case "OutOfRange":
          return outOfRange(event)
      }
    }

    // The events of one poll in order; an event is looked at only once the effects of those before it have run.
    // Records that need no effect are handed over without building one.
    const handleFrom = (events: ReadonlyArray<DriverEvent>, from: number): ReturnType<typeof handle> => {
      for (let i = from; i < events.length; i++) {
        const effect = handle(events[i]!)
        if (effect === Effect.void) continue
        if (i + 1 === events.length) return effect
        return Effect.zipRight(effect, Effect.suspend(() => handleFrom(events, i + 1)))
      }
      return Effect.void
    }

    // Leaving cleanly revokes everything owned first, so that the last positions are committed or stored. A session
    // that ends because the cluster cannot be reached, or to rejoin, loses its partitions instead: nothing it would
    // commit could land. A crashed member does nothing of the sort: its workers just stop, as they would with the
    // process.
    const stopWorkers = Effect.forEach(
      owned.values(),
      (s) => s.worker === undefined ? Effect.void : Fiber.interruptFork(s.worker),
      { discard: true }
    )
    yield* Effect.addFinalizer((exit) =>
      Effect.suspend(() => {
        if (crashed) return stopWorkers
        const all = Array.from(owned.values(), (s) => s.tp)
        if (all.length === 0) return Effect.void
        const leaving: Effect.Effect<void, PolicyError | EH, HookNeeds> = Exit.isFailure(exit) && Chunk.some(
            Cause.failures(exit.cause),
            (error) =>
              error instanceof Rejoin || staleMembership(error) || (error instanceof DriverError && error.retriable)
          )
          ? lose(all, "rejoin")
          : revoke(all, "shutdown")
        return leaving.pipe(
          Effect.catchAllCause((cause) =>
            crashed
              ? stopWorkers
              : Cause.isInterruptedOnly(cause)
              ? Effect.void
              : Effect.logWarning("the revoke on shutdown failed; the partitions' next owners repeat what was " +
                "handled since their last commit", cause)
          )
        )
      })
    )

    if (telemetry !== undefined) yield* lagReports(telemetry, session, owned, sessionScope, reachable)

    const loop = guard(session.poll).pipe(
      Effect.flatMap((events) => {
        env.connected()
        return handleFrom(events, 0)
      }),
      Effect.zipRight(policy.polled),
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
