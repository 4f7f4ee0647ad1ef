import * as Cause from "effect/Cause"
import * as Clock from "effect/Clock"
import * as Context from "effect/Context"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as FiberId from "effect/FiberId"
import * as Option from "effect/Option"
import * as Scope from "effect/Scope"
import { InvalidConfig, ProduceFailed, TransactionFailed } from "../../KafkaError.js"
import { Observability } from "../../Observability.js"
import {
  Producer,
  type ProducerRecord,
  type RecordMetadata,
  type Settings,
  type TransactionalProducer,
  type TransactionalSettings,
  type TransactionOffsets
} from "../../Producer.js"
import { positiveDuration } from "../shared/config.js"
import { partitionOfKey } from "../shared/murmur2.js"
import * as telemetry from "../telemetry/telemetry.js"
import { utf8Encode, utf8Length } from "../shared/utf8.js"
import { isFailure, type Written } from "./written.js"

/**
 * Settings checked and defaulted. `acks` is the protocol's number (`-1` for all).
 *
 * @internal
 */
export interface Resolved {
  readonly acks: -1 | 0 | 1
  readonly idempotent: boolean
  readonly maxInFlightRequests: number
  readonly lingerMillis: number
  readonly batchSize: number
  readonly maxRequestSize: number
  readonly compression: "none" | "gzip"
  readonly timeoutMillis: number
  readonly closeTimeout: Duration.Duration
  readonly bufferMemory: number
  readonly maxBlock: Duration.Duration
}

const integerIn = (field: string, value: number | undefined, fallback: number, min: number, max: number) =>
  Effect.suspend(() => {
    if (value === undefined) return Effect.succeed(fallback)
    return Number.isInteger(value) && value >= min && value <= max
      ? Effect.succeed(value)
      : Effect.fail(new InvalidConfig({ field, reason: `must be an integer from ${min} to ${max}, got ${value}` }))
  })

/** @internal */
export const resolve = (settings: Settings): Effect.Effect<Resolved, InvalidConfig> =>
  Effect.gen(function*() {
    const acks = settings.acks ?? "all"
    if (acks !== "all" && acks !== 1 && acks !== 0) {
      return yield* new InvalidConfig({ field: "acks", reason: `must be 0, 1 or "all", got ${String(acks)}` })
    }
    const idempotent = settings.idempotent ?? true
    if (typeof idempotent !== "boolean") {
      return yield* new InvalidConfig({ field: "idempotent", reason: `must be true or false, got ${String(idempotent)}` })
    }
    if (idempotent && acks !== "all") {
      return yield* new InvalidConfig({
        field: "acks",
        reason: `an idempotent producer needs acks "all" (got ${acks}): a record acknowledged by the leader alone can ` +
          "be lost with it, which idempotence cannot repair; set idempotent: false to use acks 0 or 1"
      })
    }
    const maxInFlightRequests = yield* integerIn("maxInFlightRequests", settings.maxInFlightRequests, 1, 1, 5)
    if (idempotent && maxInFlightRequests > 1) {
      return yield* new InvalidConfig({
        field: "maxInFlightRequests",
        reason: `an idempotent producer keeps one batch in flight (got ${maxInFlightRequests}): kafkajs gives a ` +
          "retried batch new sequence numbers, so a batch sent behind one that failed could land before it"
      })
    }
    const linger = settings.linger === undefined || settings.linger === 0
      ? Duration.zero
      : yield* positiveDuration("linger", settings.linger)
    const batchSize = yield* integerIn("batchSize", settings.batchSize, 256 * 1024, 1, 64 * 1024 * 1024)
    const maxRequestSize = yield* integerIn("maxRequestSize", settings.maxRequestSize, 1024 * 1024, 1, 1024 * 1024 * 1024)
    const compression = settings.compression ?? "none"
    if (compression !== "none" && compression !== "gzip") {
      return yield* new InvalidConfig({
        field: "compression",
        reason: `must be "none" or "gzip", got ${String(compression)}`
      })
    }
    const timeout = yield* positiveDuration("timeout", settings.timeout ?? "30 seconds")
    const closeTimeout = yield* positiveDuration("closeTimeout", settings.closeTimeout ?? "30 seconds")
    const bufferMemory = yield* integerIn(
      "bufferMemory",
      settings.bufferMemory,
      32 * 1024 * 1024,
      1,
      Number.MAX_SAFE_INTEGER
    )
    if (bufferMemory < maxRequestSize) {
      return yield* new InvalidConfig({
        field: "bufferMemory",
        reason: `must be at least maxRequestSize (${maxRequestSize}), got ${bufferMemory}: a record of ` +
          "maxRequestSize bytes must fit in the buffer"
      })
    }
    const maxBlock = settings.maxBlock === 0
      ? Duration.zero
      : yield* positiveDuration("maxBlock", settings.maxBlock ?? "60 seconds")
    return {
      acks: acks === "all" ? -1 : acks,
      idempotent,
      maxInFlightRequests,
      lingerMillis: settings.linger === undefined ? 5 : Duration.toMillis(linger),
      batchSize,
      maxRequestSize,
      compression,
      timeoutMillis: Duration.toMillis(timeout),
      closeTimeout,
      bufferMemory,
      maxBlock
    }
  })

export { isFailure, type Written } from "./written.js"

const firstFailure = (results: ReadonlyArray<Written>): ProduceFailed | undefined => {
  for (let i = 0; i < results.length; i++) {
    const written = results[i]!
    if (isFailure(written)) return written
  }
  return undefined
}

const allWritten = (results: ReadonlyArray<Written>): results is ReadonlyArray<RecordMetadata> =>
  firstFailure(results) === undefined

/**
 * Where batches go: `write` gets the records of one batch in the order they were sent and answers for each, in the
 * same order, in an array of its own that the producer then keeps (a call written whole gets it as its answers). It
 * never fails as a whole: a refusal of the whole batch is the same `ProduceFailed` for each record.
 *
 * @internal
 */
export interface Transport {
  readonly write: (batch: ReadonlyArray<ProducerRecord>) => Effect.Effect<Array<Written>>
}

/** Per-record overhead in a record batch (length, attributes, deltas, varint lengths), as an estimate. */
const RECORD_OVERHEAD = 21

const byteLength = (bytes: Uint8Array | string | null): number =>
  bytes === null ? 0 : typeof bytes === "string" ? utf8Length(bytes) : bytes.length

/** A record's bytes as the batcher counts them. @internal */
export const sizeOf = (record: ProducerRecord): number => {
  let size = RECORD_OVERHEAD + byteLength(record.key ?? null) + byteLength(record.value)
  if (record.headers !== undefined) {
    for (const name in record.headers) {
      const value = record.headers[name]
      if (value !== undefined) size += utf8Length(name) + byteLength(value) + 2
    }
  }
  return size
}

/** A record that cannot be sent at all, whatever the cluster says: refused before it is batched. @internal */
export const refuse = (record: ProducerRecord, size: number, maxRequestSize: number): ProduceFailed | undefined => {
  if (typeof record.topic !== "string" || record.topic.length === 0) {
    return new ProduceFailed({ reason: "UnknownTopic", topic: String(record.topic), detail: "the topic name is empty" })
  }
  if (record.partition !== undefined && (!Number.isInteger(record.partition) || record.partition < 0)) {
    return new ProduceFailed({
      reason: "UnknownPartition",
      topic: record.topic,
      detail: `partition must be a non-negative integer, got ${record.partition}`
    })
  }
  if (size > maxRequestSize) {
    return new ProduceFailed({
      reason: "RecordTooLarge",
      topic: record.topic,
      ...(record.partition === undefined ? {} : { partition: record.partition }),
      detail: `the record is ${size} bytes, more than maxRequestSize (${maxRequestSize})`
    })
  }
  return undefined
}

/** The records of one topic in a batch, as `makePartitioner` laid them out. @internal */
export interface TopicRecords {
  readonly topic: string
  /** The topic's partition count. */
  readonly count: number
  /** The places in the batch of the topic's records that can be sent, in batch order. */
  readonly indexes: ReadonlyArray<number>
}

/**
 * A batch laid out for sending: per record its partition (`-1` when it cannot be sent: its answer is in `out`); per
 * topic the records to send.
 *
 * @internal
 */
export interface Layout {
  /** The answers of the records that cannot be sent; the transport gives the others theirs. */
  readonly out: Array<Written>
  readonly partitionOf: Array<number>
  readonly topics: ReadonlyArray<TopicRecords>
}

interface TopicLayout extends TopicRecords {
  indexes: Array<number>
  /** In `topics`: a topic is listed once a record of it can be sent. */
  listed: boolean
  /** The partition of this batch's records with neither partition nor key, once one needed it. */
  sticky: number
}

/**
 * Lays out batches: each record's partition is its own, its key's (murmur2, as the Java client) or, for a record with
 * neither, the partition of its topic for this batch (sticky: one per batch, the next one for the next batch).
 * `counts` gives each topic of the batch its partition count, or why it cannot be written; a record naming a
 * partition its topic does not have is refused.
 *
 * @internal
 */
export const makePartitioner = () => {
  const sticky = new Map<string, number>()
  return (batch: ReadonlyArray<ProducerRecord>, counts: ReadonlyMap<string, number | ProduceFailed>): Layout => {
    const n = batch.length
    const out: Array<Written> = new Array(n)
    const partitionOf: Array<number> = new Array(n)
    const byTopic = new Map<string, TopicLayout>()
    const topics: Array<TopicLayout> = []
    let last: TopicLayout | undefined
    // Topics are listed in the order their first record that can be sent comes.
    for (let i = 0; i < n; i++) {
      const record = batch[i]!
      let t = last !== undefined && last.topic === record.topic ? last : byTopic.get(record.topic)
      if (t === undefined) {
        const count = counts.get(record.topic)!
        if (typeof count !== "number") {
          out[i] = count
          partitionOf[i] = -1
          continue
        }
        t = { topic: record.topic, count, indexes: [], listed: false, sticky: -1 }
        byTopic.set(record.topic, t)
      }
      last = t
      let partition: number
      if (record.partition !== undefined) {
        if (record.partition >= t.count) {
          out[i] = new ProduceFailed({
            reason: "UnknownPartition",
            topic: record.topic,
            partition: record.partition,
            detail: `${record.topic} has ${t.count} partition${t.count === 1 ? "" : "s"}`
          })
          partitionOf[i] = -1
          continue
        }
        partition = record.partition
      } else if (record.key !== undefined && record.key !== null) {
        partition = partitionOfKey(typeof record.key === "string" ? utf8Encode(record.key) : record.key, t.count)
      } else {
        if (t.sticky < 0) {
          const next = (sticky.get(t.topic) ?? Math.floor(Math.random() * t.count)) + 1
          sticky.set(t.topic, next)
          t.sticky = next % t.count
        }
        partition = t.sticky
      }
      partitionOf[i] = partition
      if (!t.listed) {
        t.listed = true
        topics.push(t)
      }
      t.indexes.push(i)
    }
    return { out, partitionOf, topics }
  }
}

/** Items grouped by key, each group in the order of `items`. @internal */
export const groupBy = <K, A>(items: Iterable<A>, key: (a: A) => K): Map<K, Array<A>> => {
  const groups = new Map<K, Array<A>>()
  for (const item of items) {
    const k = key(item)
    const group = groups.get(k)
    if (group === undefined) groups.set(k, [item])
    else group.push(item)
  }
  return groups
}

/** A topic that does not exist. @internal */
export const unknownTopic = (topic: string) =>
  new ProduceFailed({
    reason: "UnknownTopic",
    topic,
    code: "UNKNOWN_TOPIC_OR_PARTITION",
    detail: `topic "${topic}" does not exist`
  })

/**
 * The records of one `send` or `sendAll`, answered together: one callback for the whole call, not a deferred per
 * record (which costs more than the rest of the producer's work on a record).
 */
class Group {
  /**
   * Each record's answer, made at the first answer, or the writer's own answers when the group was written whole as
   * one batch (no copy).
   */
  results: Array<Written> | undefined
  remaining: number
  /** Who waits for the answers: the caller, and any `flush` that came meanwhile. */
  waiting: Array<() => void> | undefined = undefined
  /**
   * Set while some of the call's records wait for room in the buffer: waits until they are in it, or until they have
   * failed (`maxBlock` passed, the caller was interrupted, the producer closed).
   */
  admission: Effect.Effect<void> | undefined = undefined
  constructor(readonly records: ReadonlyArray<ProducerRecord>, readonly at: number) {
    this.results = records.length === 0 ? [] : undefined
    this.remaining = records.length
  }
  settle(index: number, written: Written): void {
    const results = this.results ??= new Array(this.records.length)
    if (results[index] !== undefined) return
    results[index] = written
    if (--this.remaining === 0) this.done()
  }
  /**
   * Takes a writer's answers to the whole group, written as one batch in order, as the group's own, when none of its
   * records has an answer yet and every one has one there; false (nothing taken) otherwise.
   */
  settleWhole(results: Array<Written>): boolean {
    if (this.results !== undefined || results.length !== this.records.length) return false
    for (let i = 0; i < results.length; i++) {
      if (results[i] === undefined) return false
    }
    this.results = results
    this.remaining = 0
    this.done()
    return true
  }
  private done(): void {
    if (this.waiting === undefined) return
    for (const resume of this.waiting) resume()
    this.waiting = undefined
  }
  /** Waits until every record of the group has its answer. */
  get answers(): Effect.Effect<ReadonlyArray<Written>> {
    return Effect.async<ReadonlyArray<Written>>((resume) => {
      if (this.remaining === 0) return resume(Effect.succeed(this.results!))
      const waiter = () => resume(Effect.succeed(this.results!))
      ;(this.waiting ??= []).push(waiter)
      return Effect.sync(() => {
        if (this.waiting !== undefined) this.waiting = this.waiting.filter((w) => w !== waiter)
      })
    })
  }
  /** The caller's wait: for room in the buffer first, when some of its records wait for it, then for the answers. */
  get await(): Effect.Effect<ReadonlyArray<Written>> {
    return this.admission === undefined ? this.answers : Effect.zipRight(this.admission, this.answers)
  }
}

/**
 * Records `from` (inclusive) to `to` (exclusive) of a group, waiting in the buffer or written together: a `sendAll`
 * is kept as its records, with no object of the producer's own per record.
 */
interface Segment {
  readonly group: Group
  readonly from: number
  readonly to: number
  /** The records' sizes added up. */
  readonly bytes: number
}

/** A call whose records from `next` on wait for room in the buffer. */
interface Blocked {
  readonly group: Group
  next: number
  /** Every record is in the buffer, or has failed. */
  done: boolean
  /** Resumes the caller, once it waits. */
  resume: (() => void) | undefined
}

const closed = (record: ProducerRecord, detail: string) =>
  new ProduceFailed({
    reason: "Closed",
    topic: record.topic,
    ...(record.partition === undefined ? {} : { partition: record.partition }),
    detail
  })

/** The group of a batch that is one whole call (a `sendAll` written as it came), if it is one. */
const wholeCall = (batch: ReadonlyArray<Segment>): Group | undefined => {
  const first = batch[0]!
  return batch.length === 1 && first.from === 0 && first.to === first.group.records.length ? first.group : undefined
}

/** The records of a batch; a batch that is one whole call is the call's own copy. */
const recordsOf = (batch: ReadonlyArray<Segment>): ReadonlyArray<ProducerRecord> => {
  const whole = wholeCall(batch)
  if (whole !== undefined) return whole.records
  const records: Array<ProducerRecord> = []
  for (const { from, group, to } of batch) {
    for (let i = from; i < to; i++) records.push(group.records[i]!)
  }
  return records
}

/** Answers every record of `segments` with `answer`. */
const settleAll = (segments: ReadonlyArray<Segment>, answer: (record: ProducerRecord) => Written) => {
  for (const { from, group, to } of segments) {
    for (let i = from; i < to; i++) group.settle(i, answer(group.records[i]!))
  }
}

/**
 * Told of every record of the producer that failed; `sent` when the transport answered it (it reached the cluster,
 * or may have), not when it was refused before it was sent.
 *
 * @internal
 */
export type OnFailure = (failure: ProduceFailed, sent: boolean) => void

/**
 * The producer service on a transport: sends from any number of fibers go into one buffer; a collector fiber cuts
 * batches of up to `batchSize` bytes once the oldest record has waited `linger` (at once when the buffer holds a full
 * batch, a flush asks, or a send waits for room), and writes at most `maxInFlightRequests` of them at a time, in the
 * order they were cut.
 *
 * The records held, from their send until their answer, are at most `bufferMemory` bytes: a counter, checked as a
 * call's records go into the buffer. A call that does not fit waits for room with what is left of it, behind the
 * calls that already wait (so that a large `sendAll` is not starved by small sends), for up to `maxBlock`.
 *
 * @internal
 */
export const make = (
  settings: Resolved,
  transport: Transport,
  onFailure?: OnFailure
): Effect.Effect<Context.Tag.Service<typeof Producer>, never, Scope.Scope> =>
  Effect.gen(function*() {
    let buffer: Array<Segment> = []
    let bufferBytes = 0
    /** The bytes of the records in the buffer and in flight: what `bufferMemory` bounds. */
    let held = 0
    /** Calls waiting for room, in the order they came. */
    const blocked: Array<Blocked> = []
    let closing = false
    let flushes = 0
    const inFlight = new Set<ReadonlyArray<Segment>>()
    const writers = new Set<Fiber.RuntimeFiber<void>>()
    let wake: Deferred.Deferred<void> | undefined
    let running = 0
    const slotFree: { current: Deferred.Deferred<void> | undefined } = { current: undefined }
    const drained = yield* Deferred.make<void>()
    const maxBlockMillis = Duration.toMillis(settings.maxBlock)

    const signal = () => {
      const w = wake
      if (w !== undefined) {
        wake = undefined
        Deferred.unsafeDone(w, Exit.void)
      }
    }

    /**
     * Puts a call's records from `from` on into the buffer while they fit in `bufferMemory`, and answers the ones that
     * cannot be sent at all; returns where it stopped (the call's length once every record is in).
     */
    const admit = (group: Group, from: number): number => {
      const records = group.records
      const wasEmpty = buffer.length === 0
      // Runs of records that can be sent become segments; the others are answered at once.
      let start = from
      let bytes = 0
      let index = from
      for (; index < records.length; index++) {
        const record = records[index]!
        const size = sizeOf(record)
        const refused = closing
          ? closed(record, "the producer is shut down")
          : refuse(record, size, settings.maxRequestSize)
        if (refused === undefined) {
          if (held + bytes + size > settings.bufferMemory) break
          bytes += size
          continue
        }
        if (index > start) buffer.push({ group, from: start, to: index, bytes })
        held += bytes
        bufferBytes += bytes
        bytes = 0
        start = index + 1
        group.settle(index, refused)
        if (onFailure !== undefined) onFailure(refused, false)
      }
      if (index > start) buffer.push({ group, from: start, to: index, bytes })
      held += bytes
      bufferBytes += bytes
      // The collector waits with no deadline while the buffer is empty, and with the linger deadline of the oldest
      // record otherwise: it is woken when the buffer stops being empty or holds a full batch.
      if (buffer.length > 0 && (wasEmpty || bufferBytes >= settings.batchSize)) signal()
      return index
    }

    /** Lets waiting calls in, in order, while they fit. */
    const admitBlocked = () => {
      while (blocked.length > 0) {
        const entry = blocked[0]!
        entry.next = admit(entry.group, entry.next)
        if (entry.next < entry.group.records.length) return
        blocked.shift()
        entry.done = true
        entry.resume?.()
      }
    }

    /** Fails the records of a waiting call that are not in the buffer yet; they are never sent. */
    const giveUp = (entry: Blocked, detail: string) => {
      if (entry.done) return
      entry.done = true
      const at = blocked.indexOf(entry)
      if (at >= 0) blocked.splice(at, 1)
      const { group } = entry
      for (let i = entry.next; i < group.records.length; i++) {
        const record = group.records[i]!
        const failure = refuse(record, sizeOf(record), settings.maxRequestSize) ?? new ProduceFailed({
          reason: "BufferFull",
          topic: record.topic,
          ...(record.partition === undefined ? {} : { partition: record.partition }),
          detail
        })
        group.settle(i, failure)
        if (onFailure !== undefined) onFailure(failure, false)
      }
      // The calls behind it may fit where it did not.
      if (at === 0) admitBlocked()
    }

    const waitForRoom = (entry: Blocked): Effect.Effect<void> =>
      Effect.async<void>((resume) => {
        if (entry.done) return resume(Effect.void)
        entry.resume = () => resume(Effect.void)
      }).pipe(
        Effect.timeoutOption(settings.maxBlock),
        Effect.onExit((exit) =>
          Effect.sync(() =>
            giveUp(
              entry,
              Exit.isSuccess(exit)
                ? `the producer's buffer stayed full for maxBlock (${
                  Duration.format(settings.maxBlock)
                }): ${held} bytes held, bufferMemory ${settings.bufferMemory}; the record was not sent`
                : "the send was interrupted while it waited for room in the buffer; the record was not sent"
            )
          )
        ),
        Effect.asVoid
      )

    /** What is left of a call that does not fit waits for room, or fails at once when `maxBlock` is zero. */
    const block = (group: Group, next: number) => {
      const entry: Blocked = { group, next, done: false, resume: undefined }
      if (maxBlockMillis === 0) {
        return giveUp(
          entry,
          `the producer's buffer is full (${held} bytes held, bufferMemory ${settings.bufferMemory}) and maxBlock ` +
            "is 0; the record was not sent"
        )
      }
      blocked.push(entry)
      group.admission = waitForRoom(entry)
      // A waiting send makes the buffer go out without waiting for linger, as the Java client's accumulator does when
      // its memory is used up.
      signal()
    }

    const writeBatch = (batch: ReadonlyArray<Segment>) =>
      transport.write(recordsOf(batch)).pipe(
        Effect.exit,
        Effect.map((exit) => {
          if (Exit.isSuccess(exit) && onFailure !== undefined) {
            for (const written of exit.value) {
              if (written !== undefined && isFailure(written)) onFailure(written, true)
            }
          }
          if (Exit.isSuccess(exit) && wholeCall(batch)?.settleWhole(exit.value) === true) {
            // A call written as one batch: its answers are the writer's, as they are.
          } else if (Exit.isSuccess(exit)) {
            const results = exit.value
            let k = 0
            for (const { from, group, to } of batch) {
              for (let i = from; i < to; i++) {
                let written = results[k++]
                if (written === undefined) {
                  written = new ProduceFailed({ reason: "Other", topic: group.records[i]!.topic, detail: "no answer" })
                  if (onFailure !== undefined) onFailure(written, true)
                }
                group.settle(i, written)
              }
            }
          } else {
            const interrupted = Cause.isInterruptedOnly(exit.cause)
            const detail = interrupted
              ? "the producer was shut down while the record was in flight"
              : Cause.pretty(exit.cause)
            settleAll(batch, (record) => {
              const failure = interrupted
                ? closed(record, detail)
                : new ProduceFailed({ reason: "Other", topic: record.topic, detail })
              if (onFailure !== undefined) onFailure(failure, true)
              return failure
            })
          }
          inFlight.delete(batch)
          running--
          for (const segment of batch) held -= segment.bytes
          if (blocked.length > 0) admitBlocked()
          const free = slotFree.current
          if (free !== undefined) {
            slotFree.current = undefined
            Deferred.unsafeDone(free, Exit.void)
          }
        })
      )

    /** The oldest records of the buffer, up to `batchSize` bytes (at least one record). */
    const cut = (): Array<Segment> => {
      const batch: Array<Segment> = []
      let bytes = 0
      let taken = 0
      while (taken < buffer.length) {
        const segment = buffer[taken]!
        if (bytes + segment.bytes <= settings.batchSize || (bytes === 0 && segment.to - segment.from === 1)) {
          bytes += segment.bytes
          batch.push(segment)
          taken++
          continue
        }
        const { from, group, to } = segment
        let end = from
        let head = 0
        // The records' sizes are counted again here, where a call's records are split between batches (rare: a
        // group keeps no array of sizes for it).
        while (end < to) {
          const size = sizeOf(group.records[end]!)
          if (bytes + head > 0 && bytes + head + size > settings.batchSize) break
          head += size
          end++
        }
        if (end > from) batch.push({ group, from, to: end, bytes: head })
        buffer[taken] = { group, from: end, to, bytes: segment.bytes - head }
        bytes += head
        break
      }
      buffer = taken === buffer.length ? [] : buffer.slice(taken)
      bufferBytes -= bytes
      // A flush holds until what waited for room when it came has gone out too.
      if (flushes > 0 && buffer.length === 0 && blocked.length === 0) flushes = 0
      return batch
    }

    const waitForWake = (millis: number | undefined) =>
      Effect.suspend(() => {
        const w = Deferred.unsafeMake<void>(FiberId.none)
        wake = w
        const waiting = Deferred.await(w)
        return millis === undefined ? waiting : Effect.asVoid(Effect.timeoutOption(waiting, Duration.millis(millis)))
      })

    const collector: Effect.Effect<void> = Effect.gen(function*() {
      while (true) {
        if (buffer.length === 0) {
          if (closing) {
            if (running === 0) return
          } else {
            yield* waitForWake(undefined)
            continue
          }
        }
        if (
          settings.lingerMillis > 0 && buffer.length > 0 && !closing && flushes === 0 && blocked.length === 0 &&
          bufferBytes < settings.batchSize
        ) {
          const now = yield* Clock.currentTimeMillis
          const remaining = buffer[0]!.group.at + settings.lingerMillis - now
          if (remaining > 0) {
            yield* waitForWake(remaining)
            continue
          }
        }
        if (running >= settings.maxInFlightRequests || (buffer.length === 0 && running > 0)) {
          const free = Deferred.unsafeMake<void>(FiberId.none)
          slotFree.current = free
          yield* Deferred.await(free)
          continue
        }
        const batch = cut()
        inFlight.add(batch)
        running++
        if (settings.maxInFlightRequests === 1) {
          // One batch at a time: the collector writes it itself (a fiber of its own would only add a hand-over), and
          // cuts the next one once it is answered.
          yield* writeBatch(batch)
          continue
        }
        const writer = yield* Effect.forkDaemon(Effect.interruptible(writeBatch(batch)))
        writers.add(writer)
        writer.addObserver(() => writers.delete(writer))
      }
    })

    // The collector and the writers wait on timeouts: they must be interruptible even when the producer is made in
    // an uninterruptible region (a transaction is).
    const collectorFiber = yield* collector.pipe(
      Effect.interruptible,
      Effect.ensuring(Deferred.succeed(drained, undefined)),
      Effect.forkDaemon
    )

    // The clock of the producer's maker (a test's TestClock), read synchronously: a send is one step, not three.
    const clock = yield* Effect.clock

    /**
     * Puts a call's records into the buffer (or answers the refused ones); its group answers for them. What does not
     * fit waits for room, behind the calls already waiting.
     */
    const submit = (records: ReadonlyArray<ProducerRecord>): Group => {
      const group = new Group(records, clock.unsafeCurrentTimeMillis())
      const next = blocked.length === 0 || closing ? admit(group, 0) : 0
      if (next < records.length) block(group, next)
      return group
    }

    const answerOne = (results: ReadonlyArray<Written>): Effect.Effect<RecordMetadata, ProduceFailed> => {
      const written = results[0]!
      return isFailure(written) ? Effect.fail(written) : Effect.succeed(written)
    }

    // A group's answers, once all are in, are the caller's as they are (no copy) when none is a failure.
    const answerAll = (results: ReadonlyArray<Written>): Effect.Effect<ReadonlyArray<RecordMetadata>, ProduceFailed> =>
      allWritten(results) ? Effect.succeed(results) : Effect.fail(firstFailure(results)!)

    // With observability (looked up in the caller's context), a send is counted, timed and traced.
    const send: Context.Tag.Service<typeof Producer>["send"] = (record) =>
      Effect.contextWithEffect((context: Context.Context<never>) => {
        const observability = Context.getOption(context, Observability)
        if (Option.isNone(observability)) return Effect.flatMap(submit([record]).await, answerOne)
        return telemetry.send(observability.value, clock, [record], submit, answerOne, sizeOf)
      })

    // The records are copied into an array of the producer's own: the caller may reuse its array once the call is made.
    const sendAll: Context.Tag.Service<typeof Producer>["sendAll"] = (records) =>
      Effect.contextWithEffect((context: Context.Context<never>) => {
        const own = Array.isArray(records) ? records.slice() : Array.from(records)
        const observability = Context.getOption(context, Observability)
        if (Option.isNone(observability)) return Effect.flatMap(submit(own).await, answerAll)
        return telemetry.send(observability.value, clock, own, submit, answerAll, sizeOf)
      })

    const flush: Effect.Effect<void> = Effect.suspend(() => {
      const waiting = new Set<Group>()
      for (const { group } of buffer) waiting.add(group)
      for (const batch of inFlight) for (const { group } of batch) waiting.add(group)
      for (const { group } of blocked) waiting.add(group)
      if (waiting.size === 0) return Effect.void
      if (buffer.length > 0 || blocked.length > 0) {
        flushes++
        signal()
      }
      return Effect.forEach(waiting, (group) => group.answers, { discard: true })
    })

    yield* Effect.addFinalizer(() =>
      Effect.gen(function*() {
        closing = true
        // What still waits for room was never handed over: it fails with Closed.
        admitBlocked()
        signal()
        // Finalizers run uninterruptibly: the wait must be interruptible for the timeout to end it.
        const finished = yield* Effect.interruptible(Deferred.await(drained)).pipe(
          Effect.timeoutOption(settings.closeTimeout)
        )
        yield* Fiber.interrupt(collectorFiber)
        if (Option.isNone(finished)) {
          yield* Fiber.interruptAll(writers)
          const left = [...buffer, ...Array.from(inFlight).flat()]
          settleAll(left, (record) => closed(record, "the producer was shut down before the record was written"))
          buffer = []
          inFlight.clear()
          held = 0
        }
      })
    )

    return { send, sendAll, flush }
  })

/**
 * One open transaction of a transactional producer, as a transport sees it.
 *
 * @internal
 */
export interface TxnSession {
  /** As `Transport.write`. */
  readonly write: (batch: ReadonlyArray<ProducerRecord>) => Effect.Effect<Array<Written>>
  /** Commits these positions for the group, with the transaction: they land if it commits, and only then. */
  readonly sendOffsets: (
    groupId: string,
    positions: ReadonlyArray<{ readonly topic: string; readonly partition: number; readonly next: bigint }>
  ) => Effect.Effect<void, TransactionFailed>
  readonly commit: Effect.Effect<void, TransactionFailed>
  readonly abort: Effect.Effect<void, TransactionFailed>
}

/**
 * A transactional producer, as a transport sees it: `init` fences every earlier producer with the same transactional
 * id (the broker bumps the id's epoch and aborts their open transaction); `begin` opens a transaction.
 *
 * @internal
 */
export interface TxnClient {
  readonly transactionalId: string
  readonly init: Effect.Effect<void, TransactionFailed>
  readonly begin: Effect.Effect<TxnSession, TransactionFailed>
}

/** @internal */
export const transactionFailed = (
  transactionalId: string,
  operation: TransactionFailed["operation"],
  reason: TransactionFailed["reason"],
  detail?: string
) => new TransactionFailed({ transactionalId, operation, reason, ...(detail === undefined ? {} : { detail }) })

/**
 * Runs `body` in a transaction of `client`: its `Producer` sends go into the transaction (batched as the settings
 * say). When `body` succeeds and every send succeeded, `offsets` are sent with the transaction and it commits. When a
 * send failed (refused before it was sent, or by the cluster; caught by `body` or not) it is aborted, and so it is when
 * `body` fails or is interrupted: `body`'s own failure is the answer then, `TransactionFailed` (`Aborted`) when `body`
 * succeeded. Sends still in the buffer are written first either way.
 *
 * @internal
 */
export const inTransaction = <A, E, R>(
  settings: Resolved,
  client: TxnClient,
  body: Effect.Effect<A, E, R>,
  offsets: TransactionOffsets | undefined,
  /** Told when a send of the transaction failed or its end did: the client must start over before the next one. */
  unclean: () => void = () => {}
): Effect.Effect<A, E | TransactionFailed, Exclude<R, Producer>> =>
  Effect.uninterruptibleMask((restore) =>
    Effect.gen(function*() {
      const observability = Option.getOrUndefined(yield* Effect.serviceOption(Observability))
      const session = yield* client.begin
      // The first send of the transaction that failed, whatever the reason and whether the body caught it: the
      // transaction cannot commit any more (the Java client's rule). `sentFailed`: one failed after it was sent, so the
      // client's sequence numbers may be behind the broker's.
      let failed: ProduceFailed | undefined
      let sentFailed = false
      const scope = yield* Scope.make()
      const producer = yield* make(settings, { write: session.write }, (failure, sent) => {
        failed ??= failure
        if (sent) sentFailed = true
      }).pipe(Scope.extend(scope))
      const exit = yield* Effect.exit(restore(Effect.provideService(body, Producer, producer)))
      yield* Scope.close(scope, Exit.void)
      if (sentFailed) unclean()
      if (Exit.isFailure(exit)) {
        yield* Effect.ignore(session.abort)
        telemetry.transactionEnded(observability, "aborted")
        return yield* Effect.failCause(exit.cause)
      }
      if (failed !== undefined) {
        yield* Effect.ignore(session.abort)
        telemetry.transactionEnded(observability, "aborted")
        return yield* transactionFailed(
          client.transactionalId,
          "commit",
          "Aborted",
          `a send of the transaction failed, so it was aborted: ${failed.message}`
        )
      }
      const committed = yield* Effect.exit(
        offsets === undefined
          ? session.commit
          : Effect.zipRight(session.sendOffsets(offsets.groupId, offsets.positions), session.commit)
      )
      if (Exit.isFailure(committed)) {
        unclean()
        yield* Effect.ignore(session.abort)
        telemetry.transactionEnded(observability, "aborted")
        return yield* Effect.failCause(committed.cause)
      }
      telemetry.transactionEnded(observability, "committed")
      return exit.value
    })
  )

/** A transactional id: a non-empty string. @internal */
export const checkTransactionalId = (transactionalId: string): Effect.Effect<string, InvalidConfig> =>
  typeof transactionalId === "string" && transactionalId.trim().length > 0
    ? Effect.succeed(transactionalId)
    : Effect.fail(new InvalidConfig({ field: "transactionalId", reason: "must be a non-empty string" }))

/**
 * Transactional settings checked: a transactional producer is idempotent, with acks "all" and one batch in flight.
 *
 * @internal
 */
export const resolveTransactional = (settings: Omit<TransactionalSettings, "transactionalId">) =>
  Effect.gen(function*() {
    const { transactionTimeout: _, ...rest } = settings
    const resolved = yield* resolve({ ...rest, acks: "all", idempotent: true, maxInFlightRequests: 1 })
    const transactionTimeout = yield* positiveDuration("transactionTimeout", settings.transactionTimeout ?? "60 seconds")
    return { resolved, transactionTimeout }
  })

/**
 * The `TransactionalProducer` service on a client: fenced earlier producers at once, then one transaction at a time.
 *
 * @internal
 */
export const makeTransactional = (
  settings: Resolved,
  client: TxnClient
): Effect.Effect<Context.Tag.Service<typeof TransactionalProducer>, TransactionFailed> =>
  Effect.gen(function*() {
    yield* client.init
    const one = yield* Effect.makeSemaphore(1)
    // Once fenced, a producer stays fenced: its client may not even be able to begin (kafkajs stays in the state of
    // the refused commit), and nothing it could write would land.
    let fenced: string | undefined
    // A transaction whose send or end failed leaves the client's sequence numbers behind the broker's: the next
    // transaction starts with a fresh producer session (the same id, a new epoch).
    let restart = false
    const noteFenced = (error: unknown) => {
      if (
        (error instanceof TransactionFailed || error instanceof ProduceFailed) && error.reason === "Fenced" &&
        fenced === undefined
      ) fenced = error.message
    }
    return {
      transactionalId: client.transactionalId,
      transaction: (body, options) =>
        one.withPermits(1)(Effect.suspend(() =>
          fenced !== undefined
            ? Effect.fail(transactionFailed(client.transactionalId, "begin", "Fenced", `fenced earlier: ${fenced}`))
            : Effect.zipRight(
              restart ? Effect.tap(client.init, () => Effect.sync(() => (restart = false))) : Effect.void,
              inTransaction(settings, client, body, options?.offsets, () => (restart = true))
            ).pipe(Effect.tapError((error) => Effect.sync(() => noteFenced(error))))
        ))
    }
  })
