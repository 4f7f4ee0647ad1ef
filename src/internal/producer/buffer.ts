/**
 * The producer's buffer: the records sent and not yet written, the calls that wait for room in it, and the bytes held
 * from a send until its answer, which `bufferMemory` bounds.
 */
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import type * as Fiber from "effect/Fiber"
import { ProduceFailed } from "../../KafkaError.js"
import type { ProducerRecord } from "../../Producer.js"
import type { Group, Segment } from "./group.js"
import { closed, refuse, sizeOf } from "./record.js"
import type { Resolved } from "./settings.js"
import type { Written } from "./written.js"

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

/**
 * Told of every record of the producer that failed; `sent` when the transport answered it (it reached the cluster,
 * or may have), not when it was refused before it was sent.
 *
 * @internal
 */
export type OnFailure = (failure: ProduceFailed, sent: boolean) => void

/** A call whose records from `next` on wait for room in the buffer. @internal */
export interface Blocked {
  readonly group: Group
  next: number
  /** Every record is in the buffer, or has failed. */
  done: boolean
  /** Resumes the caller, once it waits. */
  resume: (() => void) | undefined
}

/**
 * One producer's state, shared by its senders, its collector and its writers.
 *
 * @internal
 */
export interface State {
  readonly settings: Resolved
  readonly transport: Transport
  readonly onFailure: OnFailure | undefined
  buffer: Array<Segment>
  bufferBytes: number
  /** The bytes of the records in the buffer and in flight: what `bufferMemory` bounds. */
  held: number
  /** Calls waiting for room, in the order they came. */
  readonly blocked: Array<Blocked>
  closing: boolean
  flushes: number
  readonly inFlight: Set<ReadonlyArray<Segment>>
  readonly writers: Set<Fiber.RuntimeFiber<void>>
  wake: Deferred.Deferred<void> | undefined
  running: number
  slotFree: Deferred.Deferred<void> | undefined
  readonly drained: Deferred.Deferred<void>
  readonly maxBlockMillis: number
}

/** @internal */
export const makeState = (settings: Resolved, transport: Transport, onFailure: OnFailure | undefined) =>
  Effect.map(Deferred.make<void>(), (drained): State => ({
    settings,
    transport,
    onFailure,
    buffer: [],
    bufferBytes: 0,
    held: 0,
    blocked: [],
    closing: false,
    flushes: 0,
    inFlight: new Set(),
    writers: new Set(),
    wake: undefined,
    running: 0,
    slotFree: undefined,
    drained,
    maxBlockMillis: Duration.toMillis(settings.maxBlock)
  }))

/** Wakes the collector, if it waits. @internal */
export const signal = (state: State) => {
  const w = state.wake
  if (w !== undefined) {
    state.wake = undefined
    Deferred.unsafeDone(w, Exit.void)
  }
}

/**
 * Puts a call's records from `from` on into the buffer while they fit in `bufferMemory`, and answers the ones that
 * cannot be sent at all; returns where it stopped (the call's length once every record is in).
 *
 * @internal
 */
export const admit = (state: State, group: Group, from: number): number => {
  const { onFailure, settings } = state
  const records = group.records
  const wasEmpty = state.buffer.length === 0
  // Runs of records that can be sent become segments; the others are answered at once.
  let start = from
  let bytes = 0
  let index = from
  for (; index < records.length; index++) {
    const record = records[index]!
    const size = sizeOf(record)
    const refused = state.closing
      ? closed(record, "the producer is shut down")
      : refuse(record, size, settings.maxRequestSize)
    if (refused === undefined) {
      if (state.held + bytes + size > settings.bufferMemory) break
      bytes += size
      continue
    }
    if (index > start) state.buffer.push({ group, from: start, to: index, bytes })
    state.held += bytes
    state.bufferBytes += bytes
    bytes = 0
    start = index + 1
    group.settle(index, refused)
    if (onFailure !== undefined) onFailure(refused, false)
  }
  if (index > start) state.buffer.push({ group, from: start, to: index, bytes })
  state.held += bytes
  state.bufferBytes += bytes
  // The collector waits with no deadline while the buffer is empty, and with the linger deadline of the oldest
  // record otherwise: it is woken when the buffer stops being empty or holds a full batch.
  if (state.buffer.length > 0 && (wasEmpty || state.bufferBytes >= settings.batchSize)) signal(state)
  return index
}

/** Lets waiting calls in, in order, while they fit. @internal */
export const admitBlocked = (state: State) => {
  const { blocked } = state
  while (blocked.length > 0) {
    const entry = blocked[0]!
    entry.next = admit(state, entry.group, entry.next)
    if (entry.next < entry.group.records.length) return
    blocked.shift()
    entry.done = true
    entry.resume?.()
  }
}

/** Fails the records of a waiting call that are not in the buffer yet; they are never sent. */
const giveUp = (state: State, entry: Blocked, detail: string) => {
  const { blocked, onFailure, settings } = state
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
  if (at === 0) admitBlocked(state)
}

const waitForRoom = (state: State, entry: Blocked): Effect.Effect<void> => {
  const { settings } = state
  return Effect.async<void>((resume) => {
    if (entry.done) return resume(Effect.void)
    entry.resume = () => resume(Effect.void)
  }).pipe(
    Effect.timeoutOption(settings.maxBlock),
    Effect.onExit((exit) =>
      Effect.sync(() =>
        giveUp(
          state,
          entry,
          Exit.isSuccess(exit)
            ? `the producer's buffer stayed full for maxBlock (${
              Duration.format(settings.maxBlock)
            }): ${state.held} bytes held, bufferMemory ${settings.bufferMemory}; the record was not sent`
            : "the send was interrupted while it waited for room in the buffer; the record was not sent"
        )
      )
    ),
    Effect.asVoid
  )
}

/**
 * What is left of a call that does not fit waits for room, or fails at once when `maxBlock` is zero.
 *
 * @internal
 */
export const block = (state: State, group: Group, next: number) => {
  const entry: Blocked = { group, next, done: false, resume: undefined }
  if (state.maxBlockMillis === 0) {
    return giveUp(
      state,
      entry,
      `the producer's buffer is full (${state.held} bytes held, bufferMemory ${state.settings.bufferMemory}) and ` +
        "maxBlock is 0; the record was not sent"
    )
  }
  state.blocked.push(entry)
  group.admission = waitForRoom(state, entry)
  // A waiting send makes the buffer go out without waiting for linger, as the Java client's accumulator does when
  // its memory is used up.
  signal(state)
}

/** The oldest records of the buffer, up to `batchSize` bytes (at least one record). @internal */
export const cut = (state: State): Array<Segment> => {
  const { settings } = state
  const buffer = state.buffer
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
  state.buffer = taken === buffer.length ? [] : buffer.slice(taken)
  state.bufferBytes -= bytes
  // A flush holds until what waited for room when it came has gone out too.
  if (state.flushes > 0 && state.buffer.length === 0 && state.blocked.length === 0) state.flushes = 0
  return batch
}
