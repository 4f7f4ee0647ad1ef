/**
 * Per-key concurrency: the events of one account must be applied in order, but different accounts need not wait for
 * each other. With `ordering: "key"` the records of a key are handled one after another, in offset order, and
 * records of other keys side by side, up to `concurrency` handler calls in flight for the consumer; a slow account
 * holds back its own events only. Under `commitAfter`, the committed position of a partition never passes a record
 * still in flight, and the records finished beyond it travel with the commit, so that after a crash only the records
 * that were in flight are handled again.
 *
 *   npx tsx examples/13-per-key.ts
 */
import { NodeRuntime } from "@effect/platform-node"
import { CommitPolicy, Consumer, ConsumerRecord } from "effect-kafka-delivery"
import * as Console from "effect/Console"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Broker from "./broker.js"

const accounts = 40
const eventsPerAccount = 10

const program = Effect.gen(function*() {
  const topics = yield* Broker.Topics
  const topic = Broker.unique("account-events")
  yield* topics.create(topic, 2)
  // Event n of an account carries its sequence number; an account's events all go to its key's partition.
  yield* topics.produce(
    topic,
    Array.from({ length: accounts * eventsPerAccount }, (_, i) => ({
      key: `account-${i % accounts}`,
      value: String(Math.floor(i / accounts))
    }))
  )

  const applied = new Map<string, Array<number>>()
  let inFlight = 0
  let most = 0
  const done = yield* Deferred.make<void>()
  yield* Consumer.runEach(
    { groupId: Broker.unique("balances"), topics: [topic], ordering: "key", concurrency: 50 },
    (record) =>
      Effect.gen(function*() {
        inFlight++
        most = Math.max(most, inFlight)
        // A call to the ledger service: 5 ms of waiting per event.
        yield* Effect.sleep("5 millis")
        const account = ConsumerRecord.keyString(record) ?? ""
        const seen = applied.get(account) ?? []
        seen.push(Number(ConsumerRecord.valueString(record)))
        applied.set(account, seen)
        inFlight--
        if (seen.length === eventsPerAccount && applied.size === accounts) {
          const all = [...applied.values()].every((s) => s.length === eventsPerAccount)
          if (all) yield* Deferred.succeed(done, undefined)
        }
      })
  ).pipe(
    Effect.raceFirst(Deferred.await(done)),
    Effect.provide(CommitPolicy.commitAfter({ maxBatch: 100, maxInterval: "200 millis" }))
  )
  const inOrder = [...applied.values()].every((s) => s.every((n, i) => n === i))
  yield* Console.log(
    `per key on ${topics.where}: ${accounts * eventsPerAccount} events of ${applied.size} accounts, ` +
      `${inOrder ? "each account's in order" : "SOME OUT OF ORDER"}; ${most} calls in flight at most (bound 50)`
  )
})

program.pipe(Effect.provide(Broker.layer), NodeRuntime.runMain)
