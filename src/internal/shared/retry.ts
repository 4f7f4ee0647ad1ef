import * as Clock from "effect/Clock"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import type * as Schedule from "effect/Schedule"
import * as ScheduleDecision from "effect/ScheduleDecision"
import * as ScheduleIntervals from "effect/ScheduleIntervals"

/**
 * `Effect.retry` that builds nothing until `effect` has failed: an attempt that succeeds (the hot path: a chunk, a
 * commit) costs no retry machinery. The first failure is handed to the schedule as if it had driven that attempt, so
 * the number of retries is what `schedule` says. Failures `retryable` refuses are not retried.
 *
 * The schedule is stepped here, one `step` per failure, rather than through `Effect.retry`, whose driver (its state
 * and iteration references, the schedule wrapped for `while`) costs several times the whole failure path of a record
 * routed at once; a schedule that allows no retry (`Schedule.recurs(0)`) costs one step. Decisions are the same:
 * the failure is the step's input, a step that is done gives the failure back, and a step that continues waits until
 * its interval starts.
 *
 * @internal
 */
export const retryAfterFailure = <A, E, R, R2>(
  effect: Effect.Effect<A, E, R>,
  options: { readonly schedule: Schedule.Schedule<unknown, E, R2>; readonly retryable: (error: E) => boolean }
): Effect.Effect<A, E, R | R2> =>
  Effect.catchIf(effect, options.retryable, (first) => retryFrom(effect, first, options))

/**
 * Retries `effect` as `schedule` says, after a failure already seen (`first`), which counts as its first attempt.
 *
 * @internal
 */
export const retryFrom = <A, E, R, R2>(
  effect: Effect.Effect<A, E, R>,
  first: E,
  options: { readonly schedule: Schedule.Schedule<unknown, E, R2>; readonly retryable: (error: E) => boolean }
): Effect.Effect<A, E, R | R2> => {
  const { retryable, schedule } = options
  const after = (error: E, state: unknown): Effect.Effect<A, E, R | R2> =>
    Effect.flatMap(
      Clock.currentTimeMillis,
      (now) =>
        Effect.flatMap(schedule.step(now, error, state), ([next, , decision]) => {
          if (ScheduleDecision.isDone(decision)) return Effect.fail(error)
          const again = Effect.catchIf(effect, retryable, (error) => after(error, next))
          const wait = ScheduleIntervals.start(decision.intervals) - now
          return wait > 0 ? Effect.zipRight(Effect.sleep(Duration.millis(wait)), again) : again
        })
    )
  return after(first, schedule.initial)
}
