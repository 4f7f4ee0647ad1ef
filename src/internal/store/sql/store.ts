/**
 * The offset store on the application's own `@effect/sql` client: positions and owner epochs in one table of its
 * database, read and claimed on connections reserved from its pool, and stored by each unit in the transaction the
 * handler writes in (`./unit.ts`).
 */
import * as SqlClient from "@effect/sql/SqlClient"
import type * as SqlConnection from "@effect/sql/SqlConnection"
import type * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import type * as Runtime from "effect/Runtime"
import * as Schedule from "effect/Schedule"
import type { Semaphore } from "effect/Effect"
import { InvalidConfig, type OffsetStoreError } from "../../../KafkaError.js"
import type { Options as SqlOffsetStoreOptions } from "../../../SqlOffsetStore.js"
import type { Claim, CommitUnit, OffsetStore } from "../../../OffsetStore.js"
import * as TopicPartition from "../../../TopicPartition.js"
import { claimOf, inLockOrder, positionsAmong, topicsOf } from "../claims.js"
import { defaultRetry, retrying, type Transient } from "../retry.js"
import {
  asText,
  begin,
  createTable,
  type Dialect,
  DIALECTS,
  type IsolationLevel,
  ISOLATION_LEVELS,
  now,
  partitionColumn,
  quote,
  tableName
} from "./dialect.js"
import * as unit from "./unit.js"

/**
 * The store's options, as `SqlOffsetStore.Options` declares and explains them; imported for their type only.
 *
 * @internal
 */
export type Options = SqlOffsetStoreOptions

/**
 * An open store, as its operations get it.
 *
 * @internal
 */
export interface SqlStore {
  readonly name: string
  readonly client: SqlClient.SqlClient
  readonly dialect: Dialect
  /** The table, quoted (with its schema). */
  readonly table: string
  readonly isolationLevel: IsolationLevel | undefined
  readonly schedule: Schedule.Schedule<unknown, OffsetStoreError>
  /** Per partition: the units of this process take turns from storing their position to COMMIT's answer. */
  readonly tails: (unit: CommitUnit) => Semaphore
  /** Runs the waits for a connection, on fibers of their own (see `unit.reserve`). */
  readonly runtime: Runtime.Runtime<never>
}

const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_]{0,62}$/

const notAnIdentifier = (field: string, value: string) =>
  new InvalidConfig({
    field,
    reason: `${JSON.stringify(value)} is not a plain SQL identifier (letters, digits and _, not starting with a ` +
      "digit, at most 63 characters)"
  })

const checkTable = (options: Options, dialect: Dialect): Effect.Effect<string, InvalidConfig> => {
  const table = options.table ?? "kafka_offsets"
  if (!IDENTIFIER.test(table)) return Effect.fail(notAnIdentifier("table", table))
  if (options.schema !== undefined && !IDENTIFIER.test(options.schema)) {
    return Effect.fail(notAnIdentifier("schema", options.schema))
  }
  return Effect.succeed(tableName(dialect, table, options.schema))
}

const dialectOf = (client: SqlClient.SqlClient): Effect.Effect<Dialect, InvalidConfig> =>
  client.onDialectOrElse({
    mysql: () => Effect.succeed<Dialect>("mysql"),
    pg: () => Effect.succeed<Dialect>("pg"),
    sqlite: () => Effect.succeed<Dialect>("sqlite"),
    orElse: () =>
      Effect.fail(
        new InvalidConfig({
          field: "SqlClient",
          reason: `the client's database is not one the store speaks (${DIALECTS.join(", ")})`
        })
      )
  })

/** Runs `f` on a connection of its own, reserved from the pool, outside any transaction of the caller. */
const onConnection = <A>(
  store: SqlStore,
  operation: string,
  f: (connection: SqlConnection.Connection) => Effect.Effect<A, OffsetStoreError | Transient>
): Effect.Effect<A, OffsetStoreError> =>
  retrying(
    store.name,
    store.schedule,
    operation,
    Effect.scoped(Effect.flatMap(
      unit.reserve(store, operation),
      f
    ))
  )

const load = (
  store: SqlStore,
  groupId: string,
  partitions: ReadonlyArray<TopicPartition.TopicPartition>
): Effect.Effect<ReadonlyMap<string, bigint>, OffsetStoreError> => {
  if (partitions.length === 0) return Effect.succeed(new Map())
  const topics = topicsOf(partitions)
  return onConnection(store, "load", (connection) =>
    unit.run(
      store,
      connection,
      "load",
      `select topic, ${partitionColumn(store.dialect)} as p, ${asText(store.dialect, "next_offset")} as next_offset
       from ${store.table} where group_id = ? and topic in (${topics.map(() => "?").join(", ")})
       and next_offset is not null`,
      [groupId, ...topics]
    )).pipe(
      Effect.map((rows) =>
        positionsAmong(
          partitions,
          rows.map((row) => [String(row.topic), Number(row.p), String(row.next_offset)] as const)
        )
      )
    )
}

// The epoch of each partition goes up by one, in a fixed order so that two claims of overlapping partitions lock
// rows in the same order. The upsert waits for a unit holding a row (one that has stored its position and not yet
// committed) and then updates the newest version, so the position it returns includes that unit if it committed.
// Retrying is safe: a claim whose answer was lost only makes the epoch skip a number.
const claimStatements = (store: SqlStore, count: number) => {
  const p = partitionColumn(store.dialect)
  const values = Array.from({ length: count }, () => `(?, ?, ?, null, 1, ${now(store.dialect)})`).join(", ")
  const columns = `(group_id, topic, ${p}, next_offset, epoch, updated_at)`
  const returned = `topic, ${p} as p, ${asText(store.dialect, "next_offset")} as next_offset, ${
    asText(store.dialect, "epoch")
  } as epoch, finished`
  if (store.dialect === "mysql") {
    return {
      upsert: `insert into ${store.table} ${columns} values ${values}
        on duplicate key update epoch = epoch + 1, updated_at = ${now(store.dialect)}`,
      read: `select ${returned} from ${store.table} where group_id = ? and (topic, ${p}) in (${
        Array.from({ length: count }, () => "(?, ?)").join(", ")
      })`
    }
  }
  return {
    upsert: `insert into ${store.table} as o ${columns} values ${values}
      on conflict (group_id, topic, ${p}) do update set epoch = o.epoch + 1, updated_at = ${now(store.dialect)}
      returning ${returned}`,
    read: undefined
  }
}

const claim = (
  store: SqlStore,
  groupId: string,
  partitions: ReadonlyArray<TopicPartition.TopicPartition>
): Effect.Effect<ReadonlyMap<string, Claim>, OffsetStoreError> => {
  const unique = inLockOrder(partitions)
  if (unique.length === 0) return Effect.succeed(new Map())
  const statements = claimStatements(store, unique.length)
  const upsertParams = unique.flatMap((tp) => [groupId, tp.topic, tp.partition])
  return onConnection(store, "claim", (connection) =>
    statements.read === undefined
      // One statement: atomic on its own.
      ? unit.run(store, connection, "claim", statements.upsert, upsertParams)
      // MySQL has no RETURNING: the upsert and the read of the rows it locked, in one transaction.
      : Effect.gen(function*() {
        for (const statement of begin(store.dialect, undefined)) {
          yield* unit.run(store, connection, "claim", statement, [])
        }
        yield* unit.run(store, connection, "claim", statements.upsert, upsertParams)
        const rows = yield* unit.run(
          store,
          connection,
          "claim",
          statements.read!,
          [groupId, ...unique.flatMap((tp) => [tp.topic, tp.partition])]
        )
        yield* unit.run(store, connection, "claim", "commit", [])
        return rows
      }).pipe(Effect.onError(() => Effect.ignore(unit.run(store, connection, "claim", "rollback", []))))).pipe(
      Effect.map((rows) => {
        const claims = new Map<string, Claim>()
        for (const row of rows) {
          claims.set(
            TopicPartition.key(TopicPartition.make(String(row.topic), Number(row.p))),
            claimOf(
              row.next_offset === null ? null : String(row.next_offset),
              String(row.epoch),
              typeof row.finished === "string" ? row.finished : null
            )
          )
        }
        return claims
      })
    )
}

/**
 * Creates the table if it does not exist, and adds the `unit_id` column to one made by `PgOffsetStore` (or by an
 * earlier version). Safe to run again; two layers migrating at once may both try to add the column, and the one
 * that finds it there already goes on.
 *
 * @internal
 */
export const ensureTable = (store: SqlStore, schema: string | undefined): Effect.Effect<void, OffsetStoreError> =>
  onConnection(store, "migrate", (connection) =>
    Effect.gen(function*() {
      if (schema !== undefined && store.dialect !== "sqlite") {
        yield* unit.run(
          store,
          connection,
          "migrate",
          `create ${store.dialect === "mysql" ? "database" : "schema"} if not exists ${quote(store.dialect, schema)}`,
          []
        )
      }
      yield* unit.run(store, connection, "migrate", createTable(store.dialect, store.table), [])
      const hasUnitId = unit.run(store, connection, "migrate", `select unit_id from ${store.table} where 1 = 0`, [])
      yield* Effect.catchAll(hasUnitId, () =>
        unit.run(
          store,
          connection,
          "migrate",
          `alter table ${store.table} add column unit_id ${store.dialect === "mysql" ? "varchar(64)" : "text"}`,
          []
          // A migration beside this one may have added it first: then it is there, and this one goes on.
        ).pipe(Effect.catchAll((error) => Effect.orElse(hasUnitId, () => Effect.fail(error)))))
    }))

/** @internal */
export const open = (
  options: Options
): Effect.Effect<SqlStore, InvalidConfig, SqlClient.SqlClient> =>
  Effect.gen(function*() {
    const client = yield* SqlClient.SqlClient
    const dialect = yield* dialectOf(client)
    const table = yield* checkTable(options, dialect)
    if (options.isolationLevel !== undefined && !ISOLATION_LEVELS.includes(options.isolationLevel)) {
      return yield* new InvalidConfig({
        field: "isolationLevel",
        reason: `${JSON.stringify(options.isolationLevel)} is not one of ${
          ISOLATION_LEVELS.map((l) => `"${l}"`).join(", ")
        }`
      })
    }
    if (options.isolationLevel !== undefined && dialect === "sqlite") {
      return yield* new InvalidConfig({
        field: "isolationLevel",
        reason: "SQLite's transactions are serializable and take no other level; leave it out"
      })
    }
    const retryFor = Duration.decodeUnknown(options.retryFor ?? "60 seconds")
    if (retryFor._tag === "None") {
      return yield* new InvalidConfig({ field: "retryFor", reason: "is not a duration, such as \"60 seconds\"" })
    }
    const tails = new Map<string, Semaphore>()
    return {
      name: `sql/${dialect}`,
      client,
      dialect,
      table,
      isolationLevel: options.isolationLevel,
      schedule: Schedule.upTo(options.retry ?? defaultRetry, retryFor.value),
      runtime: yield* Effect.runtime<never>(),
      tails: (commitUnit) => {
        const key = `${commitUnit.groupId}\u0000${TopicPartition.key(commitUnit.partition)}`
        let tail = tails.get(key)
        if (tail === undefined) {
          tail = Effect.unsafeMakeSemaphore(1)
          tails.set(key, tail)
        }
        return tail
      }
    }
  })

/** @internal */
export const make = (
  options: Options
): Effect.Effect<Context.Tag.Service<OffsetStore>, InvalidConfig | OffsetStoreError, SqlClient.SqlClient> =>
  Effect.gen(function*() {
    const store = yield* open(options)
    yield* onConnection(store, "connect", (connection) => unit.run(store, connection, "connect", "select 1", []))
    if (options.migrate === true) yield* ensureTable(store, options.schema)
    return {
      name: store.name,
      load: (groupId, partitions) => load(store, groupId, partitions),
      claim: (groupId, partitions) => claim(store, groupId, partitions),
      commit: <A, E, R>(commitUnit: CommitUnit, work: Effect.Effect<A, E, R>) => unit.commit(store, commitUnit, work)
    }
  })
