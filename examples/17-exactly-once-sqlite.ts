/**
 * Exactly-once with an embedded SQLite file: the same consumer as 16-exactly-once-mysql.ts, the handler writing its
 * results with the application's own `@effect/sql` client and the partition's new position committing in the same
 * transaction (`BEGIN IMMEDIATE`), on condition that the partition's owner epoch is still this member's. Nothing to
 * start but the script: the database is a file in a temporary directory, through the `SqlClient` of
 * examples/support/sqlite.ts (node:sqlite, on Node, Deno and Bun; an application would use `@effect/sql-sqlite-node`
 * or `@effect/sql-sqlite-bun`). The platform layer (NodeContext) is chosen here, at the edge.
 *
 *   npx tsx examples/17-exactly-once-sqlite.ts
 */
import { NodeContext, NodeRuntime } from "@effect/platform-node"
import * as FileSystem from "@effect/platform/FileSystem"
import * as SqlClient from "@effect/sql/SqlClient"
import { CommitPolicy, Consumer, ConsumerRecord, OffsetStore } from "effect-kafka-delivery"
import * as SqlOffsetStore from "effect-kafka-delivery/SqlOffsetStore"
import * as Console from "effect/Console"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Broker from "./broker.js"
import * as Sqlite from "./support/sqlite.js"

const program = (filename: string) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    yield* sql`create table if not exists example_totals
      (group_id text, customer text, total integer, primary key (group_id, customer))`
    const topics = yield* Broker.Topics
    const topic = Broker.unique("orders")
    const groupId = Broker.unique("order-totals")
    yield* topics.create(topic, 3)
    yield* topics.produce(topic, Array.from({ length: 60 }, (_, i) => ({ key: `customer-${i % 4}`, value: String(i) })))

    let handled = 0
    const allHandled = yield* Deferred.make<void>()
    const consume = Consumer.run({ groupId, topics: [topic] }, (records) =>
      Effect.gen(function*() {
        for (const record of records) {
          const [customer, amount] = [ConsumerRecord.keyString(record), ConsumerRecord.valueString(record)]
          // The application's own `sql`, in the unit of work's transaction: the position is stored in it too.
          yield* sql`insert into example_totals values (${groupId}, ${customer}, ${Number(amount)})
            on conflict (group_id, customer) do update set total = example_totals.total + excluded.total`
        }
        if ((handled += records.length) === 60) yield* Deferred.succeed(allHandled, undefined)
      }))
    yield* consume.pipe(Effect.raceFirst(Deferred.await(allHandled)), Effect.provide(CommitPolicy.transactional()))

    const store = yield* OffsetStore.OffsetStore
    const positions = yield* store.load(groupId, [0, 1, 2].map((partition) => ({ topic, partition })))
    const totals = yield* sql<{ customer: string; total: number }>`
      select customer, total from example_totals where group_id = ${groupId} order by customer`
    yield* Console.log(`exactly-once on ${topics.where} and SQLite; positions: ${[...positions.values()].join(", ")}`)
    for (const row of totals) yield* Console.log(`  ${row.customer}: ${row.total}`)
  }).pipe(
    Effect.provide(SqlOffsetStore.layer({ migrate: true }).pipe(Layer.provideMerge(Sqlite.layer({ filename }))))
  )

Effect.gen(function*() {
  const fs = yield* FileSystem.FileSystem
  const directory = yield* fs.makeTempDirectoryScoped({ prefix: "offsets-" })
  yield* program(`${directory}/orders.db`)
}).pipe(Effect.scoped, Effect.provide(Broker.layer), Effect.provide(NodeContext.layer), NodeRuntime.runMain)
