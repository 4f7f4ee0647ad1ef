/**
 * Transactional producers on kafkajs: a kafkajs producer per transactional id, whose batches are written as the
 * producer service's are (`makeWriter`).
 */
import type * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
import type { Producer as KafkaProducer, Transaction } from "kafkajs"
import type { DriverError, TransactionFailed } from "../../KafkaError.js"
import type { TransactionalProducers } from "../../Producer.js"
import * as producer from "../producer/producer.js"
import { type ClientConfig, disconnect, makeClient } from "./driver.js"
import { causeChain, describe, isRetriable, protocolType } from "./errors.js"
import { explicitPartition } from "./messages.js"
import { connected, makeWriter, reasonOfType, type SendBatch } from "./producer.js"

const transactionFailed = (transactionalId: string, operation: TransactionFailed["operation"]) => (cause: unknown) => {
  const type = protocolType(cause)
  const names = causeChain(cause).map((e) => e.name)
  const reason: TransactionFailed["reason"] = reasonOfType(type) === "Fenced"
    ? "Fenced"
    : names.includes("KafkaJSRequestTimeoutError") || type === "REQUEST_TIMED_OUT"
    ? "Timeout"
    : isRetriable(cause)
    ? "Disconnected"
    : "Other"
  return producer.transactionFailed(transactionalId, operation, reason, describe(cause), type)
}

/**
 * Transactional producers on kafkajs, sharing one kafkajs client and admin connection. Each is one kafkajs producer
 * with its transactional id; its `init` opens and aborts an empty transaction, which makes kafkajs send
 * InitProducerId (bumping the id's epoch, fencing earlier producers and aborting their open transaction) and nothing
 * else.
 *
 * @internal
 */
export const makeTransactionClients = (
  client: ClientConfig,
  resolved: producer.Resolved,
  transactionTimeout: number,
  retries: number | undefined
): Effect.Effect<Context.Tag.Service<typeof TransactionalProducers>, DriverError, Scope.Scope> =>
  Effect.gen(function*() {
    const kafka = makeClient(client)
    const admin = yield* connected(kafka.admin())
    const make = (transactionalId: string) =>
      Effect.gen(function*() {
        const create = () =>
          kafka.producer({
            transactionalId,
            transactionTimeout,
            idempotent: true,
            maxInFlightRequests: 1,
            allowAutoTopicCreation: false,
            createPartitioner: explicitPartition,
            ...(retries === undefined ? {} : { retry: { ...client.kafka.retry, retries } })
          })
        // `init` starts a kafkajs producer of its own each time: kafkajs sends InitProducerId once per producer, and
        // a producer whose send failed would give the failed batch's sequence numbers to the next one.
        let kafkaProducer: KafkaProducer | undefined
        yield* Effect.addFinalizer(() =>
          kafkaProducer === undefined ? Effect.void : disconnect(() => kafkaProducer!.disconnect())
        )
        let current: Transaction | undefined
        const send: SendBatch = (request) =>
          current === undefined ? Promise.reject(new Error("no open transaction")) : current.sendBatch(request)
        const write = makeWriter(admin, resolved, yield* Effect.clock, () => send)
        const begin = (operation: "init" | "begin") =>
          Effect.tryPromise({
            try: () => kafkaProducer!.transaction(),
            catch: transactionFailed(transactionalId, operation)
          })
        const start = Effect.suspend(() => {
          const previous = kafkaProducer
          const next = create()
          kafkaProducer = next
          current = undefined
          return (previous === undefined ? Effect.void : disconnect(() => previous.disconnect())).pipe(
            Effect.zipRight(
              Effect.tryPromise({ try: () => next.connect(), catch: transactionFailed(transactionalId, "init") })
            )
          )
        })
        const txnClient: producer.TxnClient = {
          transactionalId,
          init: start.pipe(
            Effect.zipRight(begin("init")),
            Effect.flatMap((txn) =>
              Effect.tryPromise({ try: () => txn.abort(), catch: transactionFailed(transactionalId, "init") })
            )
          ),
          begin: Effect.map(begin("begin"), (txn): producer.TxnSession => {
            current = txn
            const end = (operation: "commit" | "abort") =>
              Effect.tryPromise({
                try: () => operation === "commit" ? txn.commit() : txn.abort(),
                catch: transactionFailed(transactionalId, operation)
              }).pipe(Effect.ensuring(Effect.sync(() => {
                if (current === txn) current = undefined
              })))
            return {
              write,
              sendOffsets: ({ groupId, member, positions }) =>
                member !== undefined
                  ? Effect.fail(producer.transactionFailed(
                    transactionalId,
                    "sendOffsets",
                    "Other",
                    producer.withoutGroupMetadata("kafkajs")
                  ))
                  : Effect.tryPromise({
                    try: () =>
                      txn.sendOffsets({
                        consumerGroupId: groupId,
                        topics: Array.from(
                          producer.groupBy(positions, (p) => p.topic),
                          ([topic, list]) => ({
                            topic,
                            partitions: list.map((p) => ({ partition: p.partition, offset: String(p.next) }))
                          })
                        )
                      }),
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
