import * as Effect from "effect/Effect"
import * as Schedule from "effect/Schedule"

/** Waits until `condition` holds, checking it again and again, failing after `deadline` with `what`. */
export const eventually = <E, R>(
  what: string,
  condition: Effect.Effect<boolean, E, R>,
  deadline: `${number} seconds` = "10 seconds"
) =>
  condition.pipe(
    Effect.repeat({ schedule: Schedule.spaced("1 millis"), until: (ok) => ok }),
    Effect.timeoutFail({ duration: deadline, onTimeout: () => new Error(`timed out waiting for: ${what}`) }),
    Effect.asVoid
  )

/** The same, for tests that run on the `TestClock`: it yields to other fibers instead of sleeping. */
export const settled = <E, R>(what: string, condition: Effect.Effect<boolean, E, R>, maxTurns = 100_000) =>
  Effect.gen(function*() {
    for (let i = 0; i < maxTurns; i++) {
      if (yield* condition) return
      yield* Effect.yieldNow()
    }
    return yield* Effect.fail(new Error(`never happened: ${what}`))
  })
