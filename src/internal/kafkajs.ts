import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Runtime from "effect/Runtime"
import { Kafka, logLevel as KafkaLogLevel } from "kafkajs"
import type { KafkaConfig, KafkaMessage, LogEntry, logCreator, RetryOptions, SASLOptions } from "kafkajs"
import type { ConsumerRecord } from "../ConsumerRecord.js"
import { CommitFailed, ConfigError, DriverError } from "../KafkaError.js"

/** @internal */
export type LogLevel = "nothing" | "error" | "warn" | "info" | "debug"

/** @internal */
export interface TlsOptions {
  readonly ca?: string | ReadonlyArray<string> | undefined
  readonly cert?: string | undefined
  readonly key?: string | undefined
  readonly passphrase?: string | undefined
  readonly servername?: string | undefined
  readonly rejectUnauthorized?: boolean | undefined
}

/** @internal */
export type SaslOptions = {
  readonly mechanism: "plain" | "scram-sha-256" | "scram-sha-512"
  readonly username: string
  readonly password: string
}

/** @internal */
export interface RetryConfig {
  readonly retries?: number | undefined
  readonly initialRetryTime?: Duration.DurationInput | undefined
  readonly maxRetryTime?: Duration.DurationInput | undefined
  readonly factor?: number | undefined
  readonly multiplier?: number | undefined
}

/** What a kafkajs client is made from: passed through to kafkajs. @internal */
export interface ConnectionConfig {
  /** Bootstrap brokers, each `host:port`. */
  readonly brokers: ReadonlyArray<string>
  /** Default client id; a session's own `clientId` takes precedence. */
  readonly clientId?: string | undefined
  readonly ssl?: boolean | TlsOptions | undefined
  readonly sasl?: SaslOptions | undefined
  readonly connectionTimeout?: Duration.DurationInput | undefined
  readonly authenticationTimeout?: Duration.DurationInput | undefined
  readonly requestTimeout?: Duration.DurationInput | undefined
  readonly retry?: RetryConfig | undefined
  /** What kafkajs itself logs, through Effect's logger. Default `"warn"`. */
  readonly logLevel?: LogLevel | undefined
}

const brokerPattern = /^(\[[0-9A-Fa-f:.]+\]|[^\s:/[\]@]+):(\d{1,5})$/

/**
 * Splits `host:port,host:port` (as `KAFKA_BROKERS` is usually written) or checks a list of addresses.
 *
 * @internal
 */
export const parseBrokers = (
  input: string | ReadonlyArray<string>,
  field = "brokers"
): Effect.Effect<ReadonlyArray<string>, ConfigError> =>
  Effect.suspend(() => {
    const list = typeof input === "string" ? input.split(",") : input
    const brokers = list.map((broker) => broker.trim()).filter((broker) => broker.length > 0)
    if (brokers.length === 0) {
      return Effect.fail(new ConfigError({ field, reason: "at least one broker address (host:port) is required" }))
    }
    for (const broker of brokers) {
      const match = brokerPattern.exec(broker)
      const port = match === null ? NaN : Number(match[2])
      if (match === null || !(port >= 1 && port <= 65535)) {
        return Effect.fail(
          new ConfigError({ field, reason: `"${broker}" is not a broker address of the form host:port` })
        )
      }
    }
    return Effect.succeed(brokers)
  })

/** @internal */
export const positiveMillis = (
  field: string,
  input: Duration.DurationInput | undefined
): Effect.Effect<number | undefined, ConfigError> => {
  if (input === undefined) return Effect.succeed(undefined)
  const decoded = Duration.decodeUnknown(input)
  if (decoded._tag === "None" || !Duration.isFinite(decoded.value) || Duration.toMillis(decoded.value) <= 0) {
    return Effect.fail(new ConfigError({ field, reason: "must be a finite, positive duration" }))
  }
  return Effect.succeed(Math.max(1, Math.round(Duration.toMillis(decoded.value))))
}

/** @internal */
export const positiveInteger = (
  field: string,
  input: number | undefined
): Effect.Effect<number | undefined, ConfigError> =>
  input === undefined || (Number.isInteger(input) && input > 0)
    ? Effect.succeed(input)
    : Effect.fail(new ConfigError({ field, reason: `must be a positive integer, got ${input}` }))

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

/**
 * kafkajs logs through a callback; this sends each entry to Effect's logger with the runtime captured when the layer
 * was built, so the application's logger configuration applies.
 */
const makeLogCreator = (runtime: Runtime.Runtime<never>): logCreator => () => (entry: LogEntry) => {
  const { message, timestamp: _timestamp, logger: _logger, ...rest } = entry.log
  const text = `kafkajs ${entry.namespace}: ${message}`
  // kafkajs logs every error response at error level, including the expected ones of a rebalance
  // ("The group is rebalancing"); the operation that got it reports the error itself.
  const level = entry.namespace === "Connection" && message.startsWith("Response ") ? KafkaLogLevel.DEBUG : entry.level
  const effect = level <= KafkaLogLevel.ERROR
    ? Effect.logError(text)
    : level === KafkaLogLevel.WARN
    ? Effect.logWarning(text)
    : level === KafkaLogLevel.INFO
    ? Effect.logInfo(text)
    : Effect.logDebug(text)
  Runtime.runFork(runtime)(Effect.annotateLogs(effect, rest))
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

const toSasl = (sasl: SaslOptions): SASLOptions => {
  switch (sasl.mechanism) {
    case "plain":
      return { mechanism: "plain", username: sasl.username, password: sasl.password }
    case "scram-sha-256":
      return { mechanism: "scram-sha-256", username: sasl.username, password: sasl.password }
    case "scram-sha-512":
      return { mechanism: "scram-sha-512", username: sasl.username, password: sasl.password }
  }
}

/**
 * Checks the connection settings and builds the kafkajs client configuration. Nothing connects here.
 *
 * @internal
 */
export const makeKafkaConfig = (
  config: ConnectionConfig,
  runtime: Runtime.Runtime<never>
): Effect.Effect<KafkaConfig, ConfigError> =>
  Effect.gen(function*() {
    const brokers = yield* parseBrokers(config.brokers)
    if (config.clientId !== undefined && config.clientId.trim().length === 0) {
      return yield* new ConfigError({ field: "clientId", reason: "must not be blank" })
    }
    if (config.sasl !== undefined) {
      const mechanisms = ["plain", "scram-sha-256", "scram-sha-512"]
      if (!mechanisms.includes(config.sasl.mechanism)) {
        return yield* new ConfigError({
          field: "sasl.mechanism",
          reason: `must be one of ${mechanisms.join(", ")}, got "${String(config.sasl.mechanism)}"`
        })
      }
      if (config.sasl.username.length === 0) {
        return yield* new ConfigError({ field: "sasl.username", reason: "must not be empty" })
      }
    }
    const connectionTimeout = yield* positiveMillis("connectionTimeout", config.connectionTimeout)
    const authenticationTimeout = yield* positiveMillis("authenticationTimeout", config.authenticationTimeout)
    const requestTimeout = yield* positiveMillis("requestTimeout", config.requestTimeout)
    const out: KafkaConfig = {
      brokers: Array.from(brokers),
      logLevel: toKafkaLogLevel(config.logLevel ?? "warn"),
      logCreator: makeLogCreator(runtime)
    }
    if (config.clientId !== undefined) out.clientId = config.clientId
    if (config.ssl !== undefined) out.ssl = toTls(config.ssl)
    if (config.sasl !== undefined) out.sasl = toSasl(config.sasl)
    if (connectionTimeout !== undefined) out.connectionTimeout = connectionTimeout
    if (authenticationTimeout !== undefined) out.authenticationTimeout = authenticationTimeout
    if (requestTimeout !== undefined) out.requestTimeout = requestTimeout
    if (config.retry !== undefined) out.retry = yield* makeRetry(config.retry)
    return out
  })

const makeRetry = (retry: RetryConfig): Effect.Effect<RetryOptions, ConfigError> =>
  Effect.gen(function*() {
    const out: RetryOptions = {}
    if (retry.retries !== undefined) {
      if (!Number.isInteger(retry.retries) || retry.retries < 0) {
        return yield* new ConfigError({ field: "retry.retries", reason: "must be a non-negative integer" })
      }
      out.retries = retry.retries
    }
    const initialRetryTime = yield* positiveMillis("retry.initialRetryTime", retry.initialRetryTime)
    const maxRetryTime = yield* positiveMillis("retry.maxRetryTime", retry.maxRetryTime)
    if (initialRetryTime !== undefined) out.initialRetryTime = initialRetryTime
    if (maxRetryTime !== undefined) out.maxRetryTime = maxRetryTime
    if (retry.factor !== undefined) {
      if (!(retry.factor >= 0 && retry.factor <= 1)) {
        return yield* new ConfigError({ field: "retry.factor", reason: "must be between 0 and 1" })
      }
      out.factor = retry.factor
    }
    if (retry.multiplier !== undefined) {
      if (!(retry.multiplier >= 1)) {
        return yield* new ConfigError({ field: "retry.multiplier", reason: "must be at least 1" })
      }
      out.multiplier = retry.multiplier
    }
    return out
  })

/** @internal */
export const makeClient = (config: KafkaConfig, clientId?: string): Kafka =>
  new Kafka(clientId === undefined ? config : { ...config, clientId })

// ---------------------------------------------------------------------------------------------------------------------
// errors
// ---------------------------------------------------------------------------------------------------------------------

interface ErrorLike {
  readonly name?: unknown
  readonly type?: unknown
  readonly message?: unknown
  readonly retriable?: unknown
  readonly cause?: unknown
}

const isErrorLike = (u: unknown): u is ErrorLike => typeof u === "object" && u !== null

/** kafkajs wraps errors (retries exceeded, non-retriable) with the original as `cause`; the protocol type is inside. */
const causeChain = (error: unknown): Array<ErrorLike> => {
  const chain: Array<ErrorLike> = []
  let current: unknown = error
  while (isErrorLike(current) && chain.length < 8 && !chain.includes(current)) {
    chain.push(current)
    current = current.cause
  }
  return chain
}

/** @internal */
export const protocolType = (error: unknown): string | undefined => {
  for (const e of causeChain(error)) {
    if (typeof e.type === "string") return e.type
  }
  return undefined
}

/** @internal */
export const describe = (error: unknown): string => {
  const chain = causeChain(error)
  if (chain.length === 0) return String(error)
  const messages: Array<string> = []
  for (const e of chain) {
    const text = typeof e.message === "string" && e.message.length > 0 ? e.message : String(e.name ?? "error")
    if (!messages.includes(text)) messages.push(text)
  }
  const type = protocolType(error)
  return type === undefined ? messages.join(": ") : `${messages.join(": ")} (${type})`
}

/** @internal */
export const isRebalanceError = (error: unknown): boolean => {
  const type = protocolType(error)
  return type === "REBALANCE_IN_PROGRESS" || type === "ILLEGAL_GENERATION" || type === "NOT_COORDINATOR_FOR_GROUP"
}

/** @internal */
export const driverError = (operation: string) => (cause: unknown): DriverError =>
  new DriverError({ operation, reason: describe(cause), cause })

/**
 * Classifies a refused commit. A rebalance that is starting and a coordinator that moved are worth retrying; a stale
 * generation or an unknown member mean the partitions belong to someone else now.
 *
 * @internal
 */
export const commitFailed = (cause: unknown): CommitFailed => {
  const detail = describe(cause)
  switch (protocolType(cause)) {
    case "REBALANCE_IN_PROGRESS":
      return new CommitFailed({ reason: "RebalanceInProgress", retriable: true, detail })
    case "ILLEGAL_GENERATION":
      return new CommitFailed({ reason: "IllegalGeneration", retriable: false, detail })
    case "UNKNOWN_MEMBER_ID":
    case "FENCED_INSTANCE_ID":
      return new CommitFailed({ reason: "UnknownMember", retriable: false, detail })
    case "NOT_COORDINATOR_FOR_GROUP":
    case "GROUP_COORDINATOR_NOT_AVAILABLE":
    case "GROUP_LOAD_IN_PROGRESS":
      return new CommitFailed({ reason: "CoordinatorNotAvailable", retriable: true, detail })
  }
  const chain = causeChain(cause)
  const root = chain[chain.length - 1]
  const retriable = chain.some((e) => e.name === "KafkaJSNumberOfRetriesExceeded") ||
    chain.some((e) => typeof e.name === "string" && e.name.startsWith("KafkaJSConnection")) ||
    chain.some((e) => e.name === "KafkaJSRequestTimeoutError") ||
    (root !== undefined && root.retriable === true)
  return new CommitFailed({ reason: "Other", retriable, detail })
}

// ---------------------------------------------------------------------------------------------------------------------
// records
// ---------------------------------------------------------------------------------------------------------------------

const encoder = new TextEncoder()

/**
 * kafkajs's own `Buffer`, which is a `Uint8Array`, as it is: a view of it would cost a typed array per key and value,
 * the most expensive step of turning a kafkajs message into a record. Records are typed `Uint8Array`, and code written
 * against that works alike on both brokers.
 */
const toBytes = (value: Buffer | string): Uint8Array => typeof value === "string" ? encoder.encode(value) : value

const noHeaders: Readonly<Record<string, Uint8Array>> = Object.freeze({})

const toHeaders = (raw: KafkaMessage["headers"]): Readonly<Record<string, Uint8Array>> => {
  if (raw === undefined) return noHeaders
  let headers: Record<string, Uint8Array> | undefined
  for (const name in raw) {
    const value = raw[name]
    if (value === undefined) continue
    // A header repeated in the record arrives as an array; the last value wins, as `lastHeader` does in Java.
    const last = Array.isArray(value) ? value[value.length - 1] : value
    if (last === undefined) continue
    headers ??= {}
    headers[name] = toBytes(last)
  }
  return headers ?? noHeaders
}

/** @internal */
export const toConsumerRecord = (topic: string, partition: number, message: KafkaMessage): ConsumerRecord => {
  const headers = toHeaders(message.headers)
  return {
    topic,
    partition,
    offset: BigInt(message.offset),
    key: message.key === null || message.key === undefined ? null : toBytes(message.key),
    value: message.value === null ? null : toBytes(message.value),
    headers,
    timestamp: Number(message.timestamp)
  }
}

/** @internal */
export const toBuffer = (value: string | Uint8Array): Buffer | string =>
  typeof value === "string" ? value : Buffer.from(value.buffer, value.byteOffset, value.byteLength)
