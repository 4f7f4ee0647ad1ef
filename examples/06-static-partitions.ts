/**
 * Exactly-once on partitions you choose (`partitions` instead of `topics`): no group membership, no rebalances.
 * Each partition starts at the position stored in the offset store, never at Kafka's committed offset, so a
 * restarted consumer goes on exactly where the last committed unit of work left it.
 *
 *   npx tsx examples/06-static-partitions.ts
 */
import { NodeRuntime } from "@effect/platform-node"
import { CommitPolicy, Consumer, OffsetStore } from "effect-kafka-delivery"
import * as Chunk from "effect/Chunk"
import * as Console from "effect/Console"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Broker from "./broker.js"

const program = Effect.gen(function*() {
  const topics = yield* Broker.Topics
  const topic = Broker.unique("inventory")
  const groupId = Broker.unique("warehouse-east")
  const chosen = [{ topic, partition: 1 }, { topic, partition: 3 }]
  const produce = (n: number) =>
    topics.produce(topic, Array.from({ length: 4 * n }, (_, i) => ({ partition: i % 4, value: `sku-${i}` })))
  yield* topics.create(topic, 4)

  // One run of the consumer: it stops once it has handled `expected` records, and says where each partition began.
  const session = (name: string, expected: number) =>
    Effect.gen(function*() {
      const began = new Map<number, bigint>()
      let handled = 0
      const done = yield* Deferred.make<void>()
      yield* Consumer.run({ groupId, partitions: chosen }, (records, tp) =>
        Effect.gen(function*() {
          if (!began.has(tp.partition)) began.set(tp.partition, Chunk.unsafeHead(records).offset)
          yield* OffsetStore.append(Chunk.toReadonlyArray(Chunk.map(records, (r) => `${r.partition}@${r.offset}`)))
          if ((handled += records.length) === expected) yield* Deferred.succeed(done, undefined)
        })).pipe(Effect.raceFirst(Deferred.await(done)))
      const where = [...began].sort().map(([partition, offset]) => `partition ${partition} at offset ${offset}`)
      yield* Console.log(`${name}: began ${where.join(", ")}; handled ${handled}`)
    })

  yield* produce(10)
  yield* session("first run", 20)
  yield* produce(3)
  yield* session("second run", 6)
  const results = yield* OffsetStore.results(groupId)
  yield* Console.log(`exactly-once on ${topics.where}: ${results.length} results stored, each record once`)
}).pipe(Effect.provide(CommitPolicy.transactional()), Effect.provide(OffsetStore.layerMemory))

program.pipe(Effect.provide(Broker.layer), NodeRuntime.runMain)
