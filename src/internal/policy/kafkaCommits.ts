/**
 * The policies whose positions Kafka holds, committed by the consumer group: `atMostOnce` (commit, then handle),
 * `autoCommit` (what was fetched, every interval) and `commitAfter` (what was handled, by count and time).
 *
 * @internal
 */
import * as Chunk from "effect/Chunk"
import * as Clock from "effect/Clock"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Mailbox from "effect/Mailbox"
import type * as Scope from "effect/Scope"
import type { PolicyContext, PolicyError, PolicyInstance } from "../../CommitPolicy.js"
import * as OffsetBatch from "../../OffsetBatch.js"
import * as TopicPartition from "../../TopicPartition.js"
import * as Progress from "../consumer/progress.js"
import { retryAfterFailure } from "../shared/retry.js"
import { makeCommitter } from "./committer.js"
import { andThen, finishedRanges, handled, kafkaStartPositions, persistentRetry, whileUnreachable } from "./support.js"

/** Commits before handing records over: a record is handled at most once. */
export const atMostOnce = (context: PolicyContext): Effect.Effect<PolicyInstance, never, Scope.Scope> =>
  Effect.sync(() => {
    const owned = new Set<string>()
    // The commit must land before the handler runs: retriable refusals are retried until the deadline.
    const commitFirst = (partition: TopicPartition.TopicPartition, next: bigint) =>
      retryAfterFailure(context.session.commit(OffsetBatch.of(partition, next)), {
        schedule: persistentRetry(context.reconnectTimeout),
        retryable: (error) => error.retriable
      }).pipe(
        Effect.as(true),
        Effect.catchIf((error) => error.reason === "NotOwned", (error) => {
          owned.delete(TopicPartition.key(partition))
          return Effect.as(
            Effect.logInfo(
              `${
                TopicPartition.key(partition)
              }: ${error.message}; the chunk is skipped, its next owner starts before it`
            ),
            false
          )
        })
      )
    const instance: PolicyInstance = {
      name: "atMostOnce",
      failedRecords: "once",
      assign: (partitions) =>
        Effect.suspend(() => {
          for (const tp of partitions) owned.add(TopicPartition.key(tp))
          return kafkaStartPositions(context, partitions)
        }),
      delivered: () => Effect.void,
      polled: Effect.void,
      process: (partition, _records, next, work) =>
        Effect.gen(function*() {
          if (!owned.has(TopicPartition.key(partition))) return
          yield* context.crashAt("beforeCommit", [partition])
          if (!(yield* context.guard(commitFirst(partition, next)))) return
          yield* context.crashAt("afterCommit", [partition])
          yield* context.crashAt("beforeHandler", [partition])
          yield* context.guard(work)
          yield* context.crashAt("afterHandler", [partition])
        }),
      revoke: (partitions) =>
        Effect.sync(() => {
          for (const tp of partitions) owned.delete(TopicPartition.key(tp))
        }),
      lost: (partitions) =>
        Effect.sync(() => {
          for (const tp of partitions) owned.delete(TopicPartition.key(tp))
        })
    }
    return instance
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
      awaitsRoutes: true,
      assign: (partitions) => Effect.zipRight(committer.assign(partitions), kafkaStartPositions(context, partitions)),
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
      process: (partition, _records, _next, work, retry) =>
        Effect.gen(function*() {
          yield* context.crashAt("beforeHandler", [partition])
          yield* context.guard(retry(work))
          yield* context.crashAt("afterHandler", [partition])
        }),
      // Positions follow what was fetched, not what finished: records may finish in any order.
      outOfOrder: {
        handle: (partition, _next, _finished, work, retry) => handled(context, partition, work, retry),
        progressed: () => {}
      },
      // kafka-clients commits synchronously before a rebalance when auto commit is on.
      revoke: committer.revoke,
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
        if (now < deadline) {
          return Effect.sleep(Duration.millis(deadline - now))
        }
        deadline = now + every
        due.unsafeOffer(undefined)
        return Effect.sleep(maxInterval)
      }).pipe(Effect.forever)
    )
    // Ranges the previous owners finished above their committed positions, read on assign, taken by the runloop.
    const finishedBefore = finishedRanges()
    return {
      name: "commitAfter",
      awaitsRoutes: true,
      assign: (partitions) =>
        Effect.zipRight(
          committer.assign(partitions),
          Effect.map(
            whileUnreachable(context.session.committedWithMetadata(partitions), context.reconnectTimeout),
            (committed) => {
              const positions = new Map<string, bigint>()
              for (const [k, { metadata, position }] of committed) {
                positions.set(k, position)
                finishedBefore.set(k, Progress.decode(position, metadata))
              }
              return positions
            }
          )
        ),
      finishedOnAssign: finishedBefore.take,
      // Records finishing out of order: the commit carries the lowest unfinished offset as the position and the
      // ranges finished above it as the position's metadata.
      outOfOrder: {
        handle: (partition, _next, _finished, work, retry) =>
          handled(context, partition, work, retry),
        progressed: (partition, progress, records) => {
          if (committer.unsafeTrack(partition, progress, records) >= maxBatch) {
            due.unsafeOffer(undefined)
          }
        }
      },
      delivered: () =>
        Effect.void,
      polled: Effect.void,
      // Runs once per chunk: combinators rather than a generator, and the bookkeeping after the handler is one
      // synchronous step.
      process: (partition, records, next, work, retry) => {
        const handled = andThen(context.guard(retry(work)), context.crashAt("afterHandler", [partition]))
        return andThen(
          context.crashAt("beforeHandler", [partition]),
          Effect.map(handled, () => {
            if (committer.unsafeAdd(partition, next, Chunk.size(records)) >= maxBatch) due.unsafeOffer(undefined)
          })
        )
      },
      revoke: committer.revoke,
      lost: committer.forget
    } satisfies PolicyInstance
  })
