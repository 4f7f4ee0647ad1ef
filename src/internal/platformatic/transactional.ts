/**
 * Transactional producers on @platformatic/kafka: a client per transactional id, whose batches are written as the
 * producer service's are (`makeWriter`), and whose transactions carry a consumer group's positions.
 */
import { Consumer, type Message, Producer as Client } from "@platformatic/kafka"
import type * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
import type { DriverError, TransactionFailed } from "../../KafkaError.js"
import type { TransactionalProducers } from "../../Producer.js"
import * as producer from "../producer/producer.js"
import { reasonOfType } from "../producer/reasons.js"
import type { ClientOptions } from "./config.js"
import { apiIds, describe, flatten, isRetriable } from "./errors.js"
import { closing, makeWriter, type Send } from "./producer.js"

const transactionFailed = (transactionalId: string, operation: TransactionFailed["operation"]) => (cause: unknown) => {
  const ids = apiIds(cause)
  const timeout = ids.includes("REQUEST_TIMED_OUT") ||
    flatten(cause).some((e) => typeof e.message === "string" && /timeout|timed out/i.test(e.message))
  const reason: TransactionFailed["reason"] = ids.some((id) => reasonOfType(id) === "Fenced")
    ? "Fenced"
    : timeout
    ? "Timeout"
    : isRetriable(cause)
    ? "Disconnected"
    : "Other"
  return producer.transactionFailed(transactionalId, operation, reason, describe(cause), ids[0])
}

/**
 * Transactional producers on @platformatic/kafka. Each is one client with its transactional id; `init` starts a new
 * client and opens and aborts an empty transaction, which sends InitProducerId (bumping the id's epoch, fencing
 * earlier producers and aborting their open transaction). The client sends the transaction timeout as its request
 * timeout (`timeout`), so a transactional client's requests may take that long.
 *
 * A transaction's positions are sent as the client does for a consumer's messages (AddOffsetsToTxn, then
 * TxnOffsetCommit to the group's coordinator), with the member's generation (or member epoch) and member id when the
 * offsets carry its group metadata (KIP-447, kafka-clients' `sendOffsetsToTransaction(offsets, groupMetadata)`), and
 * else with none: a consumer outside the group's generations (`sendOffsetsToTransaction(offsets, groupId)`). The
 * client sends no group instance id: the coordinator checks a static member by its member id and generation then.
 *
 * @internal
 */
export const makeTransactionClients = (
  client: ClientOptions,
  clientId: string,
  resolved: producer.Resolved,
  transactionTimeout: number
): Effect.Effect<Context.Tag.Service<typeof TransactionalProducers>, DriverError, Scope.Scope> =>
  Effect.gen(function*() {
    // Reads the topics' metadata for the writers of every transactional id.
    const metadata = yield* closing(new Client({ ...client, clientId, autocreateTopics: false }))
    const groups = new Map<string, Consumer>()
    yield* Effect.addFinalizer(() =>
      Effect.forEach(
        groups.values(),
        (consumer) =>
          Effect.promise(() => consumer.close(true).catch(() => undefined)).pipe(
            Effect.interruptible,
            Effect.timeoutOption("5 seconds")
          ),
        { discard: true }
      )
    )
    /** A consumer of the group that never joins it: what the client adds to a transaction, and asks for its coordinator. */
    const groupOf = (groupId: string) => {
      let consumer = groups.get(groupId)
      if (consumer === undefined) {
        consumer = new Consumer({ ...client, clientId, groupId })
        groups.set(groupId, consumer)
      }
      return consumer
    }
    const make = (transactionalId: string) =>
      Effect.gen(function*() {
        const create = () =>
          new Client({
            ...client,
            clientId,
            transactionalId,
            timeout: transactionTimeout,
            idempotent: true,
            acks: -1,
            compression: resolved.compression,
            autocreateTopics: false
          })
        let current: Client | undefined
        yield* Effect.addFinalizer(() =>
          current === undefined ? Effect.void : Effect.promise(() => current!.close(true).catch(() => undefined)).pipe(
            Effect.interruptible,
            Effect.timeoutOption("10 seconds")
          )
        )
        let open: Awaited<ReturnType<Client["beginTransaction"]>> | undefined
        // Whether the open transaction was sent anything: the broker refuses to end one that was not (INVALID_TXN_STATE),
        // and the client sends EndTxn all the same, so an empty one is ended by the client alone (`cancel`).
        let touched = false
        const send: Send = (messages) => {
          if (open === undefined) return Promise.reject(new Error("no open transaction"))
          touched = true
          return open.send({ messages, acks: -1, autocreateTopics: false })
        }
        const write = makeWriter(metadata, resolved, yield* Effect.clock, () => send)
        const begin = (operation: "init" | "begin") =>
          Effect.tryPromise({
            // The first transaction of a client sends InitProducerId: with no producer id or epoch of its own (-1), so
            // that the broker bumps the id's epoch whatever producer had it, fencing it and aborting its transaction.
            try: () =>
              (current ??= create()).beginTransaction(
                operation === "init" ? { producerId: -1n, producerEpoch: -1 } : {}
              ),
            catch: transactionFailed(transactionalId, operation)
          })
        const start = Effect.suspend(() => {
          const previous = current
          current = create()
          open = undefined
          return previous === undefined
            ? Effect.void
            : Effect.promise(() => previous.close(true).catch(() => undefined)).pipe(
              Effect.interruptible,
              Effect.timeoutOption("10 seconds")
            )
        })
        const txnClient: producer.TxnClient = {
          transactionalId,
          init: start.pipe(
            Effect.zipRight(begin("init")),
            // Beginning the client's first transaction sent InitProducerId; nothing was sent in it.
            Effect.flatMap((txn) =>
              Effect.tryPromise({ try: () => txn.cancel(), catch: transactionFailed(transactionalId, "init") })
            )
          ),
          begin: Effect.map(begin("begin"), (txn): producer.TxnSession => {
            open = txn
            touched = false
            const end = (operation: "commit" | "abort") =>
              Effect.tryPromise({
                try: () => !touched ? txn.cancel() : operation === "commit" ? txn.commit() : txn.abort(),
                catch: transactionFailed(transactionalId, operation)
              }).pipe(Effect.ensuring(Effect.sync(() => {
                if (open === txn) open = undefined
              })))
            return {
              write,
              sendOffsets: ({ groupId, member, positions }) =>
                Effect.tryPromise({
                  try: async () => {
                    const consumer = groupOf(groupId)
                    touched = true
                    await txn.addConsumer(consumer)
                    const coordinatorId = await consumer.findGroupCoordinator()
                    for (const { next, partition, topic } of positions) {
                      // The client commits a message's offset + 1, for the group of its metadata.
                      const message = {
                        topic,
                        partition,
                        offset: next - 1n,
                        metadata: {
                          consumer: {
                            groupId,
                            generationId: member?.generationId ?? -1,
                            memberId: member?.memberId ?? "",
                            coordinatorId
                          }
                        }
                      }
                      await txn.addOffset(message as unknown as Message)
                    }
                  },
                  catch: transactionFailed(transactionalId, "sendOffsets")
                }),
              commit: end("commit"),
              abort: end("abort")
            }
          })
        }
        return yield* producer.makeTransactional(resolved, txnClient)
      })
    return { make }
  })
