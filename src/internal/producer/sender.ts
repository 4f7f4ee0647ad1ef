/**
 * The producer's collector, which cuts batches from the buffer once they are due, and the writing of a batch, which
 * answers its records with what the transport said.
 */
import * as Cause from "effect/Cause"
import * as Clock from "effect/Clock"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as FiberId from "effect/FiberId"
import { ProduceFailed } from "../../KafkaError.js"
import { admitBlocked, cut, type State } from "./buffer.js"
import { recordsOf, type Segment, settleAll, wholeCall } from "./group.js"
import { closed } from "./record.js"
import { isFailure } from "./written.js"

const writeBatch = (state: State, batch: ReadonlyArray<Segment>) => {
  const { onFailure } = state
  return state.transport.write(recordsOf(batch)).pipe(
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
      state.inFlight.delete(batch)
      state.running--
      for (const segment of batch) state.held -= segment.bytes
      if (state.blocked.length > 0) admitBlocked(state)
      const free = state.slotFree
      if (free !== undefined) {
        state.slotFree = undefined
        Deferred.unsafeDone(free, Exit.void)
      }
    })
  )
}

const waitForWake = (state: State, millis: number | undefined) =>
  Effect.suspend(() => {
    const w = Deferred.unsafeMake<void>(FiberId.none)
    state.wake = w
    const waiting = Deferred.await(w)
    return millis === undefined ? waiting : Effect.asVoid(Effect.timeoutOption(waiting, Duration.millis(millis)))
  })

/**
 * Cuts batches once they are due and writes them, at most `maxInFlightRequests` at a time, in the order they were
 * cut; it ends once the producer is closing and everything it held is answered.
 *
 * @internal
 */
export const collector = (state: State): Effect.Effect<void> => {
  const { settings } = state
  return Effect.gen(function*() {
    while (true) {
      if (state.buffer.length === 0) {
        if (state.closing) {
          if (state.running === 0) return
        } else {
          yield* waitForWake(state, undefined)
          continue
        }
      }
      if (
        settings.lingerMillis > 0 && state.buffer.length > 0 && !state.closing && state.flushes === 0 &&
        state.blocked.length === 0 && state.bufferBytes < settings.batchSize
      ) {
        const now = yield* Clock.currentTimeMillis
        const remaining = state.buffer[0]!.group.at + settings.lingerMillis - now
        if (remaining > 0) {
          yield* waitForWake(state, remaining)
          continue
        }
      }
      if (state.running >= settings.maxInFlightRequests || (state.buffer.length === 0 && state.running > 0)) {
        const free = Deferred.unsafeMake<void>(FiberId.none)
        state.slotFree = free
        yield* Deferred.await(free)
        continue
      }
      const batch = cut(state)
      state.inFlight.add(batch)
      state.running++
      if (settings.maxInFlightRequests === 1) {
        // One batch at a time: the collector writes it itself (a fiber of its own would only add a hand-over), and
        // cuts the next one once it is answered.
        yield* writeBatch(state, batch)
        continue
      }
      const writer = yield* Effect.forkDaemon(Effect.interruptible(writeBatch(state, batch)))
      state.writers.add(writer)
      writer.addObserver(() => state.writers.delete(writer))
    }
  })
}
