/**
 * Transactions of a producer: a producer per transaction whose sends go into it, committed with the consumed
 * positions, or aborted once anything in it failed.
 */
import type * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Option from "effect/Option"
import * as Scope from "effect/Scope"
import { ProduceFailed, TransactionFailed } from "../../KafkaError.js"
import { Observability } from "../../Observability.js"
import { Producer, type ProducerRecord, type TransactionalProducer, type TransactionOffsets } from "../../Producer.js"
import * as telemetry from "../telemetry/telemetry.js"
import { make } from "./batcher.js"
import type { Resolved } from "./settings.js"
import type { Written } from "./written.js"

/**
 * One open transaction of a transactional producer, as a transport sees it.
 *
 * @internal
 */
export interface TxnSession {
  /** As `Transport.write`. */
  readonly write: (batch: ReadonlyArray<ProducerRecord>) => Effect.Effect<Array<Written>>
  /** Commits these positions for the group, with the transaction: they land if it commits, and only then. */
  readonly sendOffsets: (offsets: TransactionOffsets) => Effect.Effect<void, TransactionFailed>
  readonly commit: Effect.Effect<void, TransactionFailed>
  readonly abort: Effect.Effect<void, TransactionFailed>
}

/**
 * A transactional producer, as a transport sees it: `init` fences every earlier producer with the same transactional
 * id (the broker bumps the id's epoch and aborts their open transaction); `begin` opens a transaction.
 *
 * @internal
 */
export interface TxnClient {
  readonly transactionalId: string
  readonly init: Effect.Effect<void, TransactionFailed>
  readonly begin: Effect.Effect<TxnSession, TransactionFailed>
}

/**
 * Why a transaction given the consumer's group metadata fails on a client that cannot send it: sent without, the
 * positions would not be fenced by the group's generation, which is what the caller asked for.
 *
 * @internal
 */
export const withoutGroupMetadata = (client: string) =>
  `${client} cannot send a consumer's group metadata with a transaction's positions (KIP-447); ` +
  "send them without it and fence with a transactional id per input partition"

/** @internal */
export const transactionFailed = (
  transactionalId: string,
  operation: TransactionFailed["operation"],
  reason: TransactionFailed["reason"],
  detail?: string,
  code?: string
) =>
  new TransactionFailed({
    transactionalId,
    operation,
    reason,
    ...(code === undefined ? {} : { code }),
    ...(detail === undefined ? {} : { detail })
  })

/**
 * Runs `body` in a transaction of `client`: its `Producer` sends go into the transaction (batched as the settings
 * say). When `body` succeeds and every send succeeded, `offsets` are sent with the transaction and it commits. When a
 * send failed (refused before it was sent, or by the cluster; caught by `body` or not) it is aborted, and so it is when
 * `body` fails or is interrupted: `body`'s own failure is the answer then, `TransactionFailed` (`Aborted`) when `body`
 * succeeded; a send refused because another producer took the transactional id makes it `TransactionFailed` (`Fenced`)
 * either way. Sends still in the buffer are written first either way.
 *
 * @internal
 */
export const inTransaction = <A, E, R>(
  settings: Resolved,
  client: TxnClient,
  body: Effect.Effect<A, E, R>,
  offsets: TransactionOffsets | Effect.Effect<TransactionOffsets, TransactionFailed> | undefined,
  /** Told when a send of the transaction failed or its end did: the client must start over before the next one. */
  unclean: () => void = () => {}
): Effect.Effect<A, E | TransactionFailed, Exclude<R, Producer>> =>
  Effect.uninterruptibleMask((restore) =>
    Effect.gen(function*() {
      const observability = Option.getOrUndefined(yield* Effect.serviceOption(Observability))
      const session = yield* client.begin
      // The first send of the transaction that failed, whatever the reason and whether the body caught it: the
      // transaction cannot commit any more (the Java client's rule). `sentFailed`: one failed after it was sent, so the
      // client's sequence numbers may be behind the broker's.
      let failed: ProduceFailed | undefined
      let sentFailed = false
      const scope = yield* Scope.make()
      const producer = yield* make(settings, { write: session.write }, (failure, sent) => {
        failed ??= failure
        if (sent) sentFailed = true
      }).pipe(Scope.extend(scope))
      const exit = yield* Effect.exit(restore(Effect.provideService(body, Producer, producer)))
      yield* Scope.close(scope, Exit.void)
      if (sentFailed) unclean()
      if (Exit.isFailure(exit)) {
        yield* Effect.ignore(session.abort)
        telemetry.transactionEnded(observability, "aborted")
        // A fenced send says more than the body's failure (which it may have caused): another producer took the
        // transactional id, and this one must not begin again, nor its caller retry as if the body had failed.
        return yield* failed?.reason === "Fenced"
          ? transactionFailed(client.transactionalId, "commit", "Fenced", failed.message)
          : Effect.failCause(exit.cause)
      }
      if (failed !== undefined) {
        yield* Effect.ignore(session.abort)
        telemetry.transactionEnded(observability, "aborted")
        return yield* transactionFailed(
          client.transactionalId,
          "commit",
          "Aborted",
          `a send of the transaction failed, so it was aborted: ${failed.message}`
        )
      }
      const committed = yield* Effect.exit(
        offsets === undefined ? session.commit : Effect.zipRight(
          Effect.flatMap(Effect.isEffect(offsets) ? offsets : Effect.succeed(offsets), session.sendOffsets),
          session.commit
        )
      )
      if (Exit.isFailure(committed)) {
        unclean()
        yield* Effect.ignore(session.abort)
        telemetry.transactionEnded(observability, "aborted")
        return yield* Effect.failCause(committed.cause)
      }
      telemetry.transactionEnded(observability, "committed")
      return exit.value
    })
  )

/**
 * The `TransactionalProducer` service on a client: fenced earlier producers at once, then one transaction at a time.
 *
 * @internal
 */
export const makeTransactional = (
  settings: Resolved,
  client: TxnClient
): Effect.Effect<Context.Tag.Service<typeof TransactionalProducer>, TransactionFailed> =>
  Effect.gen(function*() {
    yield* client.init
    const one = yield* Effect.makeSemaphore(1)
    // Once fenced, a producer stays fenced: its client may not even be able to begin (kafkajs stays in the state of
    // the refused commit), and nothing it could write would land.
    let fenced: string | undefined
    // A transaction whose send or end failed leaves the client's sequence numbers behind the broker's: the next
    // transaction starts with a fresh producer session (the same id, a new epoch).
    let restart = false
    const noteFenced = (error: unknown) => {
      if (
        (error instanceof TransactionFailed || error instanceof ProduceFailed) && error.reason === "Fenced" &&
        fenced === undefined
      ) fenced = error.message
    }
    return {
      transactionalId: client.transactionalId,
      transaction: (body, options) =>
        one.withPermits(1)(Effect.suspend(() =>
          fenced !== undefined
            ? Effect.fail(transactionFailed(client.transactionalId, "begin", "Fenced", `fenced earlier: ${fenced}`))
            : Effect.zipRight(
              restart ? Effect.tap(client.init, () => Effect.sync(() => (restart = false))) : Effect.void,
              inTransaction(settings, client, body, options?.offsets, () => (restart = true))
            ).pipe(Effect.tapError((error) => Effect.sync(() => noteFenced(error))))
        ))
    }
  })
