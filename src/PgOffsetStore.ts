/**
 * The offset store in Postgres, on `postgres` (porsager). Positions live in one table; the handler writes its results
 * with the transaction from {@link sql}, and the position is stored in that same transaction, on the condition that it
 * is still the one the batch started from.
 *
 * @since 0.1.0
 */
import * as Config from "effect/Config"
import * as EffectConfigError from "effect/ConfigError"
import type * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Layer from "effect/Layer"
import * as Redacted from "effect/Redacted"
import * as Schema from "effect/Schema"
import type * as Scope from "effect/Scope"
import postgres from "postgres"
import { ConfigError } from "./KafkaError.js"
import type { CommitUnit } from "./OffsetStore.js"
import { Fenced, OffsetStore, OffsetStoreError, Transaction } from "./OffsetStore.js"
import * as TopicPartition from "./TopicPartition.js"

const STORE = "postgres"
const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_]{0,62}$/

/**
 * Where the positions are kept. Give either `url` or a `postgres` client as `sql` (which the store then uses but does
 * not close).
 *
 * @since 0.1.0
 * @category models
 */
export interface Options {
  /** A connection URL, `postgres://user@host:port/database`. */
  readonly url?: string | Redacted.Redacted<string> | undefined
  /** A client of your own; the store does not end it. */
  readonly sql?: postgres.Sql | undefined
  /** The table of positions; `kafka_offsets` when omitted. */
  readonly table?: string | undefined
  /** The schema of the table; the connection's `search_path` when omitted. */
  readonly schema?: string | undefined
  /** Create the schema and table when the layer starts (see {@link migrate}). */
  readonly migrate?: boolean | undefined
}

// The open transaction as the handler reaches it through `Transaction`; closed once the work has ended.
class PgTransaction {
  open = true
  constructor(readonly sql: postgres.ISql) {}
}

// Rows are read as arrays of text, whatever parsers or column transforms a client passed in `sql` was set up with.
const decodeRows = Schema.decodeUnknownSync(Schema.Array(Schema.Tuple(Schema.String, Schema.String, Schema.String)))
const decodePosition = Schema.decodeUnknownSync(Schema.Array(Schema.Tuple(Schema.String)))

interface Client {
  readonly sql: postgres.Sql
  readonly table: string
  readonly target: string
}

const quote = (identifier: string): string => `"${identifier}"`

const notAnIdentifier = (field: string, value: string) =>
  new ConfigError({
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

// `unsafe` with parameters is otherwise sent unprepared, which costs a round trip of its own to describe the statement
// every time. Prepared, it is described once per connection. A client set up with `prepare: false` (for a pooler in
// transaction mode) keeps its setting.
const prepared = { prepare: true }

const errorCode = (cause: unknown): string | undefined =>
  typeof cause === "object" && cause !== null && "code" in cause && typeof cause.code === "string"
    ? cause.code
    : undefined

const UNREACHABLE = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "ETIMEDOUT",
  "CONNECT_TIMEOUT",
  "CONNECTION_CLOSED",
  "CONNECTION_DESTROYED",
  "CONNECTION_ENDED"
])

const describe = (cause: unknown): string => cause instanceof Error ? cause.message : String(cause)

const toStoreError = (operation: string, target: string) => (cause: unknown): OffsetStoreError => {
  const code = errorCode(cause)
  if (code !== undefined && UNREACHABLE.has(code)) {
    return new OffsetStoreError({
      store: STORE,
      operation,
      reason: `cannot reach Postgres at ${target} (${describe(cause)}). Start the server, on these machines with ` +
        "`pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start`, or set DATABASE_URL to one that " +
        "is running",
      cause
    })
  }
  if (code === "3D000") {
    return new OffsetStoreError({
      store: STORE,
      operation,
      reason: `${describe(cause)} at ${target}; create it (createdb) or point DATABASE_URL at an existing database`,
      cause
    })
  }
  if (code === "42P01") {
    return new OffsetStoreError({
      store: STORE,
      operation,
      reason: `${describe(cause)}; create the table with PgOffsetStore.migrate, or the layer option migrate: true`,
      cause
    })
  }
  return new OffsetStoreError({ store: STORE, operation, reason: describe(cause), cause })
}

const targetOf = (sql: postgres.Sql): string => {
  const { database, host, port } = sql.options
  return `${host.map((h, i) => `${h}:${port[i] ?? port[0] ?? 5432}`).join(",")}/${database}`
}

const connect = (options: Options): Effect.Effect<Client, ConfigError | OffsetStoreError, Scope.Scope> =>
  Effect.gen(function*() {
    const table = yield* validateIdentifiers(options)
    if (options.sql !== undefined) {
      return { sql: options.sql, table, target: targetOf(options.sql) }
    }
    if (options.url === undefined) {
      return yield* new ConfigError({
        field: "url",
        reason: "give a connection URL (or a postgres client as sql); PgOffsetStore.layerConfig reads DATABASE_URL"
      })
    }
    const url = Redacted.isRedacted(options.url) ? Redacted.value(options.url) : options.url
    if (url.trim() === "") {
      return yield* new ConfigError({ field: "url", reason: "the connection URL is empty" })
    }
    const sql = yield* Effect.acquireRelease(
      Effect.try({
        try: () => postgres(url, { onnotice: () => {}, connect_timeout: 10 }),
        catch: (cause) => new ConfigError({ field: "url", reason: `not a Postgres connection URL: ${describe(cause)}` })
      }),
      (sql) =>
        Effect.tryPromise(() => sql.end({ timeout: 5 })).pipe(Effect.ignore, Effect.timeoutOption("10 seconds"))
    )
    return { sql, table, target: targetOf(sql) }
  })

const ensureTable = (client: Client, schema: string | undefined): Effect.Effect<void, OffsetStoreError> =>
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
            next_offset bigint not null,
            updated_at timestamptz not null default now(),
            primary key (group_id, topic, partition)
          )`
        )
      }),
    catch: toStoreError("migrate", client.target)
  }).pipe(Effect.asVoid)

/**
 * Creates the schema (when given) and the table of positions if they do not exist. Safe to run concurrently and
 * repeatedly.
 *
 * @since 0.1.0
 * @category migrations
 */
export const migrate = (options: Options): Effect.Effect<void, ConfigError | OffsetStoreError> =>
  Effect.scoped(Effect.flatMap(connect(options), (client) => ensureTable(client, options.schema)))

/**
 * The open transaction of the unit of work, for the handler to write its results in. Use it, not another client:
 * only what goes through it commits or rolls back with the position. It is a connection in the middle of a
 * transaction, typed as postgres.js's `ISql`: queries, `unsafe` and the helpers, but no `begin`, `reserve` or `end`,
 * which would break the unit (a nested rollback point is a plain `savepoint` statement).
 *
 * @since 0.1.0
 * @category transactions
 */
export const sql: Effect.Effect<postgres.ISql, OffsetStoreError, Transaction> = Effect.flatMap(
  Transaction,
  (transaction) => {
    const handle = transaction.handle
    if (!(handle instanceof PgTransaction)) {
      return Effect.fail(
        new OffsetStoreError({
          store: transaction.store,
          operation: "transaction",
          reason: `the open unit of work belongs to the ${transaction.store} store, not to Postgres` +
            " (use OffsetStore.append for the memory and file stores)"
        })
      )
    }
    if (!handle.open) {
      return Effect.fail(
        new OffsetStoreError({
          store: STORE,
          operation: "transaction",
          reason: "the unit of work has ended; use the transaction only while the work given to commit runs"
        })
      )
    }
    return Effect.succeed(handle.sql)
  }
)

const make = (
  options: Options
): Effect.Effect<Context.Tag.Service<OffsetStore>, ConfigError | OffsetStoreError, Scope.Scope> =>
  Effect.gen(function*() {
    const client = yield* connect(options)
    const { table, target } = client
    yield* Effect.tryPromise({ try: () => client.sql.unsafe("select 1"), catch: toStoreError("connect", target) })
    if (options.migrate === true) yield* ensureTable(client, options.schema)

    const load = (
      groupId: string,
      partitions: ReadonlyArray<TopicPartition.TopicPartition>
    ): Effect.Effect<ReadonlyMap<string, bigint>, OffsetStoreError> => {
      if (partitions.length === 0) return Effect.succeed(new Map())
      const wanted = new Set(partitions.map(TopicPartition.key))
      const topics = [...new Set(partitions.map((tp) => tp.topic))]
      return Effect.tryPromise({
        try: async () =>
          decodeRows(
            await client.sql.unsafe(
              `select topic, partition::text, next_offset::text from ${table}
               where group_id = $1 and topic = any($2::text[])`,
              [groupId, topics], prepared
            ).values()
          ),
        catch: toStoreError("load", target)
      }).pipe(Effect.map((rows) => {
        const positions = new Map<string, bigint>()
        for (const [topic, partition, next] of rows) {
          const key = TopicPartition.key(TopicPartition.make(topic, Number(partition)))
          if (wanted.has(key)) positions.set(key, BigInt(next))
        }
        return positions
      }))
    }

    const storePosition = (tx: postgres.Sql, unit: CommitUnit) => {
      const { groupId, partition: { partition, topic } } = unit
      return unit.expected === null
        ? tx.unsafe(
          `insert into ${table} (group_id, topic, partition, next_offset, updated_at)
           values ($1, $2, $3::int, $4::bigint, now())
           on conflict (group_id, topic, partition) do nothing`,
          [groupId, topic, partition, unit.next.toString()], prepared
        )
        : tx.unsafe(
          `update ${table} set next_offset = $4::bigint, updated_at = now()
           where group_id = $1 and topic = $2 and partition = $3::int and next_offset = $5::bigint`,
          [groupId, topic, partition, unit.next.toString(), unit.expected.toString()], prepared
        )
    }

    const fenced = (tx: postgres.Sql, unit: CommitUnit): Effect.Effect<never, Fenced | OffsetStoreError> => {
      const { groupId, partition: { partition, topic } } = unit
      return Effect.tryPromise({
        try: async () =>
          decodePosition(
            await tx.unsafe(
              `select next_offset::text from ${table} where group_id = $1 and topic = $2 and partition = $3::int`,
              [groupId, topic, partition], prepared
            ).values()
          ),
        catch: toStoreError("commit", target)
      }).pipe(Effect.flatMap((rows) => {
        const actual = rows.length === 0 ? null : BigInt(rows[0][0])
        return Effect.fail(new Fenced({ groupId, topic, partition, expected: unit.expected, actual }))
      }))
    }

    // Rolls back and gives the connection back to the pool, in the background if it takes longer than the bound: a
    // rollback waits behind the statements still running on the connection. A connection that was lost is not given
    // back: postgres.js has already taken it out of the pool.
    const rollback = (tx: postgres.ReservedSql): Effect.Effect<void> =>
      Effect.tryPromise(() =>
        tx.unsafe("rollback").then(() => tx.release(), (cause: unknown) => {
          if (!UNREACHABLE.has(errorCode(cause) ?? "")) tx.release()
        })
      ).pipe(Effect.interruptible, Effect.ignore, Effect.timeoutOption("10 seconds"), Effect.asVoid)

    // Waiting for a connection can be interrupted: a connection that arrives after that goes straight back.
    const reserve = Effect.async<postgres.ReservedSql, OffsetStoreError>((resume) => {
      let wanted = true
      client.sql.reserve().then(
        (tx) => wanted ? resume(Effect.succeed(tx)) : tx.release(),
        (cause: unknown) => resume(Effect.fail(toStoreError("commit", target)(cause)))
      )
      return Effect.sync(() => {
        wanted = false
      })
    })

    // The unit on its reserved connection, the work on this fiber: interrupting the commit interrupts the work. BEGIN
    // is sent without waiting for its answer, so that postgres.js pipelines it with the work's first statement; a
    // failed BEGIN shows in that statement too, and is reported as the cause. The position is written after the work,
    // so that a zombie stalled in its work holds no lock on it and the partition's new owner is not held up.
    const runUnit = <A, E, R>(tx: postgres.ReservedSql, unit: CommitUnit, work: Effect.Effect<A, E, R>) =>
      Effect.gen(function*() {
        const begun = tx.unsafe("begin").execute()
        // Its failure is read once the work has ended; this keeps it from going unhandled if the work is interrupted.
        begun.catch(() => undefined)
        const handle = new PgTransaction(tx)
        const exit = yield* Effect.exit(
          Effect.provideService(work, Transaction, { store: STORE, handle }).pipe(
            Effect.ensuring(Effect.sync(() => {
              handle.open = false
            }))
          )
        )
        yield* Effect.tryPromise({ try: () => begun, catch: toStoreError("commit", target) })
        if (Exit.isFailure(exit)) return yield* exit
        const stored = yield* Effect.tryPromise({
          try: () => storePosition(tx, unit),
          catch: toStoreError("commit", target)
        })
        if (stored.count !== 1) return yield* fenced(tx, unit)
        // Once COMMIT is sent, its answer is awaited: an interruption now could not undo it.
        yield* Effect.uninterruptible(
          Effect.tryPromise({ try: () => tx.unsafe("commit"), catch: toStoreError("commit", target) })
        )
        return exit.value
      })

    const commit = <A, E, R>(
      unit: CommitUnit,
      work: Effect.Effect<A, E, R>
    ): Effect.Effect<A, E | OffsetStoreError | Fenced, Exclude<R, Transaction>> =>
      Effect.uninterruptibleMask((restore) =>
        Effect.flatMap(restore(reserve), (tx) =>
          restore(runUnit(tx, unit, work)).pipe(
            Effect.onExit((exit) => Exit.isSuccess(exit) ? Effect.sync(() => tx.release()) : rollback(tx))
          ))
      )

    return { name: STORE, load, commit }
  })

/**
 * The Postgres offset store. Options are checked before anything connects (a bad `table` or `schema` fails with a
 * `ConfigError` naming it); the layer then checks that the server answers, and creates the table when
 * `migrate: true`.
 *
 * @since 0.1.0
 * @category layers
 */
export const layer = (options: Options): Layer.Layer<OffsetStore, ConfigError | OffsetStoreError> =>
  Layer.scoped(OffsetStore, make(options))

/**
 * {@link layer} with the connection URL read from `DATABASE_URL` through effect's `Config`.
 *
 * @since 0.1.0
 * @category layers
 */
export const layerConfig = (
  options: Omit<Options, "url" | "sql"> = {}
): Layer.Layer<OffsetStore, ConfigError | OffsetStoreError> =>
  Layer.unwrapEffect(
    Config.redacted("DATABASE_URL").pipe(
      Effect.mapError((error) =>
        new ConfigError({
          field: "DATABASE_URL",
          reason: `${
            EffectConfigError.isMissingDataOnly(error) ? "is not set" : "cannot be read"
          }; set it to a Postgres URL such as postgres://postgres@127.0.0.1:5432/test`
        })
      ),
      Effect.map((url) => layer({ ...options, url }))
    )
  )
