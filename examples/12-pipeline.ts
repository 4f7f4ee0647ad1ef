/**
 * Consume, transform, produce, exactly once inside Kafka: each chunk of orders becomes invoices written in one Kafka
 * transaction together with the orders' position. A crash aborts both; the next owner fences the old producer and
 * starts at the committed position, so a reader of the invoices (read_committed, the default) sees each order's
 * invoice once.
 *
 *   npx tsx examples/12-pipeline.ts
 */
import { NodeRuntime } from "@effect/platform-node"
import { CommitPolicy, Consumer, ConsumerRecord, Producer } from "effect-kafka-delivery"
import * as Chunk from "effect/Chunk"
import * as Console from "effect/Console"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Broker from "./broker.js"

const program = Effect.gen(function*() {
  const topics = yield* Broker.Topics
  const orders = Broker.unique("orders")
  const invoices = Broker.unique("invoices")
  yield* topics.create(orders, 2)
  yield* topics.create(invoices, 2)
  yield* topics.produce(orders, Array.from({ length: 40 }, (_, i) => ({ key: `order-${i}`, value: String(5 * i) })))

  // The pipeline: the handler sends through `Producer`, which under kafkaTransactional writes into the chunk's
  // transaction; the orders' position commits with it.
  const group = Broker.unique("invoicing")
  const pipelineDone = yield* Deferred.make<void>()
  let handled = 0
  yield* Consumer.run({ groupId: group, topics: [orders], maxPollRecords: 8 }, (records) =>
    Effect.gen(function*() {
      yield* Producer.sendAll(Chunk.map(records, (order) => ({
        topic: invoices,
        key: ConsumerRecord.keyString(order),
        value: `invoice for ${ConsumerRecord.keyString(order)}: ${Number(ConsumerRecord.valueString(order)) * 1.2}`
      })))
      handled += records.length
      if (handled === 40) yield* Deferred.succeed(pipelineDone, undefined)
    })).pipe(
      Effect.raceFirst(Deferred.await(pipelineDone)),
      Effect.provide(CommitPolicy.kafkaTransactional().pipe(Layer.provide(topics.transactionalProducers)))
    )

  // A reader of the invoices sees committed transactions only.
  const invoiced = new Map<string, number>()
  const readerDone = yield* Deferred.make<void>()
  yield* Consumer.run({ groupId: Broker.unique("billing"), topics: [invoices] }, (records) =>
    Effect.gen(function*() {
      for (const r of records) {
        const key = ConsumerRecord.keyString(r) ?? ""
        invoiced.set(key, (invoiced.get(key) ?? 0) + 1)
      }
      if (invoiced.size === 40) yield* Deferred.succeed(readerDone, undefined)
    })).pipe(Effect.raceFirst(Deferred.await(readerDone)), Effect.provide(CommitPolicy.atMostOnce()))
  const once = [...invoiced.values()].every((n) => n === 1)
  yield* Console.log(`pipeline on ${topics.where}: ${invoiced.size} invoices, ${once ? "each order once" : "REPEATS"}`)
})

program.pipe(Effect.provide(Broker.layer), NodeRuntime.runMain)
