/**
 * The offset store in the application's own database, through its `@effect/sql` client (`SqlClient`): MySQL and
 * MariaDB (`@effect/sql-mysql2`), Postgres (`@effect/sql-pg`) and SQLite. Imported from
 * `effect-kafka-delivery/SqlOffsetStore`, so that `@effect/sql` (an optional peer dependency) is needed only by the
 * applications that use it. The handler writes its results with the
 * `sql` it already uses; under the `transactional` policy each unit's statements run in one transaction of that
 * client, and the partition's position is stored in the same transaction, on the condition that the partition's
 * owner epoch is still the unit's.
 *
 * @example
 * ```ts
 * import { MysqlClient } from "@effect/sql-mysql2"
 * import * as SqlClient from "@effect/sql/SqlClient"
 * import { CommitPolicy, Consumer, ConsumerRecord } from "effect-kafka-delivery"
 * import * as SqlOffsetStore from "effect-kafka-delivery/SqlOffsetStore"
 * import * as Effect from "effect/Effect"
 * import * as Layer from "effect/Layer"
 * import * as Redacted from "effect/Redacted"
 *
 * // The handler writes with its own `sql`: the rows and the position commit together, once.
 * const consumer = Consumer.run({ groupId: "payments", topics: ["payments"] }, (records) =>
 *   Effect.flatMap(SqlClient.SqlClient, (sql) =>
 *     Effect.forEach(records, (record) =>
 *       sql`insert into payments (id, body) values (${record.offset.toString()}, ${
 *         ConsumerRecord.valueString(record)
 *       })`, { discard: true })))
 *
 * const database = MysqlClient.layer({ url: Redacted.make("mysql://root@127.0.0.1:3306/test") })
 *
 * const program = consumer.pipe(
 *   Effect.provide(
 *     CommitPolicy.transactional().pipe(
 *       Layer.provideMerge(SqlOffsetStore.layer({ migrate: true })),
 *       Layer.provideMerge(database)
 *     )
 *   )
 * )
 * ```
 *
 * @since 0.1.0
 */
import type * as SqlClient from "@effect/sql/SqlClient"
import type * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import type * as Schedule from "effect/Schedule"
import * as sqlStore from "./internal/store/sql/store.js"
import type { InvalidConfig, OffsetStoreError } from "./KafkaError.js"
import { OffsetStore } from "./OffsetStore.js"

/**
 * The isolation level of a unit's transaction on MySQL and Postgres (SQLite's are serializable).
 *
 * @since 0.1.0
 * @category models
 */
export type IsolationLevel = "read committed" | "repeatable read" | "serializable"

/**
 * Where the positions are kept, and how failures that pass are retried.
 *
 * @since 0.1.0
 * @category models
 */
export interface Options {
  /** The table of positions; `kafka_offsets` when omitted. On Postgres it is the table `PgOffsetStore` keeps. */
  readonly table?: string | undefined
  /** The schema of the table (a database, on MySQL); the connection's own when omitted. Not for SQLite. */
  readonly schema?: string | undefined
  /** Create the table (and the schema, when given) when the layer starts (see {@link migrate}). */
  readonly migrate?: boolean | undefined
  /**
   * The isolation level of each unit's transaction; the database's own default when omitted (repeatable read on
   * MySQL and MariaDB, read committed on Postgres). The fence holds at every level: the store reads the position's
   * row with a locking read.
   */
  readonly isolationLevel?: IsolationLevel | undefined
  /**
   * The waits between attempts after a failure that passes (a lost connection, the server restarting, a deadlock, a
   * serialization failure, a lock wait that timed out, a busy SQLite database); it gets the failure as an
   * `OffsetStoreError`. Exponential from 100 ms, capped at 5 seconds, jittered, when omitted.
   */
  readonly retry?: Schedule.Schedule<unknown, OffsetStoreError> | undefined
  /** How long one operation keeps being retried before it fails; 60 seconds when omitted. */
  readonly retryFor?: Duration.DurationInput | undefined
}

/**
 * Creates the table of positions (and its schema, when given) if it does not exist, and adds the column a unit names
 * itself in (`unit_id`) to a table `PgOffsetStore` made. Safe to run again.
 *
 * @since 0.1.0
 * @category migrations
 */
export const migrate = (
  options: Options = {}
): Effect.Effect<void, InvalidConfig | OffsetStoreError, SqlClient.SqlClient> =>
  Effect.flatMap(sqlStore.open(options), (store) => sqlStore.ensureTable(store, options.schema))

/**
 * The offset store on the application's `SqlClient`. Options are checked first (a bad `table` or `schema`, or a
 * database the store does not speak, fails with an `InvalidConfig` naming it); the layer then checks that the server
 * answers, and creates the table when `migrate: true`.
 *
 * A unit reserves a connection from the client, begins a transaction on it (`BEGIN IMMEDIATE` on SQLite) and runs
 * the work with that connection as the client's transaction: every statement of the handler's `sql`, in any fiber it
 * forks, goes there, and a nested `sql.withTransaction` is a savepoint in it. Then the store locks the partition's
 * row, checks its owner epoch (a claim that came first fences the unit: `Fenced`, and nothing lands), writes the
 * position and COMMITs. No `Transaction` service of this library is needed to write: `OffsetStore.append` and
 * `PgOffsetStore.sql` fail with an error that says to use the `SqlClient`.
 *
 * Failures that pass are retried on `retry`, for at most `retryFor`, and the unit is run again whole: a lost
 * connection (MariaDB's `KILL CONNECTION`, a server restart), a deadlock, a serialization failure, a lock wait
 * timeout, a busy SQLite database. They are recognised whether the work failed with them or caught them and went
 * on: after such a failure nothing more is sent in the unit's transaction (MySQL, having rolled it back, would run
 * each later statement on its own). A unit whose connection is lost during COMMIT is settled before it is run again:
 * the position's row names the last unit that committed on it. Statements that commit on their own in MySQL (DDL,
 * `LOCK TABLES`) end the unit's transaction: keep them out of the handler.
 *
 * @since 0.1.0
 * @category layers
 */
export const layer = (
  options: Options = {}
): Layer.Layer<OffsetStore, InvalidConfig | OffsetStoreError, SqlClient.SqlClient> =>
  Layer.effect(OffsetStore, sqlStore.make(options))
