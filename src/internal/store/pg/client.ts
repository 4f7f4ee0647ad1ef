/**
 * The Postgres store's client: its options checked, the connection made, the table created or upgraded, and failures
 * that pass retried.
 */
import * as Effect from "effect/Effect"
import * as Redacted from "effect/Redacted"
import type * as Schedule from "effect/Schedule"
import type * as Scope from "effect/Scope"
import postgres from "postgres"
import { InvalidConfig, OffsetStoreError } from "../../../KafkaError.js"
import { retrying as retryingOn } from "../retry.js"
import { describe, isTransient, STORE, toStoreError, Transient } from "./errors.js"
import { decodeColumns, quote } from "./sql.js"
import type { IsolationLevel as PgIsolationLevel, Options as PgOffsetStoreOptions } from "../../../PgOffsetStore.js"

const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_]{0,62}$/

/** The isolation level of a unit's transaction, as `PgOffsetStore.IsolationLevel` declares it. @internal */
export type IsolationLevel = PgIsolationLevel

/** @internal */
export const ISOLATION_LEVELS: ReadonlyArray<IsolationLevel> = ["read committed", "repeatable read", "serializable"]

/**
 * The store's options, as `PgOffsetStore.Options` declares and explains them; imported for their type only, so that
 * nothing of the public module is loaded from here.
 *
 * @internal
 */
export type Options = PgOffsetStoreOptions

/** @internal */
export { defaultRetry } from "../retry.js"

/** A client of the store, the table it keeps positions in, and where the server is (for messages). @internal */
export interface Client {
  readonly sql: postgres.Sql
  readonly table: string
  readonly target: string
}

const notAnIdentifier = (field: string, value: string) =>
  new InvalidConfig({
    field,
    reason: `${JSON.stringify(value)} is not a plain SQL identifier (letters, digits and _, not starting with a ` +
      "digit, at most 63 characters)"
  })

const validateIdentifiers = (options: Options) =>
  Effect.gen(function*() {
    const table = options.table ?? "kafka_offsets"
    if (!IDENTIFIER.test(table)) return yield* notAnIdentifier("table", table)
    if (options.schema !== undefined && !IDENTIFIER.test(options.schema)) {
      return yield* notAnIdentifier("schema", options.schema)
    }
    return options.schema === undefined ? quote(table) : `${quote(options.schema)}.${quote(table)}`
  })

const targetOf = (sql: postgres.Sql): string => {
  const { database, host, port } = sql.options
  return `${host.map((h, i) => `${h}:${port[i] ?? port[0] ?? 5432}`).join(",")}/${database}`
}

/** @internal */
export const connect = (options: Options): Effect.Effect<Client, InvalidConfig | OffsetStoreError, Scope.Scope> =>
  Effect.gen(function*() {
    const table = yield* validateIdentifiers(options)
    if (options.sql !== undefined) {
      return { sql: options.sql, table, target: targetOf(options.sql) }
    }
    if (options.url === undefined) {
      return yield* new InvalidConfig({
        field: "url",
        reason: "give a connection URL (or a postgres client as sql); PgOffsetStore.layerConfig reads DATABASE_URL"
      })
    }
    const url = Redacted.isRedacted(options.url) ? Redacted.value(options.url) : options.url
    if (url.trim() === "") {
      return yield* new InvalidConfig({ field: "url", reason: "the connection URL is empty" })
    }
    const sql = yield* Effect.acquireRelease(
      Effect.try({
        try: () => postgres(url, { onnotice: () => {}, connect_timeout: 10 }),
        catch: (cause) =>
          new InvalidConfig({ field: "url", reason: `not a Postgres connection URL: ${describe(cause)}` })
      }),
      (sql) => Effect.tryPromise(() => sql.end({ timeout: 5 })).pipe(Effect.ignore, Effect.timeoutOption("10 seconds"))
    )
    return { sql, table, target: targetOf(sql) }
  })

/**
 * Creates the table, or brings one of an earlier version up to date: `epoch` was added, `next_offset` became
 * nullable (a partition claimed before anything was stored), and `finished` was added (the ranges above the position
 * that units of records finished out of order committed; null when none). Columns are altered only when they need it, so that a
 * layer starting against an up-to-date table takes no exclusive lock on it.
 *
 * @internal
 */
export const ensureTable = (client: Client, schema: string | undefined): Effect.Effect<void, OffsetStoreError> =>
  Effect.tryPromise({
    try: () =>
      client.sql.begin(async (tx) => {
        // Serializes concurrent migrations: `create ... if not exists` alone can race on the catalog.
        await tx.unsafe("select pg_advisory_xact_lock(hashtext($1))", [client.table])
        if (schema !== undefined) await tx.unsafe(`create schema if not exists ${quote(schema)}`)
        await tx.unsafe(
          `create table if not exists ${client.table} (
            group_id text not null,
            topic text not null,
            partition integer not null,
            next_offset bigint,
            epoch bigint not null default 0,
            finished text,
            updated_at timestamptz not null default now(),
            primary key (group_id, topic, partition)
          )`
        )
        const columns = decodeColumns(
          await tx.unsafe(
            `select attname::text, attnotnull from pg_attribute
             where attrelid = $1::regclass and attnum > 0 and not attisdropped`,
            [client.table]
          ).values()
        )
        if (!columns.some(([name]) => name === "epoch")) {
          await tx.unsafe(`alter table ${client.table} add column epoch bigint not null default 0`)
        }
        if (!columns.some(([name]) => name === "finished")) {
          await tx.unsafe(`alter table ${client.table} add column finished text`)
        }
        if (columns.some(([name, notNull]) => name === "next_offset" && notNull)) {
          await tx.unsafe(`alter table ${client.table} alter column next_offset drop not null`)
        }
      }),
    catch: toStoreError("migrate", client.target)
  }).pipe(Effect.asVoid)

/**
 * An open Postgres store, as its operations get it: the client (with its table), the isolation level of a unit's
 * transaction, and the schedule that failures that pass are retried on.
 *
 * @internal
 */
export interface Pg {
  readonly client: Client
  readonly isolationLevel: IsolationLevel
  readonly schedule: Schedule.Schedule<unknown, OffsetStoreError>
}

/** A failure that passes is retried on the store's schedule (see `../retry.ts`). @internal */
export const retrying = <A, E, R>(
  pg: Pg,
  operation: string,
  effect: Effect.Effect<A, E | Transient, R>
): Effect.Effect<A, E | OffsetStoreError, R> => retryingOn(STORE, pg.schedule, operation, effect)

/** A failure of a statement on the pool: retried when it passes. @internal */
export const onPool = (pg: Pg, operation: string) => (cause: unknown): OffsetStoreError | Transient => {
  const error = toStoreError(operation, pg.client.target)(cause)
  return isTransient(cause) ? new Transient({ error }) : error
}
