/**
 * What the consumer and the producer record when `Observability.layer` is provided: metric labels made once per
 * partition (Effect caches a metric's series by the identity of its label array), spans, trace context in headers.
 * Nothing here runs without the layer. Its parts:
 * - `labels.ts`: the label sets, made once each;
 * - `traceContext.ts`: `traceparent` headers, and the links a chunk's span makes to its records' producers;
 * - `consumer.ts`: the consumer's instruments;
 * - `producer.ts`: the producer's instruments.
 *
 * @internal
 */
export { type ConsumerTelemetry, makeConsumer, type PartitionTelemetry } from "./consumer.js"
export { errorType } from "./labels.js"
export { send, transactionEnded } from "./producer.js"
export { linksOf, parseTraceparent, traceparent } from "./traceContext.js"
