/**
 * At-most-once: each chunk's position is committed before the handler sees it. A crash after the commit loses the
 * rest of the chunk; no record is ever handled twice. For work where a repeat is worse than a gap (a notification).
 *
 *   npx tsx examples/01-at-most-once.ts
 *   KAFKA_BROKERS=127.0.0.1:9092 npx tsx examples/01-at-most-once.ts
 */
import { NodeRuntime } from "@effect/platform-node"
import { CommitPolicy, Consumer, ConsumerRecord } from "effect-kafka-delivery"
import * as Console from "effect/Console"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Broker from "./broker.js"

const program = Effect.gen(function*() {
  const topics = yield* Broker.Topics
  const topic = Broker.unique("notifications")
  yield* topics.create(topic, 2)
  yield* topics.produce(topic, Array.from({ length: 6 }, (_, i) => ({ key: `user-${i % 3}`, value: `notice ${i}` })))

  let handled = 0
  const allHandled = yield* Deferred.make<void>()
  yield* Consumer.runEach({ groupId: Broker.unique("notifier"), topics: [topic] }, (record) =>
    Effect.gen(function*() {
      const where = `partition ${record.partition}, offset ${record.offset}`
      yield* Console.log(`send ${ConsumerRecord.valueString(record)} (${where})`)
      if (++handled === 6) yield* Deferred.succeed(allHandled, undefined)
    })).pipe(
      // The consumer never ends by itself: stop it once every record was handled.
      Effect.raceFirst(Deferred.await(allHandled)),
      Effect.provide(CommitPolicy.atMostOnce())
    )
  yield* Console.log(`at-most-once on ${topics.where}: ${handled} records handled, each position committed first`)
})

program.pipe(Effect.provide(Broker.layer), NodeRuntime.runMain)
