import * as Logger from "effect/Logger"
import * as TestClock from "effect/TestClock"
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

/** Collects what is logged (level and message), for tests that check a warning names what it should. */
export const logCollector = () => {
  const lines: Array<string> = []
  const logger = Logger.make(({ logLevel, message }) => {
    const text = Array.isArray(message) ? message.map(String).join(" ") : String(message)
    lines.push(`${logLevel.label} ${text}`)
  })
  return { lines, layer: Logger.replace(Logger.defaultLogger, logger) }
}

/** On the `TestClock`: lets fibers run and moves the clock a second at a time until `condition` holds. */
export const advanceUntil = <E, R>(what: string, condition: Effect.Effect<boolean, E, R>, maxSeconds = 120) =>
  Effect.gen(function*() {
    for (let second = 0; second <= maxSeconds; second++) {
      for (let i = 0; i < 200; i++) {
        if (yield* condition) return
        yield* Effect.yieldNow()
      }
      yield* TestClock.adjust("1 second")
    }
    return yield* Effect.fail(new Error(`never happened, ${maxSeconds} seconds on: ${what}`))
  })
