/**
 * Retrying what passes, for the stores on a database server: a failure that passes (a lost connection, a deadlock, a
 * serialization failure) is tried again on the store's schedule, for as long as the schedule allows; then the
 * operation fails with the last failure, saying how long it was retried.
 */
import * as Clock from "effect/Clock"
import * as Data from "effect/Data"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Schedule from "effect/Schedule"
import { OffsetStoreError } from "../../KafkaError.js"

/** Node's codes for a connection that could not be made or is gone. @internal */
export const socketErrorCodes: ReadonlyArray<string> = [
  "ECONNREFUSED",
  "ECONNRESET",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "EPIPE",
  "ETIMEDOUT"
]

/** A failure that passes: the operation is tried again, on the retry schedule. @internal */
export class Transient extends Data.TaggedError("Transient")<{ readonly error: OffsetStoreError }> {}

/** @internal */
export const isTransientError = <E>(error: E | Transient): error is Transient => error instanceof Transient

/** Exponential from 100 ms, capped at 5 seconds, jittered. @internal */
export const defaultRetry: Schedule.Schedule<unknown, OffsetStoreError> = Schedule.exponential("100 millis").pipe(
  Schedule.union(Schedule.spaced("5 seconds")),
  Schedule.jittered
)

/**
 * A failure that passes is retried on the schedule, which is built only once something failed; when the schedule
 * ends, the operation fails with the last failure and how long it was retried.
 *
 * @internal
 */
export const retrying = <A, E, R>(
  store: string,
  schedule: Schedule.Schedule<unknown, OffsetStoreError>,
  operation: string,
  effect: Effect.Effect<A, E | Transient, R>
): Effect.Effect<A, E | OffsetStoreError, R> =>
  Effect.catchIf(effect, isTransientError, (first) =>
    Effect.gen(function*() {
      const driver = yield* Schedule.driver(schedule)
      const started = yield* Clock.currentTimeMillis
      const loop = (attempts: number, last: Transient): Effect.Effect<A, E | OffsetStoreError, R> =>
        driver.next(last.error).pipe(
          Effect.matchEffect({
            onFailure: () =>
              Effect.flatMap(Clock.currentTimeMillis, (now) =>
                Effect.fail(
                  new OffsetStoreError({
                    store,
                    operation,
                    reason: `still failing after ${attempts} attempts over ${
                      Duration.format(Duration.millis(now - started))
                    }: ${last.error.reason}`,
                    cause: last.error.cause
                  })
                )),
            onSuccess: () => Effect.catchIf(effect, isTransientError, (again) => loop(attempts + 1, again))
          })
        )
      return yield* loop(1, first)
    }))
