/**
 * Producer settings checked and defaulted, for plain and transactional producers.
 */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import { InvalidConfig } from "../../KafkaError.js"
import type { Settings, TransactionalSettings } from "../../Producer.js"
import { positiveDuration } from "../shared/config.js"

/**
 * Settings checked and defaulted. `acks` is the protocol's number (`-1` for all).
 *
 * @internal
 */
export interface Resolved {
  readonly acks: -1 | 0 | 1
  readonly idempotent: boolean
  readonly maxInFlightRequests: number
  readonly lingerMillis: number
  readonly batchSize: number
  readonly maxRequestSize: number
  readonly compression: "none" | "gzip"
  readonly timeoutMillis: number
  readonly closeTimeout: Duration.Duration
  readonly bufferMemory: number
  readonly maxBlock: Duration.Duration
}

const integerIn = (field: string, value: number | undefined, fallback: number, min: number, max: number) =>
  Effect.suspend(() => {
    if (value === undefined) return Effect.succeed(fallback)
    return Number.isInteger(value) && value >= min && value <= max
      ? Effect.succeed(value)
      : Effect.fail(new InvalidConfig({ field, reason: `must be an integer from ${min} to ${max}, got ${value}` }))
  })

/** @internal */
export const resolve = (settings: Settings): Effect.Effect<Resolved, InvalidConfig> =>
  Effect.gen(function*() {
    const acks = settings.acks ?? "all"
    if (acks !== "all" && acks !== 1 && acks !== 0) {
      return yield* new InvalidConfig({ field: "acks", reason: `must be 0, 1 or "all", got ${String(acks)}` })
    }
    const idempotent = settings.idempotent ?? true
    if (typeof idempotent !== "boolean") {
      return yield* new InvalidConfig({
        field: "idempotent",
        reason: `must be true or false, got ${String(idempotent)}`
      })
    }
    if (idempotent && acks !== "all") {
      return yield* new InvalidConfig({
        field: "acks",
        reason:
          `an idempotent producer needs acks "all" (got ${acks}): a record acknowledged by the leader alone can ` +
          "be lost with it, which idempotence cannot repair; set idempotent: false to use acks 0 or 1"
      })
    }
    const maxInFlightRequests = yield* integerIn("maxInFlightRequests", settings.maxInFlightRequests, 1, 1, 5)
    if (idempotent && maxInFlightRequests > 1) {
      return yield* new InvalidConfig({
        field: "maxInFlightRequests",
        reason: `an idempotent producer keeps one batch in flight (got ${maxInFlightRequests}): kafkajs gives a ` +
          "retried batch new sequence numbers, so a batch sent behind one that failed could land before it"
      })
    }
    const linger = settings.linger === undefined || settings.linger === 0
      ? Duration.zero
      : yield* positiveDuration("linger", settings.linger)
    const batchSize = yield* integerIn("batchSize", settings.batchSize, 256 * 1024, 1, 64 * 1024 * 1024)
    const maxRequestSize = yield* integerIn(
      "maxRequestSize",
      settings.maxRequestSize,
      1024 * 1024,
      1,
      1024 * 1024 * 1024
    )
    const compression = settings.compression ?? "none"
    if (compression !== "none" && compression !== "gzip") {
      return yield* new InvalidConfig({
        field: "compression",
        reason: `must be "none" or "gzip", got ${String(compression)}`
      })
    }
    const timeout = yield* positiveDuration("timeout", settings.timeout ?? "30 seconds")
    const closeTimeout = yield* positiveDuration("closeTimeout", settings.closeTimeout ?? "30 seconds")
    const bufferMemory = yield* integerIn(
      "bufferMemory",
      settings.bufferMemory,
      32 * 1024 * 1024,
      1,
      Number.MAX_SAFE_INTEGER
    )
    if (bufferMemory < maxRequestSize) {
      return yield* new InvalidConfig({
        field: "bufferMemory",
        reason: `must be at least maxRequestSize (${maxRequestSize}), got ${bufferMemory}: a record of ` +
          "maxRequestSize bytes must fit in the buffer"
      })
    }
    const maxBlock = settings.maxBlock === 0
      ? Duration.zero
      : yield* positiveDuration("maxBlock", settings.maxBlock ?? "60 seconds")
    return {
      acks: acks === "all" ? -1 : acks,
      idempotent,
      maxInFlightRequests,
      lingerMillis: settings.linger === undefined ? 5 : Duration.toMillis(linger),
      batchSize,
      maxRequestSize,
      compression,
      timeoutMillis: Duration.toMillis(timeout),
      closeTimeout,
      bufferMemory,
      maxBlock
    }
  })

/** A transactional id: a non-empty string. @internal */
export const checkTransactionalId = (transactionalId: string): Effect.Effect<string, InvalidConfig> =>
  typeof transactionalId === "string" && transactionalId.trim().length > 0
    ? Effect.succeed(transactionalId)
    : Effect.fail(new InvalidConfig({ field: "transactionalId", reason: "must be a non-empty string" }))

/**
 * Transactional settings checked: a transactional producer is idempotent, with acks "all" and one batch in flight.
 *
 * @internal
 */
export const resolveTransactional = (settings: Omit<TransactionalSettings, "transactionalId">) =>
  Effect.gen(function*() {
    const { transactionTimeout: _, ...rest } = settings
    const resolved = yield* resolve({ ...rest, acks: "all", idempotent: true, maxInFlightRequests: 1 })
    const transactionTimeout = yield* positiveDuration(
      "transactionTimeout",
      settings.transactionTimeout ?? "60 seconds"
    )
    return { resolved, transactionTimeout }
  })
