/**
 * One unit of work in Postgres: its transaction begun, the work run in it, the position stored on the condition that
 * the partition's owner epoch is still the unit's, and COMMIT sent, settled when its answer is lost.
 */
import * as Cause from "effect/Cause"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import type postgres from "postgres"
import { type CommitUnit, Transaction } from "../../../OffsetStore.js"
import * as Progress from "../../consumer/progress.js"
import { onPool, type Pg, retrying } from "./client.js"
import {
  describe,
  errorCode,
  isConnectionLost,
  isTransient,
  isTransientError,
  STORE,
  toStoreError,
  Transient
} from "./errors.js"
import { decodeLocked, decodeText, prepared } from "./sql.js"
import { PgTransaction, RolledBack, type Session, TransactionClosed, type TrackedConnection } from "./transaction.js"
import { Fenced, OffsetStoreError } from "../../../KafkaError.js"

/**
 * The position of a unit, stored: the transaction's id (to settle a COMMIT whose answer is lost), and, when the
 * position's last statement is still on its way, that statement: COMMIT is sent right behind it (see `storePosition`).
 */
interface Stored {
  readonly xid: string
  readonly written: Promise<unknown> | undefined
}

/**
 * A statement of the store on the unit's connection; it fails, rather than hangs, if the connection goes. A
 * transaction aborted by a failure that passes, which the work caught and went on from (25P02), is tried again.
 */
const onUnit = <A>(
  pg: Pg,
  handle: PgTransaction,
  run: () => Promise<A>
): Effect.Effect<A, OffsetStoreError | Transient> =>
  Effect.tryPromise({
    try: () => handle.alive() ? Promise.race([run(), handle.closed]) : handle.closed,
    catch: (cause) => {
      const code = errorCode(cause)
      if (isConnectionLost(code)) handle.lose(cause)
      if (code === "25P02" && handle.transient !== undefined) return new Transient({ error: handle.transient })
      const error = toStoreError("commit", pg.client.target)(cause)
      return isTransient(cause) ? new Transient({ error }) : error
    }
  })

const lostConnection = (pg: Pg, handle: PgTransaction): Transient =>
  new Transient({
    error: new OffsetStoreError({
      store: STORE,
      operation: "commit",
      reason: `the connection to Postgres at ${pg.client.target} was lost while the unit ran (${
        describe(handle.lost)
      })`,
      cause: handle.lost
    })
  })

// The position is stored only if the partition's owner epoch is still the unit's. Under read committed, an UPDATE
// that finds the row locked (by a claim, or by another unit) waits, then checks its condition again on the row's
// newest version: a claim that committed meanwhile is seen, and the unit is fenced. `txid_current()` names the
// transaction, so that a COMMIT whose answer is lost with the connection can be settled (see `settle`).
// A unit of a chunk on a partition without finished ranges (the usual case) is one statement. Otherwise the row is
// locked and read (`for update`: units of the same owner committing side by side take turns here, each adding its
// ranges to what the one before stored), and written back. That last UPDATE is not waited for: COMMIT goes with it
// (one round trip, not two, and the row is not held across a round trip to the consumer). It cannot miss the row,
// which this transaction holds with the unit's epoch; should it find none all the same, it fails (a division by
// zero), and a failed statement makes the server roll back the COMMIT behind it.
// Each statement is put on the transaction's connection at once (`execute`), and only while the transaction is
// neither ending nor gone: a statement made after its ROLLBACK would run on the connection outside it, in another
// session's transaction or in none, and store a position without the unit's results.
const storePosition = async (
  pg: Pg,
  tx: postgres.TransactionSql,
  handle: PgTransaction,
  unit: CommitUnit
): Promise<Stored | undefined> => {
  const send = (query: string, parameters: ReadonlyArray<unknown>) => {
    if (handle.ending || !handle.alive()) {
      throw new TransactionClosed("UNIT_ENDED", "the unit's transaction is ending; nothing more is sent in it")
    }
    return tx.unsafe(query, parameters as Array<postgres.ParameterOrJSON<never>>, prepared).values().execute()
  }
  const where = "where group_id = $1 and topic = $2 and partition = $3::int and epoch = $4::bigint"
  const place = [unit.groupId, unit.partition.topic, unit.partition.partition, unit.epoch.toString()]
  if (unit.finished === undefined || unit.finished.length === 0) {
    const simple = await send(
      `update ${pg.client.table} set next_offset = greatest(next_offset, $5::bigint), updated_at = now()
       ${where} and finished is null
       returning txid_current()::text`,
      [...place, unit.next.toString()]
    )
    if (simple.length > 0) return { xid: decodeText(simple)[0]![0] ?? "", written: undefined }
  }
  const rows = decodeLocked(
    await send(
      `select next_offset::text, finished, txid_current()::text from ${pg.client.table} ${where} for update`,
      place
    )
  )
  if (rows.length === 0) return undefined
  const [next, finishedText, xid] = rows[0]!
  const position = next === null ? null : BigInt(next)
  const stored = Progress.advance(
    { position, finished: position === null ? [] : Progress.decode(position, finishedText) },
    unit
  )
  const text = Progress.encode(stored.position, stored.finished, Number.POSITIVE_INFINITY)
  const written: Promise<unknown> = send(
    `with written as (
       update ${pg.client.table} set next_offset = $5::bigint, finished = $6, updated_at = now() ${where} returning 1
     )
     select 1 / count(*) from written`,
    [...place, stored.position.toString(), text === "" ? null : text]
  )
  // Looked at once COMMIT has answered (`commitSession`).
  written.catch(() => undefined)
  return { xid, written }
}

const fenced = (
  pg: Pg,
  tx: postgres.TransactionSql,
  handle: PgTransaction,
  unit: CommitUnit
): Effect.Effect<never, Fenced | OffsetStoreError | Transient> => {
  const { groupId, partition: { partition, topic } } = unit
  return onUnit(pg, handle, async () =>
    decodeText(
      await tx.unsafe(
        `select epoch::text from ${pg.client.table} where group_id = $1 and topic = $2 and partition = $3::int`,
        [groupId, topic, partition],
        prepared
      ).values()
    )).pipe(Effect.flatMap((rows) => {
      const epoch = rows.length === 0 || rows[0][0] === null ? 0n : BigInt(rows[0][0])
      return Effect.fail(
        new Fenced({ groupId, topic, partition, epoch: unit.epoch, currentEpoch: epoch === 0n ? null : epoch })
      )
    }))
}

// The connection went while COMMIT was on its way: the transaction may have committed or not. The server knows;
// it is asked on another connection until it answers (a transaction `in progress` is still being ended). Only a
// unit the server says did not commit is run again.
const settle = (pg: Pg, xid: string, lost: Transient): Effect.Effect<void, OffsetStoreError | Transient> =>
  retrying(
    pg,
    "commit",
    Effect.tryPromise({
      try: async () =>
        decodeText(await pg.client.sql.unsafe("select txid_status($1::bigint)::text", [xid], prepared).values()),
      catch: onPool(pg, "commit")
    }).pipe(Effect.flatMap((rows): Effect.Effect<"committed" | "aborted", OffsetStoreError | Transient> => {
      const status = rows[0]?.[0] ?? null
      switch (status) {
        case "committed":
        case "aborted":
          return Effect.succeed(status)
        case "in progress":
          return Effect.fail(
            new Transient({
              error: new OffsetStoreError({
                store: STORE,
                operation: "commit",
                reason: `transaction ${xid}, whose connection was lost during COMMIT, is still in progress`
              })
            })
          )
        default:
          return Effect.fail(
            new OffsetStoreError({
              store: STORE,
              operation: "commit",
              reason: `the connection was lost during COMMIT and the server no longer knows whether transaction ` +
                `${xid} committed; check the position stored for the partition before going on`,
              cause: lost.error
            })
          )
      }
    }))
  ).pipe(Effect.flatMap((status) => status === "committed" ? Effect.void : Effect.fail(lost)))

// A unit's transaction is postgres.js's `sql.begin`, whose connection comes from the pool like every query's, and
// goes back to it once the transaction ends (the pool's `reserve` loses waiting callers when a connection closes).
// The callback hands the transaction over and waits for the unit to decide; meanwhile the work runs on the unit's
// fiber. Its first statement, sent with the callback, hands over postgres.js's connection object through
// `onexecute`, so that the unit can tell, before sending anything, whether the connection is still its own. Waiting
// for BEGIN can be interrupted: a transaction that begins after that is rolled back at once.
const open = (pg: Pg): Effect.Effect<Session, OffsetStoreError | Transient> => {
  const beginOptions = `isolation level ${pg.isolationLevel}`
  return Effect.async<Session, OffsetStoreError | Transient>((resume) => {
    let wanted = true
    let session: Session | undefined
    const outcome = pg.client.sql.begin(beginOptions, (tx) =>
      new Promise<void>((resolve, reject) => {
        const finish = (commit: boolean) => commit ? resolve() : reject(new RolledBack())
        if (!wanted) return finish(false)
        const handle = new PgTransaction(tx)
        const attach: postgres.UnsafeQueryOptions & { readonly onexecute: (c: TrackedConnection) => true } = {
          ...prepared,
          onexecute: (connection) => {
            handle.attach(connection)
            return true
          }
        }
        // Its failure, if any, also fails the work's statements and the transaction.
        tx.unsafe("select 1", [], attach).execute().catch(() => undefined)
        session = { tx, handle, outcome, finish }
        resume(Effect.succeed(session))
      }))
    outcome.catch((cause: unknown) => {
      if (session === undefined) {
        if (wanted && !(cause instanceof RolledBack)) resume(Effect.fail(onPool(pg, "commit")(cause)))
      } else if (isConnectionLost(errorCode(cause))) {
        session.handle.lose(cause)
      }
    })
    return Effect.sync(() => {
      wanted = false
    })
  })
}

// Ends the transaction with COMMIT, unless its connection is gone: then nothing may be sent on it any more. With
// the position's last statement still on its way, the transaction committed only if that statement did: had it
// failed, the server rolled the COMMIT behind it back (and answered it as a ROLLBACK, which postgres.js does not
// tell apart), so its failure is the unit's.
const commitSession = (pg: Pg, session: Session, written: Promise<unknown> | undefined): Effect.Effect<
  void,
  OffsetStoreError | Transient
> =>
  onUnit(pg, session.handle, async () => {
    session.handle.ending = true
    session.finish(true)
    await session.outcome
    if (written !== undefined) await written
  })

// Rolls back in the background if it takes longer than the bound: a rollback waits behind the statements still
// running on the connection. A transaction whose connection is gone is left as it is: the server rolled it back.
const rollback = (session: Session): Effect.Effect<void> =>
  Effect.suspend(() => {
    session.handle.ending = true
    if (!session.handle.alive()) return Effect.void
    session.finish(false)
    return Effect.tryPromise(() => Promise.race([session.outcome, session.handle.closed])).pipe(
      Effect.interruptible,
      Effect.ignore,
      Effect.timeoutOption("10 seconds"),
      Effect.asVoid
    )
  })

// One attempt at a unit: the work runs on this fiber, so interrupting the commit interrupts the work. The position
// is written after the work, so that a zombie stalled in its work holds no lock on it and the partition's new
// owner is not held up.
const attempt = <A, E, R>(
  pg: Pg,
  unit: CommitUnit,
  work: Effect.Effect<A, E, R>
): Effect.Effect<A, E | Fenced | OffsetStoreError | Transient, Exclude<R, Transaction>> =>
  Effect.uninterruptibleMask((restore) =>
    Effect.flatMap(restore(open(pg)), (session) => {
      const { handle, tx } = session
      return restore(Effect.gen(function*() {
        const exit = yield* Effect.exit(
          Effect.provideService(work, Transaction, { store: STORE, handle }).pipe(
            Effect.ensuring(Effect.sync(() => {
              handle.open = false
            }))
          )
        )
        const interrupted = Exit.isFailure(exit) && Cause.isInterruptedOnly(exit.cause)
        if (!handle.alive() && !interrupted) return yield* lostConnection(pg, handle)
        if (Exit.isFailure(exit)) {
          if (handle.transient !== undefined && !interrupted) {
            return yield* new Transient({ error: handle.transient })
          }
          return yield* exit
        }
        const stored = yield* onUnit(pg, handle, () => storePosition(pg, tx, handle, unit))
        if (stored === undefined) return yield* fenced(pg, tx, handle, unit)
        // Once COMMIT is sent, its answer is awaited: an interruption now could not undo it.
        yield* Effect.uninterruptible(
          commitSession(pg, session, stored.written).pipe(
            Effect.catchIf(isTransientError, (transient) =>
              handle.lost === undefined ? Effect.fail(transient) : settle(pg, stored.xid, transient))
          )
        )
        return exit.value
      })).pipe(Effect.onExit((exit) =>
        Exit.isSuccess(exit) ? Effect.void : rollback(session)
      ))
    })
  )

/**
 * A unit whose failure passes is run again whole: its writes were rolled back, and the work is an effect.
 *
 * @internal
 */
export const commit = <A, E, R>(
  pg: Pg,
  unit: CommitUnit,
  work: Effect.Effect<A, E, R>
): Effect.Effect<A, E | OffsetStoreError | Fenced, Exclude<R, Transaction>> =>
  retrying(pg, "commit", attempt(pg, unit, work))
