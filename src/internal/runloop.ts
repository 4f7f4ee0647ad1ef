import * as Cause from "effect/Cause"
import * as Chunk from "effect/Chunk"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as Option from "effect/Option"
import * as Mailbox from "effect/Mailbox"
import type * as Schedule from "effect/Schedule"
import * as Scope from "effect/Scope"
import { CommitPolicy, type PolicyContext, type PolicyError } from "../CommitPolicy.js"
import type { ConsumerRecord } from "../ConsumerRecord.js"
import { Driver, type DriverEvent, type SessionOptions } from "../Driver.js"
import { Crashed, Faults } from "../Faults.js"
import { type ConfigError, type DriverError, HandlerFailed } from "../KafkaError.js"
import type { Transaction } from "../OffsetStore.js"
import * as TopicPartition from "../TopicPartition.js"
import { retryAfterFailure } from "./retry.js"

/** Consumer settings after validation. */
export interface Resolved {
  readonly session: SessionOptions
  readonly bufferSize: number
  readonly revokeTimeout: Duration.Duration
  readonly retry: Schedule.Schedule<unknown, unknown>
}

export interface Hooks<E, R> {
  readonly onAssign?: (partition: TopicPartition.TopicPartition) => Effect.Effect<void, E, R | Scope.Scope>
  readonly onRevoke?: (partition: TopicPartition.TopicPartition) => Effect.Effect<void, E, R>
}

export type RunError = ConfigError | DriverError | PolicyError | HandlerFailed

/** A handler failure located at the record it failed on, so that `HandlerFailed` can name it. */
export class RecordFailure<E> {
  readonly _tag = "RecordFailure"
  constructor(readonly offset: bigint, readonly error: E) {}
}

interface PartitionState {
  readonly tp: TopicPartition.TopicPartition
  readonly key: string
  readonly scope: Scope.CloseableScope
  /** Fetched chunks waiting for the worker. A mailbox: a worker that waits costs a callback, not a deferred. */
  readonly queue: Mailbox.Mailbox<Chunk.Chunk<ConsumerRecord>>
  readonly lock: Effect.Semaphore
  /** Next offset expected from a fetch; records below it (fetched before a seek) are dropped. */
  next: bigint
  /** Records fetched and not yet handled; fetching pauses before it can pass `bufferSize`. */
  outstanding: number
  paused: boolean
  stopping: boolean
  worker: Fiber.RuntimeFiber<void> | undefined
}

const policyErrorTags = new Set(["CommitFailed", "DriverError", "Fenced", "OffsetStoreError"])

const isFenced = (error: unknown): boolean =>
  typeof error === "object" && error !== null && "_tag" in error && error._tag === "Fenced"

const isPolicyError = (error: unknown): boolean =>
  typeof error === "object" && error !== null && "_tag" in error && policyErrorTags.has(String(error._tag))

/**
 * Runs a consumer until it fails or is interrupted. One fiber polls the driver and owns assignment; each partition
 * has a worker fiber in a scope of its own that ends on revoke; the policy decides the commits.
 */
export const run = <E, R, EH, RH>(
  config: Resolved,
  handler: (records: Chunk.Chunk<ConsumerRecord>, partition: TopicPartition.TopicPartition) => Effect.Effect<void, E, R>,
  hooks: Hooks<EH, RH>
): Effect.Effect<never, RunError | E | EH, Driver | CommitPolicy | Exclude<R, Transaction> | Exclude<RH, Scope.Scope>> =>
  Effect.scoped(Effect.gen(function*() {
    const driver = yield* Driver
    const commitPolicy = yield* CommitPolicy
    const faults = yield* Effect.serviceOption(Faults)
    const failure = yield* Deferred.make<never, unknown>()
    const consumerScope = yield* Effect.scope
    const context = yield* Effect.context<Exclude<R, Transaction> | Exclude<RH, Scope.Scope>>()
    const session = yield* driver.connect(config.session)
    let crashed = false
    const crashSignal = yield* Deferred.make<void>()

    // After a crash nothing reaches the outside any more; the consumer ends with `Crashed` through `failure`.
    // Only an injected fault crashes a member, so without faults there is nothing to check.
    const guard = Option.isNone(faults)
      ? <A, E1, R1>(effect: Effect.Effect<A, E1, R1>): Effect.Effect<A, E1, R1> => effect
      : <A, E1, R1>(effect: Effect.Effect<A, E1, R1>): Effect.Effect<A, E1, R1> =>
        Effect.suspend(() => crashed ? Effect.never : effect)

    // Without injected faults a crash point is a constant no-op: no effect is built per chunk.
    const crashAt: PolicyContext["crashAt"] = Option.isNone(faults) ? () => Effect.void : (point, partitions) =>
      Effect.suspend(() => crashed ? Effect.never : faults.value.crashAt(point, session.memberId, partitions)).pipe(
        Effect.flatMap((dies) => {
          if (!dies) return Effect.void
          crashed = true
          return Deferred.succeed(crashSignal, undefined).pipe(
            Effect.zipRight(Effect.die(new Crashed({ memberId: session.memberId, point })))
          )
        })
      )

    const report = (cause: Cause.Cause<unknown>) =>
      Cause.isInterruptedOnly(cause) ? Effect.void : Deferred.failCause(failure, cause)

    const fork = (effect: Effect.Effect<void, PolicyError>) =>
      effect.pipe(Effect.catchAllCause(report), Effect.forkIn(consumerScope), Effect.asVoid)

    const policyContext: PolicyContext = { groupId: config.session.groupId, session, crashAt, guard, fork }
    const policy = yield* commitPolicy.make(policyContext)
    const owned = new Map<string, PartitionState>()
    const maxPoll = config.session.maxPollRecords

    // A failed handler is retried on the same chunk; a policy's failure (a refused commit, a fence) is not its to retry.
    const retry = <E2, R2>(work: Effect.Effect<void, E2, R2>) =>
      retryAfterFailure(work, { schedule: config.retry, retryable: (error) => !isPolicyError(error) })

    const toHandlerFailed = (tp: TopicPartition.TopicPartition, records: Chunk.Chunk<ConsumerRecord>) =>
    (error: unknown) => {
      if (isPolicyError(error)) return Effect.fail(error)
      const located = error instanceof RecordFailure
      return Effect.fail(
        new HandlerFailed({
          topic: tp.topic,
          partition: tp.partition,
          offset: located ? error.offset : Chunk.unsafeHead(records).offset,
          cause: located ? error.error : error
        })
      )
    }

    const maybeResume = (state: PartitionState): Effect.Effect<void> =>
      !state.paused ? Effect.void : state.lock.withPermits(1)(Effect.suspend(() => {
        if (!state.paused || state.stopping || state.outstanding + maxPoll > config.bufferSize) return Effect.void
        state.paused = false
        return guard(session.resume([state.tp]))
      }))

    // Chunks one after another, each as it was fetched. The worker takes every chunk waiting at once and handles
    // them in a loop of flatMaps rather than a generator: this runs once per chunk.
    const worker = (state: PartitionState): Effect.Effect<void, unknown> => {
      const tp = state.tp
      type Step = Effect.Effect<void, unknown, Exclude<R, Transaction>>
      const loop: Step = Effect.flatMap(state.queue.takeAll, ([chunks, done]) => next(chunks, 0, done))
      const next = (chunks: Chunk.Chunk<Chunk.Chunk<ConsumerRecord>>, at: number, done: boolean): Step => {
        if (state.stopping || (done && at === Chunk.size(chunks))) return Effect.void
        if (at === Chunk.size(chunks)) return loop
        const records = Chunk.unsafeGet(chunks, at)
        return policy.process(tp, records, handler(records, tp), retry).pipe(
          Effect.catchAll((error) =>
            // A unit fenced while its partition is being revoked was rolled back, and the partition's next owner
            // handles its records: nothing is lost, and this member goes on with its other partitions.
            state.stopping && isFenced(error)
              ? Effect.logDebug(`${state.key}: a unit fenced during the revoke was rolled back`)
              : toHandlerFailed(tp, records)(error)
          ),
          Effect.flatMap(() => {
            state.outstanding -= Chunk.size(records)
            return state.paused
              ? Effect.zipRight(maybeResume(state), Effect.suspend(() => next(chunks, at + 1, done)))
              : next(chunks, at + 1, done)
          })
        )
      }
      return Effect.provide(loop, context)
    }

    const assign = (partitions: ReadonlyArray<TopicPartition.TopicPartition>) =>
      Effect.gen(function*() {
        const fresh = partitions.filter((tp) => !owned.has(TopicPartition.key(tp)))
        if (fresh.length === 0) return
        const positions = yield* policy.startPositions(fresh)
        // A partition paused by an earlier owner state must fetch again.
        yield* guard(session.resume(fresh))
        for (const tp of fresh) {
          const key = TopicPartition.key(tp)
          const position = positions.get(key) ?? 0n
          yield* guard(session.seek(tp, position))
          const state: PartitionState = {
            tp,
            key,
            scope: yield* Scope.make(),
            queue: yield* Mailbox.make<Chunk.Chunk<ConsumerRecord>>(),
            lock: yield* Effect.makeSemaphore(1),
            next: position,
            outstanding: 0,
            paused: false,
            stopping: false,
            worker: undefined
          }
          owned.set(key, state)
          if (hooks.onAssign !== undefined) {
            yield* hooks.onAssign(tp).pipe(Scope.extend(state.scope), Effect.provide(context))
          }
          state.worker = yield* worker(state).pipe(
            Effect.catchAllCause(report),
            Effect.forkIn(state.scope)
          )
        }
      })

    const stopWorker = (state: PartitionState) =>
      Effect.gen(function*() {
        state.stopping = true
        yield* state.queue.shutdown
        if (state.worker === undefined) return
        // Interruptible, so that the deadline holds even when this runs in a finalizer; a crash meanwhile ends the
        // wait at once.
        const done = yield* Effect.raceFirst(
          Fiber.await(state.worker).pipe(Effect.asSome),
          Deferred.await(crashSignal).pipe(Effect.as(Option.none()))
        ).pipe(Effect.timeoutOption(config.revokeTimeout), Effect.map(Option.flatten), Effect.interruptible)
        if (Option.isNone(done)) {
          if (!crashed) yield* Effect.logWarning(`work on ${state.key} outlived the revoke deadline; interrupted`)
          yield* Fiber.interrupt(state.worker)
        }
      })

    const closePartitions = (states: ReadonlyArray<PartitionState>, runHook: boolean) =>
      Effect.forEach(states, (state) =>
        Effect.gen(function*() {
          if (runHook && hooks.onRevoke !== undefined) {
            yield* hooks.onRevoke(state.tp).pipe(Effect.provide(context))
          }
          owned.delete(state.key)
          yield* Scope.close(state.scope, Exit.void)
        }), { discard: true })

    const ownedStates = (partitions: ReadonlyArray<TopicPartition.TopicPartition>) =>
      partitions.flatMap((tp) => {
        const state = owned.get(TopicPartition.key(tp))
        return state === undefined ? [] : [state]
      })

    // Revoke: in-flight work ends (or is interrupted past the deadline), the final positions are committed or
    // stored, the partition scopes close, and only then are the partitions released to the group.
    const revoke = (partitions: ReadonlyArray<TopicPartition.TopicPartition>) =>
      Effect.gen(function*() {
        const states = ownedStates(partitions)
        yield* Effect.forEach(states, stopWorker, { concurrency: "unbounded", discard: true })
        yield* policy.revoke(states.map((s) => s.tp))
        yield* closePartitions(states, true)
      })

    const lose = (partitions: ReadonlyArray<TopicPartition.TopicPartition>) =>
      Effect.gen(function*() {
        const states = ownedStates(partitions)
        for (const state of states) {
          state.stopping = true
          if (state.worker !== undefined) yield* Fiber.interrupt(state.worker)
        }
        yield* policy.lost(states.map((s) => s.tp))
        yield* closePartitions(states, true)
      })

    const pause = (state: PartitionState) =>
      state.lock.withPermits(1)(Effect.suspend(() => {
        if (state.paused || state.outstanding + maxPoll <= config.bufferSize) return Effect.void
        state.paused = true
        return session.pause([state.tp])
      }))

    // Runs when called, in the poll loop: the bookkeeping and the hand-over to the worker are synchronous, and an
    // effect is returned only for what needs one (a seek, the policy's `delivered`, a pause).
    const enqueue = (
      tp: TopicPartition.TopicPartition,
      fetched: Chunk.Chunk<ConsumerRecord>
    ): Effect.Effect<void, DriverError> => {
      const state = owned.get(TopicPartition.key(tp))
      if (state === undefined || state.stopping || Chunk.isEmpty(fetched)) return Effect.void
      // A gap means the fetch did not start where this partition's position is: fetch again from there rather
      // than skip records.
      const first = Chunk.unsafeHead(fetched).offset
      if (first > state.next) return guard(session.seek(tp, state.next))
      const records = first >= state.next ? fetched : Chunk.filter(fetched, (r) => r.offset >= state.next)
      if (Chunk.isEmpty(records)) return Effect.void
      const next = Chunk.unsafeLast(records).offset + 1n
      state.next = next
      state.outstanding += Chunk.size(records)
      state.queue.unsafeOffer(records)
      const delivered = policy.delivered(tp, next)
      if (state.paused || state.outstanding + maxPoll <= config.bufferSize) return delivered
      return delivered === Effect.void ? pause(state) : Effect.zipRight(delivered, pause(state))
    }

    const handle = (event: DriverEvent) => {
      switch (event._tag) {
        case "Assigned":
          return assign(event.partitions)
        case "Revoked":
          return revoke(event.partitions).pipe(Effect.zipRight(guard(event.release)))
        case "Lost":
          return lose(event.partitions)
        case "Records":
          return enqueue(event.partition, event.records)
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

    // Leaving cleanly revokes everything owned first, so the last positions are committed or stored. A crashed
    // member does nothing of the sort: its workers just stop, as they would with the process.
    // A crash during that revoke ends it at once (what the crashed member would still do never lands anyway).
    const stopWorkers = Effect.forEach(
      owned.values(),
      (s) => s.worker === undefined ? Effect.void : Fiber.interrupt(s.worker),
      { discard: true }
    )
    yield* Effect.addFinalizer(() =>
      crashed ? stopWorkers : Effect.raceFirst(
        Effect.interruptible(revoke(Array.from(owned.values(), (s) => s.tp))).pipe(
          Effect.timeoutOption(Duration.sum(config.revokeTimeout, Duration.seconds(5))),
          Effect.catchAllCause((cause) =>
            Cause.isDie(cause) && Chunk.some(Cause.defects(cause), (d) => d instanceof Crashed)
              ? Effect.void
              : Effect.logWarning("revoke on shutdown failed", cause)
          )
        ),
        // Finalizers run uninterruptibly: the losing side of the race must be interruptible, or the race would wait
        // for a crash that never comes.
        Effect.interruptible(Deferred.await(crashSignal))
      ).pipe(Effect.zipRight(Effect.suspend(() => crashed ? stopWorkers : Effect.void)))
    )

    const loop = guard(session.poll).pipe(
      Effect.flatMap((events) => handleFrom(events, 0)),
      Effect.zipRight(policy.polled),
      Effect.forever
    )
    return yield* Effect.raceFirst(loop, Deferred.await(failure)) as Effect.Effect<never, RunError | E | EH>
  }))
