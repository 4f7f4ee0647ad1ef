/**
 * The failures the failure route tells apart: the user's handler failing (`HandlerFailure`), which the route may
 * retry and set aside, and what ends the consumer as it is (`Fatal`); and the handler as the runloop calls it.
 *
 * @internal
 */
import * as Chunk from "effect/Chunk"
import type * as Effect from "effect/Effect"
import type { ConsumerRecord } from "../../ConsumerRecord.js"
import { type CircuitOpen, DecodeFailed, type ProduceFailed, type RecordNotInChunk } from "../../KafkaError.js"
import type * as TopicPartition from "../../TopicPartition.js"

/**
 * A failure of the user's handler, wrapped where the handler is called, so that it is never taken for one of the
 * policy's own errors (a handler may well fail with a `DriverError` of its own); `offset` locates it when known.
 */
export class HandlerFailure<E> {
  constructor(
    readonly error: E,
    readonly offset: bigint | undefined,
    /** Whether the records before `offset` were handled (a record handler goes in order; a chunk handler not). */
    readonly handledBefore: boolean = true
  ) {}
}

/**
 * A failure that ends the consumer as it is, neither retried nor routed: the route's own write failed or its circuit
 * opened, or the handler named a record that is not in its chunk.
 */
export class Fatal {
  constructor(readonly error: ProduceFailed | CircuitOpen<unknown> | RecordNotInChunk<unknown>) {}
}

/** The handler as the runloop calls it. */
export type Work<E, R> = (
  records: Chunk.Chunk<ConsumerRecord>,
  partition: TopicPartition.TopicPartition
) => Effect.Effect<void, HandlerFailure<E> | Fatal, R>

/** A handler failure worth another attempt: decoding the same bytes again gives the same answer. */
export const retryable = (error: unknown): boolean =>
  error instanceof HandlerFailure && !(error.error instanceof DecodeFailed)

/**
 * The record a handler failure is about: the one it names, else the only record of its chunk; `undefined` when a
 * chunk handler failed on a chunk of several records without saying on which.
 */
export const failedOffset = (
  failure: HandlerFailure<unknown>,
  records: Chunk.Chunk<ConsumerRecord>
): bigint | undefined => failure.offset ?? (Chunk.size(records) === 1 ? Chunk.unsafeHead(records).offset : undefined)

/**
 * Where the record at `offset` is in `records`, whose offsets grow: by halves, reading records in place (a chunk may
 * be a slice, which a search through its iterator would copy); -1 when it is not there.
 */
export const indexOf = (records: Chunk.Chunk<ConsumerRecord>, offset: bigint): number => {
  let low = 0
  let high = Chunk.size(records) - 1
  while (low <= high) {
    const middle = (low + high) >>> 1
    const found = Chunk.unsafeGet(records, middle).offset
    if (found === offset) return middle
    if (found < offset) low = middle + 1
    else high = middle - 1
  }
  // Not found by halves: offsets that do not grow would be a caller's mistake, but the record is looked for anyway.
  for (let i = 0; i < Chunk.size(records); i++) if (Chunk.unsafeGet(records, i).offset === offset) return i
  return -1
}
