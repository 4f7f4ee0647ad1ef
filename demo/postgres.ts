/**
 * `transactional` with the Postgres offset store: the handler writes one row per record into `lab_results` with the
 * store's own transaction (`PgOffsetStore.sql`), and the position lands in `lab_offsets` in that same transaction.
 * The results table has no unique key on purpose: exactly-once must not lean on idempotent writes.
 */
import * as Chunk from "effect/Chunk"
import * as Data from "effect/Data"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import postgres from "postgres"
import * as InMemoryKafka from "../src/InMemoryKafka.js"
import * as PgOffsetStore from "../src/PgOffsetStore.js"
import { type Outcome, recordKey, type ResultSink, runWorkload, transactionalPlan, type Workload } from "./lab.js"

const RESULTS = "lab_results"
const OFFSETS = "lab_offsets"

class ResultsError extends Data.TaggedError("ResultsError")<{ readonly message: string }> {}

const describe = (cause: unknown) => cause instanceof Error ? cause.message : String(cause)

// The lab names a run's group after its topic; results carry the group, so several runs share one table.
const sink = (sql: postgres.Sql): ResultSink<never> => ({
  write: (records) =>
    Effect.flatMap(PgOffsetStore.sql, (tx) =>
      Effect.tryPromise({
        try: () =>
          tx`insert into ${tx(RESULTS)} ${
            tx(Chunk.toReadonlyArray(Chunk.map(records, (r) => ({
              group_id: `${r.topic}-group`,
              record: recordKey(r)
            }))))
          }`,
        catch: (cause) => new ResultsError({ message: `cannot write results: ${describe(cause)}` })
      })),
  read: (groupId) =>
    Effect.tryPromise({
      try: () => sql`select record from ${sql(RESULTS)} where group_id = ${groupId}`,
      catch: (cause) => new ResultsError({ message: `cannot read results: ${describe(cause)}` })
    }).pipe(Effect.map((rows) => rows.map((row) => String(row.record))))
})

const client = (url: string) =>
  Effect.acquireRelease(
    Effect.try({
      try: () => postgres(url, { onnotice: () => {}, max: 8, connect_timeout: 10 }),
      catch: (cause) => new ResultsError({ message: `--database-url is not a Postgres URL: ${describe(cause)}` })
    }),
    (sql) => Effect.tryPromise(() => sql.end({ timeout: 5 })).pipe(Effect.ignore, Effect.timeoutOption("10 seconds"))
  )

/** Runs the `transactional` workload with positions and results in Postgres. */
export const runTransactional = (workload: Workload, url: string): Effect.Effect<Outcome, unknown> =>
  Effect.scoped(Effect.gen(function*() {
    const sql = yield* client(url)
    const store = PgOffsetStore.layer({ sql, table: OFFSETS, migrate: true })
    // The store's layer checks the connection and creates its table first, with a message that says what to do.
    return yield* Effect.gen(function*() {
      yield* Effect.tryPromise({
        try: () => sql`create table if not exists ${sql(RESULTS)} (group_id text not null, record text not null)`,
        catch: (cause) => new ResultsError({ message: `cannot create ${RESULTS}: ${describe(cause)}` })
      })
      return yield* runWorkload(workload, transactionalPlan(sink(sql)))
    }).pipe(Effect.provide(Layer.merge(InMemoryKafka.layer(), store)))
  }))
