/**
 * The `Driver` on kafkajs, for a real Kafka cluster, plus a few admin helpers (create a topic, produce, read end
 * offsets) for tests, examples and the demo. This is the only module that imports `kafkajs`; none of its types
 * appear in the signatures below.
 *
 * @since 0.1.0
 */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import type * as Redacted from "effect/Redacted"
import { Driver } from "./Driver.js"
import type { DriverError, InvalidConfig, TransactionFailed } from "./KafkaError.js"
import * as admin from "./internal/kafkajs/admin.js"
import * as internal from "./internal/kafkajs/driver.js"
import * as kafkajsProducer from "./internal/kafkajs/producer.js"
import * as session from "./internal/kafkajs/session.js"
import * as kafkajsTransactional from "./internal/kafkajs/transactional.js"
import * as producerInternal from "./internal/producer/producer.js"
import { singleTransactional } from "./internal/producer/single.js"
import {
  Producer,
  type ProducerRecord,
  type Settings as ProducerSettings,
  TransactionalProducer,
  TransactionalProducers,
  type TransactionalSettings
} from "./Producer.js"

/**
 * What kafkajs itself logs, through Effect's logger.
 *
 * @since 0.1.0
 * @category models
 */
export type LogLevel = "nothing" | "error" | "warn" | "info" | "debug"

/**
 * TLS settings for the broker connections: PEM strings, as Node's `tls.connect` takes them.
 *
 * @since 0.1.0
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
 * SASL credentials. The password stays redacted (`Config.redacted("KAFKA_PASSWORD")` reads one) until the kafkajs
 * client is built; no log line or error of this module carries it.
 *
 * @since 0.1.0
 * @category models
 */
export interface SaslOptions {
  readonly mechanism: "plain" | "scram-sha-256" | "scram-sha-512"
  readonly username: string
  readonly password: Redacted.Redacted<string>
}

/**
 * How kafkajs retries requests that fail with retriable errors (exponential backoff with jitter).
 *
 * @since 0.1.0
 * @category models
 */
export interface RetryOptions {
  readonly retries?: number | undefined
  readonly initialRetryTime?: Duration.DurationInput | undefined
  readonly maxRetryTime?: Duration.DurationInput | undefined
  readonly factor?: number | undefined
  readonly multiplier?: number | undefined
}

/**
 * Connection settings, passed through to kafkajs; shared by the consumer's and the producer's layers. Durations accept
 * anything `Duration.decode` does (a number is milliseconds).
 *
 * @since 0.1.0
 * @category models
 */
export interface ConnectionConfig {
  /** Bootstrap brokers, each `host:port`. */
  readonly brokers: ReadonlyArray<string>
  /** Default client id; a consumer session's own `clientId` takes precedence. */
  readonly clientId?: string | undefined
  readonly ssl?: boolean | TlsOptions | undefined
  readonly sasl?: SaslOptions | undefined
  readonly connectionTimeout?: Duration.DurationInput | undefined
  readonly authenticationTimeout?: Duration.DurationInput | undefined
  readonly requestTimeout?: Duration.DurationInput | undefined
  /**
   * How kafkajs retries requests that failed retriably. Default: kafkajs's own, which for an idempotent producer
   * retries a write without end (the broker drops what it already has, so a retry cannot duplicate).
   */
  readonly retry?: RetryOptions | undefined
  /** What kafkajs itself logs, through Effect's logger. Default `"warn"`. */
  readonly logLevel?: LogLevel | undefined
}

/**
 * Connection settings and consumer tuning.
 *
 * @since 0.1.0
 * @category models
 */
export interface Config extends ConnectionConfig {
  /** How long the broker may hold a fetch when there is nothing new (kafkajs `maxWaitTimeInMs`). Default 500 ms. */
  readonly maxWaitTime?: Duration.DurationInput | undefined
  /** Default: a third of the session timeout, at most 3 seconds. */
  readonly heartbeatInterval?: Duration.DurationInput | undefined
  /** How many partitions' batches are handed over at the same time (kafkajs `partitionsConsumedConcurrently`). */
  readonly partitionsConsumedConcurrently?: number | undefined
  readonly minBytes?: number | undefined
  readonly maxBytes?: number | undefined
  readonly maxBytesPerPartition?: number | undefined
  /**
   * Read records of open and aborted transactions too, for sessions that do not say (a consumer's `isolationLevel`
   * takes precedence). Default `false` (read committed).
   */
  readonly readUncommitted?: boolean | undefined
  /**
   * How the group moves partitions (see `Driver.RebalanceProtocol`). kafkajs rebalances eagerly only: every rebalance
   * revokes every partition. `"cooperative"` and `"consumer"` need `Platformatic.layer` (or `InMemoryKafka`); given
   * here, they are refused with `InvalidConfig`.
   *
   * @since 0.3.0
   */
  readonly rebalance?: "eager" | undefined
}

/**
 * A record to produce with the `produce` helper: the `Producer`'s record without its topic. Without `partition`,
 * kafkajs's default (Java-compatible murmur2) partitioner picks one from the key.
 *
 * @since 0.1.0
 * @category models
 */
export type ProduceRecord = Omit<ProducerRecord, "topic">

/**
 * The `Driver` on kafkajs. The configuration is checked first: a malformed broker address or setting fails with a
 * `InvalidConfig` naming the field, before anything connects.
 *
 * What kafkajs allows this adapter to guarantee:
 *
 * - **Fetching is backpressured per fetch, one batch ahead.** Each kafkajs `eachBatch` call hands its records to
 *   `poll`; it returns at once when `poll` has returned every earlier batch of the partition, so that kafkajs fetches
 *   the next batch while the runloop reads this one, and otherwise once it has. kafkajs fetches again after every
 *   batch call of a fetch returned. A paused partition's batch calls return at once and the adapter keeps their
 *   records (returned first on resume, never fetched twice); after two such batches kafkajs stops fetching the
 *   partition until it is resumed. So a slow partition never holds the others' fetches, and what a consumer holds is
 *   bounded by its `bufferSize` plus two fetches (`maxBytesPerPartition`) per partition, whatever the backlog. A
 *   newly assigned partition is fetched only once the runloop has sought it (kafkajs would otherwise start at the
 *   group's committed offset on its own); when every partition waits for its seek, kafkajs's fetch loop sleeps up to
 *   `maxWaitTime` before it looks again.
 * - **Offsets with gaps.** Every `Records` event accounts for its offsets exactly (`from`, `next`): kafkajs drops
 *   transaction markers and aborted records from a batch (and resolves a batch that this leaves empty without handing
 *   it over); the adapter follows kafkajs's fetch position through both, so the `Records` after a gap start where
 *   the previous one ended, and the last `Records` of a batch ends after a trailing marker. A batch that starts
 *   elsewhere than kafkajs's known position is checked against the partition's log (admin `fetchTopicOffsets`):
 *   further on with the position still in the log, the offsets in between hold nothing to read; otherwise the
 *   position is out of range.
 * - **Out of range.** kafkajs resets a partition whose fetch answers OFFSET_OUT_OF_RANGE to its earliest offset
 *   without telling its user, and commits its default offset (-2) for the group. The adapter learns of it from
 *   kafkajs's log line ("Offset out of range, resetting to default offset"; it receives error-level lines whatever
 *   `logLevel` says), stops fetching the partition at once, and asks the cluster: a position outside the log gives
 *   `OutOfRange` (after the partition's records already fetched), a position back in range puts kafkajs back there.
 *   kafkajs's commit of -2 is sent with the group's committed position instead, when the session knows it (it read it
 *   with `committed`, or committed it), so only the runloop's commits move the group's positions.
 * - **Heartbeats continue** while records wait for `poll` and while a revoke is held; the runloop's processing
 *   time does not count against the session.
 * - **Revocation.** kafkajs uses the eager protocol and has no revoke callback: on every rebalance all owned
 *   partitions are revoked (`Revoked`), then the new assignment arrives (`Assigned`). Whatever the member is doing
 *   when the rebalance is noticed (handing records over, idle, every partition paused under a backlog, its workers busy
 *   with records already returned), kafkajs's JoinGroup request is held in the session's own socket layer until the
 *   runloop calls `release`. The coordinator completes a rebalance only when every member has sent its JoinGroup (or
 *   the rebalance timeout has passed), so no member is given any partition before this one released them. While it
 *   holds, kafkajs sends no heartbeats; the session sends them in its place, with the member's generation, and the
 *   coordinator answers REBALANCE_IN_PROGRESS and keeps the member, so a hold may outlast the session timeout. Commits
 *   made before `release` carry the generation the partitions belonged to; the coordinator accepts them while the
 *   group prepares the rebalance, and they are what the next owner starts from. After `release`, commits for the
 *   revoked partitions are refused (`NotOwned`). The hold ends by itself a heartbeat interval and a second before the
 *   rebalance timeout (counted from when the rebalance was noticed), with a warning: past it the group would go on
 *   without this member. Closing the session ends the hold too. Measured on Kafka 3.9.1 with a 6 s session timeout
 *   and an 8 s hold, idle and with every partition paused: the joining member was assigned 2 to 5 ms after `release`,
 *   every heartbeat of the hold was answered REBALANCE_IN_PROGRESS, and a commit at the end of the hold was accepted.
 *   Without the held JoinGroup the joining member was assigned 4 to 6 ms after `Revoked` (the two members overlapped
 *   for the whole hold); without the heartbeats the coordinator evicted the member after its 6 s session timeout.
 * - **Commits** are all or nothing. Partitions this member does not own are refused (`CommitFailed`, `NotOwned`,
 *   naming just those): kafkajs would send them with its current generation, which the broker accepts for any
 *   partition of the group. kafkajs retries a commit that fails retriably (coordinator moving, a timeout) with the
 *   generation current at each attempt; one that spans a rebalance could land for a partition that moved in between,
 *   which cannot be prevented from outside kafkajs. With the held JoinGroup that needs a coordinator failure during
 *   the commit, or a hold that ran out.
 * - **`offsets`** gives each partition's log start, high watermark (`latest`) and last stable offset (`lastStable`).
 *   kafkajs's admin sends ListOffsets read-committed, which answers the last stable offset; the high watermark is
 *   read through a second admin client of the session whose ListOffsets go out read-uncommitted. kafkajs's fetch
 *   position is judged out of range against the high watermark, as Kafka does.
 * - **Committed reads are stable.** kafkajs implements OffsetFetch v1 to v4 only, which cannot ask for stable offsets
 *   (`require_stable`, v7, KIP-447): a position read while a transaction that commits it completes would be the one
 *   before it. The session reads committed positions through an admin client of its own whose socket layer sends
 *   kafkajs's OffsetFetch v4 as v7 with `require_stable` (when the cluster lists v7: Kafka 2.5 and later; 3.9.1 and
 *   4.4.0 checked), for the partitions asked alone, and turns the answer back into v4. A partition whose
 *   transactional commit is pending fails `committed` with a retriable `DriverError` naming UNSTABLE_OFFSET_COMMIT.
 * - **Joining.** `connect` returns once the member has joined. While the group's coordinator loads its offsets
 *   (GROUP_LOAD_IN_PROGRESS, as a fresh Kafka 4 broker answers), moves or cannot be found, it waits for kafkajs's
 *   restart, or starts kafkajs again, for up to the rebalance timeout; then, or on a condition that does not pass,
 *   it fails with a `DriverError` (retriable for the former).
 * - **Lost.** A rejoin as a new member (the coordinator had evicted this one) or a crash of the kafkajs consumer ends
 *   the assignment with `Lost`. A crash kafkajs does not restart from fails `poll` with a `DriverError`.
 * - **Errors.** A `DriverError` is `retriable` when it goes away once the cluster is reachable again: a closed or
 *   refused connection, a request timeout, a broker, leader or coordinator moving, also after kafkajs gave up retrying
 *   them. An unknown topic, a refused authentication or authorization, or a bad setting is not.
 * - **`Subscription.Partitions`.** kafkajs has no manual assignment: the member joins `groupId` with an assignor that
 *   gives every member exactly the partitions it asked for, so commits land in that group and partitions never move.
 *   All members of such a group must use `Partitions` (kafkajs rejects a group mixing assignors). Another member
 *   joining makes kafkajs rejoin; the adapter puts each partition back at the runloop's position, and commits made
 *   during that short rebalance fail as retriable.
 * - Topics must exist before a session subscribes to them (`createTopic`).
 * - The SASL password stays `Redacted` until a kafkajs client is built, and no log line (kafkajs's own included) or
 *   error of this module carries it.
 *
 * @since 0.1.0
 * @category layers
 */
export const layer = (config: Config): Layer.Layer<Driver, InvalidConfig> =>
  Layer.effect(
    Driver,
    Effect.gen(function*() {
      const runtime = yield* Effect.runtime<never>()
      const client = yield* internal.makeClientConfig(config, runtime)
      const maxWaitTimeInMs = (yield* internal.positiveMillis("maxWaitTime", config.maxWaitTime)) ?? 500
      const heartbeatInterval = yield* internal.positiveMillis("heartbeatInterval", config.heartbeatInterval)
      const partitionsConsumedConcurrently = (yield* internal.positiveInteger(
        "partitionsConsumedConcurrently",
        config.partitionsConsumedConcurrently
      )) ?? 16
      const settings: session.ConsumerSettings = {
        client,
        maxWaitTimeInMs,
        heartbeatInterval,
        partitionsConsumedConcurrently,
        minBytes: yield* internal.positiveInteger("minBytes", config.minBytes),
        maxBytes: yield* internal.positiveInteger("maxBytes", config.maxBytes),
        maxBytesPerPartition: yield* internal.positiveInteger("maxBytesPerPartition", config.maxBytesPerPartition),
        readUncommitted: config.readUncommitted ?? false
      }
      yield* internal.rebalanceProtocol(config.rebalance, ["eager"], {
        cooperative: "kafkajs rebalances eagerly only; \"cooperative\" needs Platformatic.layer",
        consumer: "kafkajs rebalances eagerly only; \"consumer\" (KIP-848) needs InMemoryKafka"
      })
      return Driver.of({ connect: (options) => session.connect(settings, options) })
    })
  )

/**
 * Connection settings and producer settings (see `Producer.Settings` for what each means).
 *
 * @since 0.1.0
 * @category models
 */
export interface ProducerConfig extends ConnectionConfig, ProducerSettings {}

/**
 * The `Producer` on kafkajs. Settings are checked first (`InvalidConfig` naming the setting, before anything
 * connects); then a kafkajs producer and admin client connect (`DriverError` when the cluster cannot be reached).
 *
 * - Records from every fiber are batched as `Producer` says. A batch is sent with one kafkajs `sendBatch` per leader
 *   of its partitions (as the admin client last read them; one for the whole batch on a single broker), each one
 *   produce request, answered on its own: a leader that refuses its records, or cannot be reached, fails only them.
 * - Partitions are chosen here (murmur2 of the key as in Java; one partition per batch for records without a key),
 *   from partition counts the admin client reads; kafkajs's partitioner is not used. A record for a topic that does
 *   not exist fails with `UnknownTopic` (kafkajs never asks the cluster to create topics), one naming a partition the
 *   topic does not have with `UnknownPartition`, without failing the others of its batch.
 * - A request the broker refuses fails each of its records with the same `ProduceFailed`, classified by the broker's
 *   error (`code`). kafkajs retries retriable refusals first, without end for an idempotent producer unless `retry`
 *   says otherwise. The broker answers per partition, but kafkajs keeps only the first partition's error and drops the
 *   rest of the answer, though the partitions without an error were written: when a request of several partitions is
 *   refused that way, its records fail with `OutcomeUnknown`, and a `detail` that begins "outcome unknown" (each may or
 *   may not have been written; sending it again can duplicate it), unless the reason already says as much (`retriable`).
 * - Compression: `"gzip"` (kafkajs has the other codecs only as plugins).
 *
 * @since 0.1.0
 * @category layers
 */
export const layerProducer = (config: ProducerConfig): Layer.Layer<Producer, InvalidConfig | DriverError> =>
  Layer.scoped(
    Producer,
    Effect.gen(function*() {
      const resolved = yield* producerInternal.resolve(config)
      const runtime = yield* Effect.runtime<never>()
      const { retry, ...connection } = config
      const client = yield* internal.makeClientConfig(
        { ...connection, ...(retry === undefined ? {} : { retry }) },
        runtime
      )
      return yield* kafkajsProducer.make(client, resolved, retry?.retries)
    })
  )

/**
 * Connection settings and transactional producer settings (see `Producer.TransactionalSettings`).
 *
 * @since 0.1.0
 * @category models
 */
export interface TransactionalProducerConfig extends ConnectionConfig, TransactionalSettings {}

/**
 * Transactional producers on kafkajs, made on demand (see `layerTransactionalProducer`), sharing one kafkajs client and
 * one admin connection; what `CommitPolicy.kafkaTransactional` needs.
 *
 * @since 0.1.0
 * @category layers
 */
export const layerTransactionalProducers = (
  config: Omit<TransactionalProducerConfig, "transactionalId">
): Layer.Layer<TransactionalProducers, InvalidConfig | DriverError> =>
  Layer.scoped(
    TransactionalProducers,
    Effect.gen(function*() {
      const { resolved, transactionTimeout } = yield* producerInternal.resolveTransactional(config)
      const runtime = yield* Effect.runtime<never>()
      const { retry, ...connection } = config
      const client = yield* internal.makeClientConfig(
        { ...connection, ...(retry === undefined ? {} : { retry }) },
        runtime
      )
      return yield* kafkajsTransactional.makeTransactionClients(
        client,
        resolved,
        Duration.toMillis(transactionTimeout),
        retry?.retries
      )
    })
  )

/**
 * A `TransactionalProducer` on kafkajs: one kafkajs producer with the transactional id, idempotent, one batch in
 * flight. Starting the layer fences earlier producers with the same id (kafkajs's InitProducerId, sent by an empty
 * transaction that is aborted at once); each `transaction` is a kafkajs transaction, whose sends are batched and
 * partitioned as `layerProducer`'s are.
 *
 * @since 0.1.0
 * @category layers
 */
export const layerTransactionalProducer = (
  config: TransactionalProducerConfig
): Layer.Layer<TransactionalProducer, InvalidConfig | DriverError | TransactionFailed> =>
  singleTransactional(config, layerTransactionalProducers)

/**
 * Checks broker addresses the way `layer` does: `host:port,host:port` as one string (as `KAFKA_BROKERS` is usually
 * written) or a list.
 *
 * @since 0.1.0
 * @category config
 */
export const parseBrokers = (
  brokers: string | ReadonlyArray<string>
): Effect.Effect<ReadonlyArray<string>, InvalidConfig> => internal.parseBrokers(brokers)

/**
 * Creates a topic and waits until its partitions have leaders. Succeeds when the topic already exists.
 *
 * @since 0.1.0
 * @category admin
 */
export const createTopic = (
  brokers: string | ReadonlyArray<string>,
  topic: string,
  partitions: number
): Effect.Effect<void, InvalidConfig | DriverError> => admin.createTopic(brokers, topic, partitions)

/**
 * Produces records to a topic with acknowledgement from all in-sync replicas, in batches, and waits until all are
 * written. Records for the same partition are written in the order given.
 *
 * @since 0.1.0
 * @category admin
 */
export const produce = (
  brokers: string | ReadonlyArray<string>,
  topic: string,
  records: Iterable<ProduceRecord>
): Effect.Effect<void, InvalidConfig | DriverError> => admin.produce(brokers, topic, records)

/**
 * The last stable offset of every partition of a topic: how far a `read_committed` consumer can read (the high
 * watermark, the offset the next record will get, when no transaction is open on the partition).
 *
 * @since 0.1.0
 * @category admin
 */
export const endOffsets = (
  brokers: string | ReadonlyArray<string>,
  topic: string
): Effect.Effect<ReadonlyMap<number, bigint>, InvalidConfig | DriverError> => admin.endOffsets(brokers, topic)
