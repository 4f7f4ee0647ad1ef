/**
 * A measured proposal, not part of the library: `commitAfter` with the commit taken off the worker's path. The
 * worker that reaches `maxBatch` only wakes a committer fiber and goes on with its next chunk; one commit is in
 * flight at a time and merges every position handled meanwhile. Positions are still added only after their records
 * were handled, so the guarantee is the same (at-least-once); revoke waits for the commit in flight and commits the
 * rest. Crash points are left out: this exists to measure throughput (`bench/profile.ts overhead-chunk-async`).
 */
import * as Chunk from "effect/Chunk"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Queue from "effect/Queue"
import * as Schedule from "effect/Schedule"
import { CommitPolicy, type PolicyContext, type PolicyInstance } from "../src/CommitPolicy.js"
import * as ConsumerRecord from "../src/ConsumerRecord.js"
import * as OffsetBatch from "../src/OffsetBatch.js"
import type { Transaction } from "../src/OffsetStore.js"
import * as TopicPartition from "../src/TopicPartition.js"

const commitRetry = Schedule.exponential(Duration.millis(20)).pipe(Schedule.intersect(Schedule.recurs(5)))

const make = (context: PolicyContext, maxBatch: number, maxInterval: Duration.Duration) =>
  Effect.gen(function*() {
    let pending = OffsetBatch.empty
    let count = 0
    const wake = yield* Queue.sliding<void>(1)
    const lock = yield* Effect.makeSemaphore(1)
    const flush = lock.withPermits(1)(Effect.suspend(() => {
      if (OffsetBatch.isEmpty(pending)) return Effect.void
      const batch = pending
      pending = OffsetBatch.empty
      count = 0
      return context.guard(context.session.commit(batch)).pipe(
        Effect.retry({ schedule: commitRetry, while: (e) => e.retriable }),
        Effect.catchAll((error) => Effect.logWarning("commit refused; positions dropped", error))
      )
    }))
    yield* context.fork(
      Effect.race(Queue.take(wake), Effect.sleep(maxInterval)).pipe(Effect.zipRight(flush), Effect.forever)
    )
    const instance: PolicyInstance = {
      name: "commitAfter (async commit prototype)",
      startPositions: (partitions) =>
        Effect.gen(function*() {
          const committed = yield* context.session.committed(partitions)
          const missing = partitions.filter((tp) => !committed.has(TopicPartition.key(tp)))
          if (missing.length === 0) return committed
          const beginning = yield* context.session.beginning(missing)
          return new Map([...beginning, ...committed])
        }),
      delivered: () => Effect.void,
      polled: Effect.void,
      process: <E, R>(
        partition: TopicPartition.TopicPartition,
        records: Chunk.Chunk<ConsumerRecord.ConsumerRecord>,
        work: Effect.Effect<void, E, R>,
        retry: <E2, R2>(work: Effect.Effect<void, E2, R2>) => Effect.Effect<void, E2, R2>
      ) =>
        context.guard(retry(work as Effect.Effect<void, E, Exclude<R, Transaction>>)).pipe(
          Effect.zipRight(Effect.suspend(() => {
            pending = OffsetBatch.add(pending, partition, ConsumerRecord.nextPosition(Chunk.unsafeLast(records)))
            count += Chunk.size(records)
            return count >= maxBatch ? Queue.offer(wake, undefined) : Effect.void
          })),
          Effect.asVoid
        ),
      revoke: () => flush,
      lost: (partitions) =>
        Effect.sync(() => {
          pending = OffsetBatch.without(pending, partitions)
        })
    }
    return instance
  })

export const asyncCommitAfter = (maxBatch: number, maxInterval: Duration.Duration): Layer.Layer<CommitPolicy> =>
  Layer.succeed(CommitPolicy, {
    name: "commitAfter (async commit prototype)",
    make: (context) => make(context, maxBatch, maxInterval)
  })
