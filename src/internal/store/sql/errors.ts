/**
 * What the `@effect/sql` store makes of a failure, read from the `SqlError`'s cause (the client's own error): which
 * ones pass and are retried (a lost connection, a deadlock, a serialization failure, a busy database), which of those
 * end the transaction on the server, and the `OffsetStoreError` that says what to do about the rest.
 */
import { SqlError } from "@effect/sql/SqlError"
import { OffsetStoreError } from "../../../KafkaError.js"
import { socketErrorCodes, Transient } from "../retry.js"
import { databaseName, type Dialect } from "./dialect.js"

/** The client's own error behind an `SqlError` (or the error itself when it has no cause). @internal */
export const driverError = (error: unknown): unknown =>
  error instanceof SqlError && error.cause !== undefined ? error.cause : error

const field = (cause: unknown, name: string): unknown =>
  typeof cause === "object" && cause !== null && name in cause ? (cause as Record<string, unknown>)[name] : undefined

const text = (cause: unknown, name: string): string | undefined => {
  const value = field(cause, name)
  return typeof value === "string" ? value : undefined
}

const number = (cause: unknown, name: string): number | undefined => {
  const value = field(cause, name)
  return typeof value === "number" ? value : undefined
}

/** @internal */
export const describe = (cause: unknown): string => {
  const error = driverError(cause)
  return error instanceof Error ? error.message : String(error)
}

const SOCKET = new Set(socketErrorCodes)

// mysql2's codes for a connection that is gone, and the server's errors that end the session: 1053 shutting down,
// 1927 connection killed (MariaDB), 2006 and 2013 gone or lost, 4031 closed for inactivity.
const MYSQL_LOST = new Set([
  "PROTOCOL_CONNECTION_LOST",
  "PROTOCOL_ENQUEUE_AFTER_FATAL_ERROR",
  "PROTOCOL_ENQUEUE_AFTER_QUIT",
  "PROTOCOL_SEQUENCE_TIMEOUT",
  "ER_SERVER_SHUTDOWN",
  "ER_CONNECTION_KILLED",
  "CR_SERVER_GONE_ERROR",
  "CR_SERVER_LOST",
  "ER_CLIENT_INTERACTION_TIMEOUT"
])
const MYSQL_LOST_ERRNO = new Set([1053, 1927, 2006, 2013, 4031])

/**
 * The connection is gone: the client cannot send on it any more, and the server ends its transaction (or has).
 *
 * @internal
 */
export const isConnectionLost = (dialect: Dialect, error: unknown): boolean => {
  const cause = driverError(error)
  const code = text(cause, "code")
  if (code !== undefined && SOCKET.has(code)) return true
  switch (dialect) {
    case "mysql": {
      const errno = number(cause, "errno")
      return (code !== undefined && MYSQL_LOST.has(code)) || (errno !== undefined && MYSQL_LOST_ERRNO.has(errno)) ||
        field(cause, "fatal") === true || /closed state/i.test(describe(cause))
    }
    case "pg":
      // Connection exceptions (class 08), the server shutting down or starting (57P0x); node-postgres says a
      // connection ended in words only.
      return (code !== undefined && (code.startsWith("08") || /^57P0[123]$/.test(code))) ||
        /connection terminated|not queryable|connection error|Connection ended/i.test(describe(cause))
    case "sqlite":
      return false
  }
}

/**
 * The server rolled the transaction back for a conflict with another (a deadlock, a serialization failure, a lock
 * wait that timed out), or the database was busy: running the unit again passes.
 *
 * @internal
 */
export const isConflict = (dialect: Dialect, error: unknown): boolean => {
  const cause = driverError(error)
  switch (dialect) {
    case "mysql": {
      const errno = number(cause, "errno")
      // 1213 deadlock, 1205 lock wait timeout, 1020 record changed since it was read.
      return errno === 1213 || errno === 1205 || errno === 1020
    }
    case "pg": {
      const code = text(cause, "code")
      return code === "40001" || code === "40P01"
    }
    case "sqlite": {
      // SQLITE_BUSY and SQLITE_LOCKED, with their extended codes (node:sqlite's errcode, better-sqlite3's code).
      const errcode = number(cause, "errcode")
      const code = text(cause, "code")
      return (errcode !== undefined && ((errcode & 0xff) === 5 || (errcode & 0xff) === 6)) ||
        (code !== undefined && /^SQLITE_(BUSY|LOCKED)/.test(code))
    }
  }
}

/** @internal */
export const isTransient = (dialect: Dialect, error: unknown): boolean =>
  isConnectionLost(dialect, error) || isConflict(dialect, error)

const HOW_TO_START: Record<Dialect, string> = {
  mysql: "Start the server, on these machines with `start-stop-daemon --start --oknodo --background --exec " +
    "/usr/sbin/mariadbd`, or give the client a URL of one that is running",
  pg: "Start the server, on these machines with `pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main " +
    "start`, or give the client a URL of one that is running",
  sqlite: "Check the database file's path and permissions"
}

const missingTable = (dialect: Dialect, error: unknown): boolean => {
  const cause = driverError(error)
  switch (dialect) {
    case "mysql":
      return number(cause, "errno") === 1146
    case "pg":
      return text(cause, "code") === "42P01"
    case "sqlite":
      return /no such table/i.test(describe(cause))
  }
}

/** @internal */
export const toStoreError = (store: string, dialect: Dialect, operation: string) =>
(
  error: unknown
): OffsetStoreError => {
  const cause = driverError(error)
  const code = text(cause, "code")
  if (code === "ECONNREFUSED" || code === "ENOTFOUND" || code === "EHOSTUNREACH") {
    return new OffsetStoreError({
      store,
      operation,
      reason: `cannot reach ${databaseName(dialect)} (${describe(cause)}). ${HOW_TO_START[dialect]}`,
      cause: error
    })
  }
  if (missingTable(dialect, error)) {
    return new OffsetStoreError({
      store,
      operation,
      reason: `${describe(cause)}; create the table with SqlOffsetStore.migrate, or the layer option migrate: true`,
      cause: error
    })
  }
  const errno = number(cause, "errno")
  const detail = code !== undefined ? ` (${code}${errno !== undefined ? ` ${errno}` : ""})` : ""
  return new OffsetStoreError({ store, operation, reason: `${describe(cause)}${detail}`, cause: error })
}

/** A failure of the store's own statement: retried when it passes. @internal */
export const classify = (store: string, dialect: Dialect, operation: string) =>
(
  error: unknown
): OffsetStoreError | Transient => {
  const storeError = toStoreError(store, dialect, operation)(error)
  return isTransient(dialect, error) ? new Transient({ error: storeError }) : storeError
}
