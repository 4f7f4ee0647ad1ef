/**
 * Exactly-once with Postgres: the handler's writes and the partition's new position commit in one transaction, on
 * condition that the partition's owner epoch is still this member's. A crash rolls back both; a member that lost its
 * partition is refused (`Fenced`) and rejoins. The increment below is not idempotent, and it need not be. Writes go
 * through `PgOffsetStore.query`: a failure is a typed `OffsetStoreError`, and a lost connection makes the store run
 * the unit again.
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test npx tsx examples/05-exactly-once-postgres.ts
 */
import { NodeRuntime } from "@effect/platform-node"
import { CommitPolicy, Consumer, ConsumerRecord, OffsetStore, PgOffsetStore } from "effect-kafka-delivery"
import * as Config from "effect/Config"
import * as Console from "effect/Console"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import postgres from "postgres"
import * as Broker from "./broker.js"

const program = (sql: postgres.Sql) =>
  Effect.gen(function*() {
    yield* Effect.tryPromise(() =>
      sql`create table if not exists example_totals
        (group_id text, customer text, total bigint, primary key (group_id, customer))`
    )
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
          // In the unit of work's own transaction: the position is stored in it too.
          yield* PgOffsetStore.query((tx) =>
            tx`insert into example_totals values (${groupId}, ${customer}, ${amount})
             on conflict (group_id, customer) do update set total = example_totals.total + excluded.total`
          )
        }
        if ((handled += records.length) === 60) yield* Deferred.succeed(allHandled, undefined)
      }))
    yield* consume.pipe(Effect.raceFirst(Deferred.await(allHandled)), Effect.provide(CommitPolicy.transactional()))

    const store = yield* OffsetStore.OffsetStore
    const positions = yield* store.load(groupId, [0, 1, 2].map((partition) => ({ topic, partition })))
    const totals = yield* Effect.tryPromise(() =>
      sql`select customer, total from example_totals where group_id = ${groupId} order by customer`
    )
    yield* Console.log(`exactly-once on ${topics.where} and Postgres; positions: ${[...positions.values()].join(", ")}`)
    for (const row of totals) yield* Console.log(`  ${row.customer}: ${row.total}`)
  }).pipe(Effect.provide(PgOffsetStore.layer({ sql, migrate: true })))

Effect.gen(function*() {
  const url = yield* Config.string("DATABASE_URL").pipe(Config.withDefault("postgres://postgres@127.0.0.1:5432/test"))
  const sql = yield* Effect.acquireRelease(
    Effect.try(() => postgres(url, { onnotice: () => {} })),
    (sql) => Effect.tryPromise(() => sql.end({ timeout: 5 })).pipe(Effect.ignore)
  )
  yield* program(sql)
}).pipe(Effect.scoped, Effect.provide(Broker.layer), NodeRuntime.runMain)
