/**
 * The producer: records written to Kafka from Effect programs, with the durability of each write a named setting.
 *
 * Many fibers may send at once: records sent within `linger` of each other are merged into one request (up to
 * `batchSize` bytes), as the Java client's `linger.ms` and `batch.size` do, and each caller still gets its own
 * `RecordMetadata` or `ProduceFailed`. A key goes to the partition the Java client's default partitioner picks
 * (murmur2 of the key's bytes), so a Java and a TypeScript producer agree; records without a key and without a
 * partition go to one partition per batch, a different one for each batch (the Java client's sticky partitioner).
 *
 * Layers: `KafkaJs.layerProducer` for a real cluster, `InMemoryKafka.layerProducer` for the in-memory broker. Both
 * keep the same behaviour suite.
 *
 * @since 0.1.0
 */
import * as Context from "effect/Context"
import type * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
import type { GroupMetadata } from "./Driver.js"
import type { DriverError, ProduceFailed, TransactionFailed } from "./KafkaError.js"

/**
 * A record to write. `value` `null` is a tombstone (on a compacted topic, it deletes the key). Without `partition`,
 * a record with a key goes to the key's partition (murmur2, as in Java), one without to the batch's partition.
 * `timestamp` is milliseconds since the epoch (default: when it is sent). A string is written as UTF-8. The producer
 * keeps the record, not a copy of its bytes, until it is written: a `Uint8Array` must not be changed before the send
 * is answered. On kafkajs a string or a `Buffer` is handed over as it is, the cheapest; another `Uint8Array` is
 * viewed as a `Buffer` (no copy).
 *
 * @since 0.1.0
 * @category models
 */
export interface ProducerRecord {
  readonly topic: string
  readonly key?: Uint8Array | string | null | undefined
  readonly value: Uint8Array | string | null
  readonly headers?: Readonly<Record<string, Uint8Array | string>> | undefined
  readonly partition?: number | undefined
  readonly timestamp?: number | undefined
}

/**
 * Where a record was written. With `acks: 0` nobody answers, and `offset` is `-1n`.
 *
 * @since 0.1.0
 * @category models
 */
export interface RecordMetadata {
  readonly topic: string
  readonly partition: number
  readonly offset: bigint
}

/**
 * How many acknowledgements a write waits for, and what that means when the partition's leader dies:
 *
 * - `"all"` (the default): every in-sync replica has the record before it is acknowledged. With
 *   `min.insync.replicas` ≥ 2 an acknowledged record survives the death of the leader; nothing acknowledged is lost.
 * - `1`: the leader alone has it. A leader that dies before its followers copied the record loses it, though it was
 *   acknowledged.
 * - `0`: nobody answers; the record is sent and forgotten. Anything in flight when the leader dies, or refused by the
 *   broker, is lost without the producer knowing. `RecordMetadata.offset` is `-1n`.
 *
 * Whatever `acks` says, a write whose answer is lost (the connection dropped, a timeout) is retried, and the retry can
 * write the record twice unless the producer is idempotent.
 *
 * @since 0.1.0
 * @category models
 */
export type Acks = 0 | 1 | "all"

/**
 * Producer settings shared by both layers. Durations accept anything `Duration.decode` does (a number is
 * milliseconds). Invalid settings and invalid combinations fail with a `InvalidConfig` naming the setting, before
 * anything connects.
 *
 * @since 0.1.0
 * @category models
 */
export interface Settings {
  /** See {@link Acks}. Default `"all"`. */
  readonly acks?: Acks | undefined
  /**
   * The broker drops a retried write it already has (producer id and sequence numbers): retries cannot duplicate
   * or reorder records. Needs `acks: "all"` and `maxInFlightRequests: 1`. Default `true`.
   */
  readonly idempotent?: boolean | undefined
  /**
   * Batches of records in flight at once. Above 1, a batch that fails and is retried can land after the batch sent
   * after it: records of one partition may be reordered. Default 1; at most 5.
   */
  readonly maxInFlightRequests?: number | undefined
  /** How long a record may wait for others to share its request (`linger.ms`). `0` sends at once. Default 5 millis. */
  readonly linger?: Duration.DurationInput | undefined
  /** A batch is sent as soon as its records reach this many bytes (keys, values, headers). Default 256 KiB. */
  readonly batchSize?: number | undefined
  /**
   * The largest record accepted (`max.request.size`): a larger one fails with `ProduceFailed` (`RecordTooLarge`)
   * before it is sent. Default 1 MiB.
   */
  readonly maxRequestSize?: number | undefined
  /** Default `"none"`. */
  readonly compression?: "none" | "gzip" | undefined
  /** How long the broker may take to acknowledge a write (`request.timeout.ms`). Default 30 seconds. */
  readonly timeout?: Duration.DurationInput | undefined
  /**
   * On shutdown, how long records already sent may take to be written before they fail with `Closed`. Default
   * 30 seconds.
   */
  readonly closeTimeout?: Duration.DurationInput | undefined
  /**
   * The most bytes of records (counted as `batchSize` counts them) the producer holds at once, from their send until
   * they are answered, in the buffer or in flight (`buffer.memory`). A send that would pass it waits for room, up to
   * `maxBlock`; meanwhile the buffer goes out without waiting for `linger`. At least `maxRequestSize`, so that any
   * record fits. Default 32 MiB.
   *
   * @since 0.2.0
   */
  readonly bufferMemory?: number | undefined
  /**
   * How long a send waits for room in a full buffer (`max.block.ms`) before the records that did not get in fail with
   * `ProduceFailed` (`BufferFull`): they are not sent. `0` fails them at once. Default 60 seconds.
   *
   * @since 0.2.0
   */
  readonly maxBlock?: Duration.DurationInput | undefined
}

/**
 * The producer service.
 *
 * - `send` writes one record and returns where it was written, once acknowledged as `acks` says.
 * - `sendAll` writes records in the order given (records of one partition are written in that order) and returns
 *   their metadata in the same order. If some fail, it fails with the first failure in the order given, and the
 *   others may have been written.
 * - `flush` waits until every record sent before it is written or has failed, without waiting for `linger`.
 *
 * A record handed over is sent even if the fiber that sent it is interrupted. A send may wait for room first, when
 * the records held reach `bufferMemory`: records of it that are not in the buffer after `maxBlock` fail with
 * `BufferFull`, and are never sent, as are those of a send interrupted while it waits. When the producer's scope
 * closes, records already sent are written (for up to `closeTimeout`); sends after that fail with `Closed`.
 *
 * @since 0.1.0
 * @category tags
 */
export class Producer extends Context.Tag("effect-kafka-delivery/Producer")<Producer, {
  readonly send: (record: ProducerRecord) => Effect.Effect<RecordMetadata, ProduceFailed>
  readonly sendAll: (records: Iterable<ProducerRecord>) => Effect.Effect<ReadonlyArray<RecordMetadata>, ProduceFailed>
  readonly flush: Effect.Effect<void>
}>() {}

/**
 * @example
 * ```ts
 * import { InMemoryKafka, Producer } from "effect-kafka-delivery"
 * import * as Effect from "effect/Effect"
 * import * as Layer from "effect/Layer"
 *
 * // The send ends once the broker has the record: its partition and offset, or a `ProduceFailed` saying why not.
 * const sent = Effect.gen(function*() {
 *   yield* InMemoryKafka.createTopic("orders", 3)
 *   const metadata = yield* Producer.send({ topic: "orders", key: "o-1", value: "paid" })
 *   return `${metadata.topic}-${metadata.partition}@${metadata.offset}`
 * }).pipe(Effect.provide(InMemoryKafka.layerProducer().pipe(Layer.provideMerge(InMemoryKafka.layer()))))
 * ```
 *
 * @since 0.1.0
 * @category accessors
 */
export const send = (record: ProducerRecord): Effect.Effect<RecordMetadata, ProduceFailed, Producer> =>
  Effect.flatMap(Producer, (producer) => producer.send(record))

/**
 * @since 0.1.0
 * @category accessors
 */
export const sendAll = (
  records: Iterable<ProducerRecord>
): Effect.Effect<ReadonlyArray<RecordMetadata>, ProduceFailed, Producer> =>
  Effect.flatMap(Producer, (producer) => producer.sendAll(records))

/**
 * @since 0.1.0
 * @category accessors
 */
export const flush: Effect.Effect<void, never, Producer> = Effect.flatMap(Producer, (producer) => producer.flush)

/**
 * Settings of a transactional producer: those of every producer (it is always idempotent, with acks "all"), its
 * transactional id, and how long a transaction may stay open before the broker aborts it.
 *
 * @since 0.1.0
 * @category models
 */
export interface TransactionalSettings extends Omit<Settings, "acks" | "idempotent" | "maxInFlightRequests"> {
  /**
   * Names the producer across restarts. A producer that starts with the id of an earlier one fences it: the earlier
   * one's open transaction is aborted and it can write nothing more (`Fenced`).
   */
  readonly transactionalId: string
  /** The broker aborts a transaction open for longer (`transaction.timeout.ms`). Default 60 seconds. */
  readonly transactionTimeout?: Duration.DurationInput | undefined
}

/**
 * A transactional producer. `transaction(body)` runs `body` with a `Producer` whose sends go into one Kafka
 * transaction: when `body` succeeds and every send succeeded, the transaction commits (with `offsets`, when given).
 * Once a send of the transaction failed, whatever the reason (refused before it was sent, as `RecordTooLarge`, or by
 * the cluster) and whether or not `body` caught the failure, the transaction cannot commit, as with the Java client:
 * it is aborted, and `transaction` fails with `TransactionFailed` (`Aborted`), or with `body`'s own failure when `body`
 * failed. It is aborted too when `body` fails or the fiber is interrupted. Consumers reading `read_committed` see all
 * of a committed transaction's records and none of an aborted one's. Transactions of one producer run one after
 * another.
 *
 * When the layer starts, the producer fences every earlier producer with the same `transactionalId`: a zombie
 * (a paused or partitioned instance the rest of the system has replaced) can commit nothing after that. Its sends fail
 * with `ProduceFailed` (`Fenced`), its commits with `TransactionFailed` (`Fenced`); a transaction with a fenced send
 * fails with `TransactionFailed` (`Fenced`) even when `body` failed or caught the send's failure.
 *
 * @since 0.1.0
 * @category tags
 */
export class TransactionalProducer extends Context.Tag("effect-kafka-delivery/TransactionalProducer")<
  TransactionalProducer,
  {
    readonly transactionalId: string
    readonly transaction: <A, E, R>(
      body: Effect.Effect<A, E, R>,
      options?: TransactionOptions
    ) => Effect.Effect<A, E | TransactionFailed, Exclude<R, Producer>>
  }
>() {}

/**
 * Consumed positions committed for a consumer group with a transaction (Kafka's `sendOffsetsToTransaction`): they land
 * if the transaction commits, and only then. `next` is the next offset to read.
 *
 * @since 0.1.0
 * @category models
 */
export interface TransactionOffsets {
  readonly groupId: string
  readonly positions: ReadonlyArray<{ readonly topic: string; readonly partition: number; readonly next: bigint }>
  /**
   * The consuming member's group metadata (`DriverSession.groupMetadata`, KIP-447): the group's coordinator takes the
   * positions only from that member at that generation or epoch, and the transaction fails otherwise (a zombie's lands
   * nothing). Without it the positions are sent as from outside the group's generations. Only @platformatic/kafka
   * sends it; on kafkajs and the in-memory broker a transaction given one fails with `TransactionFailed` (`Other`)
   * before it sends its positions.
   */
  readonly member?: GroupMetadata | undefined
}

/**
 * How a transaction ends.
 *
 * @since 0.1.0
 * @category models
 */
export interface TransactionOptions {
  /**
   * The positions to commit with the transaction, or an effect that gives them once the body has succeeded and its
   * sends are written; when that effect fails, the transaction is aborted and fails with its error.
   */
  readonly offsets?: TransactionOffsets | Effect.Effect<TransactionOffsets, TransactionFailed> | undefined
}

/**
 * Makes transactional producers on demand, one per transactional id, each fencing the earlier producers of its id
 * when it starts. What `CommitPolicy.kafkaTransactional` uses for a producer per owned partition.
 *
 * @since 0.1.0
 * @category tags
 */
export class TransactionalProducers extends Context.Tag("effect-kafka-delivery/TransactionalProducers")<
  TransactionalProducers,
  {
    readonly make: (
      transactionalId: string
    ) => Effect.Effect<Context.Tag.Service<typeof TransactionalProducer>, TransactionFailed | DriverError, Scope.Scope>
  }
>() {}

/**
 * Runs `body` in a transaction of the `TransactionalProducer` (see there), committing `offsets` with it when given.
 *
 * @since 0.1.0
 * @category transactions
 */
export const transaction = <A, E, R>(
  body: Effect.Effect<A, E, R>,
  options?: TransactionOptions
): Effect.Effect<A, E | TransactionFailed, Exclude<R, Producer> | TransactionalProducer> =>
  Effect.flatMap(TransactionalProducer, (producer) => producer.transaction(body, options))
