/**
 * The driver on [@platformatic/kafka](https://github.com/platformatic/kafka), a maintained, pure TypeScript client
 * (Node 22.22 and later, Bun, Deno). Install it next to this library (`npm install @platformatic/kafka`); nothing
 * else imports it.
 *
 * The client keeps the group membership (classic protocol, eager rebalances); the driver keeps the library's
 * promises through its public API:
 *
 * - A rebalance's revoked partitions go to another member only after the runloop released them: the client asks
 *   for the member's user data (`protocolsMetadata`) before each JoinGroup and waits for the answer, which comes after
 *   `release`. Until then the driver sends the member's heartbeats itself, so the member stays in the group, up to
 *   the rebalance timeout.
 * - Commits carry their metadata (the finished ranges of the key and unordered modes), and committed positions are
 *   read stable (`requireStable`), through the client's exported OffsetCommit and OffsetFetch APIs on the group's
 *   coordinator, with the consumer's own generation and member id.
 * - Records are fetched per partition, from the position the runloop sought, on connections of their own; the
 *   records of aborted transactions are left out even when the fetch ends before their abort marker.
 *
 * @since 0.3.0
 */
import type * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import type * as Redacted from "effect/Redacted"
import { Driver } from "./Driver.js"
import type { InvalidConfig } from "./KafkaError.js"
import { makeClientOptions } from "./internal/platformatic/config.js"
import * as session from "./internal/platformatic/session.js"
import { positiveInteger, positiveMillis } from "./internal/shared/config.js"

/**
 * TLS settings for the broker connections: PEM strings, as Node's `tls.connect` takes them.
 *
 * @since 0.3.0
 * @category models
 */
export interface TlsOptions {
  readonly ca?: string | ReadonlyArray<string> | undefined
  readonly cert?: string | undefined
  readonly key?: string | undefined
  readonly passphrase?: string | undefined
  readonly servername?: string | undefined
  readonly rejectUnauthorized?: boolean | undefined
}

/**
 * SASL credentials. The password stays redacted until a client is built; no log line or error carries it.
 *
 * @since 0.3.0
 * @category models
 */
export interface SaslOptions {
  readonly mechanism: "plain" | "scram-sha-256" | "scram-sha-512"
  readonly username: string
  readonly password: Redacted.Redacted<string>
}

/**
 * How to reach the cluster.
 *
 * @since 0.3.0
 * @category models
 */
export interface ConnectionConfig {
  /** Bootstrap brokers, each `host:port`. */
  readonly brokers: ReadonlyArray<string>
  /** Default client id; a consumer session's own `clientId` takes precedence. */
  readonly clientId?: string | undefined
  readonly ssl?: boolean | TlsOptions | undefined
  readonly sasl?: SaslOptions | undefined
  /** How long connecting to a broker may take. Default: the client's (5 seconds). */
  readonly connectionTimeout?: Duration.DurationInput | undefined
  /** How long a request may take. Default: the client's (5 seconds). */
  readonly requestTimeout?: Duration.DurationInput | undefined
  /** How many times the client retries a request that failed retriably. Default: the client's (3). */
  readonly retries?: number | undefined
  /** How long the client waits before it retries. Default: the client's (1 second). */
  readonly retryDelay?: Duration.DurationInput | undefined
}

/**
 * The consumer driver's settings.
 *
 * @since 0.3.0
 * @category models
 */
export interface Config extends ConnectionConfig {
  /** How long the broker may hold a fetch when there is nothing new. Default 500 ms. */
  readonly maxWaitTime?: Duration.DurationInput | undefined
  /** Default: a third of the session timeout, at most 3 seconds. */
  readonly heartbeatInterval?: Duration.DurationInput | undefined
  /** Default 1. */
  readonly minBytes?: number | undefined
  /** Most bytes one fetch returns. Default 50 MiB. */
  readonly maxBytes?: number | undefined
  /** Most bytes one fetch returns for a partition. Default 1 MiB. */
  readonly maxBytesPerPartition?: number | undefined
  /**
   * Read records of open and aborted transactions too, for sessions that do not say (a consumer's `isolationLevel`
   * takes precedence). Default `false` (read committed).
   */
  readonly readUncommitted?: boolean | undefined
}

/**
 * The consumer driver on @platformatic/kafka. Settings are checked when the layer is built (`InvalidConfig` names
 * the one that is wrong); nothing connects until a consumer joins.
 *
 * @since 0.3.0
 * @category layers
 */
export const layer = (config: Config): Layer.Layer<Driver, InvalidConfig> =>
  Layer.effect(
    Driver,
    Effect.gen(function*() {
      const client = yield* makeClientOptions(config)
      const settings: session.ConsumerSettings = {
        client,
        maxWaitTime: (yield* positiveMillis("maxWaitTime", config.maxWaitTime)) ?? 500,
        heartbeatInterval: yield* positiveMillis("heartbeatInterval", config.heartbeatInterval),
        minBytes: (yield* positiveInteger("minBytes", config.minBytes)) ?? 1,
        maxBytes: (yield* positiveInteger("maxBytes", config.maxBytes)) ?? 50 * 1024 * 1024,
        maxBytesPerPartition: (yield* positiveInteger("maxBytesPerPartition", config.maxBytesPerPartition)) ??
          1024 * 1024,
        readUncommitted: config.readUncommitted ?? false
      }
      return Driver.of({ connect: (options) => session.connect(settings, options) })
    })
  )
