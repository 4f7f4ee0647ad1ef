/**
 * The committer of `autoCommit` and `commitAfter`: pending positions merged by highest per partition, committed one
 * batch at a time, and the one rule for a refused commit:
 *
 * - the member no longer owns a partition (`NotOwned`, a stale generation, an unknown member): that partition's
 *   position is dropped, alone, and the rest of the batch is committed; its next owner repeats what was handled since
 *   its last commit (a duplicate, never a loss);
 * - retriable (a rebalance starting, the coordinator moving, a timeout, a lost connection): retried a few times, then
 *   the positions are kept for the next commit; when commits have kept failing for `reconnectTimeout`, the consumer
 *   ends with the last refusal. A final commit (on revoke) cannot wait for a next one: its positions are dropped;
 * - anything else (not authorized, say) is fatal: the consumer ends with the `CommitFailed`.
 *
 * @internal
 */
import * as Clock from "effect/Clock"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import type { PartitionProgress, PolicyContext } from "../../CommitPolicy.js"
import type { CommitFailed } from "../../KafkaError.js"
import * as TopicPartition from "../../TopicPartition.js"
import * as Progress from "../consumer/progress.js"
import { retryAfterFailure } from "../shared/retry.js"
import { andThen, commitRetry, keys, partitionsOf } from "./support.js"

const noneFinal: ReadonlySet<string> = new Set()

export class Committer {
  // Mutable and private: adding a position is a map write, not a copy of the batch.
  private pending = new Map<string, bigint>()
  // Partitions whose records finish out of order: their position and finished ranges are read at the commit.
  private tracked = new Map<string, PartitionProgress>()
  private count = 0
  private readonly owned = new Set<string>()
  private failingSince: number | undefined
  private readonly deadline: number
  /** Commits what is pending. */
  readonly flush: Effect.Effect<void, CommitFailed>

  constructor(private readonly context: PolicyContext, private readonly lock: Effect.Semaphore) {
    this.deadline = Duration.toMillis(context.reconnectTimeout)
    this.flush = this.flushWith(noneFinal)
  }

  private keep(positions: ReadonlyMap<string, bigint>) {
    for (const [k, position] of positions) {
      const current = this.pending.get(k)
      if (current === undefined || position > current) this.pending.set(k, position)
    }
  }

  private attempt(
    positions: Map<string, bigint>,
    metadata: ReadonlyMap<string, string>,
    final: ReadonlySet<string>
  ): Effect.Effect<void, CommitFailed> {
    return Effect.suspend(() => {
      for (const k of positions.keys()) if (!this.owned.has(k)) positions.delete(k)
      if (positions.size === 0) return Effect.void
      return retryAfterFailure(this.context.session.commit({ positions, metadata }), {
        schedule: commitRetry,
        retryable: (error) => error.retriable
      }).pipe(
        Effect.matchEffect({
          onSuccess: () =>
            Effect.sync(() => {
              this.failingSince = undefined
            }),
          onFailure: (error) => this.refused(positions, metadata, final, error)
        })
      )
    })
  }

  private refused(
    positions: Map<string, bigint>,
    metadata: ReadonlyMap<string, string>,
    final: ReadonlySet<string>,
    error: CommitFailed
  ): Effect.Effect<void, CommitFailed> {
    if (error.reason === "NotOwned") {
      // The client knows that these partitions moved; the runloop hears of it next. The rest are committed.
      const gone = error.partitions.map(TopicPartition.key)
      for (const k of gone) {
        positions.delete(k)
        this.owned.delete(k)
      }
      return Effect.zipRight(
        Effect.logInfo(
          `positions of ${keys(gone)} dropped: this member no longer owns them; their next owner repeats what was ` +
            "handled since their last commit"
        ),
        positions.size > 0 ? this.attempt(positions, metadata, final) : Effect.void
      )
    }
    // A stale generation or an unknown member: none of the member's partitions is its own any more, though its
    // client may not know it yet. The consumer ends the session and rejoins (or ends), rather than go on handling
    // records whose positions it can no longer commit.
    if (error.notOwned) {
      this.owned.clear()
      this.pending = new Map()
      this.tracked = new Map()
      return Effect.fail(error)
    }
    if (!error.retriable) return Effect.fail(error)
    return Effect.flatMap(Clock.currentTimeMillis, (now) => {
      this.failingSince ??= now
      if (now - this.failingSince >= this.deadline) return Effect.fail(error)
      const dropped = Array.from(positions.keys()).filter((k) => final.has(k))
      for (const k of dropped) positions.delete(k)
      this.keep(positions)
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

  private flushWith(final: ReadonlySet<string>) {
    return this.lock.withPermits(1)(Effect.suspend(() => {
      if (this.pending.size === 0 && this.tracked.size === 0) return Effect.void
      const positions = this.pending
      const metadata = new Map<string, string>()
      for (const [k, progress] of this.tracked) {
        const position = progress.position()
        positions.set(k, position)
        const finished = Progress.encode(position, progress.finished())
        if (finished !== "") metadata.set(k, finished)
      }
      this.pending = new Map()
      this.tracked = new Map()
      this.count = 0
      const partitions = partitionsOf(positions)
      const { context } = this
      // The route's writes of records these positions pass were started before the positions were taken: each is
      // acknowledged before the commit, or nothing is committed (the consumer ends with the write's failure).
      return Effect.flatMap(context.routed, (acknowledged) =>
        acknowledged
          ? andThen(
            context.crashAt("beforeCommit", partitions),
            andThen(
              context.guard(this.attempt(positions, metadata, final)),
              context.crashAt("afterCommit", partitions)
            )
          )
          : Effect.void)
    }))
  }

  /** Adds a handled position of an owned partition at once; returns the records handled since the last flush. */
  readonly unsafeAdd = (partition: TopicPartition.TopicPartition, position: bigint, records: number): number => {
    const k = TopicPartition.key(partition)
    if (!this.owned.has(k)) return this.count
    const current = this.pending.get(k)
    if (current === undefined || position > current) this.pending.set(k, position)
    this.count += records
    return this.count
  }

  /** A partition whose records finish out of order has come further; `records` more of them finished. */
  readonly unsafeTrack = (
    partition: TopicPartition.TopicPartition,
    progress: PartitionProgress,
    records: number
  ): number => {
    const k = TopicPartition.key(partition)
    if (!this.owned.has(k)) return this.count
    this.tracked.set(k, progress)
    this.count += records
    return this.count
  }

  readonly assign = (partitions: ReadonlyArray<TopicPartition.TopicPartition>) =>
    Effect.sync(() => {
      for (const tp of partitions) this.owned.add(TopicPartition.key(tp))
    })

  /** Commits what is pending (the revoked partitions' positions for the last time), then lets them go. */
  readonly revoke = (partitions: ReadonlyArray<TopicPartition.TopicPartition>) =>
    Effect.suspend(() => {
      const revoked = new Set(partitions.map(TopicPartition.key))
      return this.flushWith(revoked).pipe(Effect.ensuring(Effect.sync(() => {
        for (const k of revoked) this.drop(k)
      })))
    })

  readonly forget = (partitions: ReadonlyArray<TopicPartition.TopicPartition>) =>
    Effect.sync(() => {
      for (const tp of partitions) this.drop(TopicPartition.key(tp))
    })

  private drop(k: string) {
    this.owned.delete(k)
    this.pending.delete(k)
    this.tracked.delete(k)
  }
}

export const makeCommitter = (context: PolicyContext): Effect.Effect<Committer> =>
  Effect.map(Effect.makeSemaphore(1), (lock) => new Committer(context, lock))
