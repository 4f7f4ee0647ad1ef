/**
 * Kafka consumers as Effect programs, with the delivery guarantee as a named, composable choice.
 *
 * @since 0.1.0
 */

/**
 * Typed records: Schema codecs for keys, values and headers, on both sides.
 *
 * @since 0.1.0
 */
export * as Codec from "./Codec.js"

/**
 * Commit policies as layers: `atMostOnce`, `autoCommit`, `commitAfter`, `transactional`.
 *
 * @since 0.1.0
 */
export * as CommitPolicy from "./CommitPolicy.js"

/**
 * The consumer: `run`, `runEach`, `partitions`, `records`.
 *
 * @since 0.1.0
 */
export * as Consumer from "./Consumer.js"

/**
 * Records as the handler sees them.
 *
 * @since 0.1.0
 */
export * as ConsumerRecord from "./ConsumerRecord.js"

/**
 * The low-level client contract kept by the kafkajs driver and the in-memory broker.
 *
 * @since 0.1.0
 */
export * as Driver from "./Driver.js"

/**
 * Where records that keep failing go: stop, or a dead-letter topic.
 *
 * @since 0.1.0
 */
export * as FailureRoute from "./FailureRoute.js"

/**
 * Crash injection points.
 *
 * @since 0.1.0
 */
export * as Faults from "./Faults.js"

/**
 * An in-memory Kafka: the test kit.
 *
 * @since 0.1.0
 */
export * as InMemoryKafka from "./InMemoryKafka.js"

/**
 * Typed errors.
 *
 * @since 0.1.0
 */
export * as KafkaError from "./KafkaError.js"

/**
 * Positions merged by highest per partition.
 *
 * @since 0.1.0
 */
export * as OffsetBatch from "./OffsetBatch.js"

/**
 * Metrics, spans, consumer lag and trace context, with Effect's `Metric` and `Tracer`.
 *
 * @since 0.1.0
 */
export * as Observability from "./Observability.js"

/**
 * The offset store service, with memory and file layers.
 *
 * @since 0.1.0
 */
export * as OffsetStore from "./OffsetStore.js"

/**
 * The offset store on Postgres.
 *
 * @since 0.1.0
 */
export * as PgOffsetStore from "./PgOffsetStore.js"

/**
 * The producer: `send`, `sendAll`, `flush`, with acks and idempotence as named settings.
 *
 * @since 0.1.0
 */
export * as Producer from "./Producer.js"

/**
 * Topic partitions.
 *
 * @since 0.1.0
 */
export * as TopicPartition from "./TopicPartition.js"
