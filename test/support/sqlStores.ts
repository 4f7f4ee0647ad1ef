/**
 * The databases the `@effect/sql` store is tested on, each as an application's `SqlClient` layer: MariaDB through
 * `@effect/sql-mysql2`, Postgres through `@effect/sql-pg`, SQLite through the examples' client over `node:sqlite`.
 * Each run of a test file uses tables of its own, dropped at its end.
 */
import { MysqlClient } from "@effect/sql-mysql2"
import { PgClient } from "@effect/sql-pg"
import * as SqlClient from "@effect/sql/SqlClient"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Redacted from "effect/Redacted"
import * as os from "node:os"
import * as path from "node:path"
import * as Sqlite from "../../examples/support/sqlite.js"

export const mysqlUrl = process.env.MYSQL_URL ?? "mysql://root@127.0.0.1:3306/test"
export const pgUrl = process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test"

export type Database = "mysql" | "pg" | "sqlite"

export const databases: ReadonlyArray<Database> = ["mysql", "pg", "sqlite"]

/** A fresh SQLite file in the temporary directory. */
export const sqliteFile = () => path.join(os.tmpdir(), `sql-offset-store-${crypto.randomUUID()}.db`)

/** The application's client of a database; `poolSize` bounds the connections of the servers' pools. */
export const clientLayer = (
  database: Database,
  options: { readonly poolSize?: number; readonly sqliteFilename?: string } = {}
): Layer.Layer<SqlClient.SqlClient, unknown> => {
  switch (database) {
    case "mysql":
      return MysqlClient.layer({ url: Redacted.make(mysqlUrl), maxConnections: options.poolSize ?? 8 }) as Layer.Layer<
        SqlClient.SqlClient,
        unknown
      >
    case "pg":
      return PgClient.layer({ url: Redacted.make(pgUrl), maxConnections: options.poolSize ?? 8 }) as Layer.Layer<
        SqlClient.SqlClient,
        unknown
      >
    case "sqlite":
      return Sqlite.layer({ filename: options.sqliteFilename ?? sqliteFile() }) as Layer.Layer<
        SqlClient.SqlClient,
        unknown
      >
  }
}

/** Runs a statement with the client of the context, outside any unit. */
export const exec = (text: string) => Effect.flatMap(SqlClient.SqlClient, (sql) => sql.unsafe(text))

/** The type of an auto-increment key, per database. */
export const serialKey = (database: Database): string =>
  database === "mysql"
    ? "bigint auto_increment primary key"
    : database === "pg"
    ? "bigserial primary key"
    : "integer primary key autoincrement"
