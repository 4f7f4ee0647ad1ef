/**
 * Producing: many fibers send one record each, and the producer merges what arrives within `linger` into one request,
 * each sender still getting its own partition and offset. Durability is a setting: `acks: "all"` with idempotence
 * (the default) loses nothing acknowledged and never writes a retried record twice; `acks: 1` is acknowledged by the
 * leader alone, and can lose what the leader had not copied yet when it dies.
 *
 *   npx tsx examples/11-producer.ts
 */
import { NodeRuntime } from "@effect/platform-node"
import { CommitPolicy, Consumer, ConsumerRecord, Producer } from "effect-kafka-delivery"
import * as Console from "effect/Console"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Broker from "./broker.js"

const program = Effect.gen(function*() {
  const topics = yield* Broker.Topics
  const topic = Broker.unique("orders")
  yield* topics.create(topic, 3)

  // 60 orders from 60 fibers at once, on a producer that waits up to 5 ms for others to share its request.
  const sent = yield* Effect.forEach(
    Array.from({ length: 60 }, (_, i) => i),
    (i) => Producer.send({ topic, key: `customer-${i % 6}`, value: `order-${i}` }),
    { concurrency: "unbounded" }
  ).pipe(Effect.provide(topics.producer({ acks: "all", idempotent: true, linger: "5 millis" })))
  const customer3 = new Set(sent.filter((_, i) => i % 6 === 3).map((m) => m.partition))
  yield* Console.log(`60 orders acknowledged by every in-sync replica; customer-3's all on partition ${[...customer3]}`)

  // The same producer API with the leader's acknowledgement alone: faster, and a leader that dies can lose them.
  const quick = yield* Producer.sendAll(
    Array.from({ length: 20 }, (_, i) => ({ topic, key: `customer-${i % 6}`, value: `quote-${i}` }))
  ).pipe(Effect.provide(topics.producer({ acks: 1, idempotent: false })))
  yield* Console.log(`20 quotes acknowledged by the leader, the last at offset ${quick.at(-1)?.offset}`)

  // Read back: every record is there once.
  const seen = new Set<string>()
  const all = yield* Deferred.make<void>()
  yield* Consumer.run({ groupId: Broker.unique("audit"), topics: [topic] }, (records) =>
    Effect.gen(function*() {
      for (const r of records) seen.add(ConsumerRecord.valueString(r) ?? "")
      if (seen.size === 80) yield* Deferred.succeed(all, undefined)
    })).pipe(Effect.raceFirst(Deferred.await(all)), Effect.provide(CommitPolicy.atMostOnce()))
  yield* Console.log(`producer on ${topics.where}: ${seen.size} records read back`)
})

program.pipe(Effect.provide(Broker.layer), NodeRuntime.runMain)
