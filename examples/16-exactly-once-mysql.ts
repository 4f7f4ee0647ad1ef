/**
 * Exactly-once with MySQL or MariaDB: the handler writes its results with the application's own `@effect/sql` client,
 * and the partition's new position commits in the same transaction, on condition that the partition's owner epoch is
 * still this member's. A crash rolls back both; a member that lost its partition is refused (`Fenced`) and rejoins.
 * The increment below is not idempotent, and it need not be. The handler needs no API of this library to write: under
 * the transactional policy its `sql` runs in the unit of work's transaction, and a lost connection or a deadlock makes
 * the store run the unit again.
 *
 *   MYSQL_URL=mysql://root@127.0.0.1:3306/test npx tsx examples/16-exactly-once-mysql.ts
 */
import { NodeRuntime } from "@effect/platform-node"
import { MysqlClient } from "@effect/sql-mysql2"
import * as SqlClient from "@effect/sql/SqlClient"
import { CommitPolicy, Consumer, ConsumerRecord, OffsetStore } from "effect-kafka-delivery"
import * as SqlOffsetStore from "effect-kafka-delivery/SqlOffsetStore"
import * as Console from "effect/Console"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Redacted from "effect/Redacted"
import * as Broker from "./broker.js"

const program = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* sql`create table if not exists example_totals
    (group_id varchar(255), customer varchar(255), total bigint, primary key (group_id, customer))`
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
        yield* sql`insert into example_totals values (${groupId}, ${customer}, ${amount})
          on duplicate key update total = total + ${amount}`
      }
      if ((handled += records.length) === 60) yield* Deferred.succeed(allHandled, undefined)
    }))
  yield* consume.pipe(Effect.raceFirst(Deferred.await(allHandled)), Effect.provide(CommitPolicy.transactional()))

  const store = yield* OffsetStore.OffsetStore
  const positions = yield* store.load(groupId, [0, 1, 2].map((partition) => ({ topic, partition })))
  const totals = yield* sql<{ customer: string; total: string | number }>`
    select customer, total from example_totals where group_id = ${groupId} order by customer`
  yield* Console.log(`exactly-once on ${topics.where} and MySQL; positions: ${[...positions.values()].join(", ")}`)
  for (const row of totals) yield* Console.log(`  ${row.customer}: ${row.total}`)
}).pipe(Effect.provide(SqlOffsetStore.layer({ migrate: true })))

program.pipe(
  Effect.provide(
    MysqlClient.layer({ url: Redacted.make(process.env.MYSQL_URL ?? "mysql://root@127.0.0.1:3306/test") })
  ),
  Effect.provide(Broker.layer),
  NodeRuntime.runMain
)
