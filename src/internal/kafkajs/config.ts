/**
 * The connection settings as the adapter reads them. `KafkaJs` declares and documents the public types
 * (`ConnectionConfig`, `TlsOptions`, `SaslOptions`, `RetryOptions`, `LogLevel`) and passes its values here, where
 * the compiler checks them against these shapes; the adapter's modules read these, so that none of them imports the
 * public module, whose declarations in turn name nothing internal.
 */
import type * as Duration from "effect/Duration"
import type * as Redacted from "effect/Redacted"

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
export interface SaslOptions {
  readonly mechanism: "plain" | "scram-sha-256" | "scram-sha-512"
  readonly username: string
  readonly password: Redacted.Redacted<string>
}

/** @internal */
export interface RetryOptions {
  readonly retries?: number | undefined
  readonly initialRetryTime?: Duration.DurationInput | undefined
  readonly maxRetryTime?: Duration.DurationInput | undefined
  readonly factor?: number | undefined
  readonly multiplier?: number | undefined
}

/** @internal */
export interface ConnectionConfig {
  readonly brokers: ReadonlyArray<string>
  readonly clientId?: string | undefined
  readonly ssl?: boolean | TlsOptions | undefined
  readonly sasl?: SaslOptions | undefined
  readonly connectionTimeout?: Duration.DurationInput | undefined
  readonly authenticationTimeout?: Duration.DurationInput | undefined
  readonly requestTimeout?: Duration.DurationInput | undefined
  readonly retry?: RetryOptions | undefined
  readonly logLevel?: LogLevel | undefined
}
