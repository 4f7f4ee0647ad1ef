/**
 * The offset store in Postgres, on `postgres` (porsager). Positions and owner epochs live in one table; the handler
 * writes its results in the unit's transaction (through {@link query} or {@link sql}), and the position is stored in
 * that same transaction, on the condition that the partition's owner epoch is still the unit's.
 *
 * @since 0.1.0
 */
import * as Config from "effect/Config"
import * as EffectConfigError from "effect/ConfigError"
import type * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import type * as Redacted from "effect/Redacted"
import type * as Schedule from "effect/Schedule"
import type postgres from "postgres"
import { connect, ensureTable } from "./internal/store/pg/client.js"
import * as pgStore from "./internal/store/pg/store.js"
import * as pgTransaction from "./internal/store/pg/transaction.js"
import { InvalidConfig } from "./KafkaError.js"
import { OffsetStore, type OffsetStoreError, type Transaction } from "./OffsetStore.js"

/**
 * The isolation level of a unit's transaction.
 *
 * @since 0.1.0
 * @category models
 */
export type IsolationLevel = "read committed" | "repeatable read" | "serializable"

/**
 * Where the positions are kept, and how failures that pass are retried. Give either `url` or a `postgres` client as
 * `sql` (which the store then uses but does not close).
 *
 * @since 0.1.0
 * @category models
 */
export interface Options {
  /** A connection URL, `postgres://user@host:port/database`. */
  readonly url?: string | Redacted.Redacted<string> | undefined
  /**
   * A client of your own; the store does not end it. The store works with `fetch_types: false` on it, which is worth
   * setting where connections are ended under load and the work passes no JS arrays as parameters: with postgres.js's
   * default, a connection ended while it reads the server's array types (its first query on every new connection)
   * fails a promise that nothing awaits, an unhandled rejection that ends a Node process by default.
   */
  readonly sql?: postgres.Sql | undefined
  /** The table of positions; `kafka_offsets` when omitted. */
  readonly table?: string | undefined
  /** The schema of the table; the connection's `search_path` when omitted. */
  readonly schema?: string | undefined
  /** Create or upgrade the schema and table when the layer starts (see {@link migrate}). */
  readonly migrate?: boolean | undefined
  /** The isolation level of each unit's transaction; `"read committed"` when omitted (see {@link layer}). */
  readonly isolationLevel?: IsolationLevel | undefined
  /**
   * The waits between attempts after a failure that passes (connection lost, server restarting, serialization
   * failure, deadlock); it gets the failure as an `OffsetStoreError`. Exponential from 100 ms, capped at 5 seconds,
   * jittered, when omitted.
   */
  readonly retry?: Schedule.Schedule<unknown, OffsetStoreError> | undefined
  /** How long one operation keeps being retried before it fails; 60 seconds when omitted. */
  readonly retryFor?: Duration.DurationInput | undefined
}

/**
 * Creates the schema (when given) and the table of positions if they do not exist, and upgrades a table created by an
 * earlier version in place (adding the `epoch` column, whose rows count as never claimed, and the `finished` column).
 * Safe to run concurrently and repeatedly.
 *
 * @since 0.1.0
 * @category migrations
 */
export const migrate = (options: Options): Effect.Effect<void, InvalidConfig | OffsetStoreError> =>
  Effect.scoped(Effect.flatMap(connect(options), (client) => ensureTable(client, options.schema)))

/**
 * The open transaction of the unit of work, for the handler to write its results in. Use it, not another client:
 * only what goes through it commits or rolls back with the position. It is a connection in the middle of a
 * transaction, typed as postgres.js's `ISql`: queries, `unsafe` and the helpers, but no `begin`, `reserve` or `end`,
 * which would break the unit (a nested rollback point is a plain `savepoint` statement). Prefer {@link query}, which
 * fails with a typed error and lets the store retry the unit when the failure passes.
 *
 * @since 0.1.0
 * @category transactions
 */
export const sql: Effect.Effect<postgres.ISql, OffsetStoreError, Transaction> = Effect.map(
  pgTransaction.transactionOf("transaction"),
  (handle) => handle.sql
)

/**
 * Runs queries in the open transaction of the unit of work: `f` gets the transaction (see {@link sql}) and its
 * promise's failure becomes an `OffsetStoreError` (operation `query`, the SQLSTATE in `reason`, postgres.js's error as
 * `cause`). When the failure passes (the connection was lost, a serialization failure, a deadlock), the store rolls
 * the unit back and runs it again, whatever the work made of the error.
 *
 * ```ts
 * const write = PgOffsetStore.query((sql) => sql`insert into payments ${sql(rows)}`)
 * ```
 *
 * @since 0.1.0
 * @category transactions
 */
export const query = <A>(
  f: (sql: postgres.ISql) => Promise<A>
): Effect.Effect<A, OffsetStoreError, Transaction> => pgTransaction.query(f)

/**
 * The Postgres offset store. Options are checked before anything connects (a bad `table` or `schema` fails with a
 * `InvalidConfig` naming it); the layer then checks that the server answers, and creates or upgrades the table when
 * `migrate: true`.
 *
 * Each unit runs in a transaction begun with an explicit isolation level, `read committed` unless `isolationLevel`
 * says otherwise. Read committed is what the owner-epoch fence needs: the unit's conditional UPDATE of its position,
 * when it finds the row locked by a claim, waits and then checks `epoch` again on the row's newest version, so a
 * claim that committed first fences the unit, and a claim that comes second waits for the unit and returns its
 * position. Under `repeatable read` or `serializable` the fence holds too, but such a conflict fails the unit with a
 * serialization failure, which costs a retry before the unit is fenced.
 *
 * Failures that pass are retried on `retry`, for at most `retryFor`: a lost or refused connection, the server
 * shutting down or starting, a serialization failure, a deadlock. A unit is run again whole (BEGIN, the work, the
 * position, COMMIT). A unit whose connection is lost during COMMIT is not run again before the server says it did not
 * commit. `Fenced` and the work's own failures are never retried. After `retryFor`, the operation fails with an
 * `OffsetStoreError` naming it and the last failure.
 *
 * @since 0.1.0
 * @category layers
 */
export const layer = (options: Options): Layer.Layer<OffsetStore, InvalidConfig | OffsetStoreError> =>
  Layer.scoped(OffsetStore, pgStore.make(options))

/**
 * {@link layer} with the connection URL read from `DATABASE_URL` through effect's `Config`.
 *
 * @since 0.1.0
 * @category layers
 */
export const layerConfig = (
  options: Omit<Options, "url" | "sql"> = {}
): Layer.Layer<OffsetStore, InvalidConfig | OffsetStoreError> =>
  Layer.unwrapEffect(
    Config.redacted("DATABASE_URL").pipe(
      Effect.mapError((error) =>
        new InvalidConfig({
          field: "DATABASE_URL",
          reason: `${
            EffectConfigError.isMissingDataOnly(error) ? "is not set" : "cannot be read"
          }; set it to a Postgres URL such as postgres://postgres@127.0.0.1:5432/test`
        })
      ),
      Effect.map((url) => layer({ ...options, url }))
    )
  )
