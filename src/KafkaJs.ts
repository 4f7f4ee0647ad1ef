/**
 * The `Driver` on kafkajs, for a real Kafka cluster, plus a few admin helpers (create a topic, produce, read end
 * offsets) for tests, examples and the demo. This is the only module that imports `kafkajs`; none of its types
 * appear in the signatures below.
 *
 * @since 0.1.0
 */
import type * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import { Partitioners } from "kafkajs"
import type { Message } from "kafkajs"
import { Driver } from "./Driver.js"
import type { ConfigError } from "./KafkaError.js"
import { DriverError } from "./KafkaError.js"
import * as internal from "./internal/kafkajs.js"
import * as session from "./internal/kafkajsSession.js"

/**
 * TLS settings for the broker connections: PEM strings, as Node's `tls.connect` takes them.
 *
 * @since 0.1.0
 * @category models
 */
export interface TlsOptions extends internal.TlsOptions {}

/**
 * SASL credentials.
 *
 * @since 0.1.0
 * @category models
 */
export type SaslOptions = internal.SaslOptions

/**
 * How kafkajs retries requests that fail with retriable errors (exponential backoff with jitter).
 *
 * @since 0.1.0
 * @category models
 */
export interface RetryOptions extends internal.RetryConfig {}

/**
 * Connection settings, passed through to kafkajs, and consumer tuning. Durations accept anything
 * `Duration.decode` does (a number is milliseconds).
 *
 * @since 0.1.0
 * @category models
 */
export interface Config extends internal.ConnectionConfig {
  /** How long the broker may hold a fetch when there is nothing new (kafkajs `maxWaitTimeInMs`). Default 500 ms. */
  readonly maxWaitTime?: Duration.DurationInput | undefined
  /** Default: a third of the session timeout, at most 3 seconds. */
  readonly heartbeatInterval?: Duration.DurationInput | undefined
  /** How many partitions' batches are handed over at the same time (kafkajs `partitionsConsumedConcurrently`). */
  readonly partitionsConsumedConcurrently?: number | undefined
  readonly minBytes?: number | undefined
  readonly maxBytes?: number | undefined
  readonly maxBytesPerPartition?: number | undefined
  /** Read records of open and aborted transactions too. Default `false` (read committed). */
  readonly readUncommitted?: boolean | undefined
}

/**
 * A record to produce. Without `partition`, kafkajs's default (Java-compatible murmur2) partitioner picks one from
 * the key.
 *
 * @since 0.1.0
 * @category models
 */
export interface ProduceRecord {
  readonly partition?: number | undefined
  readonly key?: string | Uint8Array | null | undefined
  readonly value: string | Uint8Array | null
  readonly headers?: Readonly<Record<string, string | Uint8Array>> | undefined
}

/**
 * The `Driver` on kafkajs. The configuration is checked first: a malformed broker address or setting fails with a
 * `ConfigError` naming the field, before anything connects.
 *
 * What kafkajs allows this adapter to guarantee:
 *
 * - **Fetching is backpressured per fetch.** Each kafkajs `eachBatch` call hands its records to `poll` and returns
 *   only once `poll` has returned them; kafkajs fetches again after every batch of a fetch was handed over. A paused
 *   partition's batch calls return at once and the adapter keeps their records (returned first on resume, never
 *   fetched twice); after two such batches kafkajs stops fetching the partition until it is resumed. So a slow
 *   partition never holds the others' fetches, and what a consumer holds is bounded by its `bufferSize` plus two
 *   fetches (`maxBytesPerPartition`) per partition, whatever the backlog.
 * - **Heartbeats continue** while records wait for `poll` and while a revoke is held; the runloop's processing
 *   time does not count against the session.
 * - **Revocation.** kafkajs uses the eager protocol and has no revoke callback: on every rebalance all owned
 *   partitions are revoked (`Revoked`), then the new assignment arrives (`Assigned`). When the rebalance is noticed
 *   by a heartbeat inside a batch call (records were being handed over, or just had been), the call holds kafkajs's
 *   rejoin until the runloop calls `release`, bounded by the rebalance timeout; commits made before `release` use the
 *   generation the partitions belonged to and are visible to the next owner.
 *   When it is noticed while no batch call runs (an idle member, or every partition paused), kafkajs has already
 *   started to rejoin when `Revoked` is emitted and does not wait: the partitions can move before `release`, and a
 *   commit for a partition that moved fails with a non-retriable `CommitFailed` (the records are then delivered
 *   again to the next owner: duplicates, never loss). Use an offset store (`transactional`) where that matters.
 * - **Commits for partitions this member does not own are refused** (`CommitFailed`, `IllegalGeneration`): kafkajs
 *   would send them with its current generation, which the broker accepts for any partition of the group. A commit
 *   that kafkajs retries internally (coordinator moving) could still land after a rebalance; that cannot be
 *   prevented from outside kafkajs.
 * - **Lost.** A rejoin that was not announced (an evicted member, a metadata change) or a crash of the kafkajs
 *   consumer ends the assignment with `Lost`. A crash kafkajs does not restart from fails `poll` with a
 *   `DriverError`.
 * - **`Subscription.Partitions`.** kafkajs has no manual assignment: the member joins `groupId` with an assignor that
 *   gives every member exactly the partitions it asked for, so commits land in that group and partitions never move.
 *   All members of such a group must use `Partitions` (kafkajs rejects a group mixing assignors). Another member
 *   joining makes kafkajs rejoin; the adapter puts each partition back at the runloop's position, and commits made
 *   during that short rebalance fail as retriable.
 * - Topics must exist before a session subscribes to them (`createTopic`).
 *
 * @since 0.1.0
 * @category layers
 */
export const layer = (config: Config): Layer.Layer<Driver, ConfigError> =>
  Layer.effect(
    Driver,
    Effect.gen(function*() {
      const runtime = yield* Effect.runtime<never>()
      const kafka = yield* internal.makeKafkaConfig(config, runtime)
      const maxWaitTimeInMs = (yield* internal.positiveMillis("maxWaitTime", config.maxWaitTime)) ?? 500
      const heartbeatInterval = yield* internal.positiveMillis("heartbeatInterval", config.heartbeatInterval)
      const partitionsConsumedConcurrently = (yield* internal.positiveInteger(
        "partitionsConsumedConcurrently",
        config.partitionsConsumedConcurrently
      )) ?? 16
      const settings: session.ConsumerSettings = {
        kafka,
        maxWaitTimeInMs,
        heartbeatInterval,
        partitionsConsumedConcurrently,
        minBytes: yield* internal.positiveInteger("minBytes", config.minBytes),
        maxBytes: yield* internal.positiveInteger("maxBytes", config.maxBytes),
        maxBytesPerPartition: yield* internal.positiveInteger("maxBytesPerPartition", config.maxBytesPerPartition),
        readUncommitted: config.readUncommitted ?? false
      }
      return Driver.of({ connect: (options) => session.connect(settings, options) })
    })
  )

/**
 * Checks broker addresses the way `layer` does: `host:port,host:port` as one string (as `KAFKA_BROKERS` is usually
 * written) or a list.
 *
 * @since 0.1.0
 * @category config
 */
export const parseBrokers = (
  brokers: string | ReadonlyArray<string>
): Effect.Effect<ReadonlyArray<string>, ConfigError> => internal.parseBrokers(brokers)

const adminClient = (brokers: string | ReadonlyArray<string>, clientId: string) =>
  Effect.gen(function*() {
    const list = yield* internal.parseBrokers(brokers)
    const runtime = yield* Effect.runtime<never>()
    const config = yield* internal.makeKafkaConfig({ brokers: list, clientId }, runtime)
    return internal.makeClient(config)
  })

/** Closing a helper's connection is bounded and cannot fail the helper: its work is done by then. */
const disconnect = (close: () => Promise<void>): Effect.Effect<void> =>
  Effect.tryPromise({ try: close, catch: internal.driverError("disconnect") }).pipe(
    Effect.timeoutOption("5 seconds"),
    Effect.ignore
  )

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
): Effect.Effect<void, ConfigError | DriverError> =>
  Effect.gen(function*() {
    if (topic.length === 0) return yield* new DriverError({ operation: "createTopic", reason: "empty topic name" })
    if (!Number.isInteger(partitions) || partitions < 1) {
      return yield* new DriverError({ operation: "createTopic", reason: `invalid partition count ${partitions}` })
    }
    const client = yield* adminClient(brokers, "effect-kafka-admin")
    const admin = client.admin()
    yield* Effect.acquireRelease(
      Effect.tryPromise({ try: () => admin.connect(), catch: internal.driverError("createTopic") }),
      () => disconnect(() => admin.disconnect())
    )
    yield* Effect.tryPromise({
      try: () => admin.createTopics({ topics: [{ topic, numPartitions: partitions }], waitForLeaders: false }),
      catch: internal.driverError("createTopic")
    })
    // kafkajs's own wait for leaders gives up on the UNKNOWN_TOPIC_OR_PARTITION a KRaft broker answers until its
    // metadata has caught up with the new topic; wait here until every partition has a leader.
    const ready = Effect.tryPromise({
      try: () => admin.fetchTopicMetadata({ topics: [topic] }),
      catch: internal.driverError("createTopic")
    }).pipe(
      Effect.map(({ topics }) => {
        const found = topics.find((t) => t.name === topic)
        return found !== undefined && found.partitions.length >= partitions &&
          found.partitions.every((p) => p.leader >= 0)
      }),
      Effect.catchAll(() => Effect.succeed(false))
    )
    const led = yield* ready.pipe(
      Effect.repeat({ schedule: Schedule.spaced("100 millis"), until: (ok) => ok }),
      Effect.timeoutOption("30 seconds")
    )
    if (Option.isNone(led)) {
      return yield* new DriverError({
        operation: "createTopic",
        reason: `${topic} was created but its partitions had no leaders within 30 seconds`
      })
    }
  }).pipe(Effect.scoped)

const toMessage = (record: ProduceRecord): Message => {
  const message: Message = { value: record.value === null ? null : internal.toBuffer(record.value) }
  if (record.partition !== undefined) message.partition = record.partition
  if (record.key !== undefined) message.key = record.key === null ? null : internal.toBuffer(record.key)
  if (record.headers !== undefined) {
    const headers: Record<string, Buffer | string> = {}
    for (const [name, value] of Object.entries(record.headers)) headers[name] = internal.toBuffer(value)
    message.headers = headers
  }
  return message
}

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
): Effect.Effect<void, ConfigError | DriverError> =>
  Effect.gen(function*() {
    const messages = Array.from(records, toMessage)
    if (messages.length === 0) return
    const client = yield* adminClient(brokers, "effect-kafka-producer")
    const producer = client.producer({
      createPartitioner: Partitioners.DefaultPartitioner,
      allowAutoTopicCreation: false,
      idempotent: true,
      maxInFlightRequests: 1
    })
    yield* Effect.acquireRelease(
      Effect.tryPromise({ try: () => producer.connect(), catch: internal.driverError("produce") }),
      () => disconnect(() => producer.disconnect())
    )
    const batchSize = 1000
    for (let start = 0; start < messages.length; start += batchSize) {
      yield* Effect.tryPromise({
        try: () => producer.send({ topic, acks: -1, messages: messages.slice(start, start + batchSize) }),
        catch: internal.driverError("produce")
      })
    }
  }).pipe(Effect.scoped)

/**
 * The end offset (high watermark: the offset the next record will get) of every partition of a topic.
 *
 * @since 0.1.0
 * @category admin
 */
export const endOffsets = (
  brokers: string | ReadonlyArray<string>,
  topic: string
): Effect.Effect<ReadonlyMap<number, bigint>, ConfigError | DriverError> =>
  Effect.gen(function*() {
    const client = yield* adminClient(brokers, "effect-kafka-admin")
    const admin = client.admin()
    yield* Effect.acquireRelease(
      Effect.tryPromise({ try: () => admin.connect(), catch: internal.driverError("endOffsets") }),
      () => disconnect(() => admin.disconnect())
    )
    const offsets = yield* Effect.tryPromise({
      try: () => admin.fetchTopicOffsets(topic),
      catch: internal.driverError("endOffsets")
    })
    return new Map(offsets.map(({ partition, high }) => [partition, BigInt(high)] as const))
  }).pipe(Effect.scoped)
