/**
 * The records of one call (`send` or `sendAll`) and their answers, and the runs of them that wait in the buffer or
 * are written together.
 */
import * as Effect from "effect/Effect"
import type { ProduceFailed } from "../../KafkaError.js"
import type { ProducerRecord, RecordMetadata } from "../../Producer.js"
import { isFailure, type Written } from "./written.js"

/** The first failure among a call's answers, in their order. @internal */
export const firstFailure = (results: ReadonlyArray<Written>): ProduceFailed | undefined => {
  for (let i = 0; i < results.length; i++) {
    const written = results[i]!
    if (isFailure(written)) return written
  }
  return undefined
}

/** Every answer is where its record was written. @internal */
export const allWritten = (results: ReadonlyArray<Written>): results is ReadonlyArray<RecordMetadata> =>
  firstFailure(results) === undefined

/**
 * The records of one `send` or `sendAll`, answered together: one callback for the whole call, not a deferred per
 * record (which costs more than the rest of the producer's work on a record).
 *
 * @internal
 */
export class Group {
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
 *
 * @internal
 */
export interface Segment {
  readonly group: Group
  readonly from: number
  readonly to: number
  /** The records' sizes added up. */
  readonly bytes: number
}

/** The group of a batch that is one whole call (a `sendAll` written as it came), if it is one. @internal */
export const wholeCall = (batch: ReadonlyArray<Segment>): Group | undefined => {
  const first = batch[0]!
  return batch.length === 1 && first.from === 0 && first.to === first.group.records.length ? first.group : undefined
}

/** The records of a batch; a batch that is one whole call is the call's own copy. @internal */
export const recordsOf = (batch: ReadonlyArray<Segment>): ReadonlyArray<ProducerRecord> => {
  const whole = wholeCall(batch)
  if (whole !== undefined) return whole.records
  const records: Array<ProducerRecord> = []
  for (const { from, group, to } of batch) {
    for (let i = from; i < to; i++) records.push(group.records[i]!)
  }
  return records
}

/** Answers every record of `segments` with `answer`. @internal */
export const settleAll = (segments: ReadonlyArray<Segment>, answer: (record: ProducerRecord) => Written) => {
  for (const { from, group, to } of segments) {
    for (let i = from; i < to; i++) group.settle(i, answer(group.records[i]!))
  }
}
