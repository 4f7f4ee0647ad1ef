/**
 * What a consumer records: labels made once per partition, the positions its lag counts from, and the wrappers the
 * runloop and the policies put around their work (handler calls, chunks, units, commits).
 *
 * @internal
 */
import * as Cause from "effect/Cause"
import * as Chunk from "effect/Chunk"
import type * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Option from "effect/Option"
import type { ConsumerRecord } from "../../ConsumerRecord.js"
import type { DriverSession } from "../../Driver.js"
import { CommitFailed, Fenced, TransactionFailed } from "../../KafkaError.js"
import type * as OffsetBatch from "../../OffsetBatch.js"
import { type LagSnapshot, metrics } from "../../Observability.js"
import * as TopicPartition from "../../TopicPartition.js"
import { HandlerFailure } from "../route/failures.js"
import { errorType, label, type Labels, LabelSet, seconds, type Settings, system } from "./labels.js"
import { linksOf } from "./traceContext.js"

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
  readonly rebalance: (
    event: "assigned" | "revoked" | "lost",
    partitions: ReadonlyArray<TopicPartition.TopicPartition>
  ) => void
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

/** What a consumer session's instruments share. */
interface ConsumerState {
  readonly settings: Settings
  readonly groupId: string
  readonly clock: Clock.Clock
  readonly group: LabelSet
  readonly byPartition: Map<string, PartitionTelemetry>
  readonly byTopic: Map<string, Map<string, Labels>>
  readonly positions: Map<string, bigint>
  /** Whether metrics are recorded. */
  readonly on: boolean
  readonly spans: boolean
  /** Whether a chunk's span links to the spans its records name. */
  readonly links: boolean
}

export const makeConsumer = (given: Settings, groupId: string, clock: Clock.Clock): ConsumerTelemetry => {
  const settings = reportingOwnIds(given)
  const state: ConsumerState = {
    settings,
    groupId,
    clock,
    group: new LabelSet([system, label("messaging.consumer.group.name", groupId)]),
    byPartition: new Map(),
    byTopic: new Map(),
    positions: new Map(),
    on: settings.metrics,
    spans: settings.spans,
    links: settings.traceContext
  }
  const { on, positions } = state
  return {
    settings,
    groupId,
    clock,
    group: state.group,
    partition: (tp) => partitionOf(state, tp),
    positions,
    started: (tp, position) => {
      positions.set(TopicPartition.key(tp), position)
    },
    forget: (tp) => {
      positions.delete(TopicPartition.key(tp))
    },
    received: (tp, records) => {
      if (on && records > 0) metrics.consumedMessages.unsafeUpdate(records, partitionOf(state, tp).set.labels)
    },
    handled: (tp, records) => {
      if (on && records > 0) metrics.handledRecords.unsafeUpdate(records, partitionOf(state, tp).set.labels)
    },
    routed: (_tp, topic) => {
      if (on) metrics.routedRecords.unsafeUpdate(1, groupWith(state, "messaging.destination.name", topic))
    },
    rebalance: (event, partitions) => rebalance(state, event, partitions),
    session: (session) => ({
      get memberId() {
        return session.memberId
      },
      ...(session.groupMetadata === undefined ? {} : { groupMetadata: session.groupMetadata }),
      poll: session.poll,
      commit: (batch) => commit(state, session, batch),
      committed: session.committed,
      committedWithMetadata: session.committedWithMetadata,
      offsets: session.offsets,
      seek: session.seek,
      pause: session.pause,
      resume: session.resume
    }),
    call: (tp, records, effect) => call(state, tp, records, effect),
    chunk: (tp, records, count, effect) => chunk(state, tp, records, count, effect),
    unit: (kind, tp, next, effect) => unit(state, kind, tp, next, effect)
  }
}

const partitionOf = (state: ConsumerState, tp: TopicPartition.TopicPartition): PartitionTelemetry => {
  const k = TopicPartition.key(tp)
  let found = state.byPartition.get(k)
  if (found === undefined) {
    found = {
      tp,
      set: new LabelSet([
        ...state.group.labels,
        label("messaging.destination.name", tp.topic),
        label("messaging.destination.partition.id", String(tp.partition))
      ]),
      attributes: {
        "messaging.system": "kafka",
        "messaging.consumer.group.name": state.groupId,
        "messaging.destination.name": tp.topic,
        "messaging.destination.partition.id": String(tp.partition)
      }
    }
    state.byPartition.set(k, found)
  }
  return found
}

/** Labels of the group and one other label, made once per value. */
const groupWith = (state: ConsumerState, key: string, value: string) => {
  let values = state.byTopic.get(key)
  if (values === undefined) {
    values = new Map()
    state.byTopic.set(key, values)
  }
  let found = values.get(value)
  if (found === undefined) {
    found = [...state.group.labels, label(key, value)]
    values.set(value, found)
  }
  return found
}

const moved = (state: ConsumerState, k: string, position: bigint) => {
  const current = state.positions.get(k)
  if (current === undefined || position > current) state.positions.set(k, position)
}

const rebalance = (
  state: ConsumerState,
  event: "assigned" | "revoked" | "lost",
  partitions: ReadonlyArray<TopicPartition.TopicPartition>
) => {
  if (!state.on || partitions.length === 0) return
  const counts = new Map<string, number>()
  for (const tp of partitions) counts.set(tp.topic, (counts.get(tp.topic) ?? 0) + 1)
  for (const [topic, count] of counts) {
    const labels = groupWith(state, "kafka.rebalance.event", event)
    metrics.rebalancePartitions.unsafeUpdate(count, [...labels, label("messaging.destination.name", topic)])
  }
}

/** A commit of the session's, counted, timed, traced, and its positions kept for the lag. */
const commit = (
  state: ConsumerState,
  session: DriverSession,
  batch: OffsetBatch.OffsetBatch
): Effect.Effect<void, CommitFailed> => {
  const { clock, group, on } = state
  const measured = Effect.suspend(() => {
    const start = clock.unsafeCurrentTimeNanos()
    return Effect.onExit(session.commit(batch), (exit) =>
      Effect.sync(() => {
        if (Exit.isSuccess(exit)) {
          for (const [k, position] of batch.positions) moved(state, k, position)
          if (!on) return
          metrics.commits.unsafeUpdate(1, group.labels)
          metrics.commitDuration.unsafeUpdate(seconds(clock, start), group.labels)
          return
        }
        if (!on) return
        const failure = Cause.failureOption(exit.cause)
        const type = Option.isSome(failure) && failure.value instanceof CommitFailed
          ? failure.value.reason
          : Cause.isInterruptedOnly(exit.cause)
          ? "interrupted"
          : "defect"
        metrics.commitFailures.unsafeUpdate(1, group.failed(type))
        metrics.commitDuration.unsafeUpdate(seconds(clock, start), group.failed(type))
      }))
  })
  return state.spans
    ? Effect.withSpan(measured, "commit", {
      kind: "client",
      attributes: {
        "messaging.system": "kafka",
        "messaging.operation.name": "commit",
        "messaging.operation.type": "settle",
        "messaging.consumer.group.name": state.groupId,
        "messaging.batch.message_count": batch.positions.size
      },
      captureStackTrace: false
    })
    : measured
}

/** A handler call, timed, its failures counted. */
const call = <E, R>(
  state: ConsumerState,
  tp: TopicPartition.TopicPartition,
  records: Chunk.Chunk<ConsumerRecord>,
  effect: Effect.Effect<void, E, R>
): Effect.Effect<void, E, R> => {
  if (!state.on) return effect
  const { clock } = state
  const { set } = partitionOf(state, tp)
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
}

/** A chunk (or a unit of records finishing out of order) in a span of its own, linked to its records' producers. */
const chunk = <A, E, R>(
  state: ConsumerState,
  tp: TopicPartition.TopicPartition,
  records: Iterable<ConsumerRecord>,
  count: number,
  effect: Effect.Effect<A, E, R>
): Effect.Effect<A, E, R> => {
  if (!state.spans) return effect
  const p = partitionOf(state, tp)
  return Effect.suspend(() =>
    Effect.withSpan(effect, `process ${tp.topic}`, {
      kind: "consumer",
      attributes: {
        ...p.attributes,
        "messaging.operation.name": "process",
        "messaging.operation.type": "process",
        "messaging.batch.message_count": count
      },
      links: state.links ? linksOf(records) : [],
      captureStackTrace: false
    })
  )
}

/** A unit of a store or a Kafka transaction that moves the partition's position to `next`. */
const unit = <A, E, R>(
  state: ConsumerState,
  kind: "store" | "transaction",
  tp: TopicPartition.TopicPartition,
  next: bigint,
  effect: Effect.Effect<A, E, R>
): Effect.Effect<A, E, R> => {
  const { clock, on } = state
  const p = partitionOf(state, tp)
  const k = TopicPartition.key(tp)
  const measured = Effect.suspend(() => {
    const start = clock.unsafeCurrentTimeNanos()
    return Effect.onExit(effect, (exit) =>
      Effect.sync(() => {
        if (Exit.isSuccess(exit)) {
          moved(state, k, next)
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
  return state.spans
    ? Effect.withSpan(measured, `${kind} ${tp.topic}`, {
      kind: "client",
      attributes: { ...p.attributes, "messaging.operation.name": kind, "messaging.operation.type": "settle" },
      captureStackTrace: false
    })
    : measured
}

/** A failure as the user sees it: a handler's failure carries the user's error in `error`. */
const unwrap = (failure: unknown): unknown => failure instanceof HandlerFailure ? failure.error : failure
