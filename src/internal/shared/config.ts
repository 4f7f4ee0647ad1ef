import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import { InvalidConfig } from "../../KafkaError.js"
import type { RebalanceProtocol } from "../../Driver.js"

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

const brokerPattern = /^(\[[0-9A-Fa-f:.]+\]|[^\s:/[\]@]+):(\d{1,5})$/

/**
 * Splits `host:port,host:port` (as `KAFKA_BROKERS` is usually written) or checks a list of addresses.
 *
 * @internal
 */
export const parseBrokers = (
  input: string | ReadonlyArray<string>,
  field = "brokers"
): Effect.Effect<ReadonlyArray<string>, InvalidConfig> =>
  Effect.suspend(() => {
    const list = typeof input === "string" ? input.split(",") : input
    const brokers = list.map((broker) => broker.trim()).filter((broker) => broker.length > 0)
    if (brokers.length === 0) {
      return Effect.fail(new InvalidConfig({ field, reason: "at least one broker address (host:port) is required" }))
    }
    for (const broker of brokers) {
      const match = brokerPattern.exec(broker)
      const port = match === null ? NaN : Number(match[2])
      if (match === null || !(port >= 1 && port <= 65535)) {
        return Effect.fail(
          new InvalidConfig({ field, reason: `"${broker}" is not a broker address of the form host:port` })
        )
      }
    }
    return Effect.succeed(brokers)
  })

/** @internal */
export const positiveMillis = (
  field: string,
  input: Duration.DurationInput | undefined
): Effect.Effect<number | undefined, InvalidConfig> => {
  if (input === undefined) return Effect.succeed(undefined)
  const decoded = Duration.decodeUnknown(input)
  if (decoded._tag === "None" || !Duration.isFinite(decoded.value) || Duration.toMillis(decoded.value) <= 0) {
    return Effect.fail(new InvalidConfig({ field, reason: "must be a finite, positive duration" }))
  }
  return Effect.succeed(Math.max(1, Math.round(Duration.toMillis(decoded.value))))
}

/** @internal */
export const positiveInteger = (
  field: string,
  input: number | undefined
): Effect.Effect<number | undefined, InvalidConfig> =>
  input === undefined || (Number.isInteger(input) && input > 0)
    ? Effect.succeed(input)
    : Effect.fail(new InvalidConfig({ field, reason: `must be a positive integer, got ${input}` }))

/**
 * A driver's rebalance protocol: one it can keep the library's promises with, or `InvalidConfig` saying why another
 * cannot be.
 *
 * @internal
 */
export const rebalanceProtocol = <A extends RebalanceProtocol>(
  input: unknown,
  supported: ReadonlyArray<A>,
  refused: Partial<Record<RebalanceProtocol, string>>
): Effect.Effect<A, InvalidConfig> => {
  if (input === undefined) return Effect.succeed(supported[0]!)
  if ((supported as ReadonlyArray<unknown>).includes(input)) return Effect.succeed(input as A)
  const why = typeof input === "string" ? refused[input as RebalanceProtocol] : undefined
  return Effect.fail(
    new InvalidConfig({
      field: "rebalance",
      reason: why ?? `must be one of ${supported.map((p) => `"${p}"`).join(", ")}, got ${JSON.stringify(input)}`
    })
  )
}
