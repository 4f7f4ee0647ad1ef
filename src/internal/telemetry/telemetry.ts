/**
 * What the consumer and the producer record when `Observability.layer` is provided: metric labels made once per
 * partition (Effect caches a metric's series by the identity of its label array), spans, trace context in headers.
 * Nothing here runs without the layer.
 *
 * @internal
 */
import * as Cause from "effect/Cause"
import * as Chunk from "effect/Chunk"
import type * as Clock from "effect/Clock"
import type * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as MetricLabel from "effect/MetricLabel"
import * as Option from "effect/Option"
import * as Tracer from "effect/Tracer"
import type { ConsumerRecord } from "../../ConsumerRecord.js"
import type { DriverSession } from "../../Driver.js"
import { CommitFailed, ProduceFailed, TransactionFailed } from "../../KafkaError.js"
import type * as OffsetBatch from "../../OffsetBatch.js"
import { type LagSnapshot, metrics, type Observability } from "../../Observability.js"
import { Fenced } from "../../OffsetStore.js"
import type { ProducerRecord } from "../../Producer.js"
import * as TopicPartition from "../../TopicPartition.js"
import { HandlerFailure } from "../route/router.js"
import { isFailure, type Written } from "../producer/written.js"

type Settings = Context.Tag.Service<typeof Observability>
type Labels = ReadonlyArray<MetricLabel.MetricLabel>

const system = MetricLabel.make("messaging.system", "kafka")
const label = MetricLabel.make

/** A label set, and the same with `error.type` for each failure seen, made once each. */
class LabelSet {
  private readonly failures = new Map<string, Labels>()
  constructor(readonly labels: Labels) {}
  failed(type: string): Labels {
    let found = this.failures.get(type)
    if (found === undefined) {
      found = [...this.labels, label("error.type", type)]
      this.failures.set(type, found)
    }
    return found
  }
}

/** The tag of a failure, for `error.type`: its `_tag`, its class, or what it is. */
export const errorType = (error: unknown): string => {
  if (typeof error === "object" && error !== null) {
    const tag = (error as { readonly _tag?: unknown })._tag
    if (typeof tag === "string") return tag
    const name = error.constructor?.name
    if (typeof name === "string" && name !== "Object") return name
  }
  return typeof error
}

const seconds = (clock: Clock.Clock, start: bigint) => Number(clock.unsafeCurrentTimeNanos() - start) / 1e9

// --- trace context ---------------------------------------------------------------------------------------------------

/** The W3C `traceparent` of a span: version 00, its trace id, its span id, sampled or not. */
export const traceparent = (span: Tracer.AnySpan): string =>
  `00-${span.traceId}-${span.spanId}-${span.sampled ? "01" : "00"}`

/** Whether the bytes `from` to `to` are lower-case hex digits, and not all zeros. */
const hexDigits = (bytes: Uint8Array, from: number, to: number, zerosAllowed: boolean): boolean => {
  let zeros = true
  for (let i = from; i < to; i++) {
    const b = bytes[i]!
    if (!((b >= 48 && b <= 57) || (b >= 97 && b <= 102))) return false
    if (b !== 48) zeros = false
  }
  return zerosAllowed || !zeros
}

const ascii = (bytes: Uint8Array, from: number, to: number) => String.fromCharCode(...bytes.subarray(from, to))

/** The span a `traceparent` names, if it is well formed (version 00 and up, ids not all zeros). */
export const parseTraceparent = (header: Uint8Array | string): Tracer.ExternalSpan | undefined => {
  const bytes = typeof header === "string" ? new TextEncoder().encode(header) : header
  // 00-<32 hex trace id>-<16 hex span id>-<2 hex flags>
  if (bytes.length < 55 || bytes[2] !== 45 || bytes[35] !== 45 || bytes[52] !== 45) return undefined
  if (!hexDigits(bytes, 0, 2, true) || (bytes[0] === 102 && bytes[1] === 102)) return undefined
  if (!hexDigits(bytes, 3, 35, false) || !hexDigits(bytes, 36, 52, false) || !hexDigits(bytes, 53, 55, true)) {
    return undefined
  }
  // A version 00 header is exactly 55 bytes; a later version may append fields after a dash.
  if (bytes.length > 55 && ((bytes[0] === 48 && bytes[1] === 48) || bytes[55] !== 45)) return undefined
  const flags = Number.parseInt(ascii(bytes, 53, 55), 16)
  return Tracer.externalSpan({ traceId: ascii(bytes, 3, 35), spanId: ascii(bytes, 36, 52), sampled: (flags & 1) === 1 })
}

/** Whether two headers name the same span: the same bytes (span ids first: they differ first). */
const sameBytes = (a: Uint8Array, b: Uint8Array) => {
  if (a === b) return true
  const length = a.length
  if (length !== b.length) return false
  for (let i = length - 1; i >= 0; i--) if (a[i] !== b[i]) return false
  return true
}

/**
 * Links to the spans the records' `traceparent` headers name, one per span, at most `max`. Records sent together
 * name the same span: a header equal to the one before it is not parsed again.
 */
export const linksOf = (records: Iterable<ConsumerRecord>, max = 128): Array<Tracer.SpanLink> => {
  const links: Array<Tracer.SpanLink> = []
  const seen = new Set<string>()
  let previous: Uint8Array | undefined
  for (const record of records) {
    const header = record.headers["traceparent"]
    if (header === undefined || (previous !== undefined && sameBytes(header, previous))) continue
    previous = header
    const span = parseTraceparent(header)
    if (span === undefined || seen.has(span.spanId)) continue
    seen.add(span.spanId)
    links.push({ _tag: "SpanLink", span, attributes: { "messaging.kafka.offset": String(record.offset) } })
    if (links.length >= max) break
  }
  return links
}

/** The records with the span's `traceparent` in their headers, where they do not name one of their own. */
const withTraceparent = (records: ReadonlyArray<ProducerRecord>, span: Tracer.AnySpan): Array<ProducerRecord> => {
  const value = traceparent(span)
  return records.map((record) =>
    record.headers !== undefined && record.headers["traceparent"] !== undefined
      ? record
      : { ...record, headers: { ...record.headers, traceparent: value } }
  )
}

// --- the consumer ----------------------------------------------------------------------------------------------------

/** One partition's labels and span attributes. */
export interface PartitionTelemetry {
  readonly tp: TopicPartition.TopicPartition
  readonly set: LabelSet
  readonly attributes: Readonly<Record<string, unknown>>
}

/**
 * A consumer session's observability: labels per partition, the positions committed or stored (for the lag), and
 * the wrappers the runloop and the policies put around their work.
 */
export interface ConsumerTelemetry {
  readonly settings: Settings
  readonly groupId: string
  readonly clock: Clock.Clock
  readonly group: LabelSet
  readonly partition: (tp: TopicPartition.TopicPartition) => PartitionTelemetry
  /** The position each partition's lag counts from, by `TopicPartition.key`. */
  readonly positions: Map<string, bigint>
  /** Where a partition starts: its lag counts from there until a commit or a unit moves it. */
  readonly started: (tp: TopicPartition.TopicPartition, position: bigint) => void
  readonly forget: (tp: TopicPartition.TopicPartition) => void
  readonly received: (tp: TopicPartition.TopicPartition, records: number) => void
  readonly handled: (tp: TopicPartition.TopicPartition, records: number) => void
  readonly routed: (tp: TopicPartition.TopicPartition, topic: string) => void
  readonly rebalance: (event: "assigned" | "revoked" | "lost", partitions: ReadonlyArray<TopicPartition.TopicPartition>) => void
  /** The driver session with its commits counted, timed, traced, and their positions kept for the lag. */
  readonly session: (session: DriverSession) => DriverSession
  /** A handler call, timed, its failures counted. */
  readonly call: <E, R>(
    tp: TopicPartition.TopicPartition,
    records: Chunk.Chunk<ConsumerRecord>,
    effect: Effect.Effect<void, E, R>
  ) => Effect.Effect<void, E, R>
  /** A chunk (or a unit of records finishing out of order) in a span of its own, linked to its records' producers. */
  readonly chunk: <A, E, R>(
    tp: TopicPartition.TopicPartition,
    records: Iterable<ConsumerRecord>,
    count: number,
    effect: Effect.Effect<A, E, R>
  ) => Effect.Effect<A, E, R>
  /** A unit of a store or a Kafka transaction that moves the partition's position to `next`. */
  readonly unit: <A, E, R>(
    kind: "store" | "transaction",
    tp: TopicPartition.TopicPartition,
    next: bigint,
    effect: Effect.Effect<A, E, R>
  ) => Effect.Effect<A, E, R>
}

const isFenced = (error: unknown) =>
  error instanceof Fenced || (error instanceof TransactionFailed && error.reason === "Fenced")

/**
 * The settings with `report` telling a member id that the session left behind. A driver may give the session a new
 * member id when it rejoins (after an eviction); the old id reports nothing more, so it is reported as owning nothing,
 * which lets `Observability` forget it as it forgets a session that ended.
 */
const reportingOwnIds = (settings: Settings): Settings => {
  let previous: LagSnapshot | undefined
  return {
    ...settings,
    report: (snapshot) =>
      Effect.suspend(() => {
        const before = previous
        previous = snapshot
        return before !== undefined && before.memberId !== snapshot.memberId && before.partitions.length > 0
          ? Effect.zipRight(settings.report({ ...before, at: snapshot.at, partitions: [] }), settings.report(snapshot))
          : settings.report(snapshot)
      })
  }
}

export const makeConsumer = (given: Settings, groupId: string, clock: Clock.Clock): ConsumerTelemetry => {
  const settings = reportingOwnIds(given)
  const group = new LabelSet([system, label("messaging.consumer.group.name", groupId)])
  const byPartition = new Map<string, PartitionTelemetry>()
  const byTopic = new Map<string, Map<string, Labels>>()
  const positions = new Map<string, bigint>()
  const { metrics: on, spans } = settings
  const links = settings.traceContext

  const partition = (tp: TopicPartition.TopicPartition): PartitionTelemetry => {
    const k = TopicPartition.key(tp)
    let found = byPartition.get(k)
    if (found === undefined) {
      found = {
        tp,
        set: new LabelSet([
          ...group.labels,
          label("messaging.destination.name", tp.topic),
          label("messaging.destination.partition.id", String(tp.partition))
        ]),
        attributes: {
          "messaging.system": "kafka",
          "messaging.consumer.group.name": groupId,
          "messaging.destination.name": tp.topic,
          "messaging.destination.partition.id": String(tp.partition)
        }
      }
      byPartition.set(k, found)
    }
    return found
  }

  /** Labels of the group and one other label, made once per value. */
  const groupWith = (key: string, value: string) => {
    let values = byTopic.get(key)
    if (values === undefined) {
      values = new Map()
      byTopic.set(key, values)
    }
    let found = values.get(value)
    if (found === undefined) {
      found = [...group.labels, label(key, value)]
      values.set(value, found)
    }
    return found
  }

  const moved = (k: string, position: bigint) => {
    const current = positions.get(k)
    if (current === undefined || position > current) positions.set(k, position)
  }

  const commitOf = (session: DriverSession) => (batch: OffsetBatch.OffsetBatch): Effect.Effect<void, CommitFailed> => {
    const commit = Effect.suspend(() => {
      const start = clock.unsafeCurrentTimeNanos()
      return Effect.onExit(session.commit(batch), (exit) =>
        Effect.sync(() => {
          if (Exit.isSuccess(exit)) {
            for (const [k, position] of batch.positions) moved(k, position)
            if (!on) return
            metrics.commits.unsafeUpdate(1, group.labels)
            metrics.commitDuration.unsafeUpdate(seconds(clock, start), group.labels)
            return
          }
          if (!on) return
          const failure = Cause.failureOption(exit.cause)
          const type = Option.isSome(failure) && failure.value instanceof CommitFailed
            ? failure.value.reason
            : Cause.isInterruptedOnly(exit.cause) ? "interrupted" : "defect"
          metrics.commitFailures.unsafeUpdate(1, group.failed(type))
          metrics.commitDuration.unsafeUpdate(seconds(clock, start), group.failed(type))
        }))
    })
    return spans
      ? Effect.withSpan(commit, "commit", {
        kind: "client",
        attributes: {
          "messaging.system": "kafka",
          "messaging.operation.name": "commit",
          "messaging.operation.type": "settle",
          "messaging.consumer.group.name": groupId,
          "messaging.batch.message_count": batch.positions.size
        },
        captureStackTrace: false
      })
      : commit
  }

  return {
    settings,
    groupId,
    clock,
    group,
    partition,
    positions,
    started: (tp, position) => {
      positions.set(TopicPartition.key(tp), position)
    },
    forget: (tp) => {
      positions.delete(TopicPartition.key(tp))
    },
    received: (tp, records) => {
      if (on && records > 0) metrics.consumedMessages.unsafeUpdate(records, partition(tp).set.labels)
    },
    handled: (tp, records) => {
      if (on && records > 0) metrics.handledRecords.unsafeUpdate(records, partition(tp).set.labels)
    },
    routed: (_tp, topic) => {
      if (on) metrics.routedRecords.unsafeUpdate(1, groupWith("messaging.destination.name", topic))
    },
    rebalance: (event, partitions) => {
      if (!on || partitions.length === 0) return
      const counts = new Map<string, number>()
      for (const tp of partitions) counts.set(tp.topic, (counts.get(tp.topic) ?? 0) + 1)
      for (const [topic, count] of counts) {
        const labels = groupWith("kafka.rebalance.event", event)
        metrics.rebalancePartitions.unsafeUpdate(count, [...labels, label("messaging.destination.name", topic)])
      }
    },
    session: (session) => ({
      get memberId() {
        return session.memberId
      },
      poll: session.poll,
      commit: commitOf(session),
      committed: session.committed,
      committedWithMetadata: session.committedWithMetadata,
      offsets: session.offsets,
      seek: session.seek,
      pause: session.pause,
      resume: session.resume
    }),
    call: (tp, records, effect) => {
      if (!on) return effect
      const { set } = partition(tp)
      return Effect.suspend(() => {
        const start = clock.unsafeCurrentTimeNanos()
        return Effect.onExit(effect, (exit) =>
          Effect.sync(() => {
            metrics.chunkRecords.unsafeUpdate(Chunk.size(records), set.labels)
            if (Exit.isSuccess(exit)) {
              metrics.processDuration.unsafeUpdate(seconds(clock, start), set.labels)
              return
            }
            if (Cause.isInterruptedOnly(exit.cause)) return
            const failure = Cause.failureOption(exit.cause)
            const type = Option.isSome(failure) ? errorType(unwrap(failure.value)) : "defect"
            metrics.processDuration.unsafeUpdate(seconds(clock, start), set.failed(type))
            metrics.handlerFailures.unsafeUpdate(1, set.failed(type))
          }))
      })
    },
    chunk: (tp, records, count, effect) => {
      if (!spans) return effect
      const p = partition(tp)
      return Effect.suspend(() =>
        Effect.withSpan(effect, `process ${tp.topic}`, {
          kind: "consumer",
          attributes: {
            ...p.attributes,
            "messaging.operation.name": "process",
            "messaging.operation.type": "process",
            "messaging.batch.message_count": count
          },
          links: links ? linksOf(records) : [],
          captureStackTrace: false
        })
      )
    },
    unit: (kind, tp, next, effect) => {
      const p = partition(tp)
      const k = TopicPartition.key(tp)
      const measured = Effect.suspend(() => {
        const start = clock.unsafeCurrentTimeNanos()
        return Effect.onExit(effect, (exit) =>
          Effect.sync(() => {
            if (Exit.isSuccess(exit)) {
              moved(k, next)
              if (!on) return
              metrics.units.unsafeUpdate(1, p.set.labels)
              metrics.unitDuration.unsafeUpdate(seconds(clock, start), p.set.labels)
              return
            }
            if (!on || Cause.isInterruptedOnly(exit.cause)) return
            const failure = Cause.failureOption(exit.cause)
            const error = Option.isSome(failure) ? unwrap(failure.value) : undefined
            const type = error === undefined ? "defect" : errorType(error)
            metrics.unitDuration.unsafeUpdate(seconds(clock, start), p.set.failed(type))
            if (isFenced(error)) metrics.unitsFenced.unsafeUpdate(1, p.set.labels)
          }))
      })
      return spans
        ? Effect.withSpan(measured, `${kind} ${tp.topic}`, {
          kind: "client",
          attributes: { ...p.attributes, "messaging.operation.name": kind, "messaging.operation.type": "settle" },
          captureStackTrace: false
        })
        : measured
    }
  }
}

/** A failure as the user sees it: a handler's failure carries the user's error in `error`. */
const unwrap = (failure: unknown): unknown => failure instanceof HandlerFailure ? failure.error : failure

// --- the producer ----------------------------------------------------------------------------------------------------

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
