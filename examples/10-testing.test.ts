/**
 * Testing your own consumer: the in-memory broker as a layer, and the TestClock for the intervals. Nothing sleeps;
 * time moves only when the test says so, and a crash is injected where the test wants it.
 *
 *   npx vitest run examples/10-testing.test.ts
 */
import { assert, describe, it } from "@effect/vitest"
import { CommitPolicy, Consumer, ConsumerRecord, InMemoryKafka } from "effect-kafka-delivery"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as TestClock from "effect/TestClock"

// The consumer under test: it counts orders per customer and commits at least every 5 seconds.
const countOrders = (counts: Map<string, number>) =>
  Consumer.run({ groupId: "order-counter", topics: ["orders"] }, (records) =>
    Effect.sync(() => {
      for (const record of records) {
        const customer = ConsumerRecord.keyString(record) ?? ""
        counts.set(customer, (counts.get(customer) ?? 0) + 1)
      }
    }))

const policy = CommitPolicy.commitAfter({ maxBatch: 1_000, maxInterval: "5 seconds" })
const orders = ["ann", "bob", "ann", "cy", "bob", "ann"].map((key, i) => ({ key, value: `order-${i}` }))
const total = (counts: Map<string, number>) => [...counts.values()].reduce((a, b) => a + b, 0)

// Lets the consumer's fibers run until `condition` holds; the clock does not move meanwhile.
const eventually = <E, R>(condition: Effect.Effect<boolean, E, R>) =>
  Effect.gen(function*() {
    for (let turn = 0; turn < 10_000; turn++) {
      if (yield* condition) return
      yield* Effect.yieldNow()
    }
    assert.fail("the condition never held")
  })

const committed = Effect.map(
  InMemoryKafka.committed("order-counter"),
  (batch) => [...batch.positions.values()].reduce((a, b) => a + b, 0n)
)

describe("the order counter", () => {
  it.scoped("counts every order, and commits once the interval has passed", () =>
    Effect.gen(function*() {
      yield* InMemoryKafka.createTopic("orders", 2)
      yield* InMemoryKafka.produce("orders", orders)
      const counts = new Map<string, number>()
      yield* Effect.forkScoped(Effect.provide(countOrders(counts), policy))
      yield* eventually(Effect.sync(() => total(counts) === 6))
      assert.deepStrictEqual(Object.fromEntries(counts), { ann: 3, bob: 2, cy: 1 })
      assert.strictEqual(yield* committed, 0n)

      yield* TestClock.adjust("5 seconds")
      yield* eventually(Effect.map(committed, (n) => n === 6n))
    }).pipe(Effect.provide(InMemoryKafka.layer())))

  it.scoped("after a crash between handling and committing, the next member counts those orders again", () =>
    Effect.gen(function*() {
      yield* InMemoryKafka.createTopic("orders", 1)
      yield* InMemoryKafka.produce("orders", orders)
      const counts = new Map<string, number>()
      const crashBeforeCommit = InMemoryKafka.layerFaults((point) => point === "beforeCommit")
      const first = yield* Effect.fork(Effect.provide(countOrders(counts), Layer.merge(policy, crashBeforeCommit)))
      yield* eventually(Effect.sync(() => total(counts) === 6))
      yield* TestClock.adjust("5 seconds")
      assert.isTrue(Exit.isFailure(yield* Fiber.await(first)), "the first member crashed")
      assert.strictEqual(yield* committed, 0n)

      yield* Effect.forkScoped(Effect.provide(countOrders(counts), policy))
      yield* eventually(Effect.sync(() => total(counts) === 12))
      assert.deepStrictEqual(Object.fromEntries(counts), { ann: 6, bob: 4, cy: 2 })
    }).pipe(Effect.provide(InMemoryKafka.layer())))
})
