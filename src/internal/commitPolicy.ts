import * as Chunk from "effect/Chunk"
import * as Clock from "effect/Clock"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Mailbox from "effect/Mailbox"
import * as Schedule from "effect/Schedule"
import type * as Scope from "effect/Scope"
import type { PolicyContext, PolicyError, PolicyInstance } from "../CommitPolicy.js"
import { CommitPolicy } from "../CommitPolicy.js"
import * as ConsumerRecord from "../ConsumerRecord.js"
import type { DriverSession } from "../Driver.js"
import type { CommitFailed } from "../KafkaError.js"
import * as OffsetBatch from "../OffsetBatch.js"
import { OffsetStore, type Transaction } from "../OffsetStore.js"
import * as TopicPartition from "../TopicPartition.js"
import { retryAfterFailure } from "./retry.js"

/** Retriable commit failures (a coordinator moving, a rebalance starting) are retried a few times. */
const commitRetry = Schedule.exponential(Duration.millis(20)).pipe(Schedule.intersect(Schedule.recurs(5)))

const commitOnce = (session: DriverSession, batch: OffsetBatch.OffsetBatch): Effect.Effect<void, CommitFailed> =>
  retryAfterFailure(session.commit(batch), { schedule: commitRetry, retryable: (e) => e.retriable })

/** `first` then `second`, without a step for either that does nothing (a crash point without faults). */
const andThen = <E1, R1, E2, R2>(
  first: Effect.Effect<void, E1, R1>,
  second: Effect.Effect<void, E2, R2>
): Effect.Effect<void, E1 | E2, R1 | R2> =>
  first === Effect.void ? second : second === Effect.void ? first : Effect.zipRight(first, second)

const lastPosition = (records: Chunk.Chunk<ConsumerRecord.ConsumerRecord>): bigint =>
  ConsumerRecord.nextPosition(Chunk.unsafeLast(records))

// The handler's requirements without `Transaction`: policies other than `transactional` never provide it, and a
// handler that asks for it there dies with a missing-service defect that names the tag.
const withoutTransaction = <E, R>(work: Effect.Effect<void, E, R>) =>
  work as Effect.Effect<void, E, Exclude<R, Transaction>>

/** Commits before handing records over: a record is handled at most once. */
export const atMostOnce = (context: PolicyContext): Effect.Effect<PolicyInstance, never, Scope.Scope> =>
  Effect.succeed({
    name: "atMostOnce",
    startPositions: (partitions) => kafkaStartPositions(context.session, partitions),
    delivered: () => Effect.void,
    polled: Effect.void,
    process: (partition, records, work) =>
      Effect.gen(function*() {
        const batch = OffsetBatch.of(partition, lastPosition(records))
        yield* context.crashAt("beforeCommit", [partition])
        yield* context.guard(commitOnce(context.session, batch))
        yield* context.crashAt("afterCommit", [partition])
        yield* context.crashAt("beforeHandler", [partition])
        yield* context.guard(withoutTransaction(work))
        yield* context.crashAt("afterHandler", [partition])
      }),
    revoke: () => Effect.void,
    lost: () => Effect.void
  })

/** Pending positions merged by highest per partition, committed one batch at a time. */
const makeCommitter = (context: PolicyContext) =>
  Effect.map(Effect.makeSemaphore(1), (lock) => {
    // Mutable and private: adding a position is a map write, not a copy of the batch.
    let pending = new Map<string, bigint>()
    let count = 0
    const flush = lock.withPermits(1)(Effect.suspend(() => {
      if (pending.size === 0) return Effect.void
      const batch: OffsetBatch.OffsetBatch = { positions: pending }
      pending = new Map()
      count = 0
      const partitions = OffsetBatch.entries(batch).map(([tp]) => tp)
      return andThen(
        context.crashAt("beforeCommit", partitions),
        context.guard(commitOnce(context.session, batch)).pipe(
          // A refused commit means the member lost these partitions; their records will be handled again by the
          // next owner (a duplicate, never a loss). The runloop learns of the loss from the driver.
          Effect.catchAll((error) => Effect.logWarning("commit refused; positions dropped", error)),
          (committed) => andThen(committed, context.crashAt("afterCommit", partitions))
        )
      )
    }))
    return {
      /** Adds a handled position at once; returns the records handled since the last flush. */
      unsafeAdd: (partition: TopicPartition.TopicPartition, position: bigint, records: number): number => {
        const k = TopicPartition.key(partition)
        const current = pending.get(k)
        if (current === undefined || position > current) pending.set(k, position)
        count += records
        return count
      },
      forget: (partitions: ReadonlyArray<TopicPartition.TopicPartition>) =>
        Effect.sync(() => {
          for (const tp of partitions) pending.delete(TopicPartition.key(tp))
        }),
      flush
    } as const
  })

/** The kafka-clients auto commit: positions of fetched records, committed every interval from the poll loop. */
export const autoCommit = (
  context: PolicyContext,
  interval: Duration.Duration
): Effect.Effect<PolicyInstance, never, Scope.Scope> =>
  Effect.gen(function*() {
    const committer = yield* makeCommitter(context)
    let last = yield* Clock.currentTimeMillis
    const every = Duration.toMillis(interval)
    return {
      name: "autoCommit",
      startPositions: (partitions) => kafkaStartPositions(context.session, partitions),
      delivered: (partition, next) =>
        Effect.sync(() => {
          committer.unsafeAdd(partition, next, 0)
        }),
      polled: Effect.gen(function*() {
        const now = yield* Clock.currentTimeMillis
        if (now - last < every) return
        last = now
        yield* committer.flush
      }),
      process: (partition, _records, work, retry) =>
        Effect.gen(function*() {
          yield* context.crashAt("beforeHandler", [partition])
          yield* context.guard(withoutTransaction(retry(work)))
          yield* context.crashAt("afterHandler", [partition])
        }),
      // kafka-clients commits synchronously before a rebalance when auto commit is on.
      revoke: () => committer.flush,
      lost: committer.forget
    } satisfies PolicyInstance
  })

/** At-least-once: positions of handled records, batched by count and time. */
export const commitAfter = (
  context: PolicyContext,
  maxBatch: number,
  maxInterval: Duration.Duration
): Effect.Effect<PolicyInstance, never, Scope.Scope> =>
  Effect.gen(function*() {
    const committer = yield* makeCommitter(context)
    // The commit is off the worker's path: a worker that completes a batch wakes the committer and goes on; one
    // commit is in flight at a time and carries every position handled meanwhile (merged, highest per partition).
    // Time: `maxInterval` after the last commit ended, as a timer fiber of its own that asks the committer like a
    // full batch does (racing the wait against a sleep forked two fibers and interrupted one on every commit).
    // A mailbox, not a queue: a committer that waits costs a callback, not a deferred.
    const due = yield* Mailbox.make<void>({ capacity: 1, strategy: "sliding" })
    const every = Duration.toMillis(maxInterval)
    let deadline = (yield* Clock.currentTimeMillis) + every
    const commits: Effect.Effect<void, PolicyError> = Effect.flatMap(due.takeAll, () =>
      Effect.flatMap(committer.flush, () =>
        Effect.flatMap(Clock.currentTimeMillis, (now) => {
          deadline = now + every
          return commits
        })))
    yield* context.fork(commits)
    yield* context.fork(
      Effect.flatMap(Clock.currentTimeMillis, (now) => {
        if (now < deadline) return Effect.sleep(Duration.millis(deadline - now))
        deadline = now + every
        due.unsafeOffer(undefined)
        return Effect.sleep(maxInterval)
      }).pipe(Effect.forever)
    )
    return {
      name: "commitAfter",
      startPositions: (partitions) => kafkaStartPositions(context.session, partitions),
      delivered: () => Effect.void,
      polled: Effect.void,
      // Runs once per chunk: combinators rather than a generator, and the bookkeeping after the handler is one
      // synchronous step.
      process: (partition, records, work, retry) => {
        const handled = andThen(
          context.guard(withoutTransaction(retry(work))),
          context.crashAt("afterHandler", [partition])
        )
        return andThen(
          context.crashAt("beforeHandler", [partition]),
          Effect.map(handled, () => {
            if (committer.unsafeAdd(partition, lastPosition(records), Chunk.size(records)) >= maxBatch) {
              due.unsafeOffer(undefined)
            }
          })
        )
      },
      revoke: () => committer.flush,
      lost: committer.forget
    } satisfies PolicyInstance
  })

/** Where a partition starts when Kafka holds the position: the committed offset, else the beginning. */
const kafkaStartPositions = (
  session: DriverSession,
  partitions: ReadonlyArray<TopicPartition.TopicPartition>
) =>
  Effect.gen(function*() {
    const committed = yield* session.committed(partitions)
    const missing = partitions.filter((tp) => !committed.has(TopicPartition.key(tp)))
    if (missing.length === 0) return committed
    const beginning = yield* session.beginning(missing)
    return new Map([...beginning, ...committed])
  })

/** Exactly-once: the handler's writes and the position in one transaction of the offset store. */
export const transactionalLayer = (commitToKafka: boolean): Layer.Layer<CommitPolicy, never, OffsetStore> =>
  Layer.effect(
    CommitPolicy,
    Effect.map(OffsetStore, (store) => ({
      name: "transactional",
      make: (context: PolicyContext) =>
        Effect.sync(() => {
          // The stored position each owned partition's next unit starts from; `null` when nothing is stored yet.
          const stored = new Map<string, bigint | null>()
          const instance: PolicyInstance = {
            name: "transactional",
            startPositions: (partitions) =>
              Effect.gen(function*() {
                const loaded = yield* store.load(context.groupId, partitions)
                const missing = partitions.filter((tp) => !loaded.has(TopicPartition.key(tp)))
                const beginning = missing.length === 0 ? new Map<string, bigint>() : yield* context.session.beginning(missing)
                for (const tp of partitions) stored.set(TopicPartition.key(tp), loaded.get(TopicPartition.key(tp)) ?? null)
                return new Map([...beginning, ...loaded])
              }),
            delivered: () => Effect.void,
            polled: Effect.void,
            process: (partition, records, work, retry) =>
              Effect.gen(function*() {
                const key = TopicPartition.key(partition)
                const next = lastPosition(records)
                yield* context.crashAt("beforeHandler", [partition])
                const unit = { groupId: context.groupId, partition, expected: stored.get(key) ?? null, next }
                yield* retry(context.guard(store.commit(
                  unit,
                  work.pipe(
                    Effect.zipLeft(context.crashAt("afterHandler", [partition])),
                    Effect.zipLeft(context.crashAt("beforeCommit", [partition]))
                  )
                )))
                stored.set(key, next)
                yield* context.crashAt("afterCommit", [partition])
                if (commitToKafka) {
                  yield* context.guard(context.session.commit(OffsetBatch.of(partition, next))).pipe(
                    Effect.catchAll((error) => Effect.logDebug("position hint not committed to Kafka", error))
                  )
                }
              }),
            revoke: () => Effect.void,
            lost: (partitions) =>
              Effect.sync(() => {
                for (const tp of partitions) stored.delete(TopicPartition.key(tp))
              })
          }
          return instance
        })
    }))
  )

export type { PolicyError }
