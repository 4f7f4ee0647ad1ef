import * as Chunk from "effect/Chunk"
import * as Clock from "effect/Clock"
import * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Mailbox from "effect/Mailbox"
import * as Schedule from "effect/Schedule"
import * as Exit from "effect/Exit"
import * as Scope from "effect/Scope"
import type { PartitionProgress, PolicyContext, PolicyError, PolicyInstance } from "../../CommitPolicy.js"
import { CommitPolicy } from "../../CommitPolicy.js"
import { type CommitFailed, DriverError, ProduceFailed, TransactionFailed } from "../../KafkaError.js"
import * as OffsetBatch from "../../OffsetBatch.js"
import { OffsetStore, Transaction } from "../../OffsetStore.js"
import { Producer, type TransactionalProducer, TransactionalProducers } from "../../Producer.js"
import * as TopicPartition from "../../TopicPartition.js"
import * as Progress from "../consumer/progress.js"
import { retryAfterFailure } from "../shared/retry.js"
import { OutsideUnit } from "../store/unitBuffer.js"

/** Retriable commit failures (a coordinator moving, a rebalance starting) are retried a few times at once. */
const commitRetry = Schedule.exponential(Duration.millis(20)).pipe(Schedule.intersect(Schedule.recurs(5)))

/** A commit that must land before anything else happens is retried, more slowly, until the deadline. */
const persistentRetry = (deadline: Duration.Duration) =>
  Schedule.exponential(Duration.millis(100)).pipe(
    Schedule.union(Schedule.spaced(Duration.seconds(5))),
    Schedule.upTo(deadline)
  )

/**
 * A failure that the cluster's coming back makes go away: a retriable `DriverError` (a lost connection, a coordinator
 * loading or moving, an offset read that is not stable yet), or a transaction step that timed out or lost its
 * connection.
 */
const transient = (error: unknown): boolean =>
  (error instanceof DriverError && error.retriable) ||
  (error instanceof TransactionFailed && (error.reason === "Timeout" || error.reason === "Disconnected"))

/**
 * `effect`, tried again while it fails with transient errors, for up to `within`: a broker away for less than the
 * consumer's `reconnectTimeout` does not end it.
 */
const whileUnreachable = <A, E, R>(effect: Effect.Effect<A, E, R>, within: Duration.Duration): Effect.Effect<A, E, R> =>
  retryAfterFailure(effect, { schedule: persistentRetry(within), retryable: transient })

/** `first` then `second`, without a step for either that does nothing (a crash point without faults). */
const andThen = <E1, R1, E2, R2>(
  first: Effect.Effect<void, E1, R1>,
  second: Effect.Effect<void, E2, R2>
): Effect.Effect<void, E1 | E2, R1 | R2> =>
  first === Effect.void ? second : second === Effect.void ? first : Effect.zipRight(first, second)

const keys = (list: Iterable<string>) => Array.from(list).join(", ")

const partitionsOf = (positions: ReadonlyMap<string, bigint>) => Array.from(positions.keys(), TopicPartition.fromKey)

/**
 * Pending positions merged by highest per partition, committed one batch at a time, and the one rule for a refused
 * commit, shared by `autoCommit` and `commitAfter`:
 *
 * - the member no longer owns a partition (`NotOwned`, a stale generation, an unknown member): that partition's
 *   position is dropped, alone, and the rest of the batch is committed; its next owner repeats what was handled since
 *   its last commit (a duplicate, never a loss);
 * - retriable (a rebalance starting, the coordinator moving, a timeout, a lost connection): retried a few times, then
 *   the positions are kept for the next commit; when commits have kept failing for `reconnectTimeout`, the consumer
 *   ends with the last refusal. A final commit (on revoke) cannot wait for a next one: its positions are dropped;
 * - anything else (not authorized, say) is fatal: the consumer ends with the `CommitFailed`.
 */
const makeCommitter = (context: PolicyContext) =>
  Effect.map(Effect.makeSemaphore(1), (lock) => {
    // Mutable and private: adding a position is a map write, not a copy of the batch.
    let pending = new Map<string, bigint>()
    // Partitions whose records finish out of order: their position and finished ranges are read at the commit.
    let tracked = new Map<string, PartitionProgress>()
    let count = 0
    const owned = new Set<string>()
    let failingSince: number | undefined
    const deadline = Duration.toMillis(context.reconnectTimeout)

    const keep = (positions: ReadonlyMap<string, bigint>) => {
      for (const [k, position] of positions) {
        const current = pending.get(k)
        if (current === undefined || position > current) pending.set(k, position)
      }
    }

    const attempt = (
      positions: Map<string, bigint>,
      metadata: ReadonlyMap<string, string>,
      final: ReadonlySet<string>
    ): Effect.Effect<void, CommitFailed> =>
      Effect.suspend(() => {
        for (const k of positions.keys()) if (!owned.has(k)) positions.delete(k)
        if (positions.size === 0) return Effect.void
        return retryAfterFailure(context.session.commit({ positions, metadata }), {
          schedule: commitRetry,
          retryable: (error) => error.retriable
        }).pipe(
          Effect.matchEffect({
            onSuccess: () =>
              Effect.sync(() => {
                failingSince = undefined
              }),
            onFailure: (error) => refused(positions, metadata, final, error)
          })
        )
      })

    const refused = (
      positions: Map<string, bigint>,
      metadata: ReadonlyMap<string, string>,
      final: ReadonlySet<string>,
      error: CommitFailed
    ): Effect.Effect<void, CommitFailed> => {
      if (error.reason === "NotOwned") {
        // The client knows that these partitions moved; the runloop hears of it next. The rest are committed.
        const gone = error.partitions.map(TopicPartition.key)
        for (const k of gone) {
          positions.delete(k)
          owned.delete(k)
        }
        return Effect.zipRight(
          Effect.logInfo(
            `positions of ${keys(gone)} dropped: this member no longer owns them; their next owner repeats what was ` +
              "handled since their last commit"
          ),
          positions.size > 0 ? attempt(positions, metadata, final) : Effect.void
        )
      }
      // A stale generation or an unknown member: none of the member's partitions is its own any more, though its
      // client may not know it yet. The consumer ends the session and rejoins (or ends), rather than go on handling
      // records whose positions it can no longer commit.
      if (error.notOwned) {
        owned.clear()
        pending = new Map()
        tracked = new Map()
        return Effect.fail(error)
      }
      if (!error.retriable) return Effect.fail(error)
      return Effect.flatMap(Clock.currentTimeMillis, (now) => {
        failingSince ??= now
        if (now - failingSince >= deadline) return Effect.fail(error)
        const dropped = Array.from(positions.keys()).filter((k) => final.has(k))
        for (const k of dropped) positions.delete(k)
        keep(positions)
        return Effect.logWarning(
          `${error.message}, after retries; ` +
            (positions.size > 0 ? `the positions of ${keys(positions.keys())} wait for the next commit` : "") +
            (dropped.length > 0 ?
              `${positions.size > 0 ? "; " : ""}the final positions of ${keys(dropped)} are dropped (their next ` +
                "owner repeats what was handled since their last commit)" :
              "")
        )
      })
    }

    const flushWith = (final: ReadonlySet<string>) =>
      lock.withPermits(1)(Effect.suspend(() => {
        if (pending.size === 0 && tracked.size === 0) return Effect.void
        const positions = pending
        const metadata = new Map<string, string>()
        for (const [k, progress] of tracked) {
          const position = progress.position()
          positions.set(k, position)
          const finished = Progress.encode(position, progress.finished())
          if (finished !== "") metadata.set(k, finished)
        }
        pending = new Map()
        tracked = new Map()
        count = 0
        const partitions = partitionsOf(positions)
        // The route's writes of records these positions pass were started before the positions were taken: each is
        // acknowledged before the commit, or nothing is committed (the consumer ends with the write's failure).
        return Effect.flatMap(context.routed, (acknowledged) =>
          acknowledged
            ? andThen(
              context.crashAt("beforeCommit", partitions),
              andThen(context.guard(attempt(positions, metadata, final)), context.crashAt("afterCommit", partitions))
            )
            : Effect.void)
      }))

    const noneFinal: ReadonlySet<string> = new Set()

    return {
      /** Adds a handled position of an owned partition at once; returns the records handled since the last flush. */
      unsafeAdd: (partition: TopicPartition.TopicPartition, position: bigint, records: number): number => {
        const k = TopicPartition.key(partition)
        if (!owned.has(k)) return count
        const current = pending.get(k)
        if (current === undefined || position > current) pending.set(k, position)
        count += records
        return count
      },
      /** A partition whose records finish out of order has come further; `records` more of them finished. */
      unsafeTrack: (partition: TopicPartition.TopicPartition, progress: PartitionProgress, records: number): number => {
        const k = TopicPartition.key(partition)
        if (!owned.has(k)) return count
        tracked.set(k, progress)
        count += records
        return count
      },
      assign: (partitions: ReadonlyArray<TopicPartition.TopicPartition>) =>
        Effect.sync(() => {
          for (const tp of partitions) owned.add(TopicPartition.key(tp))
        }),
      flush: flushWith(noneFinal),
      /** Commits what is pending (the revoked partitions' positions for the last time), then lets them go. */
      revoke: (partitions: ReadonlyArray<TopicPartition.TopicPartition>) =>
        Effect.suspend(() => {
          const revoked = new Set(partitions.map(TopicPartition.key))
          return flushWith(revoked).pipe(Effect.ensuring(Effect.sync(() => {
            for (const k of revoked) {
              owned.delete(k)
              pending.delete(k)
              tracked.delete(k)
            }
          })))
        }),
      forget: (partitions: ReadonlyArray<TopicPartition.TopicPartition>) =>
        Effect.sync(() => {
          for (const tp of partitions) {
            owned.delete(TopicPartition.key(tp))
            pending.delete(TopicPartition.key(tp))
            tracked.delete(TopicPartition.key(tp))
          }
        })
    } as const
  })

/**
 * Ranges an earlier owner finished above a partition's start position, as read on assign; the runloop takes each
 * partition's once.
 */
const finishedRanges = () => {
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
const handled = <E, R>(
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
const kafkaStartPositions = (context: PolicyContext, partitions: ReadonlyArray<TopicPartition.TopicPartition>) =>
  whileUnreachable(context.session.committed(partitions), context.reconnectTimeout)

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
              `${TopicPartition.key(partition)}: ${error.message}; the chunk is skipped, its next owner starts before it`
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
      assign: (partitions) =>
        Effect.zipRight(committer.assign(partitions), kafkaStartPositions(context, partitions)),
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
        if (now < deadline) return Effect.sleep(Duration.millis(deadline - now))
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
          Effect.map(whileUnreachable(context.session.committedWithMetadata(partitions), context.reconnectTimeout), (committed) => {
            const positions = new Map<string, bigint>()
            for (const [k, { metadata, position }] of committed) {
              positions.set(k, position)
              finishedBefore.set(k, Progress.decode(position, metadata))
            }
            return positions
          })
        ),
      finishedOnAssign: finishedBefore.take,
      // Records finishing out of order: the commit carries the lowest unfinished offset as the position and the
      // ranges finished above it as the position's metadata.
      outOfOrder: {
        handle: (partition, _next, _finished, work, retry) => handled(context, partition, work, retry),
        progressed: (partition, progress, records) => {
          if (committer.unsafeTrack(partition, progress, records) >= maxBatch) due.unsafeOffer(undefined)
        }
      },
      delivered: () => Effect.void,
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

/** Exactly-once: the handler's writes and the position in one transaction of the offset store. */
export const transactionalLayer = (
  commitToKafka: boolean
): Layer.Layer<CommitPolicy | Transaction, never, OffsetStore> =>
  Layer.effectContext(
    Effect.map(OffsetStore, (store) =>
      Context.make(CommitPolicy, {
        name: "transactional",
        make: (context: PolicyContext) =>
          Effect.sync(() => {
            // The owner epoch of each owned partition, from the claim made on assign.
            const epochs = new Map<string, bigint>()
            // Ranges the earlier owners finished above the stored position, from the claim, taken by the runloop.
            const finishedBefore = finishedRanges()
            const forget = (partitions: ReadonlyArray<TopicPartition.TopicPartition>) =>
              Effect.sync(() => {
                for (const tp of partitions) {
                  epochs.delete(TopicPartition.key(tp))
                  finishedBefore.forget(TopicPartition.key(tp))
                }
              })
            // One unit of the store: the handler's writes, and the position (or the ranges finished) with them.
            const unitOf = <E, R>(
              partition: TopicPartition.TopicPartition,
              next: bigint,
              finished: ReadonlyArray<readonly [bigint, bigint]> | undefined,
              work: Effect.Effect<void, E, R>,
              retry: <E2, R2>(work: Effect.Effect<void, E2, R2>) => Effect.Effect<void, E2, R2>
            ): Effect.Effect<void, E | PolicyError, R> =>
              Effect.gen(function*() {
                const epoch = epochs.get(TopicPartition.key(partition))
                // Work of a partition this member no longer owns (left running after a revoke) commits nothing.
                if (epoch === undefined) return
                yield* context.crashAt("beforeHandler", [partition])
                const unit = { groupId: context.groupId, partition, epoch, next, finished }
                yield* retry(context.guard(context.observe(
                  "store",
                  partition,
                  next,
                  store.commit(
                    unit,
                    work.pipe(
                      Effect.zipLeft(context.crashAt("afterHandler", [partition])),
                      Effect.zipLeft(context.crashAt("beforeCommit", [partition]))
                    )
                  )
                )))
                yield* context.crashAt("afterCommit", [partition])
                if (commitToKafka && finished === undefined) {
                  yield* context.guard(context.session.commit(OffsetBatch.of(partition, next))).pipe(
                    Effect.catchAll((error) => Effect.logDebug("position hint not committed to Kafka", error))
                  )
                }
              })
            const instance: PolicyInstance = {
              name: "transactional",
              failedRecords: "rerun",
              assign: (partitions) =>
                Effect.map(store.claim(context.groupId, partitions), (claims) => {
                  const positions = new Map<string, bigint>()
                  for (const [k, claim] of claims) {
                    epochs.set(k, claim.epoch)
                    if (claim.position !== null) positions.set(k, claim.position)
                    finishedBefore.set(k, claim.finished)
                  }
                  return positions
                }),
              finishedOnAssign: finishedBefore.take,
              delivered: () => Effect.void,
              polled: Effect.void,
              process: (partition, _records, next, work, retry) => unitOf(partition, next, undefined, work, retry),
              // Records finishing out of order: a unit per few records of a key, naming the ranges it finished.
              outOfOrder: {
                handle: (partition, next, finished, work, retry) => unitOf(partition, next, finished, work, retry),
                unitRecords: 32,
                progressed: () => {}
              },
              revoke: forget,
              lost: forget
            }
            return instance
          })
      }).pipe(
        // Outside a unit of work the service holds no transaction; each unit provides its own over it.
        Context.add(Transaction, { store: store.name, handle: new OutsideUnit(store.name) })
      ))
  )

const outsideUnit =
  "under CommitPolicy.kafkaTransactional the Producer writes into the transaction of the chunk being handled; " +
  "outside a handler there is none (provide a Producer layer of its own to write elsewhere)"

/** The `Producer` outside a chunk's handler: it has no transaction to write into. */
const producerOutsideUnit: Context.Tag.Service<typeof Producer> = {
  send: (record) => Effect.fail(new ProduceFailed({ reason: "Other", topic: record.topic, detail: outsideUnit })),
  sendAll: (records) =>
    Effect.suspend(() => {
      const first = Array.from(records)[0]
      return first === undefined
        ? Effect.succeed([])
        : Effect.fail(new ProduceFailed({ reason: "Other", topic: first.topic, detail: outsideUnit }))
    }),
  flush: Effect.void
}

/** A transaction whose outcome is unknown (a timeout, a lost connection, a client in a broken state). */
const unsettled = (error: unknown): error is TransactionFailed =>
  error instanceof TransactionFailed &&
  (error.reason === "Timeout" || error.reason === "Disconnected" || error.reason === "Other")

/** Exactly-once inside Kafka: the handler's records and the position in one Kafka transaction per chunk. */
export const kafkaTransactionalLayer = (
  prefix: string
): Layer.Layer<CommitPolicy | Producer, never, TransactionalProducers> =>
  Layer.effectContext(
    Effect.map(TransactionalProducers, (factory) =>
      Context.make(CommitPolicy, {
        name: "kafkaTransactional",
        make: (context: PolicyContext) =>
          Effect.gen(function*() {
            interface Owned {
              readonly producer: Context.Tag.Service<typeof TransactionalProducer>
              readonly scope: Scope.CloseableScope
            }
            const owned = new Map<string, Owned>()
            const idOf = (tp: TopicPartition.TopicPartition) => `${prefix}${context.groupId}-${tp.topic}-${tp.partition}`

            const close = (partitions: ReadonlyArray<TopicPartition.TopicPartition>) =>
              Effect.forEach(partitions, (tp) => {
                const k = TopicPartition.key(tp)
                const o = owned.get(k)
                if (o === undefined) return Effect.void
                owned.delete(k)
                return Scope.close(o.scope, Exit.void)
              }, { concurrency: "unbounded", discard: true })

            // Starting the partition's producer fences every earlier owner and ends its open transaction.
            const open = (tp: TopicPartition.TopicPartition) =>
              Effect.gen(function*() {
                yield* close([tp])
                const scope = yield* Scope.make()
                const producer = yield* factory.make(idOf(tp)).pipe(
                  Scope.extend(scope),
                  Effect.onError(() => Scope.close(scope, Exit.void))
                )
                owned.set(TopicPartition.key(tp), { producer, scope })
              })

            yield* Effect.addFinalizer(() => close(Array.from(owned.keys(), TopicPartition.fromKey)))

            const processChunk = <E, R>(
              partition: TopicPartition.TopicPartition,
              next: bigint,
              work: Effect.Effect<void, E, R>,
              retry: <E2, R2>(work: Effect.Effect<void, E2, R2>) => Effect.Effect<void, E2, R2>
            ): Effect.Effect<void, E | PolicyError, R> =>
              Effect.gen(function*() {
                const k = TopicPartition.key(partition)
                // Work of a partition this member no longer owns (left running after a revoke) commits nothing.
                if (!owned.has(k)) return
                yield* context.crashAt("beforeHandler", [partition])
                const offsets = {
                  groupId: context.groupId,
                  positions: [{ topic: partition.topic, partition: partition.partition, next }]
                }
                const body = work.pipe(
                  Effect.zipLeft(context.crashAt("afterHandler", [partition])),
                  Effect.zipLeft(context.crashAt("beforeCommit", [partition]))
                )
                const attempt = Effect.suspend(() => {
                  const o = owned.get(k)
                  return o === undefined
                    ? Effect.void
                    : context.observe("transaction", partition, next, o.producer.transaction(body, { offsets }))
                })
                const deadline = (yield* Clock.currentTimeMillis) + Duration.toMillis(context.reconnectTimeout)
                // An unsettled transaction is settled by starting the partition's producer anew: then the committed
                // position (read stable: a transaction still completing makes the read wait) says whether it
                // committed. A cluster still away is waited for, up to the chunk's deadline.
                const settle = Effect.flatMap(Clock.currentTimeMillis, (now) =>
                  whileUnreachable(
                    Effect.zipRight(
                      context.guard(open(partition)),
                      Effect.map(context.guard(context.session.committed([partition])), (committed) => {
                        const position = committed.get(k)
                        return position !== undefined && position >= next
                      })
                    ),
                    Duration.millis(Math.max(0, deadline - now))
                  ))
                const run = (delay: number): Effect.Effect<void, E | PolicyError, R> =>
                  Effect.catchIf(retry(context.guard(attempt)), unsettled, (error) =>
                    Effect.flatMap(settle, (committed) =>
                      committed ? Effect.void : Effect.flatMap(Clock.currentTimeMillis, (now) =>
                        now >= deadline
                          ? Effect.fail(error)
                          : Effect.zipRight(
                            Effect.logWarning(`${k}: ${error.message}; handling the chunk again in a new transaction`),
                            Effect.zipRight(Effect.sleep(Duration.millis(delay)), run(Math.min(delay * 2, 5_000)))
                          ))))
                yield* run(100)
                yield* context.crashAt("afterCommit", [partition])
              })

            const instance: PolicyInstance = {
              name: "kafkaTransactional",
              failedRecords: "rerun",
              unitHoldsWrites: true,
              assign: (partitions) =>
                Effect.zipRight(
                  Effect.forEach(partitions, (tp) => whileUnreachable(context.guard(open(tp)), context.reconnectTimeout), {
                    concurrency: "unbounded",
                    discard: true
                  }),
                  // Read once every earlier owner is fenced: the committed positions are final.
                  kafkaStartPositions(context, partitions)
                ),
              delivered: () => Effect.void,
              polled: Effect.void,
              process: (partition, _records, next, work, retry) => processChunk(partition, next, work, retry),
              revoke: close,
              lost: close
            }
            return instance
          })
      }).pipe(Context.add(Producer, producerOutsideUnit)))
  )

export type { PolicyError }
