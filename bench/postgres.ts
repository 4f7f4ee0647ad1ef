/**
 * Benchmark 3: exactly-once on Postgres. Results and the position in one transaction of `PgOffsetStore`, against a
 * plain batched INSERT loop into the same table over the same pool, with no position written.
 */
import * as Effect from "effect/Effect"
import * as ManagedRuntime from "effect/ManagedRuntime"
import postgres from "postgres"
import { OffsetStore } from "../src/OffsetStore.js"
import * as PgOffsetStore from "../src/PgOffsetStore.js"
import * as TopicPartition from "../src/TopicPartition.js"
import { type BenchResult, compare, type Plan, ratioAtLeast, ratioInfo, timed } from "./harness.js"

export interface PostgresSizes {
  /** Records per run for each batch size. */
  readonly recordsPerBatchSize: ReadonlyArray<readonly [batch: number, records: number]>
}

interface Row {
  readonly partition: number
  readonly record_offset: string
  readonly value: Buffer
}

const targets: Readonly<Record<number, number>> = { 100: 0.7, 1000: 0.9 }

/**
 * What `PgOffsetStore.commit` does, written by hand: on a reserved connection, BEGIN sent unawaited so that it travels
 * with the results, then the position fenced by the owner epoch, then COMMIT (three round trips). With
 * `positionFirst`, the position statement is sent unawaited too, ahead of the results (two round trips), which the
 * store does not do: the position's row lock would then be held while the work runs, and a zombie stalled in its work
 * would hold up the new owner.
 */
const handWritten = (
  sql: postgres.Sql,
  table: string,
  insert: (tx: postgres.Sql, rows: ReadonlyArray<Row>) => Promise<unknown>,
  positionFirst: boolean
) =>
async (groupId: string, rows: ReadonlyArray<Row>, epoch: bigint, to: bigint): Promise<void> => {
  const tx = await sql.reserve()
  try {
    // Prepared: `unsafe` with parameters is otherwise described in a round trip of its own every time.
    const storePosition = () =>
      tx.unsafe(
        `update ${table} set next_offset = $2::bigint, updated_at = now()
         where group_id = $1 and topic = 'bench' and partition = 0 and epoch = $3::bigint
         returning txid_current()::text`,
        [groupId, to.toString(), epoch.toString()],
        { prepare: true }
      )
    // postgres.js queries are lazy: `execute` sends them now, pipelined with what follows on the connection.
    const begun = tx.unsafe("begin isolation level read committed").execute()
    const position = positionFirst ? storePosition().execute() : undefined
    await insert(tx, rows)
    await begun
    const count = (await (position ?? storePosition())).count
    if (count !== 1) throw new Error("fenced")
    await tx.unsafe("commit")
  } catch (error) {
    await tx.unsafe("rollback")
    throw error
  } finally {
    tx.release()
  }
}

/** Makes the caller the owner of the bench partition, as `PgOffsetStore.claim` does; returns its owner epoch. */
const claim = async (sql: postgres.Sql, table: string, groupId: string): Promise<bigint> => {
  const rows = await sql.unsafe(
    `insert into ${table} as offsets (group_id, topic, partition, next_offset, epoch) values ($1, 'bench', 0, null, 1)
     on conflict (group_id, topic, partition) do update set epoch = offsets.epoch + 1
     returning epoch::text`,
    [groupId]
  ).values()
  return BigInt(String(rows[0][0]))
}

export const exactlyOnce = async (
  plan: Plan,
  databaseUrl: string,
  sizes: PostgresSizes
): Promise<ReadonlyArray<BenchResult>> => {
  const suffix = `${process.pid}_${Math.floor(Math.random() * 1e9)}`
  const resultsTable = `bench_results_${suffix}`
  const offsetsTable = `bench_offsets_${suffix}`
  const positionsTable = `bench_positions_${suffix}`
  const sql = postgres(databaseUrl, { onnotice: () => {}, max: 4, connect_timeout: 10 })
  const runtime = ManagedRuntime.make(PgOffsetStore.layer({ sql, table: offsetsTable, migrate: true }))
  try {
    await sql.unsafe(
      `create table ${resultsTable} (
        partition integer not null,
        record_offset bigint not null,
        value bytea not null,
        primary key (partition, record_offset)
      )`
    )
    await Effect.runPromise(PgOffsetStore.migrate({ sql, table: positionsTable }))
    const store = await runtime.runPromise(OffsetStore)
    const value = Buffer.alloc(256, 0x61)
    const insert = (tx: postgres.ISql, rows: ReadonlyArray<Row>): Promise<unknown> =>
      tx`insert into ${tx(resultsTable)} ${tx(rows as Array<Row>, "partition", "record_offset", "value")}`
    const out: Array<BenchResult> = []
    for (const [batch, records] of sizes.recordsPerBatchSize) {
      out.push(
        await timed(async () => {
          plan.log(`3. exactly-once on Postgres, batches of ${batch}, ${records.toLocaleString("en-US")} records`)
          const batches: Array<ReadonlyArray<Row>> = []
          for (let start = 0; start < records; start += batch) {
            const rows: Array<Row> = []
            for (let o = start; o < Math.min(records, start + batch); o++) {
              rows.push({ partition: 0, record_offset: String(o), value })
            }
            batches.push(rows)
          }
          const fresh = () => sql.unsafe(`truncate ${resultsTable}`)
          const rate = (started: number) => ({
            value: records / ((performance.now() - started) / 1000),
            details: { "ms per batch": (performance.now() - started) / batches.length }
          })
          let group = 0
          // The hand-written unit, with the position statement after the rows (b) or sent first, with BEGIN (p).
          const handWrittenVariant = (id: string, label: string, positionFirst: boolean) => ({
            id,
            label,
            run: async () => {
              await fresh()
              const groupId = `bench-${suffix}-${batch}-${++group}`
              const commit = handWritten(sql, positionsTable, insert, positionFirst)
              const epoch = await claim(sql, positionsTable, groupId)
              const started = performance.now()
              let next = 0n
              for (const rows of batches) {
                next += BigInt(rows.length)
                await commit(groupId, rows, epoch, next)
              }
              return rate(started)
            }
          })
          const variants = await compare(plan, [
            {
              id: "a",
              label: "plain batched INSERT loop, no position",
              run: async () => {
                await fresh()
                const started = performance.now()
                for (const rows of batches) await insert(sql, rows)
                return rate(started)
              }
            },
            handWrittenVariant("b", "hand-written: BEGIN+INSERT, position, COMMIT", false),
            handWrittenVariant("p", "hand-written: BEGIN+position+INSERT, COMMIT", true),
            {
              id: "tx",
              label: "PgOffsetStore.commit: rows + position in one tx",
              run: async () => {
                await fresh()
                const groupId = `bench-${suffix}-${batch}-${++group}`
                const partition = TopicPartition.make("bench", 0)
                const claims = await runtime.runPromise(store.claim(groupId, [partition]))
                const epoch = claims.get(TopicPartition.key(partition))?.epoch ?? 0n
                const started = performance.now()
                await runtime.runPromise(Effect.gen(function*() {
                  let next = 0n
                  for (const rows of batches) {
                    next += BigInt(rows.length)
                    yield* store.commit(
                      { groupId, partition, epoch, next },
                      PgOffsetStore.query((tx) => insert(tx, rows))
                    )
                  }
                }))
                return rate(started)
              }
            }
          ])
          const target = targets[batch]
          return {
            id: `pg-batch-${batch}`,
            title: `3. Exactly-once on Postgres: ${
              records.toLocaleString("en-US")
            } records of 256 B, batches of ${batch}`,
            unit: "records/s",
            warmup: plan.warmup,
            rounds: plan.rounds,
            variants,
            checks: [
              target === undefined ? ratioInfo(variants, "tx", "a") : ratioAtLeast(variants, "tx", "a", target),
              ratioInfo(variants, "tx", "b"),
              ratioInfo(variants, "b", "a"),
              ratioInfo(variants, "p", "a")
            ],
            notes: [
              "one partition, batches one after another; same postgres.js pool (max 4) and results table for every variant; " +
              "the table is truncated before every run",
              "tx: claim once, then on a reserved connection, BEGIN pipelined with the multi-row INSERT through " +
              "PgOffsetStore.query, the UPDATE of the position fenced by the owner epoch, COMMIT: three round trips; " +
              "a: the same multi-row INSERT in autocommit, one; b: what tx does, written by hand with postgres.js " +
              "(the floor for tx); p: b with the position statement pipelined ahead of the INSERT, two round trips " +
              "(not what the store does: it would hold the position's row lock while the work runs)"
            ]
          }
        })
      )
    }
    return out
  } finally {
    await runtime.dispose()
    await sql.unsafe(`drop table if exists ${resultsTable}`).catch(() => undefined)
    await sql.unsafe(`drop table if exists ${offsetsTable}`).catch(() => undefined)
    await sql.unsafe(`drop table if exists ${positionsTable}`).catch(() => undefined)
    await sql.end({ timeout: 5 })
  }
}
