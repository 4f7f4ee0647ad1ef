/**
 * What the commit policies share: the retry rules for commits and for an unreachable cluster, the crash points around
 * a handler, the ranges earlier owners finished, and where a partition starts when Kafka holds its position.
 *
 * @internal
 */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Schedule from "effect/Schedule"
import type { PolicyContext } from "../../CommitPolicy.js"
import { DriverError, TransactionFailed } from "../../KafkaError.js"
import * as TopicPartition from "../../TopicPartition.js"
import { retryAfterFailure } from "../shared/retry.js"

/** Retriable commit failures (a coordinator moving, a rebalance starting) are retried a few times at once. */
export const commitRetry = Schedule.exponential(Duration.millis(20)).pipe(Schedule.intersect(Schedule.recurs(5)))

/** A commit that must land before anything else happens is retried, more slowly, until the deadline. */
export const persistentRetry = (deadline: Duration.Duration) =>
  Schedule.exponential(Duration.millis(100)).pipe(
    Schedule.union(Schedule.spaced(Duration.seconds(5))),
    Schedule.upTo(deadline)
  )

/**
 * A failure that the cluster's coming back makes go away: a retriable `DriverError` (a lost connection, a coordinator
 * loading or moving, an offset read that is not stable yet), or a transaction step that timed out or lost its
 * connection.
 */
export const transient = (error: unknown): boolean =>
  (error instanceof DriverError && error.retriable) ||
  (error instanceof TransactionFailed && (error.reason === "Timeout" || error.reason === "Disconnected"))

/**
 * `effect`, tried again while it fails with transient errors, for up to `within`: a broker away for less than the
 * consumer's `reconnectTimeout` does not end it.
 */
export const whileUnreachable = <A, E, R>(
  effect: Effect.Effect<A, E, R>,
  within: Duration.Duration
): Effect.Effect<A, E, R> => retryAfterFailure(effect, { schedule: persistentRetry(within), retryable: transient })

/** `first` then `second`, without a step for either that does nothing (a crash point without faults). */
export const andThen = <E1, R1, E2, R2>(
  first: Effect.Effect<void, E1, R1>,
  second: Effect.Effect<void, E2, R2>
): Effect.Effect<void, E1 | E2, R1 | R2> =>
  first === Effect.void ? second : second === Effect.void ? first : Effect.zipRight(first, second)

export const keys = (list: Iterable<string>) => Array.from(list).join(", ")

export const partitionsOf = (positions: ReadonlyMap<string, bigint>) =>
  Array.from(positions.keys(), TopicPartition.fromKey)

/**
 * Ranges an earlier owner finished above a partition's start position, as read on assign; the runloop takes each
 * partition's once.
 */
export const finishedRanges = () => {
  const ranges = new Map<string, ReadonlyArray<readonly [bigint, bigint]>>()
  return {
    set: (k: string, finished: ReadonlyArray<readonly [bigint, bigint]> | undefined) => {
      if (finished !== undefined && finished.length > 0) ranges.set(k, finished)
      else ranges.delete(k)
    },
    forget: (k: string) => ranges.delete(k),
    take: (partition: TopicPartition.TopicPartition): ReadonlyArray<readonly [bigint, bigint]> => {
      const k = TopicPartition.key(partition)
      const finished = ranges.get(k) ?? []
      ranges.delete(k)
      return finished
    }
  }
}

/** The handler with the consumer's retries, between the crash points around it. */
export const handled = <E, R>(
  context: PolicyContext,
  partition: TopicPartition.TopicPartition,
  work: Effect.Effect<void, E, R>,
  retry: <E2, R2>(work: Effect.Effect<void, E2, R2>) => Effect.Effect<void, E2, R2>
): Effect.Effect<void, E, R> =>
  andThen(
    context.crashAt("beforeHandler", [partition]),
    andThen(context.guard(retry(work)), context.crashAt("afterHandler", [partition]))
  )

/** Where a partition starts when Kafka holds the position: the committed offset, when there is one. */
export const kafkaStartPositions = (context: PolicyContext, partitions: ReadonlyArray<TopicPartition.TopicPartition>) =>
  whileUnreachable(context.session.committed(partitions), context.reconnectTimeout)
