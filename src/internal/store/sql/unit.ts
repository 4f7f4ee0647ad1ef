/**
 * One unit of work on the application's own database: a connection reserved from its `SqlClient`, a transaction
 * begun on it, the work run with that transaction in its context (so the handler's `sql` writes in it), the position
 * stored on the condition that the partition's owner epoch is still the unit's, and COMMIT sent, settled when its
 * answer is lost.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import type * as SqlConnection from "@effect/sql/SqlConnection"
import * as Cause from "effect/Cause"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as Runtime from "effect/Runtime"
import * as Scope from "effect/Scope"
import { Fenced, OffsetStoreError } from "../../../KafkaError.js"
import { type CommitUnit, Transaction } from "../../../OffsetStore.js"
import * as Progress from "../../consumer/progress.js"
import { retrying, Transient } from "../retry.js"
import { UnitConnection } from "./connection.js"
import { asText, begin, forShare, forUpdate, now, partitionColumn, placeholders } from "./dialect.js"
import { classify, describe } from "./errors.js"
import type { SqlStore } from "./store.js"

/** What the work finds as the store's `Transaction`: the unit writes through the application's `SqlClient`. @internal */
export class SqlUnit {
  constructor(readonly store: string) {}
}

type Row = Readonly<Record<string, unknown>>

/** A statement of the store on a connection, its failure classified (retried when it passes). @internal */
export const run = (
  store: SqlStore,
  connection: SqlConnection.Connection,
  operation: string,
  text: string,
  params: ReadonlyArray<unknown>
): Effect.Effect<ReadonlyArray<Row>, OffsetStoreError | Transient> =>
  Effect.mapError(
    // Statements without parameters (BEGIN, COMMIT) are sent as they are: MySQL prepares few of them.
    (params.length === 0
      ? connection.executeUnprepared(text, [], undefined)
      : connection.execute(placeholders(store.dialect, text), params, undefined)) as Effect.Effect<
        ReadonlyArray<Row>,
        unknown
      >,
    classify(store.name, store.dialect, operation)
  )

/**
 * A connection of the application's pool, given back when the caller's scope closes, and given back too when the
 * caller is interrupted while it waits for one: @effect/sql-pg 0.53's `reserve` loses a connection that arrives after
 * its caller was interrupted (the pool then runs dry, and every unit waits for ever). The wait runs on a fiber of its
 * own, which is never interrupted; the caller only joins it.
 *
 * @internal
 */
export const reserve = (
  store: SqlStore,
  operation: string
): Effect.Effect<SqlConnection.Connection, OffsetStoreError | Transient, Scope.Scope> =>
  Effect.gen(function*() {
    const held = yield* Scope.make()
    // Forked from the store's runtime, not from the caller: a fork copies the caller's FiberRefs, whose cost grew with
    // every unit of a long-lived consumer fiber.
    const waiting = Runtime.runFork(store.runtime)(Scope.extend(store.client.reserve, held))
    // Added to the scope as it is: `Effect.addFinalizer` would diff and patch the fiber's FiberRefs on every unit.
    yield* Scope.addFinalizer(
      yield* Effect.scope,
      Effect.suspend(() =>
        waiting.unsafePoll() === null
          ? Effect.asVoid(Effect.forkDaemon(Effect.zipRight(Fiber.await(waiting), Scope.close(held, Exit.void))))
          : Scope.close(held, Exit.void)
      )
    )
    // Awaited, not joined: joining would merge the waiting fiber's FiberRefs into the caller's, whose history then
    // grows with every unit.
    return yield* Effect.mapError(Effect.flatten(Fiber.await(waiting)), classify(store.name, store.dialect, operation))
  })

const where = (store: SqlStore) => `where group_id = ? and topic = ? and ${partitionColumn(store.dialect)} = ?`

const placeOf = (unit: CommitUnit): ReadonlyArray<unknown> => [
  unit.groupId,
  unit.partition.topic,
  unit.partition.partition
]

/** A statement of the store in the unit's transaction: refused once that transaction is gone. */
const inUnit = (
  store: SqlStore,
  connection: UnitConnection,
  text: string,
  params: ReadonlyArray<unknown>
): Effect.Effect<ReadonlyArray<Row>, OffsetStoreError | Transient> =>
  Effect.suspend(() =>
    connection.aborted !== undefined
      ? Effect.fail(
        new Transient({
          error: new OffsetStoreError({
            store: store.name,
            operation: "commit",
            reason: `the unit's transaction was ended by a failure that passes (${describe(connection.aborted)})`,
            cause: connection.aborted
          })
        })
      )
      : run(store, connection.connection, "commit", text, params).pipe(
        Effect.tapError((error) =>
          Effect.sync(() => connection.record(error instanceof Transient ? error.error.cause : error.cause))
        )
      )
  )

// The row is locked and read, its epoch checked, and the new position written back in the same transaction as the
// work's writes, after them: a zombie stalled in its work holds no lock, and a claim that comes first fences the
// unit (a locking read sees the newest version of the row, at any isolation level of MySQL; on Postgres, under
// repeatable read or serializable, such a conflict is a serialization failure, retried, then fenced). The unit's
// id goes with the position, so that a COMMIT whose answer was lost can be settled.
const storePosition = (
  store: SqlStore,
  connection: UnitConnection,
  unit: CommitUnit,
  unitId: string
): Effect.Effect<void, Fenced | OffsetStoreError | Transient> =>
  Effect.gen(function*() {
    const rows = yield* inUnit(
      store,
      connection,
      `select ${asText(store.dialect, "next_offset")} as next_offset, ${asText(store.dialect, "epoch")} as epoch,
       finished from ${store.table} ${where(store)}${forUpdate(store.dialect)}`,
      placeOf(unit)
    )
    const row = rows[0]
    const epoch = row === undefined || row.epoch === null ? null : BigInt(String(row.epoch))
    if (epoch !== unit.epoch) {
      return yield* new Fenced({
        groupId: unit.groupId,
        topic: unit.partition.topic,
        partition: unit.partition.partition,
        epoch: unit.epoch,
        currentEpoch: epoch === null || epoch === 0n ? null : epoch
      })
    }
    const position = row!.next_offset === null ? null : BigInt(String(row!.next_offset))
    const finishedText = typeof row!.finished === "string" ? row!.finished : null
    const stored = Progress.advance(
      { position, finished: position === null ? [] : Progress.decode(position, finishedText) },
      unit
    )
    const text = Progress.encode(stored.position, stored.finished, Number.POSITIVE_INFINITY)
    yield* inUnit(
      store,
      connection,
      `update ${store.table} set next_offset = ?, finished = ?, unit_id = ?, updated_at = ${now(store.dialect)} ${
        where(store)
      }`,
      [stored.position.toString(), text === "" ? null : text, unitId, ...placeOf(unit)]
    )
  })

// COMMIT's answer was lost with the connection: the transaction may have committed or not. A locking read of the
// row, on another connection, waits until the server has ended that transaction, and its unit id says which way.
// Units of one partition in this process take turns from their position to this answer (`SqlStore.tails`), so no
// later unit of the same owner has written its own id meanwhile; a claim by another member leaves the id as it is.
const settle = (
  store: SqlStore,
  unit: CommitUnit,
  unitId: string,
  lost: unknown
): Effect.Effect<void, OffsetStoreError | Transient> =>
  Effect.scoped(
    Effect.flatMap(
      reserve(store, "commit"),
      (connection) =>
        run(
          store,
          connection,
          "commit",
          `select unit_id from ${store.table} ${where(store)}${forShare(store.dialect)}`,
          placeOf(unit)
        )
    )
  ).pipe(
    (read) => retrying(store.name, store.schedule, "commit", read),
    Effect.flatMap((rows) =>
      rows[0]?.unit_id === unitId ? Effect.void : Effect.fail(
        new Transient({
          error: new OffsetStoreError({
            store: store.name,
            operation: "commit",
            reason: `the connection was lost during COMMIT, which did not commit (${describe(lost)})`,
            cause: lost
          })
        })
      )
    )
  )

const commitTransaction = (
  store: SqlStore,
  connection: UnitConnection,
  unit: CommitUnit,
  unitId: string
): Effect.Effect<void, OffsetStoreError | Transient> =>
  Effect.catchAll(
    inUnit(store, connection, "commit", []),
    (error) => connection.lost ? settle(store, unit, unitId, connection.aborted) : Effect.fail(error)
  )

// Rolls back, unless the connection is gone (the server rolled the transaction back). Bounded: a rollback waits
// behind a statement still running on the connection, and the client keeps it queued in order if it takes longer.
const rollback = (store: SqlStore, connection: UnitConnection): Effect.Effect<void> =>
  Effect.suspend(() => {
    connection.open = false
    if (connection.lost) return Effect.void
    return run(store, connection.connection, "commit", "rollback", []).pipe(
      Effect.interruptible,
      Effect.ignore,
      Effect.timeoutOption("10 seconds"),
      Effect.asVoid
    )
  })

const lostDuringWork = (store: SqlStore, connection: UnitConnection): Transient =>
  new Transient({
    error: new OffsetStoreError({
      store: store.name,
      operation: "commit",
      reason: `a failure that passes ended the unit's transaction while the work ran (${describe(connection.aborted)})`,
      cause: connection.aborted
    })
  })

// One attempt at a unit: the work runs on this fiber, so interrupting the commit interrupts the work. Once the
// work has succeeded, the position and COMMIT run without interruption, in turn with the other units of the same
// partition (`tails`), up to COMMIT's answer.
const attempt = <A, E, R>(
  store: SqlStore,
  unit: CommitUnit,
  work: Effect.Effect<A, E, R>
): Effect.Effect<A, E | Fenced | OffsetStoreError | Transient, Exclude<R, Transaction>> =>
  Effect.scoped(Effect.uninterruptibleMask((restore) =>
    Effect.gen(function*() {
      const reserved = yield* restore(reserve(store, "commit"))
      const connection = new UnitConnection(store.dialect, reserved)
      for (const statement of begin(store.dialect, store.isolationLevel)) {
        yield* restore(inUnit(store, connection, statement, [])).pipe(
          Effect.onError(() => rollback(store, connection))
        )
      }
      return yield* restore(Effect.gen(function*() {
        const exit = yield* Effect.exit(
          work.pipe(
            Effect.provideService(SqlClient.TransactionConnection, [connection, 0] as const),
            Effect.provideService(Transaction, { store: store.name, handle: new SqlUnit(store.name) }),
            Effect.ensuring(Effect.sync(() => {
              connection.open = false
            }))
          )
        )
        const interrupted = Exit.isFailure(exit) && Cause.isInterruptedOnly(exit.cause)
        if (connection.aborted !== undefined && !interrupted) return yield* lostDuringWork(store, connection)
        if (Exit.isFailure(exit)) return yield* exit
        const unitId = crypto.randomUUID()
        yield* Effect.uninterruptible(
          store.tails(unit).withPermits(1)(
            Effect.zipRight(
              storePosition(store, connection, unit, unitId),
              commitTransaction(store, connection, unit, unitId)
            )
          )
        )
        return exit.value
      }) as Effect.Effect<A, E | Fenced | OffsetStoreError | Transient, Exclude<R, Transaction>>).pipe(
        Effect.onExit((exit) => Exit.isSuccess(exit) ? Effect.void : rollback(store, connection))
      )
    })
  ))

/**
 * A unit whose failure passes is run again whole: its writes were rolled back, and the work is an effect.
 *
 * @internal
 */
export const commit = <A, E, R>(
  store: SqlStore,
  unit: CommitUnit,
  work: Effect.Effect<A, E, R>
): Effect.Effect<A, E | OffsetStoreError | Fenced, Exclude<R, Transaction>> =>
  retrying(store.name, store.schedule, "commit", attempt(store, unit, work))
