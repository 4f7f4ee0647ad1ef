/**
 * The connection settings of the @platformatic/kafka clients, checked: nothing connects here. The SASL password
 * leaves its `Redacted` only in the options handed to a new client.
 */
import * as Effect from "effect/Effect"
import * as Redacted from "effect/Redacted"
import { InvalidConfig } from "../../KafkaError.js"
import type { ConnectionConfig, TlsOptions } from "../../Platformatic.js"
import { parseBrokers, positiveMillis } from "../shared/config.js"

/** What every client of the adapter is made with (the client id is each one's own). @internal */
export interface ClientOptions {
  readonly bootstrapBrokers: Array<string>
  readonly connectTimeout?: number
  /** The time a request may take (the client's `timeout` and `requestTimeout`). */
  readonly timeout?: number
  readonly requestTimeout?: number
  readonly retries?: number
  readonly retryDelay?: number
  readonly tls?: {
    ca?: string | Array<string>
    cert?: string
    key?: string
    passphrase?: string
    servername?: string
    rejectUnauthorized?: boolean
  }
  readonly sasl?: {
    readonly mechanism: "PLAIN" | "SCRAM-SHA-256" | "SCRAM-SHA-512"
    readonly username: string
    readonly password: string
  }
}

const toTls = (ssl: TlsOptions): NonNullable<ClientOptions["tls"]> => {
  const out: NonNullable<ClientOptions["tls"]> = {}
  if (ssl.ca !== undefined) out.ca = typeof ssl.ca === "string" ? ssl.ca : Array.from(ssl.ca)
  if (ssl.cert !== undefined) out.cert = ssl.cert
  if (ssl.key !== undefined) out.key = ssl.key
  if (ssl.passphrase !== undefined) out.passphrase = ssl.passphrase
  if (ssl.servername !== undefined) out.servername = ssl.servername
  if (ssl.rejectUnauthorized !== undefined) out.rejectUnauthorized = ssl.rejectUnauthorized
  return out
}

const mechanisms = { "plain": "PLAIN", "scram-sha-256": "SCRAM-SHA-256", "scram-sha-512": "SCRAM-SHA-512" } as const

/** @internal */
export const makeClientOptions = (config: ConnectionConfig): Effect.Effect<ClientOptions, InvalidConfig> =>
  Effect.gen(function*() {
    const brokers = yield* parseBrokers(config.brokers)
    if (config.clientId !== undefined && config.clientId.trim().length === 0) {
      return yield* new InvalidConfig({ field: "clientId", reason: "must not be blank" })
    }
    const out: { -readonly [K in keyof ClientOptions]: ClientOptions[K] } = { bootstrapBrokers: Array.from(brokers) }
    if (config.sasl !== undefined) {
      const mechanism = mechanisms[config.sasl.mechanism]
      if (mechanism === undefined) {
        return yield* new InvalidConfig({
          field: "sasl.mechanism",
          reason: `must be one of ${Object.keys(mechanisms).join(", ")}, got "${String(config.sasl.mechanism)}"`
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
      out.sasl = { mechanism, username: config.sasl.username, password: Redacted.value(config.sasl.password) }
    }
    if (config.ssl !== undefined && config.ssl !== false) out.tls = config.ssl === true ? {} : toTls(config.ssl)
    const connectTimeout = yield* positiveMillis("connectionTimeout", config.connectionTimeout)
    const requestTimeout = yield* positiveMillis("requestTimeout", config.requestTimeout)
    if (connectTimeout !== undefined) out.connectTimeout = connectTimeout
    if (requestTimeout !== undefined) {
      out.timeout = requestTimeout
      out.requestTimeout = requestTimeout
    }
    if (config.retries !== undefined) {
      if (!Number.isInteger(config.retries) || config.retries < 0) {
        return yield* new InvalidConfig({
          field: "retries",
          reason: `must be a non-negative integer, got ${config.retries}`
        })
      }
      out.retries = config.retries
    }
    const retryDelay = yield* positiveMillis("retryDelay", config.retryDelay)
    if (retryDelay !== undefined) out.retryDelay = retryDelay
    return out
  })
