/**
 * Observability: `Observability.layer` turns on the consumer's and the producer's metrics, spans and lag, and
 * `@effect/opentelemetry` exports them. Here to exporters in this process (OpenTelemetry's in-memory span and metric
 * exporters), read back and printed: one order's trace, from the checkout that sent it to the chunk that handled it,
 * and the metrics as a metric reader collects them. Point the same layer at an OTLP collector in production.
 *
 *   npx tsx examples/15-observability.ts
 */
import { NodeSdk } from "@effect/opentelemetry"
import { NodeRuntime } from "@effect/platform-node"
import {
  AggregationTemporality,
  InMemoryMetricExporter,
  PeriodicExportingMetricReader
} from "@opentelemetry/sdk-metrics"
import { InMemorySpanExporter, type ReadableSpan, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base"
import { CommitPolicy, Consumer, ConsumerRecord, Observability, Producer } from "effect-kafka-delivery"
import * as Console from "effect/Console"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Stream from "effect/Stream"
import * as Broker from "./broker.js"

const spans = new InMemorySpanExporter()
const metrics = new PeriodicExportingMetricReader({
  exporter: new InMemoryMetricExporter(AggregationTemporality.CUMULATIVE),
  exportIntervalMillis: 60_000
})
const Telemetry = NodeSdk.layer(() => ({
  resource: { serviceName: "orders" },
  spanProcessor: new SimpleSpanProcessor(spans),
  metricReader: metrics
}))

const program = Effect.gen(function*() {
  const topics = yield* Broker.Topics
  const topic = Broker.unique("orders")
  const groupId = Broker.unique("billing")
  yield* topics.create(topic, 3)

  // Ten checkouts, each in a span of its own; the producer writes each send span's traceparent into its record.
  yield* Effect.forEach(
    Array.from({ length: 10 }, (_, i) => i),
    (i) =>
      Producer.send({ topic, key: `customer-${i % 4}`, value: `order-${i}` }).pipe(
        Effect.withSpan("checkout", { attributes: { "order.id": `order-${i}` } })
      )
  ).pipe(Effect.provide(topics.producer({ linger: 0 })))

  // Billing handles them; its lag is reported every 100 ms until it is 0 on every partition.
  const billed = yield* Deferred.make<void>()
  let handled = 0
  const billing = yield* Consumer.runEach({ groupId, topics: [topic] }, (record) =>
    Effect.gen(function*() {
      yield* Effect.annotateCurrentSpan("order.id", ConsumerRecord.valueString(record))
      if (++handled === 10) yield* Deferred.succeed(billed, undefined)
    })).pipe(Effect.provide(CommitPolicy.commitAfter({ maxBatch: 10, maxInterval: "50 millis" })), Effect.fork)
  yield* Deferred.await(billed)
  const caughtUp = yield* Observability.lag({ groupId }).pipe(
    Stream.filter((s) => s.partitions.length === 3 && s.partitions.every((p) => p.lag === 0n && p.position > 0n)),
    Stream.runHead
  )
  yield* Console.log(`${handled} orders handled on ${topics.where}; lag per partition once caught up:`)
  for (const p of caughtUp._tag === "Some" ? caughtUp.value.partitions : []) {
    yield* Console.log(`  ${p.topic.replace(/-[a-z0-9]+$/, "")}-${p.partition}  position ${p.position}  lag ${p.lag}`)
  }

  // One order's trace: the checkout, its send, and the chunk span that links to the send.
  const finished = spans.getFinishedSpans()
  const id = (span: ReadableSpan) => span.spanContext().spanId
  const checkout = finished.find((s) => s.name === "checkout" && s.attributes["order.id"] === "order-3")!
  const send = finished.find((s) => s.name === `send ${topic}` && s.parentSpanContext?.spanId === id(checkout))!
  const process = finished.find((s) =>
    s.name === `process ${topic}` && s.links.some((l) => l.context.spanId === id(send))
  )
  yield* Console.log(`trace of order-3 (${checkout.spanContext().traceId}):`)
  yield* Console.log(`  checkout                         ${id(checkout)}`)
  yield* Console.log(`  └─ send orders (producer)        ${id(send)}  traceparent in the record's headers`)
  if (process !== undefined) {
    // Its parent is the consumer's span, which ends (and is exported) when the consumer stops.
    yield* Console.log(
      `  process orders (consumer)        ${id(process)}  linked to the send, in the consumer's trace; ` +
        `${process.attributes["messaging.batch.message_count"]} record(s) in its chunk`
    )
  }

  // The metrics, as the metric reader collects them from Effect's registry.
  const { resourceMetrics } = yield* Effect.promise(() => metrics.collect())
  const wanted = [
    "messaging.client.sent.messages",
    "messaging.client.consumed.messages",
    "kafka.consumer.handled.records",
    "kafka.consumer.lag",
    "kafka.consumer.rebalance.partitions"
  ]
  yield* Console.log("metrics:")
  for (const scope of resourceMetrics.scopeMetrics) {
    for (const metric of scope.metrics) {
      if (!wanted.includes(metric.descriptor.name)) continue
      let total = 0
      for (const point of metric.dataPoints) {
        const labels = point.attributes
        if (labels["messaging.destination.name"] !== topic) continue
        total += typeof point.value === "number" ? point.value : 0
      }
      yield* Console.log(`  ${metric.descriptor.name.padEnd(38)} ${total}`)
    }
  }
  yield* Fiber.interrupt(billing)
})

program.pipe(
  Effect.provide(Layer.mergeAll(Broker.layer, Observability.layer({ lagInterval: "100 millis" }))),
  Effect.provide(Telemetry),
  NodeRuntime.runMain
)
