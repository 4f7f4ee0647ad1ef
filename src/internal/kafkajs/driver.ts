/**
 * The kafkajs clients of the adapter: the connection settings, checked (`makeClientConfig`), and the clients made from
 * them (`makeClient`), whose log entries go to Effect's logger. kafkajs's errors are read in `errors.ts`, its messages
 * in `records.ts`.
 */
import * as Effect from "effect/Effect"
import * as Redacted from "effect/Redacted"
import * as Runtime from "effect/Runtime"
import { Kafka, logLevel as KafkaLogLevel } from "kafkajs"
import type {
  ISocketFactory,
  KafkaConfig,
  LogEntry,
  logCreator,
  RetryOptions as KafkaRetryOptions,
  SASLOptions
} from "kafkajs"
import { InvalidConfig } from "../../KafkaError.js"
import type { ConnectionConfig, LogLevel, RetryOptions, SaslOptions, TlsOptions } from "./config.js"
import { driverError } from "./errors.js"

export { commitFailed, isRetriable } from "./errors.js"
export { toConsumerRecord } from "./records.js"

import { parseBrokers, positiveMillis } from "../shared/config.js"

export { parseBrokers, positiveInteger, positiveMillis, rebalanceProtocol } from "../shared/config.js"

const toKafkaLogLevel = (level: LogLevel): KafkaLogLevel => {
  switch (level) {
    case "nothing":
      return KafkaLogLevel.NOTHING
    case "error":
      return KafkaLogLevel.ERROR
    case "warn":
      return KafkaLogLevel.WARN
    case "info":
      return KafkaLogLevel.INFO
    case "debug":
      return KafkaLogLevel.DEBUG
  }
}

const toTls = (ssl: boolean | TlsOptions): NonNullable<KafkaConfig["ssl"]> => {
  if (typeof ssl === "boolean") return ssl
  const out: Exclude<NonNullable<KafkaConfig["ssl"]>, boolean> = {}
  if (ssl.ca !== undefined) out.ca = typeof ssl.ca === "string" ? ssl.ca : Array.from(ssl.ca)
  if (ssl.cert !== undefined) out.cert = ssl.cert
  if (ssl.key !== undefined) out.key = ssl.key
  if (ssl.passphrase !== undefined) out.passphrase = ssl.passphrase
  if (ssl.servername !== undefined) out.servername = ssl.servername
  if (ssl.rejectUnauthorized !== undefined) out.rejectUnauthorized = ssl.rejectUnauthorized
  return out
}

/** The one place the password leaves its `Redacted`: the configuration handed to a new kafkajs client. */
const toSasl = (sasl: SaslOptions): SASLOptions => {
  const password = Redacted.value(sasl.password)
  switch (sasl.mechanism) {
    case "plain":
      return { mechanism: "plain", username: sasl.username, password }
    case "scram-sha-256":
      return { mechanism: "scram-sha-256", username: sasl.username, password }
    case "scram-sha-512":
      return { mechanism: "scram-sha-512", username: sasl.username, password }
  }
}

/**
 * Checked connection settings, from which kafkajs clients are made. The SASL password is still redacted here.
 *
 * @internal
 */
export interface ClientConfig {
  /** Everything kafkajs takes but the credentials and the logger, which `makeClient` adds. */
  readonly kafka: Omit<KafkaConfig, "sasl" | "logCreator" | "logLevel">
  readonly sasl: SaslOptions | undefined
  readonly logLevel: LogLevel
  /** Runs the log entries kafkajs hands over, with the application's logger. */
  readonly runtime: Runtime.Runtime<never>
}

/**
 * Checks the connection settings. Nothing connects here.
 *
 * @internal
 */
export const makeClientConfig = (
  config: ConnectionConfig,
  runtime: Runtime.Runtime<never>
): Effect.Effect<ClientConfig, InvalidConfig> =>
  Effect.gen(function*() {
    const brokers = yield* parseBrokers(config.brokers)
    if (config.clientId !== undefined && config.clientId.trim().length === 0) {
      return yield* new InvalidConfig({ field: "clientId", reason: "must not be blank" })
    }
    if (config.sasl !== undefined) {
      const mechanisms = ["plain", "scram-sha-256", "scram-sha-512"]
      if (!mechanisms.includes(config.sasl.mechanism)) {
        return yield* new InvalidConfig({
          field: "sasl.mechanism",
          reason: `must be one of ${mechanisms.join(", ")}, got "${String(config.sasl.mechanism)}"`
        })
      }
      if (config.sasl.username.length === 0) {
        return yield* new InvalidConfig({ field: "sasl.username", reason: "must not be empty" })
      }
      if (!Redacted.isRedacted(config.sasl.password)) {
        return yield* new InvalidConfig({
          field: "sasl.password",
          reason: "must be a Redacted value (Redacted.make, or Config.redacted to read it)"
        })
      }
    }
    const connectionTimeout = yield* positiveMillis("connectionTimeout", config.connectionTimeout)
    const authenticationTimeout = yield* positiveMillis("authenticationTimeout", config.authenticationTimeout)
    const requestTimeout = yield* positiveMillis("requestTimeout", config.requestTimeout)
    const kafka: { -readonly [K in keyof ClientConfig["kafka"]]: ClientConfig["kafka"][K] } = {
      brokers: Array.from(brokers)
    }
    if (config.clientId !== undefined) kafka.clientId = config.clientId
    if (config.ssl !== undefined) kafka.ssl = toTls(config.ssl)
    if (connectionTimeout !== undefined) kafka.connectionTimeout = connectionTimeout
    if (authenticationTimeout !== undefined) kafka.authenticationTimeout = authenticationTimeout
    if (requestTimeout !== undefined) kafka.requestTimeout = requestTimeout
    if (config.retry !== undefined) kafka.retry = yield* makeRetry(config.retry)
    return { kafka, sasl: config.sasl, logLevel: config.logLevel ?? "warn", runtime }
  })

const makeRetry = (retry: RetryOptions): Effect.Effect<KafkaRetryOptions, InvalidConfig> =>
  Effect.gen(function*() {
    const out: KafkaRetryOptions = {}
    if (retry.retries !== undefined) {
      if (!Number.isInteger(retry.retries) || retry.retries < 0) {
        return yield* new InvalidConfig({ field: "retry.retries", reason: "must be a non-negative integer" })
      }
      out.retries = retry.retries
    }
    const initialRetryTime = yield* positiveMillis("retry.initialRetryTime", retry.initialRetryTime)
    const maxRetryTime = yield* positiveMillis("retry.maxRetryTime", retry.maxRetryTime)
    if (initialRetryTime !== undefined) out.initialRetryTime = initialRetryTime
    if (maxRetryTime !== undefined) out.maxRetryTime = maxRetryTime
    if (retry.factor !== undefined) {
      if (!(retry.factor >= 0 && retry.factor <= 1)) {
        return yield* new InvalidConfig({ field: "retry.factor", reason: "must be between 0 and 1" })
      }
      out.factor = retry.factor
    }
    if (retry.multiplier !== undefined) {
      if (!(retry.multiplier >= 1)) {
        return yield* new InvalidConfig({ field: "retry.multiplier", reason: "must be at least 1" })
      }
      out.multiplier = retry.multiplier
    }
    return out
  })

const REDACTED = "<redacted>"

/** Replaces every occurrence of `secret` in a value that is about to be logged; other values are kept as they are. */
const scrub = (secret: string | undefined) => (value: unknown): unknown => {
  if (secret === undefined || secret.length === 0) return value
  if (typeof value === "string") return value.includes(secret) ? value.split(secret).join(REDACTED) : value
  if (typeof value !== "object" || value === null) return value
  let text: string
  try {
    text = value instanceof Error ? `${value.message}\n${value.stack ?? ""}` : JSON.stringify(value)
  } catch {
    return value
  }
  return text.includes(secret) ? text.split(secret).join(REDACTED) : value
}

/**
 * kafkajs logs through a callback; this sends each entry at or above `level` to Effect's logger with the runtime
 * captured when the layer was built, so the application's logger configuration applies. kafkajs never logs its SASL
 * password (checked against its sources); the entries are scrubbed of it all the same.
 */
const makeLogCreator = (
  runtime: Runtime.Runtime<never>,
  level: KafkaLogLevel,
  secret: string | undefined,
  onLog: ((entry: LogEntry) => void) | undefined
): logCreator =>
() => {
  const clean = scrub(secret)
  const run = Runtime.runFork(runtime)
  return (entry: LogEntry) => {
    onLog?.(entry)
    if (entry.level > level) return
    const { message, timestamp: _timestamp, logger: _logger, ...rest } = entry.log
    const annotations: Record<string, unknown> = {}
    for (const [key, value] of Object.entries(rest)) annotations[key] = clean(value)
    const text = `kafkajs ${entry.namespace}: ${String(clean(message))}`
    // kafkajs logs every error response at error level, including the expected ones of a rebalance
    // ("The group is rebalancing"); the operation that got it reports the error itself.
    const effective = entry.namespace === "Connection" && message.startsWith("Response ")
      ? KafkaLogLevel.DEBUG
      : entry.level
    const effect = effective <= KafkaLogLevel.ERROR
      ? Effect.logError(text)
      : effective === KafkaLogLevel.WARN
      ? Effect.logWarning(text)
      : effective === KafkaLogLevel.INFO
      ? Effect.logInfo(text)
      : Effect.logDebug(text)
    run(Effect.annotateLogs(effect, annotations))
  }
}

/** @internal */
export interface ClientOptions {
  readonly clientId?: string | undefined
  readonly socketFactory?: ISocketFactory | undefined
  /**
   * Sees kafkajs's log entries of level error (whatever the configured level) and of the configured level, before
   * they are forwarded: kafkajs reports some of what it does (resetting an out-of-range partition) only there.
   */
  readonly onLog?: ((entry: LogEntry) => void) | undefined
}

/** @internal */
export const makeClient = (config: ClientConfig, options: ClientOptions = {}): Kafka => {
  const level = toKafkaLogLevel(config.logLevel)
  const kafkaLevel = options.onLog === undefined ? level : Math.max(level, KafkaLogLevel.ERROR)
  const secret = config.sasl === undefined ? undefined : Redacted.value(config.sasl.password)
  return new Kafka({
    ...config.kafka,
    ...(options.clientId === undefined ? {} : { clientId: options.clientId }),
    ...(options.socketFactory === undefined ? {} : { socketFactory: options.socketFactory }),
    ...(config.sasl === undefined ? {} : { sasl: toSasl(config.sasl) }),
    logLevel: kafkaLevel,
    logCreator: makeLogCreator(config.runtime, level, secret, options.onLog)
  })
}

/**
 * Closing a client's connection is bounded and cannot fail what closes it: its work is done by then. A rejection is a
 * typed error, ignored, never a defect.
 *
 * @internal
 */
export const disconnect = (close: () => Promise<void>): Effect.Effect<void> =>
  Effect.tryPromise({ try: close, catch: driverError("disconnect") }).pipe(
    Effect.timeoutOption("5 seconds"),
    Effect.ignore
  )
