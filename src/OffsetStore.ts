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
import * as fileStore from "./internal/store/file.js"
import * as memoryStore from "./internal/store/memory.js"
import type { StoreParts } from "./internal/store/unitBuffer.js"
import { OutsideUnit, outsideUnitReason, UnitBuffer, unitRunner } from "./internal/store/unitBuffer.js"
import { Fenced, type InvalidConfig, OffsetStoreError } from "./KafkaError.js"
import type { TopicPartition } from "./TopicPartition.js"

export {
  /**
   * A zombie's unit of work was refused: its owner epoch is no longer the partition's. Declared in `KafkaError` with
   * the library's other errors, and named here too.
   *
   * @since 0.1.0
   * @category errors
   */
  Fenced,
  /**
   * The store could not be read or written. Declared in `KafkaError` with the library's other errors, and named here
   * too.
   *
   * @since 0.1.0
   * @category errors
   */
  OffsetStoreError
} from "./KafkaError.js"

/**
 * What a member gets when it claims a partition: its owner epoch, and the stored position (the next offset to read;
 * `null` when nothing was stored yet). The position is final for every earlier owner: none of their units commits
 * after the claim.
 *
 * @since 0.1.0
 * @category models
 */
export interface Claim {
  readonly epoch: bigint
  readonly position: bigint | null
  /**
   * Offset ranges above the position that units of records finished out of order committed (`until` excluded, in
   * order, apart): their records are not handled again. Absent or empty when there are none.
   */
  readonly finished?: ReadonlyArray<readonly [from: bigint, until: bigint]>
}

/**
 * One unit of work: the handler's writes for a batch of one partition and the partition's new position, committed
 * together only if the partition's owner epoch is still `epoch`, the one its member got from `claim`.
 *
 * A unit of records handled in offset order (a chunk) moves the position to `next`. A unit of records finished out of
 * order (ordering by key, or none) names the offset ranges it finished in `finished`, and `next` is then the lowest
 * offset its member had not finished when the unit began: the store keeps the ranges above the position, and moves
 * the position to `next` and past every range that starts at it. Units of one owner may commit side by side; each
 * adds its own ranges to what the others stored, and the position never moves back.
 *
 * @since 0.1.0
 * @category models
 */
export interface CommitUnit {
  readonly groupId: string
  readonly partition: TopicPartition
  readonly epoch: bigint
  readonly next: bigint
  readonly finished?: ReadonlyArray<readonly [from: bigint, until: bigint]> | undefined
}

/**
 * The open transaction of a unit of work, provided to the handler while it runs under the `transactional` policy.
 * Each store gives typed access to it (`OffsetStore.append` for memory and files, `PgOffsetStore.sql` for Postgres).
 * Outside a unit of work (in a hook, say) the service exists but holds no transaction: using it fails with
 * `OffsetStoreError`.
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
  /**
   * Stored positions of these partitions, keyed by `TopicPartition.key`; absent when nothing is stored. Reading does
   * not claim: for tools, tests and lag.
   */
  readonly load: (
    groupId: string,
    partitions: ReadonlyArray<TopicPartition>
  ) => Effect.Effect<ReadonlyMap<string, bigint>, OffsetStoreError>
  /**
   * Makes the caller the owner of these partitions: each partition's owner epoch goes up by one, and the new epoch
   * is returned with the stored position, keyed by `TopicPartition.key`. A unit of an earlier owner that is
   * committing at that moment either commits before the claim (and the position returned includes it) or is fenced.
   */
  readonly claim: (
    groupId: string,
    partitions: ReadonlyArray<TopicPartition>
  ) => Effect.Effect<ReadonlyMap<string, Claim>, OffsetStoreError>
  /**
   * Runs `work` inside a transaction of the store and stores the unit's position (and finished ranges) in the same
   * transaction, on the condition that the partition's owner epoch is still `unit.epoch`. If `work` fails, or the
   * condition does not hold (`Fenced`), neither the work's writes nor the position land.
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
 * @example
 * ```ts
 * import { CommitPolicy, Consumer, ConsumerRecord, OffsetStore } from "effect-kafka-delivery"
 * import * as Effect from "effect/Effect"
 * import * as Layer from "effect/Layer"
 *
 * // Each record's result lands in the store with the partition's position, in one unit: never twice, never lost.
 * const consumer = Consumer.run({ groupId: "totals", topics: ["sales"] }, (records) =>
 *   OffsetStore.append(records.pipe((chunk) => Array.from(chunk, (record) => ConsumerRecord.valueString(record)))))
 *
 * // `OffsetStore.append` requires `Transaction`, which only the transactional policy provides.
 * const program = consumer.pipe(
 *   Effect.provide(CommitPolicy.transactional().pipe(Layer.provideMerge(OffsetStore.layerMemory)))
 * )
 * ```
 *
 * @since 0.1.0
 * @category transactions
 */
export const append = (entries: ReadonlyArray<unknown>): Effect.Effect<void, OffsetStoreError, Transaction> =>
  Effect.flatMap(Transaction, (transaction) => {
    const buffer = transaction.handle
    const fail = (reason: string, cause?: unknown) =>
      new OffsetStoreError({ store: transaction.store, operation: "append", reason, cause })
    if (buffer instanceof OutsideUnit) return Effect.fail(fail(outsideUnitReason))
    if (!(buffer instanceof UnitBuffer)) {
      return Effect.fail(
        fail(
          `the ${transaction.store} store keeps results in its own transaction, not through OffsetStore.append` +
            " (for PgOffsetStore, write with the transaction from PgOffsetStore.sql; for SqlOffsetStore, with your own" +
            " SqlClient)"
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
      // One at a time: a large batch spread into `push` overflows the stack.
      for (const text of texts) buffer.entries.push(text)
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

/** The memory and file stores' units of work: each runs with a fresh buffer as its `Transaction`. */
const runUnit = unitRunner(Transaction)

const storeContext = (parts: StoreParts): Context.Context<OffsetStore | Results> =>
  Context.make(OffsetStore, parts.store).pipe(Context.add(Results, parts.results))

/**
 * An offset store in memory, with results written through {@link append}. A claim and a unit's check of the owner
 * epoch are each one atomic step, so a unit of an earlier owner either commits before the claim or is fenced; units of
 * the current owner may run side by side. For tests and the demo; nothing survives the layer.
 *
 * @since 0.1.0
 * @category layers
 */
export const layerMemory: Layer.Layer<OffsetStore | Results> = Layer.effectContext(
  Effect.map(Effect.suspend(() => memoryStore.make(runUnit)), storeContext)
)

/**
 * An offset store in a directory, through `@effect/platform`'s `FileSystem` (so it runs on Node, Deno and Bun).
 *
 * Each partition is a chain of small JSON segments under `directory/<group>/<topic>/<partition>/`, numbered from 1;
 * the newest holds the partition's owner epoch and position. A claim adds a `claim` segment (the epoch goes up by
 * one), a committed unit a `unit` segment with its position and the results appended by its work. Each segment is
 * written to a temporary file, synced, then linked into place under a name only one writer can take, and a unit is
 * linked only on top of a segment of its own epoch: commits are atomic and fenced even between processes sharing the
 * directory, with no lock between them.
 *
 * ```json
 * {
 *   "format": "effect-kafka-delivery/offset-segment/2",
 *   "id": "0b6c4c1e-6f55-4d4e-9a53-3b1b5f9f3c8e",
 *   "groupId": "billing",
 *   "topic": "orders",
 *   "partition": 0,
 *   "sequence": 2,
 *   "epoch": "3",
 *   "next": "125",
 *   "kind": "unit",
 *   "writtenAt": "2025-01-01T12:00:00.000Z",
 *   "results": [{ "orderId": "o-7" }]
 * }
 * ```
 *
 * Every 256 units the owner compacts the partition: the results since the last compaction go to one file under
 * `archive/`, a `checkpoint` segment is linked, and the older segments are deleted. A partition directory so holds a
 * few hundred segments at most, and loading, claiming or committing costs the same after a million units as after
 * ten; the results are kept, in the archives. Directories written by the previous version (segment format 1) are read
 * as they are, their units as never claimed, and continued by the first claim.
 *
 * A damaged file is reported with its path and left as it is; leftover `.tmp-*` files of a crashed write are ignored.
 *
 * @since 0.1.0
 * @category layers
 */
export const layerFileSystem = (
  directory: string
): Layer.Layer<OffsetStore | Results, InvalidConfig | OffsetStoreError, FileSystem.FileSystem> =>
  Layer.effectContext(Effect.map(Effect.suspend(() => fileStore.make(directory, runUnit)), storeContext))
