/**
 * A handler that fails is retried on the `retry` Schedule, on the same records: the position never moves past the
 * failed record, and the partition goes back to it. Records before it in the same chunk are handled again (this is
 * at-least-once). When the retries run out the consumer fails, by default, with `HandlerFailed` naming the record.
 *
 *   npx tsx examples/09-retry.ts
 */
import { NodeRuntime } from "@effect/platform-node"
import { CommitPolicy, Consumer, ConsumerRecord } from "effect-kafka-delivery"
import * as Console from "effect/Console"
import * as Data from "effect/Data"
import * as Effect from "effect/Effect"
import * as Schedule from "effect/Schedule"
import * as Broker from "./broker.js"

class ServiceUnavailable extends Data.TaggedError("ServiceUnavailable")<{ readonly message: string }> {}

const program = Effect.gen(function*() {
  const topics = yield* Broker.Topics
  const topic = Broker.unique("shipments")
  yield* topics.create(topic, 1)
  yield* topics.produce(topic, ["box-1", "box-2", "box-3", "crate-4", "box-5", "pallet-6"].map((value) => ({ value })))

  let calls = 0
  const ship = (record: ConsumerRecord.ConsumerRecord) =>
    Effect.gen(function*() {
      const item = ConsumerRecord.valueString(record)
      // The carrier rejects crates twice before taking one, and never takes pallets.
      if ((item === "crate-4" && ++calls <= 2) || item === "pallet-6") {
        yield* Console.log(`  offset ${record.offset} (${item}): carrier unavailable`)
        return yield* new ServiceUnavailable({ message: `carrier rejected ${item}` })
      }
      yield* Console.log(`  offset ${record.offset} (${item}): shipped`)
    })

  const error = yield* Consumer.runEach({
    groupId: Broker.unique("shipping"),
    topics: [topic],
    maxPollRecords: 2,
    retry: Schedule.exponential("100 millis").pipe(Schedule.intersect(Schedule.recurs(3)))
  }, ship).pipe(Effect.provide(CommitPolicy.commitAfter({ maxBatch: 1, maxInterval: "1 second" })), Effect.flip)
  yield* Console.log(`on ${topics.where}, the consumer stopped: ${error.message}`)
  // The handler's own error, typed, with the record it failed on.
  if (error._tag === "HandlerFailed") {
    yield* Console.log(`  ${error.cause._tag} at offset ${error.offset}: ${error.cause.message}`)
  }
})

program.pipe(Effect.provide(Broker.layer), NodeRuntime.runMain)
