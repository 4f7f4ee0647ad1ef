/**
 * At-least-once, committing after each processed batch: the handler gets a chunk of one partition's records, and
 * once it has finished, the chunk's position is committed. A crash before that commit hands the chunk to the next
 * owner again, so make the handler's effect idempotent: here payments are keyed by id, and a repeat overwrites.
 *
 *   npx tsx examples/03-at-least-once.ts
 */
import { NodeRuntime } from "@effect/platform-node"
import { CommitPolicy, Consumer, ConsumerRecord } from "effect-kafka-delivery"
import * as Chunk from "effect/Chunk"
import * as Console from "effect/Console"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Broker from "./broker.js"

const program = Effect.gen(function*() {
  const topics = yield* Broker.Topics
  const topic = Broker.unique("payments")
  yield* topics.create(topic, 2)
  yield* topics.produce(topic, Array.from({ length: 40 }, (_, i) => ({ key: `payment-${i}`, value: String(10 * i) })))

  const ledger = new Map<string, number>()
  const allHandled = yield* Deferred.make<void>()
  yield* Consumer.run(
    { groupId: Broker.unique("ledger"), topics: [topic], maxPollRecords: 8 },
    (records, partition) =>
      Effect.gen(function*() {
        for (const record of records) {
          ledger.set(ConsumerRecord.keyString(record) ?? "", Number(ConsumerRecord.valueString(record)))
        }
        const last = Chunk.unsafeLast(records)
        yield* Console.log(`partition ${partition.partition}: ${records.length} payments up to offset ${last.offset}`)
        if (ledger.size === 40) yield* Deferred.succeed(allHandled, undefined)
      })
  ).pipe(
    Effect.raceFirst(Deferred.await(allHandled)),
    // maxBatch 1: the worker that finishes a chunk commits it at once; maxInterval only matters for larger batches.
    Effect.provide(CommitPolicy.commitAfter({ maxBatch: 1, maxInterval: "1 second" }))
  )
  const total = [...ledger.values()].reduce((a, b) => a + b, 0)
  yield* Console.log(`at-least-once on ${topics.where}: ${ledger.size} payments, total ${total}`)
})

program.pipe(Effect.provide(Broker.layer), NodeRuntime.runMain)
