/**
 * Metrics, spans, consumer lag and trace context for consumers and producers, with Effect's own `Metric` and
 * `Tracer`. Nothing is recorded unless `Observability.layer` is provided: without it the consumer and the producer do
 * none of this work (one check when a consumer starts, one per send).
 *
 * With the layer:
 *
 * - **metrics** go to Effect's metric registry, which an exporter reads (`@effect/opentelemetry`'s metric reader, or
 *   `Metric.snapshot`). Names follow OpenTelemetry's messaging semantic conventions where they define one
 *   (`messaging.client.consumed.messages`, `messaging.process.duration`, `messaging.client.sent.messages`,
 *   `messaging.client.operation.duration`); the others are `kafka.consumer.*` and `kafka.producer.*`. Every metric
 *   carries `messaging.system` (`kafka`) and, where they apply, `messaging.consumer.group.name`,
 *   `messaging.destination.name` (the topic) and `messaging.destination.partition.id`. Durations are in seconds. See
 *   {@link metrics} for each one and what to alert on.
 * - **spans** go to the `Tracer` of the program (`@effect/opentelemetry`'s, or Effect's own, which keeps nothing): a
 *   span for the consumer's life, a child span per chunk handled (`process <topic>`), one per commit (`commit`) and
 *   per unit of an offset store or a Kafka transaction (`store <topic>`, `transaction <topic>`), and one per send of
 *   the producer (`send <topic>`).
 * - **trace context**: the producer writes the W3C `traceparent` of its send span into each record's headers (unless
 *   the record has one), and the consumer links each chunk's span to the spans its records name, so that a trace
 *   leads from the producer's span to the handler's.
 * - **lag**: each consumer reads, every `lagInterval`, its partitions' latest offsets (the high watermark, or the last
 *   stable offset when reading `read_committed`) on a fiber of its own, off the poll loop, and reports the lag behind
 *   its committed or stored position: as the `kafka.consumer.lag` gauge and as snapshots on {@link lag}.
 *
 * @since 0.1.0
 */
import * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Metric from "effect/Metric"
import * as MetricBoundaries from "effect/MetricBoundaries"
import * as PubSub from "effect/PubSub"
import * as Stream from "effect/Stream"
import * as config from "./internal/shared/config.js"
import type { InvalidConfig } from "./KafkaError.js"

/**
 * @since 0.1.0
 * @category models
 */
export interface Options {
  /** Record metrics. Default `true`. */
  readonly metrics?: boolean | undefined
  /** Make spans. Default `true`. */
  readonly spans?: boolean | undefined
  /**
   * Write the send span's `traceparent` into produced records' headers, and link a chunk's span to the spans its
   * records name. Default `true`; it needs `spans`.
   */
  readonly traceContext?: boolean | undefined
  /** How often each consumer reads its partitions' latest offsets to report its lag. Default 5 seconds. */
  readonly lagInterval?: Duration.DurationInput | undefined
}

/**
 * One partition's lag: how many offsets lie between the consumer group's committed (or stored) position and the
 * partition's latest offset. Offsets that hold nothing to read (transaction markers) count too, as in Kafka's own
 * tools.
 *
 * @since 0.1.0
 * @category models
 */
export interface PartitionLag {
  readonly topic: string
  readonly partition: number
  /** The position committed or stored last (the next offset to read), or where the partition started. */
  readonly position: bigint
  /** The partition's latest offset: its high watermark, or its last stable offset when reading `read_committed`. */
  readonly latest: bigint
  /** `latest - position`, never below 0. */
  readonly lag: bigint
}

/**
 * What one member of a group owed at one moment: the lag of every partition it owns.
 *
 * @since 0.1.0
 * @category models
 */
export interface LagSnapshot {
  readonly groupId: string
  readonly memberId: string
  /** Milliseconds since the epoch, on the consumer's clock. */
  readonly at: number
  /**
   * The member's partitions, by topic and partition; empty once the member owns none. A session's last snapshot, when
   * it ends, is empty; so is the last one of a member id the session left behind when it rejoined under a new one.
   */
  readonly partitions: ReadonlyArray<PartitionLag>
}

/**
 * The observability settings and the lag snapshots of the consumers that run with them.
 *
 * @since 0.1.0
 * @category tags
 */
export class Observability extends Context.Tag("effect-kafka-delivery/Observability")<Observability, {
  readonly metrics: boolean
  readonly spans: boolean
  readonly traceContext: boolean
  readonly lagInterval: Duration.Duration
  /**
   * Every snapshot reported from now on, after the latest of each member that owns partitions: a member that ended
   * (or owns none at the moment) is not among them.
   */
  readonly lag: Stream.Stream<LagSnapshot>
  /** What a consumer calls with its snapshot. */
  readonly report: (snapshot: LagSnapshot) => Effect.Effect<void>
}>() {}

/**
 * Turns observability on for the consumers and producers that run with it. Bad options fail with a `InvalidConfig`
 * naming the option.
 *
 * @since 0.1.0
 * @category layers
 */
export const layer = (options: Options = {}): Layer.Layer<Observability, InvalidConfig> =>
  Layer.scoped(
    Observability,
    Effect.gen(function*() {
      const lagInterval = yield* config.positiveDuration(
        "Observability.lagInterval",
        options.lagInterval ?? Duration.seconds(5)
      )
      const metrics = options.metrics ?? true
      const spans = options.spans ?? true
      const snapshots = yield* Effect.acquireRelease(PubSub.sliding<LagSnapshot>(1_024), PubSub.shutdown)
      const latest = new Map<string, LagSnapshot>()
      return {
        metrics,
        spans,
        traceContext: spans && (options.traceContext ?? true),
        lagInterval,
        lag: Stream.unwrapScoped(Effect.map(PubSub.subscribe(snapshots), (subscription) =>
          Stream.concat(Stream.fromIterable(Array.from(latest.values())), Stream.fromQueue(subscription)))),
        report: (snapshot) =>
          Effect.suspend(() => {
            // A member that owns nothing has no lag to show a later subscriber, and one that ended (its last snapshot
            // owns nothing) reports nothing more: keeping it would grow the map with every restart and rejoin.
            const key = `${snapshot.groupId}\u0000${snapshot.memberId}`
            if (snapshot.partitions.length === 0) {
              latest.delete(key)
            } else latest.set(key, snapshot)
            return PubSub.publish(snapshots, snapshot)
          })
      }
    })
  )

/**
 * The lag snapshots of the consumers running with `Observability.layer`: the latest of each member that owns
 * partitions first (members that ended are forgotten), then each one as it is reported. With `groupId`, only that
 * group's.
 *
 * @since 0.1.0
 * @category lag
 */
export const lag = (options: { readonly groupId?: string } = {}): Stream.Stream<LagSnapshot, never, Observability> =>
  Stream.unwrap(Effect.map(Observability, (observability) =>
    options.groupId === undefined
      ? observability.lag
      : Stream.filter(observability.lag, (snapshot) => snapshot.groupId === options.groupId)))

/** Seconds, from half a millisecond to a minute. */
const seconds = MetricBoundaries.exponential({ start: 0.0005, factor: 2, count: 18 })

/**
 * The metrics, each with the labels it carries and what to watch it for. Read one with `Metric.value` (tagged with
 * the labels of the series) or export them all with `@effect/opentelemetry`.
 *
 * Labels: `messaging.system` (always `kafka`), `messaging.consumer.group.name` (group), `messaging.destination.name`
 * (topic), `messaging.destination.partition.id` (partition, as a string), `error.type` (a failure's tag or reason),
 * `kafka.rebalance.event` (`assigned`, `revoked`, `lost`), `kafka.transaction.outcome` (`committed`, `aborted`).
 *
 * @since 0.1.0
 * @category metrics
 */
export const metrics = {
  /**
   * Records fetched and handed to the consumer (group, topic, partition). Its rate is what the consumer takes in; set
   * beside `kafka.consumer.lag`.
   */
  consumedMessages: Metric.counter("messaging.client.consumed.messages", {
    description: "Records fetched and handed to the consumer",
    incremental: true
  }),
  /**
   * Records whose handling finished (group, topic, partition): the chunk or unit they were in succeeded, or they were
   * routed by the failure route. Alert when its rate falls to 0 while `kafka.consumer.lag` grows: the consumer is stuck.
   */
  handledRecords: Metric.counter("kafka.consumer.handled.records", {
    description: "Records whose handling finished",
    incremental: true
  }),
  /**
   * Seconds per handler call (group, topic, partition; `error.type` when it failed): a chunk under `Consumer.run`, a
   * record or a few of one key under `runEach`. Watch its high quantiles against `revokeTimeout` and the session.
   */
  processDuration: Metric.histogram(
    "messaging.process.duration",
    seconds,
    "Seconds per handler call (a chunk, or the records of one key)"
  ),
  /**
   * Handler calls that failed (group, topic, partition, `error.type`), retried ones included. A rate above 0 for long
   * means a dependency is down or records are poison: see the failure route.
   */
  handlerFailures: Metric.counter("kafka.consumer.handler.failures", {
    description: "Handler calls that failed, retries included",
    incremental: true
  }),
  /** Records per handler call (group, topic, partition). */
  chunkRecords: Metric.histogram(
    "kafka.consumer.chunk.records",
    MetricBoundaries.exponential({ start: 1, factor: 2, count: 14 }),
    "Records per handler call"
  ),
  /** Commits of positions to Kafka that landed (group). */
  commits: Metric.counter("kafka.consumer.commits", {
    description: "Commits of positions that landed",
    incremental: true
  }),
  /** Seconds per commit to Kafka, retries inside it included (group). */
  commitDuration: Metric.histogram("kafka.consumer.commit.duration", seconds, "Seconds per commit of positions"),
  /**
   * Commits refused (group, `error.type`: the `CommitFailed` reason). Retriable reasons during a rebalance are normal;
   * `Unauthorized` or a steady rate of any other is worth an alert.
   */
  commitFailures: Metric.counter("kafka.consumer.commit.failures", {
    description: "Commits of positions that were refused",
    incremental: true
  }),
  /** Units of an offset store or Kafka transactions of the consumer that committed (group, topic, partition). */
  units: Metric.counter("kafka.consumer.units", {
    description: "Store units and Kafka transactions that committed",
    incremental: true
  }),
  /** Seconds per unit, the handler inside it included (group, topic, partition; `error.type` when it failed). */
  unitDuration: Metric.histogram(
    "kafka.consumer.unit.duration",
    seconds,
    "Seconds per store unit or Kafka transaction"
  ),
  /**
   * Units refused because another member owns the partition now (group, topic, partition): a zombie's late unit. A
   * few during rebalances are the fence at work; a steady rate means members keep stalling past their session.
   */
  unitsFenced: Metric.counter("kafka.consumer.units.fenced", {
    description: "Store units and Kafka transactions fenced by a newer owner",
    incremental: true
  }),
  /**
   * Partitions assigned, revoked and lost (group, topic, `kafka.rebalance.event`). `lost` means the member was
   * evicted (its session expired): alert on it.
   */
  rebalancePartitions: Metric.counter("kafka.consumer.rebalance.partitions", {
    description: "Partitions assigned, revoked and lost",
    incremental: true
  }),
  /** Partitions of the member paused because their records are not handled fast enough (group), sampled. */
  pausedPartitions: Metric.gauge("kafka.consumer.paused.partitions", {
    description: "Partitions paused for back-pressure, sampled every lagInterval"
  }),
  /** Records fetched and not handled yet (group, topic, partition), sampled. */
  bufferedRecords: Metric.gauge("kafka.consumer.buffered.records", {
    description: "Records fetched and not yet handled, sampled every lagInterval"
  }),
  /**
   * Offsets between the committed or stored position and the latest offset (group, topic, partition), every
   * `lagInterval`. The one to alert on: growing for minutes means the consumer does not keep up.
   */
  lag: Metric.gauge("kafka.consumer.lag", {
    description: "Offsets between the committed or stored position and the partition's latest offset"
  }),
  /** Records the failure route wrote to a retry or dead-letter topic (group, the route's topic as destination). */
  routedRecords: Metric.counter("kafka.consumer.routed.records", {
    description: "Records written to a retry or dead-letter topic by the failure route",
    incremental: true
  }),
  /** Records the producer wrote and the broker acknowledged (topic). */
  sentMessages: Metric.counter("messaging.client.sent.messages", {
    description: "Records written and acknowledged",
    incremental: true
  }),
  /**
   * Bytes of the records written (topic), as the producer counts them against `batchSize`: keys, values, headers,
   * and an estimate of a record's framing (21 bytes).
   */
  sentBytes: Metric.counter("kafka.producer.sent.bytes", {
    description: "Bytes of the records written: keys, values, headers and framing",
    incremental: true
  }),
  /** Seconds per `send` or `sendAll`, until answered (topic of its first record; `error.type` when it failed). */
  operationDuration: Metric.histogram(
    "messaging.client.operation.duration",
    seconds,
    "Seconds per send, until every record of it is answered"
  ),
  /** Records the producer could not write (topic, `error.type`: the `ProduceFailed` reason). Alert on any rate. */
  producerErrors: Metric.counter("kafka.producer.errors", {
    description: "Records that could not be written",
    incremental: true
  }),
  /**
   * Kafka transactions that ended (`kafka.transaction.outcome`). Aborts come with handler failures and fences; a
   * rate of aborts with no failure behind it is worth a look.
   */
  transactions: Metric.counter("kafka.producer.transactions", {
    description: "Kafka transactions committed and aborted",
    incremental: true
  })
} as const
