/**
 * The README's quick start: a consumer that ships orders, committing after it handled them. Its code below the
 * comment is the README's code block, word for word (test/Readme.test.ts checks it).
 *
 *   npx tsx examples/00-quick-start.ts                               # on the in-memory broker
 *   KAFKA_BROKERS=127.0.0.1:9092 npx tsx examples/00-quick-start.ts  # on Kafka
 */
import { NodeRuntime } from "@effect/platform-node"
import { CommitPolicy, Consumer, ConsumerRecord, InMemoryKafka } from "effect-kafka-delivery"
import * as Platformatic from "effect-kafka-delivery/Platformatic"
import * as Config from "effect/Config"
import * as Console from "effect/Console"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"

const orders = ["2 books", "a lamp", "a kettle"].map((value, i) => ({ key: `order-${i + 1}`, value }))

// Handles each order, then commits: every 100 records or every second, and before a partition goes to another
// member. A crash repeats the orders handled since the last commit; it never loses one.
const shipOrders = Effect.gen(function*() {
  let shipped = 0
  const allShipped = yield* Deferred.make<void>()
  yield* Consumer.runEach({ groupId: "shipping", topics: ["orders"] }, (record) =>
    Effect.gen(function*() {
      yield* Console.log(`shipping ${ConsumerRecord.keyString(record)}: ${ConsumerRecord.valueString(record)}`)
      if (++shipped === orders.length) yield* Deferred.succeed(allShipped, undefined)
    })).pipe(
      // A consumer runs until it is interrupted or fails; this one stops once the orders are shipped.
      Effect.raceFirst(Deferred.await(allShipped)),
      Effect.provide(CommitPolicy.commitAfter({ maxBatch: 100, maxInterval: "1 second" }))
    )
  yield* Console.log(`${shipped} orders shipped`)
})

// On the in-memory broker: nothing to install, nothing left behind.
const inMemory = Effect.gen(function*() {
  yield* InMemoryKafka.createTopic("orders", 3)
  yield* InMemoryKafka.produce("orders", orders)
  yield* shipOrders
}).pipe(Effect.provide(InMemoryKafka.layer()))

// On Kafka: the same consumer, with @platformatic/kafka as its driver.
const onKafka = (brokers: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    yield* Platformatic.createTopic(brokers, "orders", 3)
    yield* Platformatic.produce(brokers, "orders", orders)
    yield* shipOrders
  }).pipe(Effect.provide(Platformatic.layer({ brokers })))

Config.option(Config.string("KAFKA_BROKERS")).pipe(
  Effect.flatMap(Option.match({
    onNone: () => inMemory,
    onSome: (brokers) => Effect.flatMap(Platformatic.parseBrokers(brokers), onKafka)
  })),
  NodeRuntime.runMain
)
