import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import { InvalidConfig } from "../../KafkaError.js"

/** A positive, finite duration, or a `InvalidConfig` naming `field`. */
export const positiveDuration = (
  field: string,
  input: Duration.DurationInput
): Effect.Effect<Duration.Duration, InvalidConfig> =>
  Effect.suspend(() => {
    const decoded = Duration.decodeUnknown(input)
    if (Option.isNone(decoded) || !Duration.isFinite(decoded.value) || Duration.toMillis(decoded.value) <= 0) {
      return new InvalidConfig({ field, reason: `must be a positive, finite duration, got ${String(input)}` })
    }
    return Effect.succeed(decoded.value)
  })

/** A positive integer, or a `InvalidConfig` naming `field`. */
export const positiveInt = (field: string, input: number): Effect.Effect<number, InvalidConfig> =>
  Number.isInteger(input) && input > 0
    ? Effect.succeed(input)
    : new InvalidConfig({ field, reason: `must be a positive integer, got ${input}` })
