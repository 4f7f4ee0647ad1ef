/**
 * An `@effect/sql` `SqlClient` over the runtime's built-in SQLite: `node:sqlite`'s `DatabaseSync`, which Node 24, Bun
 * 1.4 and Deno 2.9 all have. The examples, the semantics lab and the tests use it, because `@effect/sql-sqlite-node`
 * needs better-sqlite3, a native addon that is not built for every Node version. An application would use
 * `@effect/sql-sqlite-node` on Node and `@effect/sql-sqlite-bun` on Bun.
 *
 * - One connection, shared by every fiber. A transaction (`sql.withTransaction`) or a reserved connection
 *   (`sql.reserve`) holds it until it ends; a statement outside a transaction holds it for that statement only, so it
 *   waits for another fiber's open transaction and is never part of it. Do not `sql.reserve`, nor run a statement from a
 *   fiber that has lost the transaction's context (a daemon fiber, say), inside a transaction: it would wait for it.
 * - A file is opened in WAL mode, and every connection waits up to `busyTimeoutMillis` (5 s by default) for a lock
 *   another connection or process holds, so that several processes may share one file. node:sqlite is synchronous:
 *   the wait blocks the thread, so in one process a client that waits for another client's lock waits the whole
 *   timeout (the other cannot go on meanwhile) and then fails with SQLITE_BUSY.
 * - `@effect/sql` has one `TransactionConnection` for every client: inside a transaction of any client, every client's
 *   statements run on that transaction's connection.
 * - Every failure is a `SqlError` whose `cause` is the runtime's error: `code` "ERR_SQLITE_ERROR", `errcode` and
 *   `errstr`. `errcode` is SQLite's extended result code (2067 for a unique constraint); `primaryCode` gives the
 *   primary one (19 for any constraint, 5 busy, 6 locked).
 * - Parameters: strings, numbers, bigints, null (or undefined), Uint8Array and booleans (bound as 1 and 0). Rows are
 *   plain objects; `.values` gives arrays. `.stream` reads the rows at once, then streams them.
 */
import * as Reactivity from "@effect/experimental/Reactivity"
import * as SqlClient from "@effect/sql/SqlClient"
import type * as SqlConnection from "@effect/sql/SqlConnection"
import { SqlError } from "@effect/sql/SqlError"
import * as Statement from "@effect/sql/Statement"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import type * as Scope from "effect/Scope"
import * as Stream from "effect/Stream"

/** What this module uses of `node:sqlite`, which the project's `@types/node` (Node 20) does not describe. */
interface DatabaseSync {
  exec(sql: string): void
  prepare(sql: string): StatementSync
  close(): void
}
interface StatementSync {
  all(...params: ReadonlyArray<unknown>): Array<Record<string, unknown>>
  run(
    ...params: ReadonlyArray<unknown>
  ): { readonly changes: number | bigint; readonly lastInsertRowid: number | bigint }
  columns(): ReadonlyArray<unknown>
  setReturnArrays(enabled: boolean): void
}
interface NodeSqlite {
  readonly DatabaseSync: new(filename: string) => DatabaseSync
}

/** Options of `make` and `layer`. */
export interface SqliteClientOptions {
  /** A file's path, or ":memory:". */
  readonly filename: string
  /** How long a statement waits for a lock another connection holds before it fails with SQLITE_BUSY (5000 ms). */
  readonly busyTimeoutMillis?: number
}

// A variable, so that TypeScript does not look for the module's types (see NodeSqlite).
const nodeSqlite = "node:sqlite"

const describeSql = (sql: string) => {
  const oneLine = sql.replace(/\s+/g, " ").trim()
  return oneLine.length > 200 ? `${oneLine.slice(0, 200)}…` : oneLine
}

const failure = (action: string, cause: unknown) =>
  new SqlError({ cause, message: `${action}: ${cause instanceof Error ? cause.message : String(cause)}` })

const bind = (params: ReadonlyArray<unknown>): Array<unknown> =>
  params.map((value) => typeof value === "boolean" ? (value ? 1 : 0) : value === undefined ? null : value)

/** A row as a plain object (node:sqlite gives objects without a prototype). */
const plain = (row: Record<string, unknown>): Record<string, unknown> => ({ ...row })

/**
 * SQLite's primary result code of a failure of this client (`errcode & 0xff`): 19 for a constraint, 5 busy, 6 locked.
 * Undefined when the failure did not come from SQLite.
 */
export const primaryCode = (error: SqlError): number | undefined => {
  const errcode = (error.cause as { readonly errcode?: unknown } | null | undefined)?.errcode
  return typeof errcode === "number" ? errcode & 0xff : undefined
}

/** A client over one connection to `options.filename`, closed when the scope closes. */
export const make = (
  options: SqliteClientOptions
): Effect.Effect<SqlClient.SqlClient, SqlError, Scope.Scope | Reactivity.Reactivity> =>
  Effect.gen(function*() {
    const sqlite = yield* Effect.tryPromise({
      try: () => import(/* @vite-ignore */ nodeSqlite) as Promise<NodeSqlite>,
      catch: (cause) => failure("This runtime has no node:sqlite", cause)
    })
    const db = yield* Effect.acquireRelease(
      Effect.try({
        try: () => {
          const db = new sqlite.DatabaseSync(options.filename)
          try {
            db.exec(`PRAGMA busy_timeout = ${Math.max(0, Math.trunc(options.busyTimeoutMillis ?? 5000))}`)
            if (options.filename !== ":memory:" && options.filename !== "") db.exec("PRAGMA journal_mode = WAL")
          } catch (error) {
            db.close()
            throw error
          }
          return db
        },
        catch: (cause) => failure(`Failed to open SQLite database ${JSON.stringify(options.filename)}`, cause)
      }),
      (db) => Effect.sync(() => db.close()).pipe(Effect.ignore)
    )

    // Prepared statements by their SQL, the oldest forgotten first.
    const prepared = new Map<string, StatementSync>()
    const prepare = (sql: string): StatementSync => {
      const cached = prepared.get(sql)
      if (cached !== undefined) return cached
      const statement = db.prepare(sql)
      if (prepared.size >= 200) prepared.delete(prepared.keys().next().value!)
      prepared.set(sql, statement)
      return statement
    }

    const attempt = <A>(sql: string, f: () => A): Effect.Effect<A, SqlError> =>
      Effect.try({ try: f, catch: (cause) => failure(`Failed to execute statement "${describeSql(sql)}"`, cause) })

    const rows = (statement: StatementSync, params: ReadonlyArray<unknown>) => statement.all(...bind(params)).map(plain)

    const execute = (
      sql: string,
      params: ReadonlyArray<unknown>,
      transformRows: (<A extends object>(rows: ReadonlyArray<A>) => ReadonlyArray<A>) | undefined
    ) =>
      attempt(sql, () => {
        const result = rows(prepare(sql), params)
        return transformRows === undefined ? result : transformRows(result)
      })

    const connection: SqlConnection.Connection = {
      execute,
      executeRaw: (sql, params) =>
        attempt(sql, () => {
          const statement = prepare(sql)
          // A statement that returns rows gives them; any other gives its changes and last row id.
          return statement.columns().length > 0 ? rows(statement, params) : statement.run(...bind(params))
        }),
      executeStream: (sql, params, transformRows) => Stream.fromIterableEffect(execute(sql, params, transformRows)),
      executeValues: (sql, params) =>
        attempt(sql, () => {
          const statement = prepare(sql)
          statement.setReturnArrays(true)
          try {
            return statement.all(...bind(params)) as unknown as ReadonlyArray<ReadonlyArray<unknown>>
          } finally {
            statement.setReturnArrays(false)
          }
        }),
      executeUnprepared: (sql, params, transformRows) =>
        attempt(sql, () => {
          const result = rows(db.prepare(sql), params)
          return transformRows === undefined ? result : transformRows(result)
        })
    }

    // The one permit to use the connection. A statement outside a transaction holds it for its own scope (one
    // statement, or one stream); a transaction or a reserved connection for its whole scope. Statements inside a
    // transaction find the connection in their context (SqlClient.TransactionConnection) and do not ask for it.
    const permit = yield* Effect.makeSemaphore(1)
    const acquire: SqlConnection.Connection.Acquirer = Effect.uninterruptibleMask((restore) =>
      restore(permit.take(1)).pipe(
        Effect.zipRight(Effect.addFinalizer(() => permit.release(1))),
        Effect.as(connection)
      )
    )

    return yield* SqlClient.make({
      acquirer: acquire,
      transactionAcquirer: acquire,
      compiler: Statement.makeCompilerSqlite(),
      spanAttributes: [["db.system.name", "sqlite"]]
    })
  })

/** A client over one connection to `options.filename`, closed with the layer. */
export const layer = (options: SqliteClientOptions): Layer.Layer<SqlClient.SqlClient, SqlError> =>
  Layer.scoped(SqlClient.SqlClient, make(options)).pipe(Layer.provide(Reactivity.layer))
