/**
 * The results table of a cluster run: one row per record a handler finished, with how many times it did. It lives in
 * Postgres, or, for a `transactional` run whose positions are kept in MariaDB (`SqlOffsetStore`), in MariaDB beside
 * them; the supervisor reads either through `RunTables`.
 */
import { MysqlClient } from "@effect/sql-mysql2"
import * as SqlClient from "@effect/sql/SqlClient"
import * as Context from "effect/Context"
import * as Data from "effect/Data"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Redacted from "effect/Redacted"
import type * as Scope from "effect/Scope"
import postgres from "postgres"
import * as PgOffsetStore from "../../src/PgOffsetStore.js"
import * as SqlOffsetStore from "../../src/SqlOffsetStore.js"

// ---------------------------------------------------------------------------------------------------------------------
// Postgres
// ---------------------------------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------------------------------
// MariaDB
// ---------------------------------------------------------------------------------------------------------------------

const quoteMysql = (identifier: string) => `\`${identifier}\``

/**
 * The same count in MariaDB (or MySQL), with the application's `SqlClient`: under `transactional` the handler's own
 * `sql`, whose statements the offset store runs in the unit's transaction.
 */
export const recordHandledSql = (
  table: string,
  topic: string,
  partition: number,
  offsets: ReadonlyArray<bigint>
) =>
  Effect.gen(function*() {
    if (offsets.length === 0) return
    const sql = yield* SqlClient.SqlClient
    const rows = offsets.map((offset) => ({ topic, partition, offset: offset.toString(), count: 1 }))
    yield* sql`insert into ${sql(table)} ${sql.insert(rows)} on duplicate key update count = count + 1`
  })

/** A MariaDB client for a member or the supervisor, `maxConnections` at most. */
export const mysqlClient = (url: string, maxConnections: number) =>
  MysqlClient.layer({ url: Redacted.make(url), maxConnections })

// ---------------------------------------------------------------------------------------------------------------------
// a run's tables, wherever they are
// ---------------------------------------------------------------------------------------------------------------------

export class ResultsFailed extends Data.TaggedError("ResultsFailed")<{ readonly cause: unknown }> {
  override get message() {
    return this.cause instanceof Error ? this.cause.message : String(this.cause)
  }
}

/** A run's tables as the supervisor reads them: the results, and under `transactional` the stored positions. */
export interface RunTables {
  /** Records handled at least once, all partitions together: how far the run has got. */
  readonly handledCount: (topic: string) => Effect.Effect<number, ResultsFailed>
  readonly tallyByPartition: (topic: string) => Effect.Effect<ReadonlyArray<PartitionTally>, ResultsFailed>
  /** How many of these records (`<partition>@<offset>`) the handlers finished at least once. */
  readonly handledAmong: (topic: string, keys: ReadonlyArray<string>) => Effect.Effect<number, ResultsFailed>
  /** The positions `transactional` members stored for the group, by partition. */
  readonly storedPositions: (
    groupId: string,
    topic: string
  ) => Effect.Effect<ReadonlyMap<number, bigint>, ResultsFailed>
}

export interface RunTablesOptions {
  readonly url: string
  readonly resultsTable: string
  /** The offsets table of a `transactional` run. */
  readonly offsetsTable: string
  /** Create the offsets table too, as its store does. */
  readonly transactional: boolean
}

const attempt = <A>(f: () => Promise<A>) =>
  Effect.tryPromise({ try: f, catch: (cause) => new ResultsFailed({ cause }) })

/**
 * The tables in Postgres, created for the run and dropped at the end of the scope. The offsets table is
 * `PgOffsetStore`'s.
 */
export const postgresTables = (options: RunTablesOptions): Effect.Effect<RunTables, ResultsFailed, Scope.Scope> =>
  Effect.gen(function*() {
    const { offsetsTable, resultsTable } = options
    const sql = yield* Effect.acquireRelease(
      Effect.sync(() => postgres(options.url, { max: 2, onnotice: () => {} })),
      (sql) => Effect.tryPromise(() => sql.end({ timeout: 5 })).pipe(Effect.timeoutOption("10 seconds"), Effect.ignore)
    )
    yield* Effect.acquireRelease(
      attempt(() => createResultsTable(sql, resultsTable)),
      () =>
        attempt(async () => {
          await dropTable(sql, resultsTable)
          await dropTable(sql, offsetsTable)
        }).pipe(Effect.timeoutOption("10 seconds"), Effect.ignore)
    )
    if (options.transactional) {
      yield* Effect.mapError(
        PgOffsetStore.migrate({ url: options.url, table: offsetsTable }),
        (cause) => new ResultsFailed({ cause })
      )
    }
    return {
      handledCount: (topic) => attempt(() => handledCount(sql, resultsTable, topic)),
      tallyByPartition: (topic) => attempt(() => tallyByPartition(sql, resultsTable, topic)),
      handledAmong: (topic, keys) => attempt(() => handledAmong(sql, resultsTable, topic, keys)),
      storedPositions: (groupId, topic) =>
        attempt(async () => {
          const rows = await sql.unsafe(
            `select partition, next_offset::text as next from ${quote(offsetsTable)}
             where group_id = $1 and topic = $2 and next_offset is not null`,
            [groupId, topic]
          )
          return new Map(rows.map((row) => [Number(row.partition), BigInt(row.next)] as const))
        })
    } satisfies RunTables
  })

/**
 * The tables in MariaDB, created for the run and dropped at the end of the scope. The offsets table is
 * `SqlOffsetStore`'s.
 */
export const mariadbTables = (options: RunTablesOptions): Effect.Effect<RunTables, ResultsFailed, Scope.Scope> =>
  Effect.gen(function*() {
    const { offsetsTable, resultsTable } = options
    const context = yield* Effect.mapError(
      Layer.build(mysqlClient(options.url, 2)),
      (cause) => new ResultsFailed({ cause })
    )
    const sql = Context.get(context, SqlClient.SqlClient)
    const query = <A>(effect: Effect.Effect<A, unknown, SqlClient.SqlClient>) =>
      effect.pipe(
        Effect.provideService(SqlClient.SqlClient, sql),
        Effect.mapError((cause) => new ResultsFailed({ cause }))
      )
    const p = quoteMysql("partition")
    const o = quoteMysql("offset")
    const results = quoteMysql(resultsTable)
    yield* Effect.acquireRelease(
      query(sql.unsafe(
        `create table if not exists ${results} (
          topic varchar(255) not null,
          ${p} integer not null,
          ${o} bigint not null,
          count integer not null,
          primary key (topic, ${p}, ${o})
        ) engine = InnoDB`
      )),
      () =>
        query(Effect.zipRight(
          sql.unsafe(`drop table if exists ${results}`),
          sql.unsafe(`drop table if exists ${quoteMysql(offsetsTable)}`)
        )).pipe(Effect.timeoutOption("10 seconds"), Effect.ignore)
    )
    if (options.transactional) yield* query(SqlOffsetStore.migrate({ table: offsetsTable }))
    const count = (rows: ReadonlyArray<{ readonly n: number }>) => Number(rows[0]?.n ?? 0)
    return {
      handledCount: (topic) =>
        Effect.map(
          query(sql.unsafe<{ readonly n: number }>(`select count(*) as n from ${results} where topic = ?`, [topic])),
          count
        ),
      tallyByPartition: (topic) =>
        query(sql.unsafe<{ readonly p: number; readonly handled: number; readonly deliveries: string }>(
          `select ${p} as p, count(*) as handled, cast(sum(count) as char) as deliveries
           from ${results} where topic = ? group by ${p}`,
          [topic]
        )).pipe(Effect.map((rows) =>
          rows.map((row) => ({
            partition: Number(row.p),
            handled: Number(row.handled),
            deliveries: Number(row.deliveries)
          }))
        )),
      handledAmong: (topic, keys) =>
        keys.length === 0 ? Effect.succeed(0) : query(sql.unsafe<{ readonly n: number }>(
          `select count(*) as n from ${results} where topic = ? and (${p}, ${o}) in (${
            keys.map(() => "(?, ?)").join(", ")
          })`,
          [topic, ...keys.flatMap((k) => [Number(k.slice(0, k.indexOf("@"))), k.slice(k.indexOf("@") + 1)])]
        )).pipe(Effect.map(count)),
      storedPositions: (groupId, topic) =>
        query(sql.unsafe<{ readonly p: number; readonly next: string }>(
          `select ${p} as p, cast(next_offset as char) as next from ${quoteMysql(offsetsTable)}
           where group_id = ? and topic = ? and next_offset is not null`,
          [groupId, topic]
        )).pipe(Effect.map((rows) => new Map(rows.map((row) => [Number(row.p), BigInt(row.next)] as const))))
    } satisfies RunTables
  })
