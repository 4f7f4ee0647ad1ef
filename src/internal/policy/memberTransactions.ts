/**
 * `kafkaTransactional` with one transactional producer per member (KIP-447): the chunks of the member's partitions
 * that are handled at the same time share one Kafka transaction, which commits their records and every one of their
 * positions, sent with the member's group metadata so that the group's coordinator refuses them from a zombie.
 *
 * A transaction ("round") takes chunks until none of those it took is being handled any more; the chunks that arrive
 * while it ends wait for the next, which begins as soon as it has ended. A chunk whose handler fails (or is
 * interrupted) aborts the round: its own failure is its answer, and the other chunks of the round are handled again
 * in the next one. Positions are taken, and the group metadata read, at one moment when every partition of the round
 * is still the member's: a partition given up after that moment is given up in a later generation (or member epoch)
 * than the one its position is sent with, so the coordinator refuses it if it arrives late.
 *
 * @internal
 */
import * as Data from "effect/Data"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as FiberId from "effect/FiberId"
import * as Scope from "effect/Scope"
import type { PolicyContext } from "../../CommitPolicy.js"
import type { GroupMetadata } from "../../Driver.js"
import type { DriverError, TransactionFailed } from "../../KafkaError.js"
import { Producer, type TransactionalProducer, type TransactionalProducers } from "../../Producer.js"
import * as TopicPartition from "../../TopicPartition.js"

type ProducerService = Effect.Effect.Success<typeof Producer>
type TxnProducer = Effect.Effect.Success<typeof TransactionalProducer>

/** A round ended without committing for a reason other than its chunk's: the chunk is handled again in the next. */
export class RoundAborted extends Data.TaggedError("RoundAborted")<{ readonly reason: string }> {}

/** Why a round's transaction failed (not a chunk's handler): its outcome may be unknown. */
export class RoundFailed extends Data.TaggedError("RoundFailed")<{ readonly error: TransactionFailed | DriverError }> {}

interface Round {
  readonly positions: Map<string, { readonly tp: TopicPartition.TopicPartition; readonly next: bigint }>
  /** Chunks taken and not finished. */
  running: number
  /** Takes no more chunks. */
  closed: boolean
  /** Must not commit: why. */
  aborted: string | undefined
  /** The transaction's `Producer`, once it has begun. */
  readonly begun: Deferred.Deferred<ProducerService, TransactionFailed | DriverError>
  /** Closed, and no chunk of it is being handled. */
  readonly settled: Deferred.Deferred<void>
  readonly outcome: Deferred.Deferred<void, TransactionFailed | DriverError | RoundAborted>
  offsets: { readonly positions: Array<{ topic: string; partition: number; next: bigint }>; member: GroupMetadata }
}

/** The member's producer and its rounds, for one consumer session. */
export interface Member {
  readonly context: PolicyContext
  readonly factory: Effect.Effect.Success<typeof TransactionalProducers>
  readonly transactionalId: string
  readonly groupMetadata: () => GroupMetadata
  /** The partitions the member owns, each with whether a transaction of its chunks failed since it last resumed. */
  readonly owned: Map<string, { failed: boolean }>
  /** One round begins at a time, and the producer starts anew only between rounds. */
  readonly lock: Effect.Semaphore
  readonly scope: Scope.Scope
  producer: { readonly service: TxnProducer; readonly scope: Scope.CloseableScope } | undefined
  /** A round's transaction failed since the producer started: it starts anew before the next round. */
  failed: boolean
  current: Round | undefined
  readonly live: Set<Round>
}

/** @internal */
export const makeMember = (
  context: PolicyContext,
  factory: Member["factory"],
  transactionalId: string,
  groupMetadata: () => GroupMetadata
): Effect.Effect<Member, never, Scope.Scope> =>
  Effect.gen(function*() {
    const member: Member = {
      context,
      factory,
      transactionalId,
      groupMetadata,
      owned: new Map(),
      lock: yield* Effect.makeSemaphore(1),
      scope: yield* Effect.scope,
      producer: undefined,
      failed: false,
      current: undefined,
      live: new Set()
    }
    yield* Effect.addFinalizer(() =>
      member.producer === undefined ? Effect.void : Scope.close(member.producer.scope, Exit.void)
    )
    return member
  })

/**
 * Starts the member's producer when it has none or a round failed since it started: starting it (InitProducerId)
 * ends the transaction an earlier start of the same id left open, one way or the other. Outside the lock.
 */
const startIfNeeded = (member: Member): Effect.Effect<TxnProducer, TransactionFailed | DriverError> =>
  Effect.suspend(() => {
    const now = member.producer
    if (now !== undefined && !member.failed) return Effect.succeed(now.service)
    return Effect.gen(function*() {
      if (now !== undefined) {
        member.producer = undefined
        yield* Scope.close(now.scope, Exit.void)
      }
      const scope = yield* Scope.fork(member.scope, { _tag: "Sequential" })
      const service = yield* member.factory.make(member.transactionalId).pipe(
        Scope.extend(scope),
        Effect.onError(() => Scope.close(scope, Exit.void))
      )
      member.producer = { service, scope }
      member.failed = false
      return service
    })
  })

/** Starts the member's producer, unless it runs and no round failed since it started. */
export const start = (member: Member): Effect.Effect<void, TransactionFailed | DriverError> =>
  member.lock.withPermits(1)(Effect.asVoid(startIfNeeded(member)))

const settle = (round: Round) => {
  round.closed = true
  if (round.running === 0) Deferred.unsafeDone(round.settled, Exit.void)
}

/**
 * Takes the positions and the group metadata once every chunk of the round is finished, at one moment: a partition
 * given up before it aborts the round.
 */
const decide = (member: Member, round: Round): Effect.Effect<void, RoundAborted> =>
  Effect.suspend(() => {
    const gone = Array.from(round.positions.keys()).filter((k) => !member.owned.has(k))
    if (round.aborted === undefined && gone.length > 0) round.aborted = `${gone.join(", ")} given up meanwhile`
    if (round.aborted !== undefined) return Effect.fail(new RoundAborted({ reason: round.aborted }))
    round.offsets = {
      positions: Array.from(round.positions.values(), ({ next, tp }) => ({ ...tp, next })),
      member: member.groupMetadata()
    }
    return Effect.void
  })

/** The round's transaction: begins once the rounds before it have ended, commits once its chunks are finished. */
const lead = (member: Member, round: Round) =>
  member.lock.withPermits(1)(
    Effect.flatMap(startIfNeeded(member), (producer) =>
      member.context.guard(producer.transaction(
        Effect.flatMap(Producer, (service) =>
          Effect.zipRight(
            Deferred.succeed(round.begun, service),
            Effect.zipRight(Deferred.await(round.settled), decide(member, round))
          )),
        {
          offsets: Effect.sync(() => ({
            groupId: member.context.groupId,
            positions: round.offsets.positions,
            member: round.offsets.member
          }))
        }
      )))
  ).pipe(
    Effect.onExit((exit) =>
      Effect.sync(() => {
        member.live.delete(round)
        if (member.current === round) member.current = undefined
        if (Exit.isFailure(exit) && !aborted(exit)) member.failed = true
        // A round that could not begin fails its chunks with the reason (it had taken nothing of them yet).
        Deferred.unsafeDone(round.begun, Exit.isSuccess(exit) || aborted(exit) ? Exit.die(notBegun) : exit as never)
        Deferred.unsafeDone(round.outcome, exit)
      })
    )
  )

const notBegun = "a round of the member's transactions ended before it began"

const aborted = (exit: Exit.Exit<unknown, unknown>) =>
  Exit.isFailure(exit) && exit.cause._tag === "Fail" && exit.cause.error instanceof RoundAborted

/** The round open to chunks, or a new one (whose transaction begins once the rounds before it have ended). */
const roundToJoin = (member: Member): Effect.Effect<Round> =>
  Effect.suspend(() => {
    const open = member.current
    if (open !== undefined && !open.closed) return Effect.succeed(open)
    const round: Round = {
      positions: new Map(),
      running: 0,
      closed: false,
      aborted: undefined,
      begun: Deferred.unsafeMake(FiberId.none),
      settled: Deferred.unsafeMake(FiberId.none),
      outcome: Deferred.unsafeMake(FiberId.none),
      offsets: { positions: [], member: { groupId: member.context.groupId, generationId: -1, memberId: "" } }
    }
    member.current = round
    member.live.add(round)
    // Forked from a chunk's uninterruptible region, the round's fiber is made interruptible: the member's scope ends
    // it when the session ends, wherever it waits.
    return Effect.as(Effect.forkIn(Effect.interruptible(lead(member, round)), member.scope), round)
  })

/**
 * A chunk of `partition` in a round: `body` runs with the round's `Producer`, and once the round has committed the
 * chunk's position is `next`. Fails with `body`'s failure (the round aborted), `RoundFailed` when the round's
 * transaction failed (its outcome may be unknown); a round aborted for another chunk's sake is joined again.
 */
export const inRound = <E, R>(
  member: Member,
  partition: TopicPartition.TopicPartition,
  next: bigint,
  body: Effect.Effect<void, E, R>
): Effect.Effect<void, E | RoundFailed, Exclude<R, Producer>> => {
  const k = TopicPartition.key(partition)
  const once: Effect.Effect<void, E | RoundFailed | RoundAborted, Exclude<R, Producer>> = Effect.uninterruptibleMask((
    restore
  ) =>
    Effect.gen(function*() {
      const round = yield* roundToJoin(member)
      round.positions.set(k, { tp: partition, next })
      round.running++
      const ran = yield* Effect.exit(
        restore(
          Effect.flatMap(
            Effect.mapError(Deferred.await(round.begun), (error) => new RoundFailed({ error })),
            (producer) => Effect.provideService(body, Producer, producer)
          )
        )
      )
      round.running--
      if (Exit.isFailure(ran)) {
        round.aborted ??= `the chunk of ${k} failed`
        settle(round)
        return yield* ran
      }
      if (round.running === 0) settle(round)
      const outcome = yield* restore(Effect.exit(Deferred.await(round.outcome)))
      if (Exit.isSuccess(outcome)) return
      return yield* Effect.catchAll(
        outcome,
        (error): Effect.Effect<never, RoundAborted | RoundFailed> =>
          error instanceof RoundAborted ? Effect.fail(error) : Effect.fail(new RoundFailed({ error }))
      )
    })
  ) as never
  const loop: Effect.Effect<void, E | RoundFailed, Exclude<R, Producer>> = Effect.catchIf(
    once,
    (error): error is RoundAborted => error instanceof RoundAborted,
    () => Effect.suspend(() => member.owned.has(k) ? loop : Effect.void)
  ) as never
  return loop
}

/**
 * Gives up partitions: no round takes their chunks any more, and a round that holds one and is ending is waited for,
 * so that their positions are final when they are released.
 */
export const giveUp = (
  member: Member,
  partitions: ReadonlyArray<TopicPartition.TopicPartition>,
  wait: boolean
): Effect.Effect<void> =>
  Effect.suspend(() => {
    const keys = partitions.map(TopicPartition.key)
    for (const k of keys) member.owned.delete(k)
    if (!wait) return Effect.void
    const holding = Array.from(member.live).filter((round) => keys.some((k) => round.positions.has(k)))
    return Effect.forEach(holding, (round) => Effect.exit(Deferred.await(round.outcome)), { discard: true })
  })
