/**
 * What the producer records: records and bytes sent, failures, the duration of a send, a span around it whose
 * `traceparent` goes into the records' headers, and transactions committed or aborted.
 *
 * @internal
 */
import type * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import type { ProduceFailed } from "../../KafkaError.js"
import { metrics } from "../../Observability.js"
import type { ProducerRecord } from "../../Producer.js"
import { isFailure, type Written } from "../producer/written.js"
import { label, type Labels, LabelSet, seconds, type Settings, system } from "./labels.js"
import { withTraceparent } from "./traceContext.js"

/** Labels by topic, and by topic and failure reason, made once each. */
const producerLabels = new Map<string, LabelSet>()
const topicLabels = (topic: string): LabelSet => {
  let found = producerLabels.get(topic)
  if (found === undefined) {
    found = new LabelSet([system, label("messaging.destination.name", topic)])
    producerLabels.set(topic, found)
  }
  return found
}

/**
 * A send with observability: records and bytes written, failures and the call's duration counted, a span around it
 * whose `traceparent` goes into the records' headers.
 */
export const send = <A>(
  settings: Settings,
  clock: Clock.Clock,
  records: ReadonlyArray<ProducerRecord>,
  submit: (records: ReadonlyArray<ProducerRecord>) => { readonly await: Effect.Effect<ReadonlyArray<Written>> },
  answer: (results: ReadonlyArray<Written>) => Effect.Effect<A, ProduceFailed>,
  /** A record's bytes, as the producer counts them. */
  sizeOf: (record: ProducerRecord) => number
): Effect.Effect<A, ProduceFailed> => {
  const topic = records[0]?.topic ?? ""
  const measured = (sent: ReadonlyArray<ProducerRecord>) =>
    Effect.suspend(() => {
      const start = clock.unsafeCurrentTimeNanos()
      const group = submit(sent)
      return Effect.flatMap(group.await, (results) => {
        if (settings.metrics) {
          let failure: string | undefined
          for (let i = 0; i < results.length; i++) {
            const written = results[i]!
            const set = topicLabels(sent[i]!.topic)
            if (isFailure(written)) {
              failure ??= written.reason
              metrics.producerErrors.unsafeUpdate(1, set.failed(written.reason))
            } else {
              metrics.sentMessages.unsafeUpdate(1, set.labels)
              metrics.sentBytes.unsafeUpdate(sizeOf(sent[i]!), set.labels)
            }
          }
          const set = topicLabels(topic)
          metrics.operationDuration.unsafeUpdate(
            seconds(clock, start),
            failure === undefined ? set.labels : set.failed(failure)
          )
        }
        return answer(results)
      })
    })
  if (!settings.spans) return measured(records)
  return Effect.useSpan(`send ${topic}`, {
    kind: "producer",
    attributes: {
      "messaging.system": "kafka",
      "messaging.operation.name": "send",
      "messaging.operation.type": "send",
      "messaging.destination.name": topic,
      "messaging.batch.message_count": records.length
    },
    captureStackTrace: false
  }, (span) => measured(settings.traceContext ? withTraceparent(records, span) : records))
}

/** A transaction that ended, committed or aborted. */
export const transactionEnded = (settings: Settings | undefined, outcome: "committed" | "aborted") => {
  if (settings === undefined || !settings.metrics) return
  metrics.transactions.unsafeUpdate(1, outcome === "committed" ? committedLabels : abortedLabels)
}
const committedLabels: Labels = [system, label("kafka.transaction.outcome", "committed")]
const abortedLabels: Labels = [system, label("kafka.transaction.outcome", "aborted")]
