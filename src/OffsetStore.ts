/**
 * The offset store: where positions live under the `transactional` commit policy, written in the same transaction as
 * the handler's results. One tag; layers for memory, files and (in `PgOffsetStore`) Postgres.
 *
 * @since 0.1.0
 */
import type * as FileSystem from "@effect/platform/FileSystem"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Schema from "effect/Schema"
import * as fileStore from "./internal/fileOffsetStore.js"
import * as memoryStore from "./internal/memoryOffsetStore.js"
import { UnitBuffer } from "./internal/unitBuffer.js"
import type { ConfigError } from "./KafkaError.js"
import type { TopicPartition } from "./TopicPartition.js"

/**
 * The store could not be read or written. `operation` says which call failed; nothing stored is lost.
 *
 * @since 0.1.0
 * @category errors
 */
export class OffsetStoreError extends Schema.TaggedError<OffsetStoreError>()("OffsetStoreError", {
  store: Schema.String,
  operation: Schema.String,
  reason: Schema.String,
  cause: Schema.optional(Schema.Defect)
}) {
  override get message(): string {
    return `Offset store (${this.store}) ${this.operation} failed: ${this.reason}`
  }
}

/**
 * The stored position was not the one this batch started from: another member moved the partition on. The unit of
 * work was rolled back; this member has lost the partition and must give it up, not retry.
 *
 * @since 0.1.0
 * @category errors
 */
export class Fenced extends Schema.TaggedError<Fenced>()("Fenced", {
  groupId: Schema.String,
  topic: Schema.String,
  partition: Schema.Number,
  expected: Schema.NullOr(Schema.BigIntFromSelf),
  actual: Schema.NullOr(Schema.BigIntFromSelf)
}) {
  override get message(): string {
    return `Fenced on ${this.topic}-${this.partition} (group ${this.groupId}): the batch started from position ${
      this.expected ?? "none"
    } but the store holds ${this.actual ?? "none"}; another member owns this partition now`
  }
}

/**
 * One unit of work: the handler's writes for a batch of one partition and the partition's new position, committed
 * together only if the stored position is still `expected` (`null`: nothing stored yet).
 *
 * @since 0.1.0
 * @category models
 */
export interface CommitUnit {
  readonly groupId: string
  readonly partition: TopicPartition
  readonly expected: bigint | null
  readonly next: bigint
}

/**
 * The open transaction of a unit of work, provided to the handler while it runs under the `transactional` policy.
 * Each store gives typed access to it (`OffsetStore.append` for memory and files, `PgOffsetStore.sql` for Postgres).
 *
 * @since 0.1.0
 * @category tags
 */
export class Transaction extends Context.Tag("effect-kafka-delivery/OffsetStore/Transaction")<Transaction, {
  readonly store: string
  readonly handle: unknown
}>() {}

/**
 * @since 0.1.0
 * @category tags
 */
export class OffsetStore extends Context.Tag("effect-kafka-delivery/OffsetStore")<OffsetStore, {
  readonly name: string
  /** Stored positions of these partitions, keyed by `TopicPartition.key`; absent when nothing is stored. */
  readonly load: (
    groupId: string,
    partitions: ReadonlyArray<TopicPartition>
  ) => Effect.Effect<ReadonlyMap<string, bigint>, OffsetStoreError>
  /**
   * Runs `work` inside a transaction of the store and stores `unit.next` in the same transaction, on the condition
   * that the stored position is `unit.expected`. If `work` fails, or the condition does not hold (`Fenced`),
   * neither the work's writes nor the position land.
   */
  readonly commit: <A, E, R>(
    unit: CommitUnit,
    work: Effect.Effect<A, E, R>
  ) => Effect.Effect<A, E | OffsetStoreError | Fenced, Exclude<R, Transaction>>
}>() {}

/**
 * Reads back the results committed through {@link append}, for the memory and file stores: what a test or the demo
 * checks to count deliveries. Only results of units that committed are there, in commit order.
 *
 * @since 0.1.0
 * @category tags
 */
export class Results extends Context.Tag("effect-kafka-delivery/OffsetStore/Results")<Results, {
  /**
   * The committed results of one partition of the group, or of all its partitions (ordered by
   * `TopicPartition.compare`, each in commit order) when `partition` is omitted.
   */
  readonly read: (
    groupId: string,
    partition?: TopicPartition
  ) => Effect.Effect<ReadonlyArray<unknown>, OffsetStoreError>
}>() {}

/**
 * Writes results of the handler into the open unit of work of the memory or file store. They land together with the
 * unit's position when it commits, and are dropped when it is rolled back or fenced.
 *
 * Entries must be JSON values (a `bigint` is not: write offsets as strings); each is copied as JSON when appended.
 * Fails when the store of the open transaction keeps results elsewhere (Postgres: use `PgOffsetStore.sql`) or when
 * the unit of work has already ended.
 *
 * @since 0.1.0
 * @category transactions
 */
export const append = (entries: ReadonlyArray<unknown>): Effect.Effect<void, OffsetStoreError, Transaction> =>
  Effect.flatMap(Transaction, (transaction) => {
    const buffer = transaction.handle
    const fail = (reason: string, cause?: unknown) =>
      new OffsetStoreError({ store: transaction.store, operation: "append", reason, cause })
    if (!(buffer instanceof UnitBuffer)) {
      return Effect.fail(
        fail(
          `the ${transaction.store} store keeps results in its own transaction, not through OffsetStore.append` +
            " (for Postgres, write with the transaction from PgOffsetStore.sql)"
        )
      )
    }
    if (!buffer.open) {
      return Effect.fail(fail("the unit of work has ended; append only while the work given to commit runs"))
    }
    return Effect.try({
      try: () =>
        entries.map((entry, index) => {
          const text = JSON.stringify(entry)
          if (text === undefined) {
            throw new TypeError(`entry ${index} (${typeof entry}) has no JSON form`)
          }
          return text
        }),
      catch: (cause) =>
        fail(
          `results must be JSON values (write bigint offsets as strings): ${
            cause instanceof Error ? cause.message : String(cause)
          }`,
          cause
        )
    }).pipe(Effect.map((texts) => {
      buffer.entries.push(...texts)
    }))
  })

/**
 * The committed results of a group (see {@link Results}).
 *
 * @since 0.1.0
 * @category accessors
 */
export const results = (
  groupId: string,
  partition?: TopicPartition
): Effect.Effect<ReadonlyArray<unknown>, OffsetStoreError, Results> =>
  Effect.flatMap(Results, (store) => store.read(groupId, partition))

/**
 * An offset store in memory, with results written through {@link append}. Commits of one partition are decided
 * atomically: of concurrent units that started from the same position, exactly one commits. For tests and the demo;
 * nothing survives the layer.
 *
 * @since 0.1.0
 * @category layers
 */
export const layerMemory: Layer.Layer<OffsetStore | Results> = Layer.effectContext(
  Effect.suspend(() => memoryStore.make)
)

/**
 * An offset store in a directory, through `@effect/platform`'s `FileSystem` (so it runs on Node, Deno and Bun).
 *
 * Each committed unit is one JSON file holding the position and the results appended by its work, written to a
 * temporary file, synced, then linked into place under a name that only one unit can take. That makes a commit
 * atomic and fenced even between processes sharing the directory. Files live under
 * `directory/<group>/<topic>/<partition>/`, numbered from 1, and the newest one holds the partition's position:
 *
 * ```json
 * {
 *   "format": "effect-kafka-delivery/offset-segment/1",
 *   "groupId": "billing",
 *   "topic": "orders",
 *   "partition": 0,
 *   "sequence": 2,
 *   "from": "120",
 *   "next": "125",
 *   "committedAt": "2025-01-01T12:00:00.000Z",
 *   "results": [{ "orderId": "o-7" }]
 * }
 * ```
 *
 * A damaged file is reported with its path and left as it is; leftover `.tmp-*` files of a crashed write are ignored.
 *
 * @since 0.1.0
 * @category layers
 */
export const layerFileSystem = (
  directory: string
): Layer.Layer<OffsetStore | Results, ConfigError | OffsetStoreError, FileSystem.FileSystem> =>
  Layer.effectContext(Effect.suspend(() => fileStore.make(directory)))
