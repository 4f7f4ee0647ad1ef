/**
 * The low-level client contract the consumer's runloop talks to. Two implementations keep it: the in-memory broker
 * (`InMemoryKafka.layerDriver`) and kafkajs (`KafkaJs.layer`). Users pick a layer; they rarely call it directly.
 *
 * @since 0.1.0
 */
import type * as Chunk from "effect/Chunk"
import * as Context from "effect/Context"
import type * as Duration from "effect/Duration"
import type * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
import type { ConsumerRecord } from "./ConsumerRecord.js"
import type { CommitFailed, DriverError } from "./KafkaError.js"
import type { OffsetBatch } from "./OffsetBatch.js"
import type { TopicPartition } from "./TopicPartition.js"

/**
 * What the member consumes: topics through the group protocol, or chosen partitions with no group membership.
 *
 * @since 0.1.0
 * @category models
 */
export type Subscription =
  | { readonly _tag: "Topics"; readonly topics: ReadonlyArray<string> }
  | { readonly _tag: "Partitions"; readonly partitions: ReadonlyArray<TopicPartition> }

/**
 * Something the runloop must react to, returned by `poll`.
 *
 * - `Assigned`: the member now owns these partitions. The runloop seeks each to its start position before any of
 *   its records are returned.
 * - `Revoked`: the group is rebalancing and these partitions will move. The driver hands them to another member only
 *   after `release` (or after the rebalance deadline, at which point this member is evicted). Commits with the
 *   current generation are accepted until `release`.
 * - `Lost`: the partitions are already gone (the member was evicted, e.g. its session expired); nothing may be
 *   committed for them any more.
 * - `Records`: fetched records of one partition, in offset order. They are every record this consumer may read at
 *   offsets from `from` (included) to `next` (excluded): an offset in that range that holds none of them holds
 *   nothing to read (a transaction marker, a record of an aborted transaction, a record removed by compaction).
 *   After a seek to `p`, the partition's first `Records` has `from` equal to `p`; each later one starts where the one
 *   before ended (`from` equals the previous `next`). Offsets are not contiguous: a consumer must accept a first
 *   record above `from`, never treat it as a stale fetch. `records` is empty when a fetch found only offsets with
 *   nothing to read (the marker of a transaction committed after its records were fetched, an aborted transaction):
 *   the partition's position moves on to `next` all the same, so that it can pass them.
 * - `OutOfRange`: the partition's fetch position `position` is outside its log (below its earliest offset, after
 *   retention or `deleteRecords`, or above its latest, the high watermark). Nothing more is fetched for the partition
 *   until it is sought. A position above the last stable offset and at most the high watermark is not out of range:
 *   a `read_committed` session returns nothing there until the transaction open at the last stable offset ends.
 *
 * @since 0.1.0
 * @category models
 */
export type DriverEvent =
  | { readonly _tag: "Assigned"; readonly partitions: ReadonlyArray<TopicPartition> }
  | {
    readonly _tag: "Revoked"
    readonly partitions: ReadonlyArray<TopicPartition>
    readonly release: Effect.Effect<void>
  }
  | { readonly _tag: "Lost"; readonly partitions: ReadonlyArray<TopicPartition> }
  | {
    readonly _tag: "Records"
    readonly partition: TopicPartition
    readonly records: Chunk.Chunk<ConsumerRecord>
    readonly from: bigint
    readonly next: bigint
  }
  | { readonly _tag: "OutOfRange"; readonly partition: TopicPartition; readonly position: bigint }

/**
 * The offsets a partition's log holds, at one moment.
 *
 * - `earliest`: the first offset still stored; it moves up with retention and `deleteRecords`.
 * - `latest`: the end of the log, the offset the next record will get (the high watermark). A position from
 *   `earliest` to `latest`, both included, is in range: a fetch there gives no `OutOfRange`, whatever the isolation
 *   level.
 * - `lastStable`: how far a `read_committed` consumer can read (the last stable offset): the first offset of the
 *   oldest transaction still open on the partition, or `latest` when none is open. A `read_committed` fetch from a
 *   position between `lastStable` and `latest` returns nothing (and no `OutOfRange`) until that transaction ends; its
 *   records come then, if it committed. A `read_uncommitted` consumer reads up to `latest`.
 *
 * `earliest <= lastStable <= latest`.
 *
 * @since 0.1.0
 * @category models
 */
export interface PartitionOffsets {
  readonly earliest: bigint
  readonly latest: bigint
  /** @since 0.2.0 */
  readonly lastStable: bigint
}

/**
 * How a group moves partitions when its members change.
 *
 * - `eager`: every member gives up every partition, the whole group stops, and the partitions are assigned anew.
 * - `cooperative` (KIP-429, the classic protocol with the cooperative-sticky assignor): members give up only the
 *   partitions that move and keep the others running; a second round hands the moved partitions to their new owners
 *   once every one of them was released.
 * - `consumer` (KIP-848, the broker's group protocol of Kafka 4): the broker moves partitions one at a time; a
 *   partition goes to its new owner as soon as its old owner released it.
 *
 * Under each, a partition reaches its new owner only after its old owner's `release` (or after the old owner's
 * rebalance deadline, when it is evicted).
 *
 * @since 0.3.0
 * @category models
 */
export type RebalanceProtocol = "eager" | "cooperative" | "consumer"

/**
 * Options the runloop passes when it joins.
 *
 * @since 0.1.0
 * @category models
 */
export interface SessionOptions {
  readonly groupId: string
  readonly clientId: string
  readonly subscription: Subscription
  /** Most records `poll` returns for one partition in one call. */
  readonly maxPollRecords: number
  /** How long `poll` waits for something to happen before it returns an empty array. */
  readonly pollTimeout: Duration.Duration
  /** A member that does not heartbeat for this long is evicted. */
  readonly sessionTimeout: Duration.Duration
  /** How long a member has to release revoked partitions before it is evicted. */
  readonly rebalanceTimeout: Duration.Duration
  /**
   * `read_committed` (the default): records of open and aborted transactions are never returned, and a partition is
   * read only up to its last stable offset. `read_uncommitted`: every record, as soon as it is written.
   */
  readonly isolationLevel?: IsolationLevel | undefined
  /**
   * Static membership (KIP-345): the member's instance id. A driver that cannot keep it fails `connect` with a
   * `DriverError` that says so.
   *
   * @since 0.3.0
   */
  readonly groupInstanceId?: string | undefined
}

/**
 * What a consumer reads of transactional writes (Kafka's `isolation.level`).
 *
 * @since 0.1.0
 * @category models
 */
export type IsolationLevel = "read_committed" | "read_uncommitted"

/**
 * A committed position and the metadata committed with it.
 *
 * @since 0.1.0
 * @category models
 */
export interface CommittedPosition {
  readonly position: bigint
  readonly metadata: string
}

/**
 * Who a member of a consumer group is now (Kafka's `ConsumerGroupMetadata`): its generation (classic protocol) or
 * member epoch (KIP-848), its member id, and its group instance id when it is static. Sent with a transaction's
 * positions (KIP-447), it makes the group's coordinator refuse them unless the member is still in the group at that
 * generation or epoch: a zombie's transaction fails and lands nothing.
 *
 * @since 0.1.0
 * @category models
 */
export interface GroupMetadata {
  readonly groupId: string
  readonly generationId: number
  readonly memberId: string
  readonly groupInstanceId?: string | undefined
}

/**
 * One member's connection to the cluster. One fiber (the runloop) owns it: calls are not made concurrently, except
 * `commit`, which may run while `poll` waits, and `offsets`, which the lag reports of `Observability` call on a fiber
 * of their own. Heartbeats are the driver's own business and continue while records are processed.
 *
 * @since 0.1.0
 * @category models
 */
export interface DriverSession {
  readonly memberId: string
  /**
   * The member's group metadata as it is now, on a driver that sends it with a transaction's positions (KIP-447);
   * absent on the others, and for a session that assigns its partitions itself (no membership).
   */
  readonly groupMetadata?: (() => GroupMetadata) | undefined
  readonly poll: Effect.Effect<ReadonlyArray<DriverEvent>, DriverError>
  /**
   * Commits positions (next offsets to read) as the group's committed offsets, all or nothing. Partitions this member
   * does not own are refused (`CommitFailed` with reason `NotOwned`, naming them), and nothing of the commit lands.
   * A position's metadata (`OffsetBatch.metadata`) is committed with it; a position without one clears it.
   */
  readonly commit: (offsets: OffsetBatch) => Effect.Effect<void, CommitFailed>
  /**
   * The group's committed positions for these partitions; absent when none was committed. The read is stable: a
   * partition whose group has a transactional offset commit pending (a transaction that sent offsets for it with
   * `sendOffsetsToTransaction` is open, or has committed and the coordinator has not finished writing its offsets)
   * fails the read with a retriable `DriverError` whose reason names `UNSTABLE_OFFSET_COMMIT`, rather than answer the
   * position from before that transaction. Read again once it has ended.
   */
  readonly committed: (
    partitions: ReadonlyArray<TopicPartition>
  ) => Effect.Effect<ReadonlyMap<string, bigint>, DriverError>
  /** The group's committed positions with the metadata committed with each (`""` when none); stable as `committed`. */
  readonly committedWithMetadata: (
    partitions: ReadonlyArray<TopicPartition>
  ) => Effect.Effect<ReadonlyMap<string, CommittedPosition>, DriverError>
  /** The earliest, latest and last stable offsets of each partition's log, keyed by `TopicPartition.key`. */
  readonly offsets: (
    partitions: ReadonlyArray<TopicPartition>
  ) => Effect.Effect<ReadonlyMap<string, PartitionOffsets>, DriverError>
  /**
   * Sets the fetch position of an owned partition; records fetched before the seek are not returned after it, and
   * the partition's next `Records` starts from `position` (or an `OutOfRange` says that it cannot).
   */
  readonly seek: (partition: TopicPartition, position: bigint) => Effect.Effect<void, DriverError>
  /**
   * Stops returning the partitions' records until `resume`. `hold`: they stay paused for a while (a retry topic's
   * partition waiting until its next record is due), so the driver need not keep fetching ahead for them.
   */
  readonly pause: (
    partitions: ReadonlyArray<TopicPartition>,
    options?: { readonly hold?: boolean | undefined }
  ) => Effect.Effect<void>
  readonly resume: (partitions: ReadonlyArray<TopicPartition>) => Effect.Effect<void>
}

/**
 * @since 0.1.0
 * @category tags
 */
export class Driver extends Context.Tag("effect-kafka-delivery/Driver")<Driver, {
  /** Joins (or assigns) and returns the session; closing the scope leaves the group cleanly. */
  readonly connect: (options: SessionOptions) => Effect.Effect<DriverSession, DriverError, Scope.Scope>
}>() {}
