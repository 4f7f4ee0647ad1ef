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
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Redacted from "effect/Redacted"
import * as Runtime from "effect/Runtime"
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
  constructor(readonly sql: postgres.TransactionSql) {}
}

// Signals thrown out of the `begin` callback: postgres.js rolls back on any rejection and rethrows it.
class WorkFailed {}
class PositionMoved {
  constructor(readonly actual: bigint | null) {}
}
class Cancelled {}

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
 * only what goes through it commits or rolls back with the position.
 *
 * @since 0.1.0
 * @category transactions
 */
export const sql: Effect.Effect<postgres.TransactionSql, OffsetStoreError, Transaction> = Effect.flatMap(
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
              [groupId, topics]
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

    const storePosition = async (tx: postgres.TransactionSql, unit: CommitUnit): Promise<void> => {
      const { groupId, partition: { partition, topic } } = unit
      const result = unit.expected === null
        ? await tx.unsafe(
          `insert into ${table} (group_id, topic, partition, next_offset, updated_at)
           values ($1, $2, $3::int, $4::bigint, now())
           on conflict (group_id, topic, partition) do nothing`,
          [groupId, topic, partition, unit.next.toString()]
        )
        : await tx.unsafe(
          `update ${table} set next_offset = $4::bigint, updated_at = now()
           where group_id = $1 and topic = $2 and partition = $3::int and next_offset = $5::bigint`,
          [groupId, topic, partition, unit.next.toString(), unit.expected.toString()]
        )
      if (result.count === 1) return
      const rows = decodePosition(
        await tx.unsafe(
          `select next_offset::text from ${table} where group_id = $1 and topic = $2 and partition = $3::int`,
          [groupId, topic, partition]
        ).values()
      )
      throw new PositionMoved(rows.length === 0 ? null : BigInt(rows[0][0]))
    }

    // postgres.js runs a transaction around a callback; the work runs in its own fiber inside it, with this fiber's
    // context. Interrupting this fiber interrupts the work, which makes the callback reject, which rolls back.
    const commit = <A, E, R>(
      unit: CommitUnit,
      work: Effect.Effect<A, E, R>
    ): Effect.Effect<A, E | OffsetStoreError | Fenced, Exclude<R, Transaction>> =>
      Effect.flatMap(Effect.runtime<Exclude<R, Transaction>>(), (runtime) =>
        Effect.async<A, E | OffsetStoreError | Fenced>((resume) => {
          let fiber: Fiber.RuntimeFiber<A, E> | undefined
          let failure: Exit.Exit<A, E> | undefined
          let cancelled = false
          const settled = client.sql.begin(async (tx) => {
            if (cancelled) throw new Cancelled()
            const handle = new PgTransaction(tx)
            const running = Runtime.runFork(runtime)(Effect.provideService(work, Transaction, { store: STORE, handle }))
            fiber = running
            const exit = await new Promise<Exit.Exit<A, E>>((resolve) => running.addObserver(resolve))
            handle.open = false
            if (Exit.isFailure(exit)) {
              failure = exit
              throw new WorkFailed()
            }
            if (cancelled) throw new Cancelled()
            await storePosition(tx, unit)
            return { value: exit.value }
          }).then(
            (box) => resume(Effect.succeed(box.value)),
            (error: unknown) => {
              if (error instanceof WorkFailed && failure !== undefined) {
                resume(failure)
              } else if (error instanceof PositionMoved) {
                resume(Effect.fail(
                  new Fenced({
                    groupId: unit.groupId,
                    topic: unit.partition.topic,
                    partition: unit.partition.partition,
                    expected: unit.expected,
                    actual: error.actual
                  })
                ))
              } else if (!(error instanceof Cancelled)) {
                resume(Effect.fail(toStoreError("commit", target)(error)))
              }
            }
          )
          return Effect.suspend(() => {
            cancelled = true
            return fiber === undefined ? Effect.void : Fiber.interrupt(fiber)
          }).pipe(
            Effect.zipRight(Effect.tryPromise(() => settled).pipe(Effect.ignore)),
            Effect.timeoutOption("10 seconds"),
            Effect.asVoid
          )
        }))

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
