/**
 * What the parts of a consumer's session share: the settings, the partition's state, the errors that end or restart a
 * session, and the session context every part is handed (the driver's session, the policy's instance, the route, the
 * telemetry, the crash guard).
 *
 * @internal
 */
import * as Cause from "effect/Cause"
import * as Chunk from "effect/Chunk"
import type * as Context from "effect/Context"
import type * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import type * as Fiber from "effect/Fiber"
import type * as Mailbox from "effect/Mailbox"
import type * as Option from "effect/Option"
import type * as Schedule from "effect/Schedule"
import type * as Scope from "effect/Scope"
import type { CommitPolicy, PolicyContext, PolicyError, PolicyInstance } from "../../CommitPolicy.js"
import type { ConsumerRecord } from "../../ConsumerRecord.js"
import type { Driver, DriverSession, PartitionOffsets, SessionOptions } from "../../Driver.js"
import type { Faults } from "../../Faults.js"
import {
  type CircuitOpen,
  CommitFailed,
  DriverError,
  HandlerFailed,
  type InvalidConfig,
  type OffsetOutOfRange,
  type PartitionsLost,
  type ProduceFailed,
  type RecordNotInChunk,
  TransactionFailed,
  type WorkerStuck
} from "../../KafkaError.js"
import type { Observability } from "../../Observability.js"
import type * as TopicPartition from "../../TopicPartition.js"
import { Fatal, HandlerFailure, type Router, type RouteSettings, type Work } from "../route/router.js"
import type { ConsumerTelemetry } from "../telemetry/telemetry.js"
import type { Ordering } from "./ordering.js"
import type * as Permits from "./permits.js"
import type { Progress } from "./progress.js"
import type * as StuckWorkers from "./stuckWorkers.js"
import { Fenced } from "../../KafkaError.js"

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

/** A unit given up because its partition is being revoked (see `abandon`). */
export class Abandoned {
  readonly _tag = "Abandoned"
}
export const givenUp = new Abandoned()
export const isGivenUp = (error: unknown): error is Abandoned => error === givenUp

/** The session must end and a new one begin: the cluster could not be reached. */
export class Reconnect {
  constructor(readonly cause: DriverError) {}
}

/**
 * The session must end and a new one begin at once: the member's membership is stale. The offset store fenced a unit
 * (another member claimed the partition), or the group refused a commit because the member's generation or member id
 * is no longer the group's (evicted, or the coordinator lost track of it): the client may take long to notice.
 */
export class Rejoin {
  constructor(readonly cause: Fenced | CommitFailed | TransactionFailed) {}
}

/** Another member owns the partition now: the offset store or the Kafka transaction coordinator fenced a unit. */
export const fenced = (error: unknown): error is Fenced | TransactionFailed =>
  error instanceof Fenced || (error instanceof TransactionFailed && error.reason === "Fenced")

/** A commit refused because the member's generation or member id is not the group's any more. */
export const staleMembership = (error: unknown): error is CommitFailed =>
  error instanceof CommitFailed && (error.reason === "IllegalGeneration" || error.reason === "UnknownMember")

export interface Fetched {
  readonly records: Chunk.Chunk<ConsumerRecord>
  /** Where the partition continues after these records (past offsets that held nothing to read). */
  readonly next: bigint
  /**
   * No records: the partition starts again at `next`, below where it had come (its log was cut back). Handed to the
   * worker in its place among the chunks, so that what was fetched before it is forgotten before what comes after.
   */
  readonly rewind?: true
}

/**
 * Where an owned partition is, as the poll loop and its worker see it:
 *
 * | phase      | fetches | how it gets there                                              | leaves for                  |
 * |------------|---------|----------------------------------------------------------------|-----------------------------|
 * | `fetching` | yes     | assigned; resumed once its buffer and window have room          | `paused`, `held`, `stopping` |
 * | `paused`   | no      | its records not handled (`bufferSize`) or its window would pass | `fetching`, `held`, `stopping` |
 * |            |         | `windowPerBuffer` × `bufferSize`                                |                             |
 * | `held`     | no      | a retry topic's next record is not due (the driver was told it  | `fetching`, `stopping`      |
 * |            |         | stays paused for a while, not to fetch it again meanwhile)      |                             |
 * | `stopping` | no      | revoked or lost: its worker takes nothing new                  | (its scope closes)          |
 *
 * The transitions are in `flow.ts` (pause, hold, resume) and `partitions.ts` (stop).
 */
export type Phase = "fetching" | "paused" | "held" | "stopping"

export interface PartitionState {
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
  phase: Phase
  worker: Fiber.RuntimeFiber<void> | undefined
  /** When records finish out of order: the lowest unfinished offset and the ranges finished above it. */
  readonly progress: Progress | undefined
  /** When chunks are units: the ranges an earlier owner finished out of order, whose records are left out. */
  skip: Progress | undefined
  /** An incremental revoke of the partition runs beside the poll loop: nothing else may revoke or lose it. */
  revoking: boolean
}

/** The partition's worker takes nothing new: it was revoked or lost. */
export const stopping = (state: PartitionState): boolean => state.phase === "stopping"

/** The partition does not fetch until resumed (its buffer was full, or a retry topic waits). */
export const paused = (state: PartitionState): boolean => state.phase === "paused" || state.phase === "held"

/** A crash of the member, injected by `Faults`: once it happened, nothing reaches the outside any more. */
export interface Crash {
  crashed: boolean
  readonly signal: Deferred.Deferred<void>
}

/** What ends a session with a failure, from wherever in it it happened. */
export type Failure<E, EH> =
  | HandlerFailed<E>
  | RouteError<E>
  | PolicyError
  | OffsetOutOfRange
  | PartitionsLost
  | WorkerStuck
  | Rejoin
  | EH

/** What a unit of work can end with. */
export type UnitError<E> = HandlerFailed<E> | RouteError<E> | PolicyError | Rejoin

/**
 * One session's parts, handed to each of them: the driver's session and the policy's instance, the partitions owned,
 * the handler as the route wraps it, the crash guard and where failures are reported.
 */
export interface SessionContext<E, R, EH, RH> {
  readonly config: Resolved
  readonly hooks: Hooks<EH, RH>
  readonly session: DriverSession
  readonly policy: PolicyInstance
  readonly telemetry: ConsumerTelemetry | undefined
  /** The partitions owned, by key. */
  readonly owned: Map<string, PartitionState>
  /** The session's scope: revokes that run beside the poll loop are forked in it. */
  readonly scope: Scope.Scope
  /** Workers of revoked partitions that did not stop when interrupted, by partition. */
  readonly abandoned: StuckWorkers.StuckWorkers
  /** Bounds the handler calls in flight over all partitions under `key` and `unordered` ordering. */
  readonly permits: Permits.Permits
  readonly crash: Crash
  /** After a crash, `effect` never runs: what the crashed member would still do must not reach the outside. */
  readonly guard: PolicyContext["guard"]
  /** Ends the session with `cause`, unless it is an interruption only. */
  readonly report: (cause: Cause.Cause<Failure<E, EH>>) => Effect.Effect<void>
  /** The failure route, when there is one. */
  readonly router: Router<E, R> | undefined
  /** The route, when the policy rolls a failed unit back and runs it again with the failed record routed. */
  readonly rerun: Router<E, R> | undefined
  /** The handler, routed. */
  readonly routed: Work<E, R>
  /** A chunk handled as one unit of the policy: its records side by side, as the ordering allows. */
  readonly chunkWork: Work<E, R>
  /** A failed handler is retried on the same chunk, as `retry` says. */
  readonly retry: <E2, R2>(effect: Effect.Effect<void, E2, R2>) => Effect.Effect<void, E2, R2>
  /** The policy's way with records that finish out of order, when the ordering lets them. */
  readonly outOfOrder: PolicyInstance["outOfOrder"]
  /** How long past a retry's due time it is handed over, so that those due just after it come with it. */
  readonly dueSlack: number
  /** The latest offset the consumer can read: the last stable offset under read_committed, else the high watermark. */
  readonly reachable: (offsets: PartitionOffsets) => bigint
}

/** What a consumer's run gives each of its sessions. */
export interface Environment {
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

/**
 * How many records of a partition may lie between its lowest unfinished offset and the last one fetched, as a multiple
 * of `bufferSize`, when records finish out of order: past it the partition is paused, so that one slow key cannot make
 * the window (and what a crash repeats) grow without bound.
 */
export const windowPerBuffer = 10

/**
 * `effect` for at most `duration`; past it, `None`, and the effect is interrupted without waiting for it (it may sit
 * in an uninterruptible region; then it is left to end in the background). It runs in a fiber of its own, so that the
 * bound holds inside a finalizer too.
 */
export const within = <A, E, R>(effect: Effect.Effect<A, E, R>, duration: Duration.Duration) =>
  Effect.disconnect(Effect.interruptible(Effect.timeoutOption(Effect.disconnect(effect), duration)))

/**
 * How long a routed record waits for others to be written with it, under a policy whose commits wait for the writes:
 * 100 ms, or a tenth of the route's shortest retry delay when that is less (a retry is held back by at most a tenth of
 * its delay). A commit writes what waits at once.
 */
export const sideWritesWait = (route: RouteSettings | undefined): Duration.Duration =>
  Duration.millis(Math.min(100, ...(route?.delays ?? []).map((delay) => delay / 10)))

/** A failed unit as the session's failure: the handler's, the route's, the policy's, or a fence. */
export const failed = <E, R, EH, RH>(
  ctx: SessionContext<E, R, EH, RH>,
  state: PartitionState,
  records: Chunk.Chunk<ConsumerRecord>,
  error: HandlerFailure<E> | Fatal | PolicyError
): Effect.Effect<void, UnitError<E>> => {
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
    if (stopping(state)) return Effect.logDebug(`${state.key}: a unit fenced during the revoke was rolled back`)
    return Effect.fail(ctx.config.rejoin ? new Rejoin(error) : error)
  }
  return Effect.fail(error)
}

// A unit rolled back while its partition is revoked: its records, and every one after them, are left to the
// partition's next owner, which handles (and routes) them. Nothing after it may move the position.
export const abandon = (state: PartitionState): Effect.Effect<never, Abandoned> =>
  Effect.zipRight(
    Effect.logDebug(`${state.key}: a failed unit is left to the partition's next owner`),
    Effect.fail(givenUp)
  )

/** Whether the failure means the member's membership is gone, so that leaving must lose, not revoke. */
export const membershipGone = (cause: Cause.Cause<unknown>): boolean =>
  Chunk.some(
    Cause.failures(cause),
    (error) => error instanceof Rejoin || staleMembership(error) || (error instanceof DriverError && error.retriable)
  )
