/**
 * `transactional` with the offset store in the application's own `@effect/sql` database: MySQL/MariaDB through
 * `@effect/sql-mysql2`, or a SQLite file through the examples' client over `node:sqlite`. The handler writes one row
 * per record into `lab_results` with its own `SqlClient`, and `SqlOffsetStore` stores the position in `lab_offsets`
 * in that same transaction. The results table has no unique key on purpose: exactly-once must not lean on idempotent
 * writes.
 */
import { MysqlClient } from "@effect/sql-mysql2"
import * as SqlClient from "@effect/sql/SqlClient"
import * as Chunk from "effect/Chunk"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Redacted from "effect/Redacted"
import * as Sqlite from "../examples/support/sqlite.js"
import * as InMemoryKafka from "../src/InMemoryKafka.js"
import * as SqlOffsetStore from "../src/SqlOffsetStore.js"
import { type Outcome, recordKey, type ResultSink, runWorkload, transactionalPlan, type Workload } from "./lab.js"

const RESULTS = "lab_results"
const OFFSETS = "lab_offsets"

/** The databases of `--store mysql://...` and `--store sqlite:<file>`. */
export type SqlDatabase =
  | { readonly _tag: "Mysql"; readonly url: string }
  | { readonly _tag: "Sqlite"; readonly file: string }

/**
 * Results written with the application's own `SqlClient`, one row per record into `table` (group_id, record), which the
 * store runs in the unit's transaction. The lab names a run's group after its topic; results carry the group, so
 * several runs share one table.
 */
export const sqlSink = (table: string): ResultSink<SqlClient.SqlClient> => ({
  write: (records) =>
    Effect.flatMap(
      SqlClient.SqlClient,
      (sql) =>
        sql`insert into ${sql(table)} ${
          sql.insert(Chunk.toReadonlyArray(Chunk.map(records, (r) => ({
            group_id: `${r.topic}-group`,
            record: recordKey(r)
          }))))
        }`
    ),
  read: (groupId) =>
    Effect.flatMap(SqlClient.SqlClient, (sql) =>
      Effect.map(
        sql<{ readonly record: string }>`select record from ${sql(table)} where group_id = ${groupId}`,
        (rows) => rows.map((row) => String(row.record))
      ))
})

/** Creates `table` for `sqlSink` if it does not exist. */
export const createResultsTable = (table: string) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) =>
      sql.unsafe(`create table if not exists ${table} (group_id varchar(255) not null, record varchar(255) not null)`)
  )

const clientOf = (database: SqlDatabase): Layer.Layer<SqlClient.SqlClient, unknown> =>
  database._tag === "Mysql"
    // Under key ordering units run side by side, each on a connection of its own.
    ? MysqlClient.layer({ url: Redacted.make(database.url), maxConnections: 16 })
    : Sqlite.layer({ filename: database.file })

/** Runs the `transactional` workload with positions and results in the database. */
export const runTransactional = (workload: Workload, database: SqlDatabase): Effect.Effect<Outcome, unknown> =>
  Effect.gen(function*() {
    yield* createResultsTable(RESULTS)
    return yield* runWorkload(workload, transactionalPlan(sqlSink(RESULTS)))
  }).pipe(
    Effect.provide(
      Layer.mergeAll(
        InMemoryKafka.layer({ rebalance: workload.rebalance ?? "eager" }),
        SqlOffsetStore.layer({
          table: OFFSETS,
          migrate: true
        })
      ).pipe(Layer.provideMerge(clientOf(database)))
    )
  )
