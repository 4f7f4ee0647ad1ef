/**
 * A unit's open transaction in Postgres, as the handler reaches it through `Transaction`: guarded so that nothing is
 * sent on it once its connection is gone or the unit has ended.
 */
import * as Effect from "effect/Effect"
import type postgres from "postgres"
import { Transaction } from "../../../OffsetStore.js"
import { OutsideUnit, outsideUnitReason } from "../unitBuffer.js"
import { describe, errorCode, isConnectionLost, isTransient, STORE } from "./errors.js"
import { OffsetStoreError } from "../../../KafkaError.js"

/**
 * The connection object postgres.js hands to a query's `onexecute`. While `sql.begin` holds it for a transaction,
 * `reserved` is the function that transaction installed; postgres.js sets it to null when the connection closes, and
 * another transaction on the reopened connection installs its own.
 *
 * @internal
 */
export interface TrackedConnection {
  readonly reserved?: unknown
}

/** What a query made on the unit's transaction once it cannot be used any more fails with. @internal */
export class TransactionClosed extends Error {
  override readonly name = "TransactionClosed"
  constructor(readonly code: "CONNECTION_CLOSED" | "UNIT_ENDED", message: string) {
    super(message)
  }
}

/**
 * The open transaction of a unit of work as the handler reaches it through `Transaction`.
 *
 * @internal
 */
export class PgTransaction {
  /** False once the work has ended. */
  open = true
  /** True once COMMIT or ROLLBACK was asked for: the store sends nothing more in the transaction. */
  ending = false
  /** Why the unit's connection is gone, once the store has noticed it closed. */
  lost: unknown = undefined
  /** The last failure of the work's own statements that passes, raised through `query`. */
  transient: OffsetStoreError | undefined = undefined
  /** The connection of the transaction, and what marks it as held by this transaction (see `attach`). */
  private connection: TrackedConnection | undefined = undefined
  private holder: unknown = undefined
  readonly closed: Promise<never>
  readonly sql: postgres.ISql
  private close: (error: unknown) => void = () => {}

  constructor(tx: postgres.TransactionSql) {
    this.closed = new Promise<never>((_, reject) => {
      this.close = reject
    })
    this.closed.catch(() => undefined)
    this.sql = guard(tx, this)
  }

  lose(error: unknown) {
    if (this.lost !== undefined) return
    this.lost = error ?? new Error("connection closed")
    this.close(this.lost)
  }

  /** Given the connection once the transaction's first statement is on it. */
  attach(connection: TrackedConnection) {
    this.connection = connection
    this.holder = connection.reserved
  }

  /**
   * Whether the transaction's connection is still there, asked before anything is sent on it. postgres.js reports a
   * closed connection to `sql.begin` a few promise turns late; a statement sent in between would be written to a
   * socket that is gone (`socket.write` on null, thrown in a timer, which kills the process).
   */
  alive(): boolean {
    if (this.lost === undefined && this.connection !== undefined && this.connection.reserved !== this.holder) {
      this.lose(new TransactionClosed("CONNECTION_CLOSED", "the unit's connection to Postgres closed"))
    }
    return this.lost === undefined
  }
}

// A transaction must never send anything once its connection has closed: postgres.js would write to a socket that is
// gone (`socket.write` on null, thrown in a timer, which kills the process), or, if the pool has meanwhile reopened
// the connection for someone else, into their session, outside the unit's transaction. So the handler gets it behind
// this guard, which refuses to make a query once the connection is lost or the unit has ended.
const QUERYING = new Set<string | symbol>(["unsafe", "file", "notify"])

const guard = (tx: postgres.TransactionSql, handle: PgTransaction): postgres.ISql => {
  const check = () => {
    if (!handle.alive()) {
      throw new TransactionClosed(
        "CONNECTION_CLOSED",
        "the unit's connection to Postgres was lost; the store rolls the unit back and runs it again"
      )
    }
    if (!handle.open) {
      throw new TransactionClosed(
        "UNIT_ENDED",
        "the unit of work has ended; use the transaction only while the work given to commit runs"
      )
    }
  }
  return new Proxy(tx, {
    apply: (target, thisArg, args) => {
      check()
      return Reflect.apply(target, thisArg, args)
    },
    get: (target, property, receiver) => {
      const value: unknown = Reflect.get(target, property, receiver)
      if (!QUERYING.has(property) || typeof value !== "function") return value
      return (...args: Array<unknown>) => {
        check()
        return Reflect.apply(value, target, args)
      }
    }
  })
}

/**
 * A unit's open transaction: `sql.begin`, whose callback waits until the unit decides. `finish(true)` lets it send
 * COMMIT, `finish(false)` ROLLBACK; `outcome` is what `sql.begin` returns.
 *
 * @internal
 */
export interface Session {
  readonly tx: postgres.TransactionSql
  readonly handle: PgTransaction
  readonly outcome: Promise<unknown>
  readonly finish: (commit: boolean) => void
}

/** What a unit's transaction is ended with when the unit does not commit. @internal */
export class RolledBack extends Error {}

/** @internal */
export const transactionOf = (operation: string): Effect.Effect<PgTransaction, OffsetStoreError, Transaction> =>
  Effect.flatMap(Transaction, (transaction) => {
    const handle = transaction.handle
    const fail = (reason: string) => Effect.fail(new OffsetStoreError({ store: transaction.store, operation, reason }))
    if (handle instanceof OutsideUnit) return fail(outsideUnitReason)
    if (!(handle instanceof PgTransaction)) {
      return fail(
        `the open unit of work belongs to the ${transaction.store} store, not to Postgres` +
          " (use OffsetStore.append for the memory and file stores, and your own SqlClient for SqlOffsetStore)"
      )
    }
    if (!handle.open) {
      return fail("the unit of work has ended; use the transaction only while the work given to commit runs")
    }
    return Effect.succeed(handle)
  })

/**
 * Runs `f` on the unit's open transaction (`PgOffsetStore.query`): its failure becomes an `OffsetStoreError`, and one
 * that passes is kept on the transaction, so that the store runs the unit again.
 *
 * @internal
 */
export const query = <A>(
  f: (sql: postgres.ISql) => Promise<A>
): Effect.Effect<A, OffsetStoreError, Transaction> =>
  Effect.flatMap(transactionOf("query"), (handle) =>
    Effect.tryPromise({
      try: () => Promise.race([f(handle.sql), handle.closed]),
      catch: (cause) => {
        const code = errorCode(cause)
        const error = new OffsetStoreError({
          store: STORE,
          operation: "query",
          reason: code === undefined ? describe(cause) : `${describe(cause)} (${code})`,
          cause
        })
        if (isConnectionLost(code)) handle.lose(cause)
        if (isTransient(cause)) handle.transient = error
        return error
      }
    }))
