/**
 * The results table of a cluster run: one row per record a handler finished, with how many times it did.
 */
import type postgres from "postgres"

const quote = (identifier: string) => `"${identifier}"`

export const createResultsTable = (sql: postgres.Sql, table: string) =>
  sql.unsafe(
    `create table if not exists ${quote(table)} (
      topic text not null,
      partition integer not null,
      "offset" bigint not null,
      count integer not null,
      primary key (topic, partition, "offset")
    )`
  )

/**
 * Counts one handling of each record; a record handled again adds one to its row. `sql` is a pool, or under
 * `transactional` the offset store's open transaction.
 */
export const recordHandled = (
  sql: postgres.ISql,
  table: string,
  topic: string,
  partition: number,
  offsets: ReadonlyArray<bigint>
) =>
  sql.unsafe(
    `insert into ${quote(table)} as t (topic, partition, "offset", count)
     select $1, $2::int, o, 1 from unnest($3::bigint[]) as o
     on conflict (topic, partition, "offset") do update set count = t.count + 1`,
    [topic, partition, offsets.map(String)]
  )

/** Records handled at least once, all partitions together: how far the run has got. */
export const handledCount = async (sql: postgres.Sql, table: string, topic: string): Promise<number> => {
  const rows = await sql.unsafe(`select count(*)::int as n from ${quote(table)} where topic = $1`, [topic])
  return Number(rows[0]?.n ?? 0)
}

export interface PartitionTally {
  readonly partition: number
  /** Records of the partition handled at least once. */
  readonly handled: number
  /** Handlings in all, counting repeats. */
  readonly deliveries: number
}

export const tallyByPartition = async (
  sql: postgres.Sql,
  table: string,
  topic: string
): Promise<ReadonlyArray<PartitionTally>> => {
  const rows = await sql.unsafe(
    `select partition, count(*)::int as handled, sum(count)::bigint::text as deliveries
     from ${quote(table)} where topic = $1 group by partition`,
    [topic]
  )
  return rows.map((row) => ({
    partition: Number(row.partition),
    handled: Number(row.handled),
    deliveries: Number(row.deliveries)
  }))
}

export const dropTable = (sql: postgres.Sql, table: string) => sql.unsafe(`drop table if exists ${quote(table)}`)

/** How many of these records (`<partition>@<offset>`) the handlers finished at least once. */
export const handledAmong = async (
  sql: postgres.Sql,
  table: string,
  topic: string,
  keys: ReadonlyArray<string>
): Promise<number> => {
  if (keys.length === 0) return 0
  const rows = await sql.unsafe(
    `select count(*)::int as n from ${quote(table)} t
     join unnest($2::int[], $3::bigint[]) as k(partition, "offset")
       on t.partition = k.partition and t."offset" = k."offset"
     where t.topic = $1`,
    [topic, keys.map((k) => k.slice(0, k.indexOf("@"))), keys.map((k) => k.slice(k.indexOf("@") + 1))]
  )
  return Number(rows[0]?.n ?? 0)
}
