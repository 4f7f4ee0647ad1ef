/**
 * An in-memory Kafka: topics, partitions, consumer groups with several members, eager rebalances, committed offsets,
 * session timeouts and crash injection, and the gaps of a real log (transaction markers, aborted transactions,
 * compaction, retention). It keeps the `Driver` contract exactly as the kafkajs driver does, runs on the Effect
 * `Clock` (so it is deterministic under `TestClock`), and is the test kit users get for their own consumers.
 *
 * @since 0.1.0
 */
import * as Context from "effect/Context"
import type * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Layer from "effect/Layer"
import { Driver, type GroupMetadata, type PartitionOffsets, type RebalanceProtocol } from "./Driver.js"
import { type CrashPoint, Faults } from "./Faults.js"
import * as broker from "./internal/memory/broker.js"
import * as operations from "./internal/memory/service.js"
import * as session from "./internal/memory/session.js"
import * as producer from "./internal/producer/producer.js"
import { type CommitFailureReason, InvalidConfig, DriverError, ProduceFailed, TransactionFailed } from "./KafkaError.js"
import type * as OffsetBatch from "./OffsetBatch.js"
import {
  Producer,
  type ProducerRecord as TopicRecord,
  type Settings as ProducerSettings,
  TransactionalProducer,
  TransactionalProducers,
  type TransactionalSettings
} from "./Producer.js"
import type * as TopicPartition from "./TopicPartition.js"

/**
 * A record to produce to a topic given apart: the `Producer`'s record without its topic. Without `partition`, records
 * with a key go to the key's partition (murmur2, as the Java client) and the others round robin; without `timestamp`,
 * the broker's clock when it is written.
 *
 * @since 0.1.0
 * @category models
 */
export type ProducerRecord = Omit<TopicRecord, "topic">

/**
 * How partitions are spread over the members of a group.
 *
 * @since 0.1.0
 * @category models
 */
export type Assignor = "range" | "roundRobin"

/**
 * @since 0.1.0
 * @category models
 */
export interface Options {
  /** How an eager rebalance spreads partitions (the incremental protocols use a sticky spread). */
  readonly assignor?: Assignor
  /**
   * How the broker's groups rebalance: `eager` (the default), `cooperative` or `consumer`, as a Kafka cluster does
   * with the same choice (see `Driver.RebalanceProtocol`).
   *
   * @since 0.3.0
   */
  readonly rebalance?: RebalanceProtocol
}

/**
 * @since 0.1.0
 * @category models
 */
export interface TopicOptions {
  /** `cleanup.policy=compact`: `compact` keeps only the latest record of each key. */
  readonly compacted?: boolean
}

/**
 * @since 0.1.0
 * @category models
 */
export interface GroupMember {
  readonly memberId: string
  readonly partitions: ReadonlyArray<TopicPartition.TopicPartition>
}

/**
 * @since 0.1.0
 * @category tags
 */
export class InMemoryKafka extends Context.Tag("effect-kafka-delivery/InMemoryKafka")<InMemoryKafka, {
  readonly createTopic: (
    topic: string,
    partitions: number,
    options?: TopicOptions
  ) => Effect.Effect<void, InvalidConfig>
  readonly produce: (
    topic: string,
    records: ReadonlyArray<ProducerRecord>
  ) => Effect.Effect<ReadonlyArray<readonly [partition: number, offset: bigint]>, DriverError>
  /**
   * Writes records as one transaction of a transactional producer, committed or aborted. Each partition it touched
   * gets a marker after its records, an offset that holds nothing to read; an aborted transaction's records take
   * offsets too and are never read (consumers read committed). Returns the offsets the records took.
   */
  readonly produceTransaction: (
    topic: string,
    records: ReadonlyArray<ProducerRecord>,
    outcome: "commit" | "abort"
  ) => Effect.Effect<ReadonlyArray<readonly [partition: number, offset: bigint]>, DriverError>
  /** Runs the log cleaner on a compacted topic: only the latest record of each key stays. */
  readonly compact: (topic: string) => Effect.Effect<void, DriverError>
  /** Removes a partition's records below `before`, as retention or `kafka-delete-records` do. */
  readonly deleteRecords: (topic: string, partition: number, before: bigint) => Effect.Effect<void, DriverError>
  /** The next offset to be written to each partition of the topic. */
  readonly endOffsets: (topic: string) => Effect.Effect<ReadonlyArray<bigint>, DriverError>
  /** The earliest, latest (high watermark) and last stable offsets of each partition of the topic. */
  readonly offsets: (topic: string) => Effect.Effect<ReadonlyArray<PartitionOffsets>, DriverError>
  readonly committed: (groupId: string) => Effect.Effect<ReadonlyMap<string, bigint>>
  /** The metadata committed with the group's positions, where there is any. */
  readonly committedMetadata: (groupId: string) => Effect.Effect<ReadonlyMap<string, string>>
  readonly members: (groupId: string) => Effect.Effect<ReadonlyArray<GroupMember>>
  /** The generation of the group's current assignment; it grows by one with every completed rebalance. */
  readonly generation: (groupId: string) => Effect.Effect<number>
  /** Records fetched by a member and not yet known to be handled are the runloop's business; this counts fetches. */
  readonly fetchedCount: (memberId: string) => Effect.Effect<number>
  /** The member's process dies: it leaves the group at once without revoking, and nothing it does lands any more. */
  readonly kill: (memberId: string) => Effect.Effect<void>
  /** The member stops heartbeating and polling, as in a long GC pause; the group evicts it after its session timeout. */
  readonly freeze: (memberId: string) => Effect.Effect<void>
  /** A frozen member goes on; if it was evicted meanwhile, it learns on its next poll that its partitions are lost. */
  readonly thaw: (memberId: string) => Effect.Effect<void>
  /** The group's next `times` commits are refused with `reason`, as the broker or the client would refuse them. */
  readonly refuseCommits: (groupId: string, reason: CommitFailureReason, times?: number) => Effect.Effect<void>
  /**
   * The broker cannot be reached: connecting, polling, reading offsets fail with a retriable `DriverError`, commits
   * with `CommitFailed` (`Disconnected`), and no heartbeat arrives, so members whose session expires meanwhile are
   * evicted when it is back.
   */
  readonly unreachable: Effect.Effect<void>
  /** The broker can be reached again. */
  readonly reachable: Effect.Effect<void>
  /**
   * Registers a transactional producer (Kafka's InitProducerId): the id's epoch goes up by one and is returned, and
   * the open transaction of the earlier epoch is aborted. Every later call with an earlier epoch is fenced. A
   * transaction open for longer than `transactionTimeout` is aborted by the broker, which bumps the epoch too. What
   * `layerTransactionalProducer` uses.
   */
  readonly initProducer: (
    transactionalId: string,
    transactionTimeout: Duration.DurationInput
  ) => Effect.Effect<number>
  /**
   * Writes records in the open transaction of the producer (opening one if none is): read-committed consumers see
   * them once it commits, and a partition is read-committed only up to the oldest transaction still open on it.
   */
  readonly transactionalProduce: (
    transactionalId: string,
    epoch: number,
    topic: string,
    records: ReadonlyArray<ProducerRecord>
  ) => Effect.Effect<ReadonlyArray<readonly [partition: number, offset: bigint]>, ProduceFailed>
  /**
   * Adds positions to commit for `groupId` to the producer's open transaction, opening one if none is (Kafka's
   * AddOffsetsToTxn and TxnOffsetCommit, what `sendOffsetsToTransaction` sends): they are committed when it commits,
   * dropped when it aborts. Until it ends, a session's read of the group's committed position of these partitions
   * (`DriverSession.committed`) fails with a retriable `DriverError` naming `UNSTABLE_OFFSET_COMMIT`, as a stable
   * read does on Kafka.
   *
   * @since 0.2.0
   */
  readonly sendOffsets: (
    transactionalId: string,
    epoch: number,
    groupId: string,
    positions: ReadonlyArray<{ readonly topic: string; readonly partition: number; readonly next: bigint }>,
    /**
     * The consuming member's group metadata (KIP-447): the positions are refused (`TransactionFailed`, `Other`, naming
     * the Kafka error) unless that member is in the group at that generation.
     */
    member?: GroupMetadata
  ) => Effect.Effect<void, TransactionFailed>
  /**
   * Ends the producer's open transaction. `commit` also commits the positions added with `sendOffsets`, and
   * `offsets`, for their groups, atomically with the records (`sendOffsetsToTransaction`); `abort` drops them.
   */
  readonly endTransaction: (
    transactionalId: string,
    epoch: number,
    outcome: "commit" | "abort",
    offsets?: ReadonlyArray<{
      readonly groupId: string
      readonly positions: ReadonlyArray<{ readonly topic: string; readonly partition: number; readonly next: bigint }>
    }>
  ) => Effect.Effect<void, TransactionFailed>
}>() {}

/**
 * Builds the broker's state and its operations. Exposed through `layer`.
 */
const makeBroker = (options: Options) =>
  Effect.map(broker.make(options.assignor ?? "range", options.rebalance ?? "eager"), (state) => {
    const service: Context.Tag.Service<InMemoryKafka> = operations.make(state)
    const driver: Context.Tag.Service<Driver> = { connect: (sessionOptions) => session.connect(state, sessionOptions) }
    return { service, driver } as const
  })

/**
 * The broker and a `Driver` on it, in one layer.
 *
 * @example
 * ```ts
 * import { CommitPolicy, Consumer, InMemoryKafka } from "effect-kafka-delivery"
 * import * as Effect from "effect/Effect"
 *
 * // A test of a consumer with no broker to start: records in, then the group's committed positions read back.
 * const test = Effect.gen(function*() {
 *   yield* InMemoryKafka.createTopic("orders", 1)
 *   yield* InMemoryKafka.produce("orders", [{ key: "o-1", value: "paid" }, { key: "o-2", value: "paid" }])
 *   yield* Consumer.runEach({ groupId: "billing", topics: ["orders"] }, () => Effect.void).pipe(
 *     Effect.provide(CommitPolicy.commitAfter({ maxBatch: 1, maxInterval: "1 second" })),
 *     Effect.timeout("200 millis"),
 *     Effect.ignore
 *   )
 *   return yield* InMemoryKafka.committed("billing") // positions: orders-0 at 2
 * }).pipe(Effect.provide(InMemoryKafka.layer()))
 * ```
 *
 * @since 0.1.0
 * @category layers
 */
export const layer = (options: Options = {}): Layer.Layer<InMemoryKafka | Driver> =>
  Layer.effectContext(
    makeBroker(options).pipe(
      Effect.map(({ driver, service }) => Context.make(InMemoryKafka, service).pipe(Context.add(Driver, driver)))
    )
  )

/**
 * Crash injection on the in-memory broker: when `plan` says so, the member is killed (it leaves its group at once,
 * and nothing it does afterwards lands) and its consumer dies with `Crashed`.
 *
 * @since 0.1.0
 * @category layers
 */
export const layerFaults = (
  plan: (point: CrashPoint, memberId: string, partitions: ReadonlyArray<TopicPartition.TopicPartition>) => boolean
): Layer.Layer<Faults, never, InMemoryKafka> =>
  Layer.effect(
    Faults,
    Effect.map(InMemoryKafka, (kafka) => ({
      crashAt: (point, memberId, partitions) =>
        Effect.suspend(() =>
          plan(point, memberId, partitions) ? Effect.as(kafka.kill(memberId), true) : Effect.succeed(false)
        )
    }))
  )

/**
 * Creates a topic with this many partitions.
 *
 * @since 0.1.0
 * @category accessors
 */
export const createTopic = (
  topic: string,
  partitions: number,
  options?: TopicOptions
): Effect.Effect<void, InvalidConfig, InMemoryKafka> =>
  Effect.flatMap(InMemoryKafka, (kafka) => kafka.createTopic(topic, partitions, options))

/**
 * @since 0.1.0
 * @category accessors
 */
export const produce = (
  topic: string,
  records: ReadonlyArray<ProducerRecord>
): Effect.Effect<ReadonlyArray<readonly [partition: number, offset: bigint]>, DriverError, InMemoryKafka> =>
  Effect.flatMap(InMemoryKafka, (kafka) => kafka.produce(topic, records))

/**
 * Writes records as one committed or aborted transaction (see {@link InMemoryKafka}).
 *
 * @since 0.1.0
 * @category accessors
 */
export const produceTransaction = (
  topic: string,
  records: ReadonlyArray<ProducerRecord>,
  outcome: "commit" | "abort"
): Effect.Effect<ReadonlyArray<readonly [partition: number, offset: bigint]>, DriverError, InMemoryKafka> =>
  Effect.flatMap(InMemoryKafka, (kafka) => kafka.produceTransaction(topic, records, outcome))

/**
 * The group's committed positions as a batch, with the metadata committed with them.
 *
 * @since 0.1.0
 * @category accessors
 */
export const committed = (groupId: string): Effect.Effect<OffsetBatch.OffsetBatch, never, InMemoryKafka> =>
  Effect.flatMap(InMemoryKafka, (kafka) =>
    Effect.zipWith(
      kafka.committed(groupId),
      kafka.committedMetadata(groupId),
      (positions, metadata): OffsetBatch.OffsetBatch => metadata.size === 0 ? { positions } : { positions, metadata }
    ))

/**
 * A batch written through `produce`: partitions chosen as the Java client does, unknown topics and partitions refused
 * per record.
 */
const makeWrite = (
  kafka: Context.Tag.Service<InMemoryKafka>,
  resolved: producer.Resolved,
  produce: (
    topic: string,
    records: ReadonlyArray<ProducerRecord>
  ) => Effect.Effect<ReadonlyArray<readonly [partition: number, offset: bigint]>, ProduceFailed>
) => {
  const partitioner = producer.makePartitioner()
  return (batch: ReadonlyArray<TopicRecord>) =>
    Effect.gen(function*() {
      const counts = new Map<string, number | ProduceFailed>()
      for (const record of batch) {
        if (counts.has(record.topic)) continue
        const ends = yield* Effect.either(kafka.endOffsets(record.topic))
        counts.set(record.topic, Either.isRight(ends) ? ends.right.length : producer.unknownTopic(record.topic))
      }
      const { out, partitionOf, topics } = partitioner(batch, counts)
      for (const { indexes, topic } of topics) {
        const records: Array<ProducerRecord> = indexes.map((i) => {
          const record = batch[i]!
          return {
            key: record.key ?? null,
            value: record.value,
            partition: partitionOf[i]!,
            ...(record.headers === undefined ? {} : { headers: record.headers }),
            ...(record.timestamp === undefined ? {} : { timestamp: record.timestamp })
          }
        })
        const written = yield* Effect.either(produce(topic, records))
        indexes.forEach((index, k) => {
          out[index] = Either.isRight(written)
            ? { topic, partition: written.right[k]![0], offset: resolved.acks === 0 ? -1n : written.right[k]![1] }
            : written.left
        })
      }
      return out
    })
}

/**
 * The `Producer` on the in-memory broker, with the same settings, batching, partitioning and errors as
 * `KafkaJs.layerProducer`: a key goes to its murmur2 partition, as with the Java client; a topic that does not exist
 * fails with `UnknownTopic`, a partition it does not have with `UnknownPartition`, a record larger than
 * `maxRequestSize` with `RecordTooLarge`. The broker has one replica, so `acks` changes nothing about what is kept.
 *
 * @since 0.1.0
 * @category layers
 */
export const layerProducer = (settings: ProducerSettings = {}): Layer.Layer<Producer, InvalidConfig, InMemoryKafka> =>
  Layer.scoped(
    Producer,
    Effect.gen(function*() {
      const resolved = yield* producer.resolve(settings)
      const kafka = yield* InMemoryKafka
      const write = makeWrite(kafka, resolved, (topic, records) =>
        Effect.mapError(
          kafka.produce(topic, records),
          (error) => new ProduceFailed({ reason: "Other", topic, detail: error.message })
        ))
      return yield* producer.make(resolved, { write })
    })
  )

/**
 * Transactional producers on the in-memory broker, made on demand (see `layerTransactionalProducer`); what
 * `CommitPolicy.kafkaTransactional` needs.
 *
 * @since 0.1.0
 * @category layers
 */
export const layerTransactionalProducers = (
  settings: Omit<TransactionalSettings, "transactionalId"> = {}
): Layer.Layer<TransactionalProducers, InvalidConfig, InMemoryKafka> =>
  Layer.effect(
    TransactionalProducers,
    Effect.gen(function*() {
      const { resolved, transactionTimeout } = yield* producer.resolveTransactional(settings)
      const kafka = yield* InMemoryKafka
      return {
        make: (transactionalId) =>
          producer.makeTransactional(resolved, transactionClient(kafka, resolved, transactionalId, transactionTimeout))
      }
    })
  )

/**
 * A `TransactionalProducer` on the in-memory broker. Starting it fences earlier producers with the same
 * `transactionalId` (their open transaction is aborted); its transactions are invisible to read-committed consumers
 * until they commit, and a partition is read-committed only up to the oldest transaction still open on it.
 *
 * @since 0.1.0
 * @category layers
 */
export const layerTransactionalProducer = (
  settings: TransactionalSettings
): Layer.Layer<TransactionalProducer, InvalidConfig | TransactionFailed, InMemoryKafka> =>
  Layer.scoped(
    TransactionalProducer,
    Effect.gen(function*() {
      const transactionalId = yield* producer.checkTransactionalId(settings.transactionalId)
      const { transactionalId: _, ...rest } = settings
      const producers = yield* Layer.build(layerTransactionalProducers(rest))
      // The in-memory broker is always reachable for a producer: `make` fails with TransactionFailed only.
      return yield* Context.get(producers, TransactionalProducers).make(transactionalId).pipe(
        Effect.catchTag("DriverError", Effect.die)
      )
    })
  )

const transactionClient = (
  kafka: Context.Tag.Service<InMemoryKafka>,
  resolved: producer.Resolved,
  transactionalId: string,
  transactionTimeout: Duration.Duration
): producer.TxnClient => {
  let epoch = -1
  const write = makeWrite(
    kafka,
    resolved,
    (topic, records) => kafka.transactionalProduce(transactionalId, epoch, topic, records)
  )
  return {
    transactionalId,
    init: Effect.map(kafka.initProducer(transactionalId, transactionTimeout), (e) => {
      epoch = e
    }),
    begin: Effect.sync(() => ({
      write,
      // The positions go to the broker at once, as TxnOffsetCommit does: the group's stable reads see them pending.
      sendOffsets: ({ groupId, member, positions }) =>
        kafka.sendOffsets(transactionalId, epoch, groupId, positions, member),
      commit: kafka.endTransaction(transactionalId, epoch, "commit"),
      abort: kafka.endTransaction(transactionalId, epoch, "abort")
    }))
  }
}
