/**
 * What the Postgres store makes of a failure: which ones pass (and are retried), and the `OffsetStoreError` that
 * says what to do about the others.
 */
import { OffsetStoreError } from "../../../KafkaError.js"
import { socketErrorCodes } from "../retry.js"

/** @internal */
export const STORE = "postgres"

/** @internal */
export const errorCode = (cause: unknown): string | undefined =>
  typeof cause === "object" && cause !== null && "code" in cause && typeof cause.code === "string"
    ? cause.code
    : undefined

// Codes of postgres.js and Node for a connection that could not be made or is gone. Not among them: postgres.js's
// CONNECTION_ENDED, which says that the client itself was ended (`sql.end()`) and will never connect again.
const UNREACHABLE = new Set([...socketErrorCodes, "CONNECT_TIMEOUT", "CONNECTION_CLOSED", "CONNECTION_DESTROYED"])

/** The connection is gone: connection exceptions (class 08) and the server shutting down or restarting. @internal */
export const isConnectionLost = (code: string | undefined): boolean =>
  code !== undefined &&
  (UNREACHABLE.has(code) || code.startsWith("08") || code === "57P01" || code === "57P02" || code === "57P03")

/**
 * Failures that pass: a lost connection, or a transaction the server rolled back for a conflict with another.
 *
 * @internal
 */
export const isTransient = (cause: unknown): boolean => {
  const code = errorCode(cause)
  return isConnectionLost(code) || code === "40001" || code === "40P01"
}

/** @internal */
export const describe = (cause: unknown): string => cause instanceof Error ? cause.message : String(cause)

/** @internal */
export const toStoreError = (operation: string, target: string) => (cause: unknown): OffsetStoreError => {
  const code = errorCode(cause)
  if (code !== undefined && UNREACHABLE.has(code)) {
    return new OffsetStoreError({
      store: STORE,
      operation,
      reason: `cannot reach Postgres at ${target} (${describe(cause)}). Start the server, on these machines with ` +
        "`pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start`, or set DATABASE_URL to one that " +
        "is running",
      cause
    })
  }
  if (code === "CONNECTION_ENDED") {
    return new OffsetStoreError({
      store: STORE,
      operation,
      reason: `the postgres client of the store (${target}) has been ended with sql.end(); a store given its own ` +
        "client needs it open for as long as the store is used",
      cause
    })
  }
  if (code === "3D000") {
    return new OffsetStoreError({
      store: STORE,
      operation,
      reason: `${describe(cause)} at ${target}; create it (createdb) or point DATABASE_URL at an existing database`,
      cause
    })
  }
  if (code === "42P01") {
    return new OffsetStoreError({
      store: STORE,
      operation,
      reason: `${describe(cause)}; create the table with PgOffsetStore.migrate, or the layer option migrate: true`,
      cause
    })
  }
  const sqlState = code !== undefined && /^[0-9A-Z]{5}$/.test(code) ? ` (SQLSTATE ${code})` : ""
  return new OffsetStoreError({ store: STORE, operation, reason: `${describe(cause)}${sqlState}`, cause })
}

export { isTransientError, Transient } from "../retry.js"
