/**
 * At-least-once with batched commits: commit once 100 records were handled since the last commit, or every 2
 * seconds while fewer wait, whichever comes first; and always before a partition is revoked. Fewer commits cost
 * less; what a crash can repeat is bounded by the batch (here at most 100 records or 2 seconds of work).
 * A position is only ever committed past records that, with all before them in the partition, were handled.
 *
 *   npx tsx examples/04-commit-every.ts
 */
import { NodeRuntime } from "@effect/platform-node"
import { CommitPolicy, Consumer } from "effect-kafka-delivery"
import * as Console from "effect/Console"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Broker from "./broker.js"

const program = Effect.gen(function*() {
  const topics = yield* Broker.Topics
  const topic = Broker.unique("sensor-readings")
  yield* topics.create(topic, 3)
  yield* topics.produce(topic, Array.from({ length: 750 }, (_, i) => ({ key: `sensor-${i % 5}`, value: String(i) })))

  const perPartition = new Map<number, number>()
  let handled = 0
  const allHandled = yield* Deferred.make<void>()
  const config = { groupId: Broker.unique("sensor-archive"), topics: [topic], maxPollRecords: 50 }
  yield* Consumer.run(config, (records, tp) =>
    Effect.gen(function*() {
      perPartition.set(tp.partition, (perPartition.get(tp.partition) ?? 0) + records.length)
      handled += records.length
      if (handled === 750) yield* Deferred.succeed(allHandled, undefined)
    })).pipe(
      Effect.raceFirst(Deferred.await(allHandled)),
      Effect.provide(CommitPolicy.commitAfter({ maxBatch: 100, maxInterval: "2 seconds" }))
    )
  yield* Console.log(`commit every 100 records or 2 seconds, on ${topics.where}: ${handled} readings archived`)
  for (const [partition, n] of [...perPartition].sort()) yield* Console.log(`  partition ${partition}: ${n}`)
})

program.pipe(Effect.provide(Broker.layer), NodeRuntime.runMain)
