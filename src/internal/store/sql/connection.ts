/**
 * The connection of a unit's transaction as the work reaches it: the application's `SqlClient` finds it in the
 * context (`SqlClient.TransactionConnection`), so that every statement the handler makes with its own `sql`, and a
 * nested `sql.withTransaction` (a savepoint), runs in the unit's transaction.
 *
 * It is guarded. Once the work has ended nothing more goes through it: a fiber that outlived the handler would
 * otherwise write after the position, or on a connection given back to the pool. Once a failure has ended the
 * transaction on the server (a lost connection, a deadlock: MySQL then rolls the whole transaction back and goes on
 * in autocommit), nothing more goes through it either: each statement would land on its own, outside the unit.
 */
import type * as Connection from "@effect/sql/SqlConnection"
import { SqlError } from "@effect/sql/SqlError"
import * as Effect from "effect/Effect"
import * as Stream from "effect/Stream"
import type { Dialect } from "./dialect.js"
import { describe, isConflict, isConnectionLost } from "./errors.js"

/** @internal */
export class UnitConnection implements Connection.Connection {
  /** False once the work has ended: the store's own statements go straight to `connection`. */
  open = true
  /** The failure that ended the transaction on the server, if one did; the unit is then run again. */
  aborted: unknown = undefined
  /** True when that failure was the connection's: nothing may be sent on it, not even ROLLBACK. */
  lost = false

  constructor(readonly dialect: Dialect, readonly connection: Connection.Connection) {}

  /** Notes a failure of a statement in the unit, the work's or the store's. */
  record(error: unknown): void {
    if (this.aborted !== undefined) return
    if (isConnectionLost(this.dialect, error)) {
      this.lost = true
      this.aborted = error
    } else if (isConflict(this.dialect, error)) {
      this.aborted = error
    }
  }

  private refusal(): SqlError | undefined {
    if (!this.open) {
      return new SqlError({
        message: "the unit of work has ended: nothing more is sent in its transaction (a fiber of the handler " +
          "outlived it)"
      })
    }
    if (this.aborted !== undefined) {
      return new SqlError({
        cause: this.aborted,
        message: `the unit's transaction was ended by an earlier failure (${
          describe(this.aborted)
        }); it will be run again`
      })
    }
    return undefined
  }

  private guard<A>(run: () => Effect.Effect<A, SqlError>): Effect.Effect<A, SqlError> {
    return Effect.suspend(() => {
      const refused = this.refusal()
      if (refused !== undefined) return Effect.fail(refused)
      return Effect.tapError(run(), (error) => Effect.sync(() => this.record(error)))
    })
  }

  readonly execute: Connection.Connection["execute"] = (sql, params, transformRows) =>
    this.guard(() => this.connection.execute(sql, params, transformRows))

  readonly executeRaw: Connection.Connection["executeRaw"] = (sql, params) =>
    this.guard(() => this.connection.executeRaw(sql, params))

  readonly executeValues: Connection.Connection["executeValues"] = (sql, params) =>
    this.guard(() => this.connection.executeValues(sql, params))

  readonly executeUnprepared: Connection.Connection["executeUnprepared"] = (sql, params, transformRows) =>
    this.guard(() => this.connection.executeUnprepared(sql, params, transformRows))

  readonly executeStream: Connection.Connection["executeStream"] = (sql, params, transformRows) =>
    Stream.suspend(() => {
      const refused = this.refusal()
      if (refused !== undefined) return Stream.fail(refused)
      return Stream.tapError(
        this.connection.executeStream(sql, params, transformRows),
        (error) => Effect.sync(() => this.record(error))
      )
    })
}
