/**
 * Commit policies: the delivery guarantee as a Layer. A policy decides where a partition starts on assign, when
 * positions are committed, and how the handler's work and the position write are tied together.
 *
 * | policy | order | a crash between the two |
 * | --- | --- | --- |
 * | `atMostOnce` | commit, then handle | loses the records, never duplicates |
 * | `autoCommit` | commit what was fetched, on a timer | can lose and can duplicate |
 * | `commitAfter` | handle, then commit | duplicates the records, never loses |
 * | `transactional` | handle and store the position in one transaction | neither |
 * | `kafkaTransactional` | produce the handler's records and commit the position in one Kafka transaction | neither |
 *
 * @since 0.1.0
 */
import type * as Chunk from "effect/Chunk"
import * as Context from "effect/Context"
import type * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import type * as Scope from "effect/Scope"
import type { ConsumerRecord } from "./ConsumerRecord.js"
import type { DriverSession } from "./Driver.js"
import type { CrashPoint } from "./Faults.js"
import * as kafkaCommits from "./internal/policy/kafkaCommits.js"
import { kafkaTransactionalLayer } from "./internal/policy/kafkaTransactional.js"
import { transactionalLayer } from "./internal/policy/transactional.js"
import * as config from "./internal/shared/config.js"
import type { CommitFailed, DriverError, TransactionFailed } from "./KafkaError.js"
import type { InvalidConfig } from "./KafkaError.js"
import type { Fenced, OffsetStore, OffsetStoreError, Transaction } from "./OffsetStore.js"
import type { Producer, TransactionalProducers } from "./Producer.js"
import type { TopicPartition } from "./TopicPartition.js"

/**
 * Errors a policy can end a consumer with.
 *
 * @since 0.1.0
 * @category errors
 */
export type PolicyError = CommitFailed | DriverError | Fenced | OffsetStoreError | TransactionFailed

/**
 * What the runloop gives a policy when a session of the consumer starts.
 *
 * @since 0.1.0
 * @category models
 */
export interface PolicyContext {
  readonly groupId: string
  readonly session: DriverSession
  /** Checks an injected crash at this point; dies with `Crashed` when the member dies here. */
  readonly crashAt: (point: CrashPoint, partitions: ReadonlyArray<TopicPartition>) => Effect.Effect<void>
  /** Runs an outside effect (a commit, a store write) unless the member has crashed. */
  readonly guard: <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>
  /** Runs a background fiber for the session's lifetime; its failure ends the consumer. */
  readonly fork: (effect: Effect.Effect<void, PolicyError>) => Effect.Effect<void>
  /** How long commits may keep failing with retriable errors before the consumer ends with the last one. */
  readonly reconnectTimeout: Duration.Duration
  /**
   * Waits until every write of the failure route (`onFailure`) started so far is acknowledged: `true`; `false` when
   * one failed, and then the consumer ends with its `ProduceFailed` and nothing may be committed past it. A policy
   * that sets `awaitsRoutes` calls it before each commit, once it has taken the positions that commit carries.
   */
  readonly routed: Effect.Effect<boolean>
  /**
   * Wraps a unit the policy writes itself, a transaction of an offset store (`"store"`) or a Kafka transaction
   * (`"transaction"`), that moves `partition`'s position to `next` when it commits: with `Observability.layer`, the
   * unit is counted, timed and traced (a fenced one counted as such), and its position is what the partition's lag
   * counts from. Without it, `unit` is returned as it is. Commits through `session.commit` are observed already.
   */
  readonly observe: <A, E, R>(
    kind: "store" | "transaction",
    partition: TopicPartition,
    next: bigint,
    unit: Effect.Effect<A, E, R>
  ) => Effect.Effect<A, E, R>
}

/**
 * How far a partition whose records finish out of order has come.
 *
 * @since 0.1.0
 * @category models
 */
export interface PartitionProgress {
  /** The lowest offset not finished: the position a commit may carry, never past an unfinished record. */
  readonly position: () => bigint
  /** The offset ranges finished above the position, in order, apart (`until` excluded). */
  readonly finished: () => ReadonlyArray<readonly [from: bigint, until: bigint]>
}

/**
 * How a policy has records finish out of offset order.
 *
 * @since 0.1.0
 * @category models
 */
export interface OutOfOrder {
  /**
   * Runs the handler on records of one partition that finish together: `finished` are the offset ranges they cover
   * (each record's up to the next record's offset, so that offsets holding nothing to read are covered), and `next`
   * the lowest offset of the partition not finished when they were handed over. `retry` runs the handler with the
   * configured retries.
   */
  readonly handle: <E, R>(
    partition: TopicPartition,
    next: bigint,
    finished: ReadonlyArray<readonly [from: bigint, until: bigint]>,
    work: Effect.Effect<void, E, R>,
    retry: <E2, R2>(work: Effect.Effect<void, E2, R2>) => Effect.Effect<void, E2, R2>
  ) => Effect.Effect<void, E | PolicyError, R>
  /**
   * The most records to hand to `handle` at once, from several keys one after another, when records are waiting: a
   * unit that costs more than a record (a transaction of a store) is then paid for fewer times. Default 1: one key's
   * waiting records at a time.
   */
  readonly unitRecords?: number
  /** Records finished (`records` more of them, or none when only offsets without records were passed). */
  readonly progressed: (partition: TopicPartition, progress: PartitionProgress, records: number) => void
}

/**
 * A policy at work for one session of a consumer.
 *
 * @since 0.1.0
 * @category models
 */
export interface PolicyInstance {
  readonly name: string
  /**
   * These partitions are now the member's: where each starts (next offset to read), keyed by `TopicPartition.key`. A
   * partition left out has no committed or stored position; the consumer's `offsetReset` decides where it starts.
   */
  readonly assign: (
    partitions: ReadonlyArray<TopicPartition>
  ) => Effect.Effect<ReadonlyMap<string, bigint>, PolicyError>
  /** Records were fetched and handed to the consumer (the point at which kafka-clients calls them "consumed"). */
  readonly delivered: (partition: TopicPartition, next: bigint) => Effect.Effect<void>
  /** Runs once per poll loop turn, in the poll loop. */
  readonly polled: Effect.Effect<void, PolicyError>
  /**
   * Runs the handler on a chunk of one partition and moves the position to `next` (where the partition continues
   * after the chunk) the way the policy says. `retry` runs the handler with the configured retries; a policy that
   * must not hand a record twice calls `work` once.
   */
  readonly process: <E, R>(
    partition: TopicPartition,
    records: Chunk.Chunk<ConsumerRecord>,
    next: bigint,
    work: Effect.Effect<void, E, R>,
    retry: <E2, R2>(work: Effect.Effect<void, E2, R2>) => Effect.Effect<void, E2, R2>
  ) => Effect.Effect<void, E | PolicyError, R>
  /**
   * A policy that has this lets the records of a partition finish out of order under `key` and `unordered`
   * ordering, across fetched chunks: instead of `process` per chunk, the runloop hands records to the handler as their
   * keys come free, a few of one key at a time, through `handle`, and tells the policy, once they finished, of the
   * partition's progress (the lowest offset not finished, and the ranges finished above it). A policy without it has
   * each chunk handled as one unit, its records side by side as the ordering allows.
   */
  readonly outOfOrder?: OutOfOrder
  /**
   * Ranges above a partition's start position that an earlier owner finished (read on assign): their records are not
   * handled again.
   */
  readonly finishedOnAssign?: (partition: TopicPartition) => ReadonlyArray<readonly [from: bigint, until: bigint]>
  /**
   * How a record whose handler keeps failing is set aside when the consumer has a failure route (`onFailure`):
   *
   * - `"inPlace"` (the default): the record is retried alone and, failing still, routed inside the unit, which goes on
   *   with the records after it;
   * - `"once"`: the handler runs once per record; a record it failed on is routed at once, inside the unit;
   * - `"rerun"`: a failed unit is rolled back, and runs again with that record routed instead of handled (its failed
   *   attempts leave nothing behind).
   */
  readonly failedRecords?: "inPlace" | "once" | "rerun"
  /**
   * Under `"rerun"`: whether what the unit's `Producer` writes is part of the unit, taken back when it is rolled back
   * (a Kafka transaction). Then a routed record is written again each time its unit runs; else once.
   */
  readonly unitHoldsWrites?: boolean
  /**
   * Under `"inPlace"`: whether every commit of the policy first waits for the route's writes (`context.routed`). Then
   * a unit does not wait for the writes it started: its next records are handled while they are in flight. Without
   * it, each unit waits for its own writes before it ends.
   */
  readonly awaitsRoutes?: boolean
  /** The partitions are being revoked: commit or store their final positions now. */
  readonly revoke: (partitions: ReadonlyArray<TopicPartition>) => Effect.Effect<void, PolicyError>
  /** The partitions are already gone: forget what was pending for them. */
  readonly lost: (partitions: ReadonlyArray<TopicPartition>) => Effect.Effect<void>
}

/**
 * @since 0.1.0
 * @category tags
 */
export class CommitPolicy extends Context.Tag("effect-kafka-delivery/CommitPolicy")<CommitPolicy, {
  readonly name: string
  readonly make: (context: PolicyContext) => Effect.Effect<PolicyInstance, never, Scope.Scope>
}>() {}

/**
 * At-most-once: the position of a chunk is committed before the handler sees it. A crash or a handler failure after
 * the commit loses the chunk's remaining records; no record is ever handed to the handler twice, so a failed
 * handler is not retried (a retry would hand the record again). A commit refused because the member no longer owns
 * the partition skips the chunk: its next owner starts before it.
 *
 * Under `key` or `unordered` ordering the chunk stays the unit: its position is committed before any of its records
 * is handled, then its records are handled side by side as the ordering allows.
 *
 * A function, as every other policy is (it takes no options yet).
 *
 * @since 0.2.0
 * @category layers
 */
export const atMostOnce = (): Layer.Layer<CommitPolicy> => atMostOnceLayer

const atMostOnceLayer: Layer.Layer<CommitPolicy> = Layer.succeed(CommitPolicy, {
  name: "atMostOnce",
  make: kafkaCommits.atMostOnce
})

/**
 * @since 0.1.0
 * @category models
 */
export interface AutoCommitOptions {
  /** How often the positions of fetched records are committed, like `auto.commit.interval.ms`. */
  readonly interval: Duration.DurationInput
}

/**
 * What `enable.auto.commit` does in kafka-clients: inside the poll loop, every `interval`, commit the positions of
 * every record already fetched, whether or not the handler finished it; commit too before partitions are revoked.
 * This is neither at-most-once nor at-least-once: a crash after a commit of records still buffered loses them, and a
 * crash after handling but before the next commit duplicates them. It is here so that the cost can be measured.
 * Refused commits follow `commitAfter`'s rule. Under `key` or `unordered` ordering records finish in any order, and
 * the positions committed are still those of fetched records.
 *
 * @since 0.1.0
 * @category layers
 */
export const autoCommit = (options: AutoCommitOptions): Layer.Layer<CommitPolicy, InvalidConfig> =>
  Layer.effect(
    CommitPolicy,
    Effect.map(config.positiveDuration("autoCommit.interval", options.interval), (interval) => ({
      name: "autoCommit",
      make: (context: PolicyContext) => kafkaCommits.autoCommit(context, interval)
    }))
  )

/**
 * @since 0.1.0
 * @category models
 */
export interface CommitAfterOptions {
  /** Commit once this many records were handled since the last commit. */
  readonly maxBatch: number
  /** Commit at least this often while handled records wait. */
  readonly maxInterval: Duration.DurationInput
}

/**
 * At-least-once: a position is committed only after its record, and every record before it in the partition, was
 * handled successfully. Commits are batched by count and time, merged by highest position per partition, and made
 * before a revoked partition is released. A crash loses no record; records handled since the last commit are
 * handled again.
 *
 * A refused commit is classified (see `CommitFailed`): a retriable one is retried on a schedule and its positions
 * are kept for the next commit (after `reconnectTimeout` of failing, the consumer ends); a partition the member no
 * longer owns has its position dropped, alone; a stale membership (an unknown member, an old generation) makes the
 * member give up its partitions and rejoin; a fatal refusal (not authorized, say) ends the consumer.
 *
 * Under `key` or `unordered` ordering records finish out of offset order, across fetched chunks. A partition's
 * committed position is then its lowest unfinished offset (never past a record in flight), and the ranges finished
 * above it are committed as the position's metadata; a new owner starts at the position and skips those ranges, so
 * a crash repeats only the records in flight and those finished since the last commit. Metadata that would pass
 * 4,000 characters keeps its lowest ranges: the rest are handled again, never lost.
 *
 * @since 0.1.0
 * @category layers
 */
export const commitAfter = (options: CommitAfterOptions): Layer.Layer<CommitPolicy, InvalidConfig> =>
  Layer.effect(
    CommitPolicy,
    Effect.gen(function*() {
      const maxBatch = yield* config.positiveInt("commitAfter.maxBatch", options.maxBatch)
      const maxInterval = yield* config.positiveDuration("commitAfter.maxInterval", options.maxInterval)
      return {
        name: "commitAfter",
        make: (context: PolicyContext) => kafkaCommits.commitAfter(context, maxBatch, maxInterval)
      }
    })
  )

/**
 * Exactly-once: each chunk is handled inside a transaction of the `OffsetStore`, and the partition's new position is
 * written in the same transaction. On assign the member claims the partition in the store (its owner epoch goes up,
 * and the stored position is final for every earlier owner); a partition starts at its stored position (Kafka's
 * committed offset is ignored), and records below it are never handed to the handler. A unit commits only while the
 * partition's epoch is still the member's: a zombie's late unit is refused (`Fenced`) and rolled back, and the
 * member gives up its partitions and rejoins the group (or, with the consumer's `rejoin: false`, ends with `Fenced`).
 *
 * The layer also provides the store's `Transaction` service, so that a handler that writes through it
 * (`OffsetStore.append`, `PgOffsetStore.sql`) type-checks under this policy and under no other. Inside a unit of work
 * it is the unit's transaction; outside one (in a hook) using it fails with `OffsetStoreError`.
 *
 * `commitToKafka` also commits each stored position to Kafka, so lag tools see progress; it is never read back.
 *
 * Under `key` or `unordered` ordering records finish out of offset order, across fetched chunks: the records of a key
 * handed to the handler together are one unit, which stores the offset ranges it finished (`CommitUnit.finished`).
 * The store keeps, per partition, the position and the ranges finished above it; on assign the member starts at the
 * position and skips those ranges. Units of one owner commit side by side; only the owner epoch fences them.
 *
 * @example
 * ```ts
 * import { CommitPolicy, Consumer, ConsumerRecord, PgOffsetStore } from "effect-kafka-delivery"
 * import * as Effect from "effect/Effect"
 * import * as Layer from "effect/Layer"
 *
 * // Each payment and the partition's new position are written in one Postgres transaction: all land or none does.
 * const consumer = Consumer.run({ groupId: "ledger", topics: ["payments"] }, (records) =>
 *   Effect.forEach(records, (record) =>
 *     PgOffsetStore.query((sql) =>
 *       sql`insert into payments (id, body) values (${String(record.offset)}, ${ConsumerRecord.valueString(record)})`
 *     ), { discard: true }))
 *
 * const program = consumer.pipe(
 *   Effect.provide(CommitPolicy.transactional().pipe(Layer.provide(PgOffsetStore.layerConfig())))
 * )
 * ```
 *
 * @since 0.1.0
 * @category layers
 */
export const transactional = (
  options: { readonly commitToKafka?: boolean } = {}
): Layer.Layer<CommitPolicy | Transaction, never, OffsetStore> =>
  transactionalLayer(CommitPolicy, options.commitToKafka ?? false)

/**
 * @since 0.1.0
 * @category models
 */
export interface KafkaTransactionalOptions {
  /**
   * Put before each transactional id, a member's `<prefix><groupId>-<instanceId>` or a partition's
   * `<prefix><groupId>-<topic>-<partition>`. Give applications that share a cluster and a group id distinct prefixes.
   * Default: none.
   */
  readonly transactionalIdPrefix?: string
  /**
   * Where the driver fences by group metadata (@platformatic/kafka and the in-memory broker, which send it): names
   * the member's transactional producer, `<prefix><groupId>-<instanceId>`. Give each member its own, the same across its restarts (a host name,
   * a pod name): a restarted member then ends at once the transaction its crashed predecessor left open. Without it
   * the id is random, and such a transaction holds the stable reads of its partitions' positions (and so their next
   * owner's start) until the broker aborts it, `transactionTimeout` after it began. Two live members with the same one
   * fence each other. Default: a random id.
   */
  readonly instanceId?: string
  /**
   * `member` (the default): one transactional producer per member where the driver sends the consumer's group
   * metadata with a transaction's positions (KIP-447: @platformatic/kafka, the in-memory broker), and one per input
   * partition where it cannot (kafkajs). `partition`: one per input partition everywhere.
   */
  readonly producers?: "member" | "partition"
}

/**
 * Exactly-once inside Kafka (consume-transform-produce): the records a chunk's handler sends through `Producer` and
 * the partition's new position (`sendOffsetsToTransaction`) are in one Kafka transaction, so both land or neither
 * does. Consumers of the output topics must read `read_committed` (the default) to see only
 * committed transactions.
 *
 * Fencing has two forms; the driver decides which is used (`producers: "partition"` asks for the second everywhere):
 *
 * - **A producer per member** (KIP-447), where the driver sends the consumer's group metadata with a transaction's
 *   positions (`DriverSession.groupMetadata`: @platformatic/kafka and the in-memory broker). The member has one
 *   transactional producer, `<prefix><groupId>-<instanceId>`, and the chunks of its partitions handled at the same
 *   time share its transaction: each chunk's handler runs in it, and once none of them is running the transaction
 *   commits their records and all their positions, sent with the member's generation (or member epoch) and member id.
 *   The group's coordinator refuses them unless the member is still in the group at that generation: a zombie's
 *   transaction fails and lands nothing. Refused because the member is not in the group any more
 *   (`UNKNOWN_MEMBER_ID`), the member gives up its partitions and rejoins; because a newer member took its instance
 *   id (`FENCED_INSTANCE_ID`), the consumer ends with the `TransactionFailed`; for its generation alone
 *   (`ILLEGAL_GENERATION`: a rebalance went by), the chunks are settled and tried again with the new one. A chunk whose handler fails aborts the shared transaction: its failure is handled as under the other form,
 *   and the other chunks of that transaction are handled again in the next. A new owner reads a partition's committed
 *   position stably, so a transaction of the earlier owner that still carries it is waited for.
 * - **A producer per input partition** (kafkajs, which cannot send the group metadata), with a transactional id made
 *   of the group, the topic and the partition. On assign the member starts that producer, which bumps the id's
 *   epoch: every earlier owner of the partition (a zombie paused past its session, say) is fenced, and its open
 *   transaction is aborted; only then is the partition's committed position read, which is final. A zombie's late
 *   transaction fails with `TransactionFailed` (`Fenced`) and lands nothing; the member gives up its partitions and
 *   rejoins (with `rejoin: false`, the consumer ends with the error).
 *
 * A transaction that fails otherwise (a timeout, a lost connection) is settled before it is tried again: the
 * producer is started anew, which ends the earlier transaction one way or the other, and the committed position says
 * which: past the chunk, it committed; else it is handled again in a new transaction. This goes on until
 * `reconnectTimeout`. A handler failure is retried on the consumer's schedule, each attempt in a new transaction. On
 * revoke, the chunk in flight finishes its transaction (or, interrupted, aborts it) before the partition is released.
 *
 * The layer provides the `Producer` the handler sends with: inside a chunk's handler it writes into the chunk's
 * transaction; outside one (in a hook) its sends fail with `ProduceFailed`.
 *
 * @since 0.1.0
 * @category layers
 */
export const kafkaTransactional = (
  options: KafkaTransactionalOptions = {}
): Layer.Layer<CommitPolicy | Producer, never, TransactionalProducers> =>
  kafkaTransactionalLayer(CommitPolicy, {
    prefix: options.transactionalIdPrefix ?? "",
    instanceId: options.instanceId,
    producers: options.producers ?? "member"
  })
