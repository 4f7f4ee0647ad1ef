/**
 * Benchmark 14: `kafkaTransactional` with one transactional producer per member (KIP-447, the chunks handled at the
 * same time share a transaction) against one per input partition (a transaction per chunk), on the real broker
 * (@platformatic/kafka). One member reads a backlog on 6 partitions; its handler writes one record per input record
 * into an output topic, in the transaction that commits the position.
 */
import * as Chunk from "effect/Chunk"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as CommitPolicy from "../src/CommitPolicy.js"
import * as Consumer from "../src/Consumer.js"
import * as Platformatic from "../src/Platformatic.js"
import * as Producer from "../src/Producer.js"
import { type BenchResult, compare, pairedRatioInfo, type Plan, type Sample, timed } from "./harness.js"
import { createTopics, type Topics } from "./topics.js"

export interface TransactionSizes {
  readonly records: number
  readonly partitions: number
}

const MAX_POLL_RECORDS = 100

let seq = 0

/** One round: a fresh group reads the whole backlog; records/s from its first handled record to its last. */
const once = (
  brokers: string,
  topic: string,
  producers: "member" | "partition",
  sizes: TransactionSizes
): Effect.Effect<Sample, Error> =>
  Effect.gen(function*() {
    const groupId = `bench-ktx-${process.pid}-${++seq}`
    const output = `${groupId}-out`
    yield* Effect.promise(() => createTopics(brokers, [output], sizes.partitions))
    let handled = 0
    let transactions = 0
    let first = 0
    const done = yield* Deferred.make<number>()
    const counting = Layer.effect(
      Producer.TransactionalProducers,
      Effect.map(Producer.TransactionalProducers, (inner) => ({
        make: (id: string) =>
          Effect.map(inner.make(id), (producer) => ({
            transactionalId: producer.transactionalId,
            transaction: <A, E, R>(body: Effect.Effect<A, E, R>, options?: Producer.TransactionOptions) =>
              Effect.zipRight(Effect.sync(() => transactions++), producer.transaction(body, options))
          }))
      }))
    ).pipe(Layer.provide(Platformatic.layerTransactionalProducers({ brokers: brokers.split(","), clientId: groupId })))
    const consumer = yield* Consumer.run(
      { groupId, topics: [topic], maxPollRecords: MAX_POLL_RECORDS },
      (records) =>
        Effect.zipRight(
          Producer.sendAll(Chunk.map(records, (r) => ({ topic: output, key: r.key, value: r.value }))),
          Effect.sync(() => {
            if (first === 0) first = performance.now()
            handled += Chunk.size(records)
            if (handled >= sizes.records) Deferred.unsafeDone(done, Effect.succeed(performance.now()))
          })
        )
    ).pipe(
      Effect.provide(CommitPolicy.kafkaTransactional({ producers, instanceId: "bench" }).pipe(Layer.provide(counting))),
      Effect.provide(Platformatic.layer({ brokers: brokers.split(","), maxWaitTime: "100 millis" })),
      Effect.fork
    )
    const last = yield* Deferred.await(done).pipe(
      Effect.timeoutFail({ duration: "5 minutes", onTimeout: () => new Error("the backlog was not read in 5 minutes") })
    )
    yield* Fiber.interrupt(consumer)
    const seconds = (last - first) / 1000
    return { value: handled / seconds, details: { transactions, recordsPerTransaction: handled / transactions } }
  })

/** On the real broker: a producer per member against a producer per partition. */
export const transactionsKafka = (
  plan: Plan,
  brokers: string,
  topics: Topics,
  sizes: TransactionSizes
): Promise<BenchResult> =>
  timed(async () => {
    const topic = await topics.get(sizes.records, 256, sizes.partitions)
    const ids = ["partition", "member"] as const
    const variants = await compare(
      plan,
      ids.map((producers) => ({
        id: producers,
        label: producers === "member" ? "a producer per member (KIP-447)" : "a producer per input partition",
        run: () => Effect.runPromise(once(brokers, topic.name, producers, sizes))
      }))
    )
    return {
      id: "transactions-kafka",
      title: `14. kafkaTransactional, a producer per member against one per partition: one member reads ` +
        `${sizes.records.toLocaleString("en-US")} records on ${sizes.partitions} partitions and writes one record ` +
        "per record, in the transactions that commit its positions (@platformatic/kafka)",
      unit: "records/s",
      warmup: plan.warmup,
      rounds: plan.rounds,
      variants,
      checks: [pairedRatioInfo(variants, "member", "partition")],
      notes: [
        `Chunks of at most ${MAX_POLL_RECORDS} records. records/s from the first record handled to the last; ` +
        "transactions and recordsPerTransaction count the transactions begun (one per chunk with a producer per " +
        "partition; one per group of chunks handled together with one per member)."
      ]
    }
  })
