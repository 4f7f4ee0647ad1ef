import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Redacted from "effect/Redacted"
import * as Runtime from "effect/Runtime"
import { Kafka, logLevel as KafkaLogLevel } from "kafkajs"
import type {
  ISocketFactory,
  KafkaConfig,
  KafkaMessage,
  LogEntry,
  logCreator,
  RetryOptions as KafkaRetryOptions,
  SASLOptions
} from "kafkajs"
import { type ConsumerRecord, toPlain } from "../../ConsumerRecord.js"
import type { Config, LogLevel, RetryOptions, SaslOptions, TlsOptions } from "../../KafkaJs.js"
import { CommitFailed, InvalidConfig, DriverError } from "../../KafkaError.js"
import type { TopicPartition } from "../../TopicPartition.js"
import { inspectSymbol } from "../shared/inspect.js"

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
  config: Pick<
    Config,
    | "brokers"
    | "clientId"
    | "ssl"
    | "sasl"
    | "connectionTimeout"
    | "authenticationTimeout"
    | "requestTimeout"
    | "retry"
    | "logLevel"
  >,
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

/**
 * kafkajs wraps errors (retries exceeded, non-retriable) with the original as `cause`; the protocol type is inside.
 *
 * @internal
 */
export const causeChain = (error: unknown): Array<ErrorLike> => {
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

/** The connection to a broker failed or closed, or no broker could be reached. */
const disconnectedNames = new Set([
  "KafkaJSConnectionError",
  "KafkaJSConnectionClosedError",
  "KafkaJSBrokerNotFound",
  "KafkaJSNoBrokerAvailableError"
])

/**
 * No broker could say where the group's coordinator is (every one refused the connection, or answered that it is
 * not available): kafkajs marks it non-retriable, but it goes away with the cluster's coming back.
 */
const COORDINATOR_NOT_FOUND = "KafkaJSGroupCoordinatorNotFound"

/** Protocol errors (names as in kafkajs's src/protocol/error.js) that go away once the cluster is reachable again. */
const transientTypes = new Set([
  "REQUEST_TIMED_OUT",
  "NETWORK_EXCEPTION",
  "BROKER_NOT_AVAILABLE",
  "LEADER_NOT_AVAILABLE",
  "NOT_LEADER_FOR_PARTITION",
  "REPLICA_NOT_AVAILABLE",
  "FENCED_LEADER_EPOCH",
  "UNKNOWN_LEADER_EPOCH",
  "KAFKA_STORAGE_ERROR",
  "NOT_ENOUGH_REPLICAS",
  "GROUP_COORDINATOR_NOT_AVAILABLE",
  "NOT_COORDINATOR_FOR_GROUP",
  "GROUP_LOAD_IN_PROGRESS",
  // The same conditions under the names newer Kafka versions give them.
  "COORDINATOR_NOT_AVAILABLE",
  "NOT_COORDINATOR",
  "COORDINATOR_LOAD_IN_PROGRESS",
  "NOT_LEADER_OR_FOLLOWER",
  // A stable read of a committed position that a transaction is still committing: read again once it has ended.
  "UNSTABLE_OFFSET_COMMIT"
])

/**
 * Whether an error goes away when the cluster is reachable again: a closed or refused connection, a request timeout,
 * a broker, leader or coordinator moving or loading, also after kafkajs gave up retrying them; and a committed position
 * that a transaction is still committing (UNSTABLE_OFFSET_COMMIT), once the transaction has ended. An unknown topic, a
 * refused login or authorization, a bad setting are not.
 *
 * @internal
 */
export const isRetriable = (error: unknown): boolean =>
  causeChain(error).some((e) =>
    (typeof e.name === "string" &&
      (disconnectedNames.has(e.name) || e.name === "KafkaJSRequestTimeoutError" || e.name === COORDINATOR_NOT_FOUND)) ||
    (typeof e.type === "string" && transientTypes.has(e.type))
  )

/** @internal */
export const driverError = (operation: string) => (cause: unknown): DriverError =>
  new DriverError({ operation, reason: describe(cause), retriable: isRetriable(cause), cause })

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

type CommitFailureReason = CommitFailed["reason"]

const commitReasonOfType = (type: string | undefined): CommitFailureReason | undefined => {
  switch (type) {
    case "REBALANCE_IN_PROGRESS":
      return "RebalanceInProgress"
    case "NOT_COORDINATOR_FOR_GROUP":
    case "NOT_COORDINATOR":
    case "GROUP_COORDINATOR_NOT_AVAILABLE":
    case "COORDINATOR_NOT_AVAILABLE":
    case "GROUP_LOAD_IN_PROGRESS":
    case "COORDINATOR_LOAD_IN_PROGRESS":
      return "CoordinatorNotAvailable"
    case "REQUEST_TIMED_OUT":
      return "Timeout"
    case "NETWORK_EXCEPTION":
      return "Disconnected"
    case "ILLEGAL_GENERATION":
      return "IllegalGeneration"
    case "UNKNOWN_MEMBER_ID":
    case "FENCED_INSTANCE_ID":
      return "UnknownMember"
    case "GROUP_AUTHORIZATION_FAILED":
    case "TOPIC_AUTHORIZATION_FAILED":
      return "Unauthorized"
    case "OFFSET_METADATA_TOO_LARGE":
    case "INVALID_COMMIT_OFFSET_SIZE":
      return "Other"
    default:
      return undefined
  }
}

/**
 * Classifies a refused commit of `partitions` by the protocol error inside it (kafkajs wraps it when it gave up
 * retrying), then by the kafkajs error around it: a timeout, a lost connection, and any other error kafkajs marks
 * retriable are retried; an unknown error that is not retriable ends the consumer.
 *
 * @internal
 */
export const commitFailed = (
  cause: unknown,
  partitions: ReadonlyArray<TopicPartition>
): CommitFailed => {
  const detail = describe(cause)
  const chain = causeChain(cause)
  const names = chain.map((e) => e.name)
  const root = chain[chain.length - 1]
  const reason: CommitFailureReason = commitReasonOfType(protocolType(cause)) ??
    (names.includes(COORDINATOR_NOT_FOUND)
      ? "CoordinatorNotAvailable"
      : names.includes("KafkaJSRequestTimeoutError")
      ? "Timeout"
      : names.some((name) => typeof name === "string" && disconnectedNames.has(name))
      ? "Disconnected"
      : root !== undefined && root.retriable === true
      ? "Transient"
      : "Other")
  return new CommitFailed({
    reason,
    partitions: partitions.map(({ partition, topic }) => ({ topic, partition })),
    detail
  })
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
  let plain = true
  for (const name in raw) {
    const value = raw[name]
    if (typeof value !== "object" || Array.isArray(value)) {
      plain = false
      break
    }
  }
  // kafkajs's own object when every header is a single `Buffer`, as decoded: nothing to convert.
  if (plain) return raw as Readonly<Record<string, Buffer>>
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

/**
 * An offset as kafkajs gives it (decimal text). Below 2^53 the text goes through a `number`, which costs a third of
 * parsing it as a `bigint`; a double at or below `MAX_SAFE_INTEGER` is the exact value.
 */
const toBigInt = (text: string): bigint => {
  const n = +text
  return n <= Number.MAX_SAFE_INTEGER ? BigInt(n) : BigInt(text)
}


/**
 * A record over kafkajs's message: one object of two fields, which reads each field of the record from the message
 * when it is read (the offset and the timestamp are parsed then, on every read). A plain record costs three objects
 * (the record, its `bigint` offset, its timestamp's boxed `number`) and every field converted whether read or not.
 * The fields are getters of the class, not properties of the object: `{ ...record }` and `structuredClone(record)`
 * copy none of them, and a deep equality with a plain object fails; `ConsumerRecord.toPlain` gives the plain record.
 */
class KafkaJsRecord implements ConsumerRecord {
  readonly #tp: TopicPartition
  readonly #message: KafkaMessage
  constructor(tp: TopicPartition, message: KafkaMessage) {
    this.#tp = tp
    this.#message = message
  }
  get topic(): string {
    return this.#tp.topic
  }
  get partition(): number {
    return this.#tp.partition
  }
  get offset(): bigint {
    return toBigInt(this.#message.offset)
  }
  get key(): Uint8Array | null {
    const key = this.#message.key
    return key === null || key === undefined ? null : toBytes(key)
  }
  get value(): Uint8Array | null {
    const value = this.#message.value
    return value === null ? null : toBytes(value)
  }
  get headers(): Readonly<Record<string, Uint8Array>> {
    return toHeaders(this.#message.headers)
  }
  get timestamp(): number {
    return +this.#message.timestamp
  }
  toJSON(): ConsumerRecord {
    return toPlain(this)
  }
  [inspectSymbol](): ConsumerRecord {
    return toPlain(this)
  }
}

/** @internal */
export const toConsumerRecord = (tp: TopicPartition, message: KafkaMessage): ConsumerRecord =>
  new KafkaJsRecord(tp, message)

/** @internal */
export const toBuffer = (value: string | Uint8Array): Buffer | string =>
  typeof value === "string" ? value : Buffer.from(value.buffer, value.byteOffset, value.byteLength)
