import * as Context from "effect/Context"
import * as Layer from "effect/Layer"
import * as Logger from "effect/Logger"
import * as TestClock from "effect/TestClock"
import * as Effect from "effect/Effect"
import * as Schedule from "effect/Schedule"
import { Driver, type DriverSession } from "../../src/Driver.js"
import * as InMemoryKafka from "../../src/InMemoryKafka.js"

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

/**
 * The in-memory broker, with each session's calls passed through `wrap`: what it returns replaces the session's own
 * (to count, hold or refuse some calls the way a client or a broker would).
 */
export const inMemoryWrapping = (
  wrap: (session: DriverSession) => Partial<Omit<DriverSession, "memberId">>
): Layer.Layer<InMemoryKafka.InMemoryKafka | Driver> =>
  Layer.scopedContext(Effect.gen(function*() {
    const context = yield* Layer.build(InMemoryKafka.layer())
    const driver = Context.get(context, Driver)
    return Context.add(context, Driver, {
      connect: (options) =>
        Effect.map(driver.connect(options), (session): DriverSession => {
          const own = wrap(session)
          return {
            get memberId() {
              return session.memberId
            },
            ...(session.groupMetadata === undefined ? {} : { groupMetadata: session.groupMetadata }),
            poll: own.poll ?? session.poll,
            commit: own.commit ?? session.commit,
            committed: own.committed ?? session.committed,
            committedWithMetadata: own.committedWithMetadata ?? session.committedWithMetadata,
            offsets: own.offsets ?? session.offsets,
            seek: own.seek ?? session.seek,
            pause: own.pause ?? session.pause,
            resume: own.resume ?? session.resume
          }
        })
    })
  }))
