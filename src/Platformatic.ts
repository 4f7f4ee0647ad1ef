/**
 * The driver on [@platformatic/kafka](https://github.com/platformatic/kafka), a maintained, pure TypeScript client
 * (Node 22.22 and later, Bun, Deno). Install it next to this library (`npm install @platformatic/kafka`); nothing
 * else imports it.
 *
 * The client keeps the group membership (the classic protocol; eager rebalances by default, cooperative-sticky with
 * `rebalance: "cooperative"`; under `rebalance: "consumer"`, KIP-848, the driver runs the member itself on the
 * client's exported API); the driver keeps the library's promises through its public API:
 *
 * - A rebalance's revoked partitions go to another member only after the runloop released them: the client asks
 *   for the member's user data (`protocolsMetadata`) before each JoinGroup and waits for the answer, which comes after
 *   `release`. Until then the driver sends the member's heartbeats itself, so the member stays in the group, up to
 *   the rebalance timeout. Under `cooperative` only the partitions that move are revoked, before the rebalance's
 *   second JoinGroup; the others are fetched and committed throughout.
 * - Commits carry their metadata (the finished ranges of the key and unordered modes), and committed positions are
 *   read stable (`requireStable`), through the client's exported OffsetCommit and OffsetFetch APIs on the group's
 *   coordinator, with the consumer's own generation and member id.
 * - Records are fetched per partition, from the position the runloop sought, on connections of their own; the
 *   records of aborted transactions are left out even when the fetch ends before their abort marker.
 *
 * @since 0.3.0
 */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import type * as Redacted from "effect/Redacted"
import { Driver } from "./Driver.js"
import type { DriverError, InvalidConfig, TransactionFailed } from "./KafkaError.js"
import * as admin from "./internal/platformatic/admin.js"
import { makeClientOptions } from "./internal/platformatic/config.js"
import * as platformaticProducer from "./internal/platformatic/producer.js"
import * as session from "./internal/platformatic/session.js"
import * as platformaticTransactional from "./internal/platformatic/transactional.js"
import * as producerInternal from "./internal/producer/producer.js"
import { singleTransactional } from "./internal/producer/single.js"
import {
  parseBrokers as parseBrokerList,
  positiveInteger,
  positiveMillis,
  rebalanceProtocol
} from "./internal/shared/config.js"
import {
  Producer,
  type ProducerRecord,
  type Settings as ProducerSettings,
  TransactionalProducer,
  TransactionalProducers,
  type TransactionalSettings
} from "./Producer.js"

/**
 * TLS settings for the broker connections: PEM strings, as Node's `tls.connect` takes them.
 *
 * @since 0.3.0
 * @category models
 */
export interface TlsOptions {
  readonly ca?: string | ReadonlyArray<string> | undefined
  readonly cert?: string | undefined
  readonly key?: string | undefined
  readonly passphrase?: string | undefined
  readonly servername?: string | undefined
  readonly rejectUnauthorized?: boolean | undefined
}

/**
 * SASL credentials. The password stays redacted until a client is built; no log line or error carries it.
 *
 * @since 0.3.0
 * @category models
 */
export interface SaslOptions {
  readonly mechanism: "plain" | "scram-sha-256" | "scram-sha-512"
  readonly username: string
  readonly password: Redacted.Redacted<string>
}

/**
 * How to reach the cluster.
 *
 * @since 0.3.0
 * @category models
 */
export interface ConnectionConfig {
  /** Bootstrap brokers, each `host:port`. */
  readonly brokers: ReadonlyArray<string>
  /** Default client id; a consumer session's own `clientId` takes precedence. */
  readonly clientId?: string | undefined
  readonly ssl?: boolean | TlsOptions | undefined
  readonly sasl?: SaslOptions | undefined
  /** How long connecting to a broker may take. Default: the client's (5 seconds). */
  readonly connectionTimeout?: Duration.DurationInput | undefined
  /** How long a request may take. Default: the client's (5 seconds). */
  readonly requestTimeout?: Duration.DurationInput | undefined
  /** How many times the client retries a request that failed retriably. Default: the client's (3). */
  readonly retries?: number | undefined
  /** How long the client waits before it retries. Default: the client's (1 second). */
  readonly retryDelay?: Duration.DurationInput | undefined
}

/**
 * The consumer driver's settings.
 *
 * @since 0.3.0
 * @category models
 */
export interface Config extends ConnectionConfig {
  /** How long the broker may hold a fetch when there is nothing new. Default 500 ms. */
  readonly maxWaitTime?: Duration.DurationInput | undefined
  /** Default: a third of the session timeout, at most 3 seconds. */
  readonly heartbeatInterval?: Duration.DurationInput | undefined
  /** Default 1. */
  readonly minBytes?: number | undefined
  /** Most bytes one fetch returns. Default 50 MiB. */
  readonly maxBytes?: number | undefined
  /** Most bytes one fetch returns for a partition. Default 1 MiB. */
  readonly maxBytesPerPartition?: number | undefined
  /**
   * Read records of open and aborted transactions too, for sessions that do not say (a consumer's `isolationLevel`
   * takes precedence). Default `false` (read committed).
   */
  readonly readUncommitted?: boolean | undefined
  /**
   * How the group moves partitions when its members change (see `Driver.RebalanceProtocol`). Default `"eager"`.
   *
   * - `"eager"`: the classic protocol with the round-robin assignor; every rebalance revokes every partition.
   * - `"cooperative"`: the classic protocol with the cooperative-sticky assignor (KIP-429). Only the partitions that
   *   move are revoked; the others keep their workers and their fetching through the rebalance. Every member of a
   *   group must use the same choice.
   * - `"consumer"` (KIP-848, Kafka 4's group protocol): the broker assigns, and moves partitions one at a time. The
   *   driver runs the member itself, on the client's exported ConsumerGroupHeartbeat API (the client's own member
   *   acknowledges a revocation before the application released the partition): a revoked partition is reported as
   *   owned, heartbeat after heartbeat, until `release`, and the heartbeat that leaves it out goes at once. The
   *   session timeout and heartbeat interval are the broker's (`group.consumer.session.timeout.ms`,
   *   `group.consumer.heartbeat.interval.ms`, or the group's own configs): a consumer's `sessionTimeout` does not
   *   apply.
   *
   * @since 0.3.0
   */
  readonly rebalance?: "eager" | "cooperative" | "consumer" | undefined
}

/**
 * The consumer driver on @platformatic/kafka. Settings are checked when the layer is built (`InvalidConfig` names
 * the one that is wrong); nothing connects until a consumer joins.
 *
 * @since 0.3.0
 * @category layers
 */
export const layer = (config: Config): Layer.Layer<Driver, InvalidConfig> =>
  Layer.effect(
    Driver,
    Effect.gen(function*() {
      const client = yield* makeClientOptions(config)
      const settings: session.ConsumerSettings = {
        client,
        maxWaitTime: (yield* positiveMillis("maxWaitTime", config.maxWaitTime)) ?? 500,
        heartbeatInterval: yield* positiveMillis("heartbeatInterval", config.heartbeatInterval),
        minBytes: (yield* positiveInteger("minBytes", config.minBytes)) ?? 1,
        maxBytes: (yield* positiveInteger("maxBytes", config.maxBytes)) ?? 50 * 1024 * 1024,
        maxBytesPerPartition: (yield* positiveInteger("maxBytesPerPartition", config.maxBytesPerPartition)) ??
          1024 * 1024,
        readUncommitted: config.readUncommitted ?? false,
        rebalance: yield* rebalanceProtocol(config.rebalance, ["eager", "cooperative", "consumer"], {})
      }
      return Driver.of({ connect: (options) => session.connect(settings, options) })
    })
  )

/**
 * The producer's settings and how to reach the cluster.
 *
 * @since 0.3.0
 * @category models
 */
export interface ProducerConfig extends ConnectionConfig, ProducerSettings {}

/**
 * The `Producer` on @platformatic/kafka: the library batches and partitions (murmur2 of the key, as the Java client),
 * the client writes each leader's records in a request of its own. An idempotent producer (the default) whose send
 * failed starts over with a new producer id, so that a batch whose answer was lost cannot make the broker drop the
 * next one as its retry.
 *
 * @since 0.3.0
 * @category layers
 */
export const layerProducer = (config: ProducerConfig): Layer.Layer<Producer, InvalidConfig | DriverError> =>
  Layer.scoped(
    Producer,
    Effect.gen(function*() {
      const resolved = yield* producerInternal.resolve(config)
      const client = yield* makeClientOptions(config)
      return yield* platformaticProducer.make(client, config.clientId ?? "effect-kafka-delivery", resolved)
    })
  )

/**
 * The transactional producer's settings and how to reach the cluster.
 *
 * @since 0.3.0
 * @category models
 */
export interface TransactionalProducerConfig extends ConnectionConfig, TransactionalSettings {}

/**
 * Transactional producers made on demand, one per transactional id (what `CommitPolicy.kafkaTransactional` needs).
 * The client sends the transaction timeout as its request timeout, so a transactional producer's requests may take
 * that long.
 *
 * @since 0.3.0
 * @category layers
 */
export const layerTransactionalProducers = (
  config: Omit<TransactionalProducerConfig, "transactionalId">
): Layer.Layer<TransactionalProducers, InvalidConfig | DriverError> =>
  Layer.scoped(
    TransactionalProducers,
    Effect.gen(function*() {
      const { resolved, transactionTimeout } = yield* producerInternal.resolveTransactional(config)
      const client = yield* makeClientOptions(config)
      return yield* platformaticTransactional.makeTransactionClients(
        client,
        config.clientId ?? "effect-kafka-delivery",
        resolved,
        Duration.toMillis(transactionTimeout)
      )
    })
  )

/**
 * One transactional producer with its transactional id, fenced against earlier ones when the layer is built.
 *
 * @since 0.3.0
 * @category layers
 */
export const layerTransactionalProducer = (
  config: TransactionalProducerConfig
): Layer.Layer<TransactionalProducer, InvalidConfig | DriverError | TransactionFailed> =>
  singleTransactional(config, layerTransactionalProducers)

/**
 * A record for `produce`: a `ProducerRecord` without its topic.
 *
 * @since 0.3.0
 * @category models
 */
export type ProduceRecord = Omit<ProducerRecord, "topic">

/**
 * Splits `host:port,host:port` (as `KAFKA_BROKERS` is usually written) or checks a list of addresses.
 *
 * @since 0.3.0
 * @category utils
 */
export const parseBrokers = (
  brokers: string | ReadonlyArray<string>
): Effect.Effect<ReadonlyArray<string>, InvalidConfig> => parseBrokerList(brokers)

/**
 * Creates a topic (replicated as the cluster's default says) and waits until every partition has a leader that
 * answers for it.
 *
 * @since 0.3.0
 * @category admin
 */
export const createTopic = (
  brokers: string | ReadonlyArray<string>,
  topic: string,
  partitions: number
): Effect.Effect<void, InvalidConfig | DriverError> => admin.createTopic(brokers, topic, partitions)

/**
 * Writes records to a topic with an idempotent producer of its own, acknowledged by every in-sync replica.
 *
 * @since 0.3.0
 * @category admin
 */
export const produce = (
  brokers: string | ReadonlyArray<string>,
  topic: string,
  records: Iterable<ProduceRecord>
): Effect.Effect<void, InvalidConfig | DriverError> => admin.produce(brokers, topic, records)

/**
 * Each partition's end: the last stable offset, which is the offset the next record will get when no transaction is
 * open on the partition.
 *
 * @since 0.3.0
 * @category admin
 */
export const endOffsets = (
  brokers: string | ReadonlyArray<string>,
  topic: string
): Effect.Effect<ReadonlyMap<number, bigint>, InvalidConfig | DriverError> => admin.endOffsets(brokers, topic)
