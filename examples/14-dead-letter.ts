/**
 * Poison records: orders are JSON, decoded with a Schema; an order that does not decode, or that the handler keeps
 * refusing, goes to a dead-letter topic, as it was, with headers saying where it came from and why, and the partition
 * goes on. Under `commitAfter` the dead-letter write is acknowledged before the position passes the record: a crash
 * can write it twice, never lose it. Ten failures in a row would stop the consumer instead (`CircuitOpen`).
 *
 * A second consumer reads the dead-letter topic, as a person's tool would; `FailureRoute.replay` (or
 * `npm run replay`) writes the records back once the cause is fixed.
 *
 *   npx tsx examples/14-dead-letter.ts
 */
import { NodeRuntime } from "@effect/platform-node"
import { Codec, CommitPolicy, Consumer, FailureRoute } from "effect-kafka-delivery"
import * as Console from "effect/Console"
import * as Data from "effect/Data"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Schedule from "effect/Schedule"
import * as Schema from "effect/Schema"
import * as Broker from "./broker.js"

const Order = Schema.Struct({ id: Schema.Number, sku: Schema.String, quantity: Schema.Int })

class OutOfCatalog extends Data.TaggedError("OutOfCatalog")<{ readonly sku: string }> {
  override get message() {
    return `${this.sku} is not in the catalog`
  }
}

const program = Effect.gen(function*() {
  const topics = yield* Broker.Topics
  const topic = Broker.unique("orders")
  const deadLetters = `${topic}-dlq`
  yield* topics.create(topic, 1)
  yield* topics.create(deadLetters, 1)
  yield* topics.produce(
    topic,
    Array.from({ length: 20 }, (_, i) => ({
      key: `customer-${i % 3}`,
      value: i === 4
        ? "{id: 4, sku: 'tea'" // not JSON
        : i === 9
        ? JSON.stringify({ id: 9, sku: "tea", quantity: 1.5 }) // not an integer quantity
        : JSON.stringify({ id: i, sku: i === 13 ? "unicorn" : "tea", quantity: 1 + (i % 4) })
    }))
  )

  let handled = 0
  const allHandled = yield* Deferred.make<void>()
  const orders = Consumer.runEach(
    {
      groupId: Broker.unique("order-handler"),
      topics: [topic],
      retry: Schedule.recurs(2),
      onFailure: FailureRoute.deadLetter({ topic: deadLetters })
    },
    Consumer.decoded({ key: Codec.string, value: Codec.json(Order) }, (order) =>
      order.value.sku === "unicorn"
        ? Effect.fail(new OutOfCatalog({ sku: order.value.sku }))
        : Effect.suspend(() => {
          handled++
          return handled === 17 ? Deferred.succeed(allHandled, undefined) : Effect.void
        }))
  )

  // What a person's tool would show of the dead-letter topic.
  const seen: Array<string> = []
  const allSeen = yield* Deferred.make<void>()
  const inspector = Consumer.runEach(
    { groupId: Broker.unique("dead-letter-inspector"), topics: [deadLetters] },
    (record) =>
      Effect.suspend(() => {
        const letter = FailureRoute.deadLettered(record)
        if (letter === undefined) return Effect.void
        seen.push(
          `dead letter: ${letter.topic}-${letter.partition}@${letter.offset}, ${letter.errorTag} after ` +
            `${letter.attempts} attempt(s): ${letter.errorMessage.split("\n").at(-1)!.replace(/^[\s└─]+/, "")}`
        )
        return seen.length === 3 ? Deferred.succeed(allSeen, undefined) : Effect.void
      })
  )

  yield* Effect.all([orders, inspector], { concurrency: "unbounded" }).pipe(
    Effect.raceFirst(Effect.all([Deferred.await(allHandled), Deferred.await(allSeen)])),
    Effect.provide(CommitPolicy.commitAfter({ maxBatch: 10, maxInterval: "100 millis" })),
    Effect.provide(topics.producer({ acks: "all" }))
  )
  yield* Console.log(`on ${topics.where}: ${handled} orders handled, ${seen.length} dead-lettered`)
  for (const line of seen.sort()) yield* Console.log(line.replaceAll(topic, "orders"))
})

program.pipe(Effect.provide(Broker.layer), NodeRuntime.runMain)
