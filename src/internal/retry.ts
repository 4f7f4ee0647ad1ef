import * as Effect from "effect/Effect"
import type * as Schedule from "effect/Schedule"

/**
 * `Effect.retry` that builds its schedule only once `effect` has failed: an attempt that succeeds (the hot path: a
 * chunk, a commit) costs no retry machinery. The first failure is handed to the schedule as if it had driven that
 * attempt, so the number of retries is what `schedule` says. Failures `retryable` refuses are not retried.
 *
 * @internal
 */
export const retryAfterFailure = <A, E, R, R2>(
  effect: Effect.Effect<A, E, R>,
  options: { readonly schedule: Schedule.Schedule<unknown, E, R2>; readonly retryable: (error: E) => boolean }
): Effect.Effect<A, E, R | R2> =>
  Effect.catchIf(effect, options.retryable, (first) => {
    let replayed = false
    return Effect.retry(
      Effect.suspend(() => {
        if (replayed) return effect
        replayed = true
        return Effect.fail(first)
      }),
      { schedule: options.schedule, while: options.retryable }
    )
  })
