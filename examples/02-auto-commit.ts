/**
 * Auto commit on an interval, as kafka-clients' `enable.auto.commit=true` does: every `interval`, inside the poll loop,
 * the positions of all records fetched so far are committed, whether the handler has finished them or not.
 *
 * What that really guarantees: nothing. It is not at-most-once (a crash after handling, before the next tick, hands
 * the records to the next owner again) and not at-least-once (records fetched ahead of a slow handler are committed
 * before they are handled; a crash then loses them). `npm run demo` measures both. Use it where neither matters.
 *
 *   npx tsx examples/02-auto-commit.ts
 */
import { NodeRuntime } from "@effect/platform-node"
import { CommitPolicy, Consumer, ConsumerRecord } from "effect-kafka-delivery"
import * as Console from "effect/Console"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Broker from "./broker.js"

const program = Effect.gen(function*() {
  const topics = yield* Broker.Topics
  const topic = Broker.unique("page-views")
  yield* topics.create(topic, 3)
  yield* topics.produce(topic, Array.from({ length: 30 }, (_, i) => ({ value: `/page/${i % 7}` })))

  const views = new Map<string, number>()
  let handled = 0
  const allHandled = yield* Deferred.make<void>()
  yield* Consumer.run(
    { groupId: Broker.unique("page-view-counter"), topics: [topic] },
    (records) =>
      Effect.gen(function*() {
        for (const record of records) {
          const page = ConsumerRecord.valueString(record) ?? ""
          views.set(page, (views.get(page) ?? 0) + 1)
        }
        handled += records.length
        if (handled === 30) yield* Deferred.succeed(allHandled, undefined)
      })
  ).pipe(
    Effect.raceFirst(Deferred.await(allHandled)),
    // Leaving the group commits what was fetched, as kafka-clients does on close.
    Effect.provide(CommitPolicy.autoCommit({ interval: "5 seconds" }))
  )
  yield* Console.log(`auto commit on ${topics.where}: ${handled} page views counted`)
  for (const [page, n] of [...views].sort()) yield* Console.log(`  ${page}: ${n}`)
})

program.pipe(Effect.provide(Broker.layer), NodeRuntime.runMain)
