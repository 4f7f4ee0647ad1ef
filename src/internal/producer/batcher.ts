/**
 * The producer service on a transport: sends go into the buffer (`./buffer.ts`), the collector cuts and writes batches
 * (`./sender.ts`), and each call is answered through its group (`./group.ts`).
 */
import * as Context from "effect/Context"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Option from "effect/Option"
import type * as Scope from "effect/Scope"
import type { ProduceFailed } from "../../KafkaError.js"
import { Observability } from "../../Observability.js"
import type { Producer, ProducerRecord, RecordMetadata } from "../../Producer.js"
import * as telemetry from "../telemetry/telemetry.js"
import { admit, admitBlocked, block, makeState, type OnFailure, signal, type Transport } from "./buffer.js"
import { allWritten, firstFailure, Group, settleAll } from "./group.js"
import { closed, sizeOf } from "./record.js"
import { collector } from "./sender.js"
import type { Resolved } from "./settings.js"
import { isFailure, type Written } from "./written.js"

const answerOne = (results: ReadonlyArray<Written>): Effect.Effect<RecordMetadata, ProduceFailed> => {
  const written = results[0]!
  return isFailure(written) ? Effect.fail(written) : Effect.succeed(written)
}

// A group's answers, once all are in, are the caller's as they are (no copy) when none is a failure.
const answerAll = (results: ReadonlyArray<Written>): Effect.Effect<ReadonlyArray<RecordMetadata>, ProduceFailed> =>
  allWritten(results) ? Effect.succeed(results) : Effect.fail(firstFailure(results)!)

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
    const state = yield* makeState(settings, transport, onFailure)

    // The collector and the writers wait on timeouts: they must be interruptible even when the producer is made in
    // an uninterruptible region (a transaction is).
    const collectorFiber = yield* collector(state).pipe(
      Effect.interruptible,
      Effect.ensuring(Deferred.succeed(state.drained, undefined)),
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
      const next = state.blocked.length === 0 || state.closing ? admit(state, group, 0) : 0
      if (next < records.length) block(state, group, next)
      return group
    }

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
      for (const { group } of state.buffer) waiting.add(group)
      for (const batch of state.inFlight) for (const { group } of batch) waiting.add(group)
      for (const { group } of state.blocked) waiting.add(group)
      if (waiting.size === 0) return Effect.void
      if (state.buffer.length > 0 || state.blocked.length > 0) {
        state.flushes++
        signal(state)
      }
      return Effect.forEach(waiting, (group) => group.answers, { discard: true })
    })

    yield* Effect.addFinalizer(() =>
      Effect.gen(function*() {
        state.closing = true
        // What still waits for room was never handed over: it fails with Closed.
        admitBlocked(state)
        signal(state)
        // Finalizers run uninterruptibly: the wait must be interruptible for the timeout to end it.
        const finished = yield* Effect.interruptible(Deferred.await(state.drained)).pipe(
          Effect.timeoutOption(settings.closeTimeout)
        )
        yield* Fiber.interrupt(collectorFiber)
        if (Option.isNone(finished)) {
          yield* Fiber.interruptAll(state.writers)
          const left = [...state.buffer, ...Array.from(state.inFlight).flat()]
          settleAll(left, (record) => closed(record, "the producer was shut down before the record was written"))
          state.buffer = []
          state.inFlight.clear()
          state.held = 0
        }
      })
    )

    return { send, sendAll, flush }
  })
