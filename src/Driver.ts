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
 * - `Records`: fetched records of one partition, in offset order, starting at the partition's fetch position.
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
  | { readonly _tag: "Records"; readonly partition: TopicPartition; readonly records: Chunk.Chunk<ConsumerRecord> }

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
}

/**
 * One member's connection to the cluster. One fiber (the runloop) owns it: calls are not made concurrently, except
 * `commit`, which may run while `poll` waits. Heartbeats are the driver's own business and continue while records
 * are processed.
 *
 * @since 0.1.0
 * @category models
 */
export interface DriverSession {
  readonly memberId: string
  readonly poll: Effect.Effect<ReadonlyArray<DriverEvent>, DriverError>
  /** Commits positions (next offsets to read) as the group's committed offsets. */
  readonly commit: (offsets: OffsetBatch) => Effect.Effect<void, CommitFailed>
  /** The group's committed positions for these partitions; absent when none was committed. */
  readonly committed: (
    partitions: ReadonlyArray<TopicPartition>
  ) => Effect.Effect<ReadonlyMap<string, bigint>, DriverError>
  /** The earliest available offset of each partition, for partitions with no committed position. */
  readonly beginning: (
    partitions: ReadonlyArray<TopicPartition>
  ) => Effect.Effect<ReadonlyMap<string, bigint>, DriverError>
  /** Sets the fetch position of an owned partition; records fetched before the seek are not returned after it. */
  readonly seek: (partition: TopicPartition, position: bigint) => Effect.Effect<void, DriverError>
  readonly pause: (partitions: ReadonlyArray<TopicPartition>) => Effect.Effect<void>
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
