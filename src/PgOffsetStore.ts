/**
 * The offset store in Postgres, on `postgres` (porsager). Positions and owner epochs live in one table; the handler
 * writes its results in the unit's transaction (through {@link query} or {@link sql}), and the position is stored in
 * that same transaction, on the condition that the partition's owner epoch is still the unit's.
 *
 * @since 0.1.0
 */
import * as Cause from "effect/Cause"
import * as Clock from "effect/Clock"
import * as Config from "effect/Config"
import * as EffectConfigError from "effect/ConfigError"
import type * as Context from "effect/Context"
import * as Data from "effect/Data"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Layer from "effect/Layer"
import * as Redacted from "effect/Redacted"
import * as Schedule from "effect/Schedule"
import * as Schema from "effect/Schema"
import type * as Scope from "effect/Scope"
import postgres from "postgres"
import * as Progress from "./internal/consumer/progress.js"
import { OutsideUnit, outsideUnitReason } from "./internal/store/unitBuffer.js"
import { InvalidConfig } from "./KafkaError.js"
import type { Claim, CommitUnit } from "./OffsetStore.js"
import { Fenced, OffsetStore, OffsetStoreError, Transaction } from "./OffsetStore.js"
import * as TopicPartition from "./TopicPartition.js"

const STORE = "postgres"
const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_]{0,62}$/

/**
 * The isolation level of a unit's transaction.
 *
 * @since 0.1.0
 * @category models
 */
export type IsolationLevel = "read committed" | "repeatable read" | "serializable"

const ISOLATION_LEVELS: ReadonlyArray<IsolationLevel> = ["read committed", "repeatable read", "serializable"]

/**
 * Where the positions are kept, and how failures that pass are retried. Give either `url` or a `postgres` client as
 * `sql` (which the store then uses but does not close).
 *
 * @since 0.1.0
 * @category models
 */
export interface Options {
  /** A connection URL, `postgres://user@host:port/database`. */
  readonly url?: string | Redacted.Redacted<string> | undefined
  /**
   * A client of your own; the store does not end it. The store works with `fetch_types: false` on it, which is worth
   * setting where connections are ended under load and the work passes no JS arrays as parameters: with postgres.js's
   * default, a connection ended while it reads the server's array types (its first query on every new connection)
   * fails a promise that nothing awaits, an unhandled rejection that ends a Node process by default.
   */
  readonly sql?: postgres.Sql | undefined
  /** The table of positions; `kafka_offsets` when omitted. */
  readonly table?: string | undefined
  /** The schema of the table; the connection's `search_path` when omitted. */
  readonly schema?: string | undefined
  /** Create or upgrade the schema and table when the layer starts (see {@link migrate}). */
  readonly migrate?: boolean | undefined
  /** The isolation level of each unit's transaction; `"read committed"` when omitted (see {@link layer}). */
  readonly isolationLevel?: IsolationLevel | undefined
  /**
   * The waits between attempts after a failure that passes (connection lost, server restarting, serialization
   * failure, deadlock); it gets the failure as an `OffsetStoreError`. Exponential from 100 ms, capped at 5 seconds,
   * jittered, when omitted.
   */
  readonly retry?: Schedule.Schedule<unknown, OffsetStoreError> | undefined
  /** How long one operation keeps being retried before it fails; 60 seconds when omitted. */
  readonly retryFor?: Duration.DurationInput | undefined
}

const defaultRetry: Schedule.Schedule<unknown, OffsetStoreError> = Schedule.exponential("100 millis").pipe(
  Schedule.union(Schedule.spaced("5 seconds")),
  Schedule.jittered
)

/**
 * The connection object postgres.js hands to a query's `onexecute`. While `sql.begin` holds it for a transaction,
 * `reserved` is the function that transaction installed; postgres.js sets it to null when the connection closes, and
 * another transaction on the reopened connection installs its own.
 */
interface TrackedConnection {
  readonly reserved?: unknown
}

/** What a query made on the unit's transaction once it cannot be used any more fails with. */
class TransactionClosed extends Error {
  override readonly name = "TransactionClosed"
  constructor(readonly code: "CONNECTION_CLOSED" | "UNIT_ENDED", message: string) {
    super(message)
  }
}

// The open transaction of a unit of work as the handler reaches it through `Transaction`.
class PgTransaction {
  /** False once the work has ended. */
  open = true
  /** True once COMMIT or ROLLBACK was asked for: the store sends nothing more in the transaction. */
  ending = false
  /** Why the unit's connection is gone, once the store has noticed it closed. */
  lost: unknown = undefined
  /** The last failure of the work's own statements that passes, raised through `query`. */
  transient: OffsetStoreError | undefined = undefined
  /** The connection of the transaction, and what marks it as held by this transaction (see `attach`). */
  private connection: TrackedConnection | undefined = undefined
  private holder: unknown = undefined
  readonly closed: Promise<never>
  readonly sql: postgres.ISql
  private close: (error: unknown) => void = () => {}

  constructor(tx: postgres.TransactionSql) {
    this.closed = new Promise<never>((_, reject) => {
      this.close = reject
    })
    this.closed.catch(() => undefined)
    this.sql = guard(tx, this)
  }

  lose(error: unknown) {
    if (this.lost !== undefined) return
    this.lost = error ?? new Error("connection closed")
    this.close(this.lost)
  }

  /** Given the connection once the transaction's first statement is on it. */
  attach(connection: TrackedConnection) {
    this.connection = connection
    this.holder = connection.reserved
  }

  /**
   * Whether the transaction's connection is still there, asked before anything is sent on it. postgres.js reports a
   * closed connection to `sql.begin` a few promise turns late; a statement sent in between would be written to a
   * socket that is gone (`socket.write` on null, thrown in a timer, which kills the process).
   */
  alive(): boolean {
    if (this.lost === undefined && this.connection !== undefined && this.connection.reserved !== this.holder) {
      this.lose(new TransactionClosed("CONNECTION_CLOSED", "the unit's connection to Postgres closed"))
    }
    return this.lost === undefined
  }
}

// A transaction must never send anything once its connection has closed: postgres.js would write to a socket that is
// gone (`socket.write` on null, thrown in a timer, which kills the process), or, if the pool has meanwhile reopened
// the connection for someone else, into their session, outside the unit's transaction. So the handler gets it behind
// this guard, which refuses to make a query once the connection is lost or the unit has ended.
const QUERYING = new Set<string | symbol>(["unsafe", "file", "notify"])

const guard = (tx: postgres.TransactionSql, handle: PgTransaction): postgres.ISql => {
  const check = () => {
    if (!handle.alive()) {
      throw new TransactionClosed(
        "CONNECTION_CLOSED",
        "the unit's connection to Postgres was lost; the store rolls the unit back and runs it again"
      )
    }
    if (!handle.open) {
      throw new TransactionClosed(
        "UNIT_ENDED",
        "the unit of work has ended; use the transaction only while the work given to commit runs"
      )
    }
  }
  return new Proxy(tx, {
    apply: (target, thisArg, args) => {
      check()
      return Reflect.apply(target, thisArg, args)
    },
    get: (target, property, receiver) => {
      const value: unknown = Reflect.get(target, property, receiver)
      if (!QUERYING.has(property) || typeof value !== "function") return value
      return (...args: Array<unknown>) => {
        check()
        return Reflect.apply(value, target, args)
      }
    }
  })
}

// Rows are read as arrays of text, whatever parsers or column transforms a client passed in `sql` was set up with.
const decodePositions = Schema.decodeUnknownSync(
  Schema.Array(Schema.Tuple(Schema.String, Schema.String, Schema.String))
)
const decodeClaims = Schema.decodeUnknownSync(
  Schema.Array(
    Schema.Tuple(Schema.String, Schema.String, Schema.NullOr(Schema.String), Schema.String, Schema.NullOr(Schema.String))
  )
)
const decodeText = Schema.decodeUnknownSync(Schema.Array(Schema.Tuple(Schema.NullOr(Schema.String))))
const decodeLocked = Schema.decodeUnknownSync(
  Schema.Array(Schema.Tuple(Schema.NullOr(Schema.String), Schema.NullOr(Schema.String), Schema.String))
)

/**
 * The position of a unit, stored: the transaction's id (to settle a COMMIT whose answer is lost), and, when the
 * position's last statement is still on its way, that statement: COMMIT is sent right behind it (see `storePosition`).
 */
interface Stored {
  readonly xid: string
  readonly written: Promise<unknown> | undefined
}

// Array parameters are sent as Postgres array literals in text (`{"a","b"}`, cast in the statement), so that they do
// not depend on the client having fetched the server's array types: a client given as `sql` may be set up with
// `fetch_types: false` (see `Options.sql`).
const arrayLiteral = (values: ReadonlyArray<string | number>): string =>
  `{${values.map((v) => typeof v === "number" ? String(v) : `"${v.replace(/[\\"]/g, (c) => `\\${c}`)}"`).join(",")}}`
const decodeColumns = Schema.decodeUnknownSync(Schema.Array(Schema.Tuple(Schema.String, Schema.Boolean)))

/**
 * A unit's open transaction: `sql.begin`, whose callback waits until the unit decides. `finish(true)` lets it send
 * COMMIT, `finish(false)` ROLLBACK; `outcome` is what `sql.begin` returns.
 */
interface Session {
  readonly tx: postgres.TransactionSql
  readonly handle: PgTransaction
  readonly outcome: Promise<unknown>
  readonly finish: (commit: boolean) => void
}

/** What a unit's transaction is ended with when the unit does not commit. */
class RolledBack extends Error {}

interface Client {
  readonly sql: postgres.Sql
  readonly table: string
  readonly target: string
}

const quote = (identifier: string): string => `"${identifier}"`

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

// `unsafe` with parameters is otherwise sent unprepared, which costs a round trip of its own to describe the statement
// every time. Prepared, it is described once per connection. A client set up with `prepare: false` (for a pooler in
// transaction mode) keeps its setting.
const prepared = { prepare: true }

const errorCode = (cause: unknown): string | undefined =>
  typeof cause === "object" && cause !== null && "code" in cause && typeof cause.code === "string"
    ? cause.code
    : undefined

// Codes of postgres.js and Node for a connection that could not be made or is gone. Not among them: postgres.js's
// CONNECTION_ENDED, which says that the client itself was ended (`sql.end()`) and will never connect again.
const UNREACHABLE = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "EPIPE",
  "ETIMEDOUT",
  "CONNECT_TIMEOUT",
  "CONNECTION_CLOSED",
  "CONNECTION_DESTROYED"
])

/** The connection is gone: connection exceptions (class 08) and the server shutting down or restarting. */
const isConnectionLost = (code: string | undefined): boolean =>
  code !== undefined &&
  (UNREACHABLE.has(code) || code.startsWith("08") || code === "57P01" || code === "57P02" || code === "57P03")

/** Failures that pass: a lost connection, or a transaction the server rolled back for a conflict with another. */
const isTransient = (cause: unknown): boolean => {
  const code = errorCode(cause)
  return isConnectionLost(code) || code === "40001" || code === "40P01"
}

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
  if (code === "CONNECTION_ENDED") {
    return new OffsetStoreError({
      store: STORE,
      operation,
      reason: `the postgres client of the store (${target}) has been ended with sql.end(); a store given its own ` +
        "client needs it open for as long as the store is used",
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
  const sqlState = code !== undefined && /^[0-9A-Z]{5}$/.test(code) ? ` (SQLSTATE ${code})` : ""
  return new OffsetStoreError({ store: STORE, operation, reason: `${describe(cause)}${sqlState}`, cause })
}

/** A failure that passes: the operation is tried again, on the retry schedule. */
class Transient extends Data.TaggedError("Transient")<{ readonly error: OffsetStoreError }> {}

const isTransientError = <E>(error: E | Transient): error is Transient => error instanceof Transient

const targetOf = (sql: postgres.Sql): string => {
  const { database, host, port } = sql.options
  return `${host.map((h, i) => `${h}:${port[i] ?? port[0] ?? 5432}`).join(",")}/${database}`
}

const connect = (options: Options): Effect.Effect<Client, InvalidConfig | OffsetStoreError, Scope.Scope> =>
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
        catch: (cause) => new InvalidConfig({ field: "url", reason: `not a Postgres connection URL: ${describe(cause)}` })
      }),
      (sql) =>
        Effect.tryPromise(() => sql.end({ timeout: 5 })).pipe(Effect.ignore, Effect.timeoutOption("10 seconds"))
    )
    return { sql, table, target: targetOf(sql) }
  })

// Creates the table, or brings one of an earlier version up to date: `epoch` was added, `next_offset` became
// nullable (a partition claimed before anything was stored), and `finished` was added (the ranges above the position
// that units of records finished out of order committed; null when none). Columns are altered only when they need it, so that a
// layer starting against an up-to-date table takes no exclusive lock on it.
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
 * Creates the schema (when given) and the table of positions if they do not exist, and upgrades a table created by an
 * earlier version in place (adding the `epoch` column, whose rows count as never claimed, and the `finished` column).
 * Safe to run concurrently and repeatedly.
 *
 * @since 0.1.0
 * @category migrations
 */
export const migrate = (options: Options): Effect.Effect<void, InvalidConfig | OffsetStoreError> =>
  Effect.scoped(Effect.flatMap(connect(options), (client) => ensureTable(client, options.schema)))

const transactionOf = (operation: string): Effect.Effect<PgTransaction, OffsetStoreError, Transaction> =>
  Effect.flatMap(Transaction, (transaction) => {
    const handle = transaction.handle
    const fail = (reason: string) =>
      Effect.fail(new OffsetStoreError({ store: transaction.store, operation, reason }))
    if (handle instanceof OutsideUnit) return fail(outsideUnitReason)
    if (!(handle instanceof PgTransaction)) {
      return fail(
        `the open unit of work belongs to the ${transaction.store} store, not to Postgres` +
          " (use OffsetStore.append for the memory and file stores)"
      )
    }
    if (!handle.open) {
      return fail("the unit of work has ended; use the transaction only while the work given to commit runs")
    }
    return Effect.succeed(handle)
  })

/**
 * The open transaction of the unit of work, for the handler to write its results in. Use it, not another client:
 * only what goes through it commits or rolls back with the position. It is a connection in the middle of a
 * transaction, typed as postgres.js's `ISql`: queries, `unsafe` and the helpers, but no `begin`, `reserve` or `end`,
 * which would break the unit (a nested rollback point is a plain `savepoint` statement). Prefer {@link query}, which
 * fails with a typed error and lets the store retry the unit when the failure passes.
 *
 * @since 0.1.0
 * @category transactions
 */
export const sql: Effect.Effect<postgres.ISql, OffsetStoreError, Transaction> = Effect.map(
  transactionOf("transaction"),
  (handle) => handle.sql
)

/**
 * Runs queries in the open transaction of the unit of work: `f` gets the transaction (see {@link sql}) and its
 * promise's failure becomes an `OffsetStoreError` (operation `query`, the SQLSTATE in `reason`, postgres.js's error as
 * `cause`). When the failure passes (the connection was lost, a serialization failure, a deadlock), the store rolls
 * the unit back and runs it again, whatever the work made of the error.
 *
 * ```ts
 * const write = PgOffsetStore.query((sql) => sql`insert into payments ${sql(rows)}`)
 * ```
 *
 * @since 0.1.0
 * @category transactions
 */
export const query = <A>(
  f: (sql: postgres.ISql) => Promise<A>
): Effect.Effect<A, OffsetStoreError, Transaction> =>
  Effect.flatMap(transactionOf("query"), (handle) =>
    Effect.tryPromise({
      try: () => Promise.race([f(handle.sql), handle.closed]),
      catch: (cause) => {
        const code = errorCode(cause)
        const error = new OffsetStoreError({
          store: STORE,
          operation: "query",
          reason: code === undefined ? describe(cause) : `${describe(cause)} (${code})`,
          cause
        })
        if (isConnectionLost(code)) handle.lose(cause)
        if (isTransient(cause)) handle.transient = error
        return error
      }
    }))

const make = (
  options: Options
): Effect.Effect<Context.Tag.Service<OffsetStore>, InvalidConfig | OffsetStoreError, Scope.Scope> =>
  Effect.gen(function*() {
    const isolationLevel = options.isolationLevel ?? "read committed"
    if (!ISOLATION_LEVELS.includes(isolationLevel)) {
      return yield* new InvalidConfig({
        field: "isolationLevel",
        reason: `${JSON.stringify(isolationLevel)} is not one of ${ISOLATION_LEVELS.map((l) => `"${l}"`).join(", ")}`
      })
    }
    const retryFor = Duration.decodeUnknown(options.retryFor ?? "60 seconds")
    if (retryFor._tag === "None") {
      return yield* new InvalidConfig({ field: "retryFor", reason: "is not a duration, such as \"60 seconds\"" })
    }
    const schedule = Schedule.upTo(options.retry ?? defaultRetry, retryFor.value)
    const client = yield* connect(options)
    const { table, target } = client
    yield* Effect.tryPromise({ try: () => client.sql.unsafe("select 1"), catch: toStoreError("connect", target) })
    if (options.migrate === true) yield* ensureTable(client, options.schema)

    // A failure that passes is retried on the schedule, which is built only once something failed; when the schedule
    // ends, the operation fails with the last failure and how long it was retried.
    const retrying = <A, E, R>(
      operation: string,
      effect: Effect.Effect<A, E | Transient, R>
    ): Effect.Effect<A, E | OffsetStoreError, R> =>
      Effect.catchIf(effect, isTransientError, (first) =>
        Effect.gen(function*() {
          const driver = yield* Schedule.driver(schedule)
          const started = yield* Clock.currentTimeMillis
          const loop = (attempts: number, last: Transient): Effect.Effect<A, E | OffsetStoreError, R> =>
            driver.next(last.error).pipe(
              Effect.matchEffect({
                onFailure: () =>
                  Effect.flatMap(Clock.currentTimeMillis, (now) =>
                    Effect.fail(
                      new OffsetStoreError({
                        store: STORE,
                        operation,
                        reason: `still failing after ${attempts} attempts over ${
                          Duration.format(Duration.millis(now - started))
                        }: ${last.error.reason}`,
                        cause: last.error.cause
                      })
                    )),
                onSuccess: () => Effect.catchIf(effect, isTransientError, (again) => loop(attempts + 1, again))
              })
            )
          return yield* loop(1, first)
        }))

    /** A failure of a statement on the pool: retried when it passes. */
    const onPool = (operation: string) => (cause: unknown): OffsetStoreError | Transient => {
      const error = toStoreError(operation, target)(cause)
      return isTransient(cause) ? new Transient({ error }) : error
    }

    const load = (
      groupId: string,
      partitions: ReadonlyArray<TopicPartition.TopicPartition>
    ): Effect.Effect<ReadonlyMap<string, bigint>, OffsetStoreError> => {
      if (partitions.length === 0) return Effect.succeed(new Map())
      const wanted = new Set(partitions.map(TopicPartition.key))
      const topics = [...new Set(partitions.map((tp) => tp.topic))]
      return retrying(
        "load",
        Effect.tryPromise({
          try: async () =>
            decodePositions(
              await client.sql.unsafe(
                `select topic, partition::text, next_offset::text from ${table}
                 where group_id = $1 and topic = any($2::text[]) and next_offset is not null`,
                [groupId, arrayLiteral(topics)],
                prepared
              ).values()
            ),
          catch: onPool("load")
        })
      ).pipe(Effect.map((rows) => {
        const positions = new Map<string, bigint>()
        for (const [topic, partition, next] of rows) {
          const key = TopicPartition.key(TopicPartition.make(topic, Number(partition)))
          if (wanted.has(key)) positions.set(key, BigInt(next))
        }
        return positions
      }))
    }

    // One statement for all the partitions, in a fixed order so that two claims of overlapping partitions lock rows
    // in the same order. The upsert waits for a unit holding a row (one that has stored its position and not yet
    // committed) and then updates the newest version, so the position it returns includes that unit if it committed.
    // Retrying is safe: a claim whose answer was lost only makes the epoch skip a number.
    const claim = (
      groupId: string,
      partitions: ReadonlyArray<TopicPartition.TopicPartition>
    ): Effect.Effect<ReadonlyMap<string, Claim>, OffsetStoreError> => {
      const unique = [...new Map(partitions.map((tp) => [TopicPartition.key(tp), tp])).values()].sort(
        TopicPartition.compare
      )
      if (unique.length === 0) return Effect.succeed(new Map())
      return retrying(
        "claim",
        Effect.tryPromise({
          try: async () =>
            decodeClaims(
              await client.sql.unsafe(
                `insert into ${table} as offsets (group_id, topic, partition, next_offset, epoch, updated_at)
                 select $1, claimed.topic, claimed.partition, null, 1, now()
                 from unnest($2::text[], $3::int[]) with ordinality as claimed(topic, partition, n)
                 order by claimed.n
                 on conflict (group_id, topic, partition)
                 do update set epoch = offsets.epoch + 1, updated_at = now()
                 returning topic, partition::text, next_offset::text, epoch::text, finished`,
                [groupId, arrayLiteral(unique.map((tp) => tp.topic)), arrayLiteral(unique.map((tp) => tp.partition))],
                prepared
              ).values()
            ),
          catch: onPool("claim")
        })
      ).pipe(Effect.map((rows) => {
        const claims = new Map<string, Claim>()
        for (const [topic, partition, next, epoch, finishedText] of rows) {
          const position = next === null ? null : BigInt(next)
          const finished = position === null ? [] : Progress.decode(position, finishedText)
          claims.set(TopicPartition.key(TopicPartition.make(topic, Number(partition))), {
            epoch: BigInt(epoch),
            position,
            ...(finished.length === 0 ? {} : { finished })
          })
        }
        return claims
      }))
    }

    /**
     * A statement of the store on the unit's connection; it fails, rather than hangs, if the connection goes. A
     * transaction aborted by a failure that passes, which the work caught and went on from (25P02), is tried again.
     */
    const onUnit = <A>(handle: PgTransaction, run: () => Promise<A>): Effect.Effect<A, OffsetStoreError | Transient> =>
      Effect.tryPromise({
        try: () => handle.alive() ? Promise.race([run(), handle.closed]) : handle.closed,
        catch: (cause) => {
          const code = errorCode(cause)
          if (isConnectionLost(code)) handle.lose(cause)
          if (code === "25P02" && handle.transient !== undefined) return new Transient({ error: handle.transient })
          const error = toStoreError("commit", target)(cause)
          return isTransient(cause) ? new Transient({ error }) : error
        }
      })

    const lostConnection = (handle: PgTransaction): Transient =>
      new Transient({
        error: new OffsetStoreError({
          store: STORE,
          operation: "commit",
          reason: `the connection to Postgres at ${target} was lost while the unit ran (${describe(handle.lost)})`,
          cause: handle.lost
        })
      })

    // The position is stored only if the partition's owner epoch is still the unit's. Under read committed, an UPDATE
    // that finds the row locked (by a claim, or by another unit) waits, then checks its condition again on the row's
    // newest version: a claim that committed meanwhile is seen, and the unit is fenced. `txid_current()` names the
    // transaction, so that a COMMIT whose answer is lost with the connection can be settled (see `settle`).
    // A unit of a chunk on a partition without finished ranges (the usual case) is one statement. Otherwise the row is
    // locked and read (`for update`: units of the same owner committing side by side take turns here, each adding its
    // ranges to what the one before stored), and written back. That last UPDATE is not waited for: COMMIT goes with it
    // (one round trip, not two, and the row is not held across a round trip to the consumer). It cannot miss the row,
    // which this transaction holds with the unit's epoch; should it find none all the same, it fails (a division by
    // zero), and a failed statement makes the server roll back the COMMIT behind it.
    // Each statement is put on the transaction's connection at once (`execute`), and only while the transaction is
    // neither ending nor gone: a statement made after its ROLLBACK would run on the connection outside it, in another
    // session's transaction or in none, and store a position without the unit's results.
    const storePosition = async (
      tx: postgres.TransactionSql,
      handle: PgTransaction,
      unit: CommitUnit
    ): Promise<Stored | undefined> => {
      const send = (query: string, parameters: ReadonlyArray<unknown>) => {
        if (handle.ending || !handle.alive()) {
          throw new TransactionClosed("UNIT_ENDED", "the unit's transaction is ending; nothing more is sent in it")
        }
        return tx.unsafe(query, parameters as Array<postgres.ParameterOrJSON<never>>, prepared).values().execute()
      }
      const where = "where group_id = $1 and topic = $2 and partition = $3::int and epoch = $4::bigint"
      const place = [unit.groupId, unit.partition.topic, unit.partition.partition, unit.epoch.toString()]
      if (unit.finished === undefined || unit.finished.length === 0) {
        const simple = await send(
          `update ${table} set next_offset = greatest(next_offset, $5::bigint), updated_at = now()
           ${where} and finished is null
           returning txid_current()::text`,
          [...place, unit.next.toString()]
        )
        if (simple.length > 0) return { xid: decodeText(simple)[0]![0] ?? "", written: undefined }
      }
      const rows = decodeLocked(
        await send(`select next_offset::text, finished, txid_current()::text from ${table} ${where} for update`, place)
      )
      if (rows.length === 0) return undefined
      const [next, finishedText, xid] = rows[0]!
      const position = next === null ? null : BigInt(next)
      const stored = Progress.advance(
        { position, finished: position === null ? [] : Progress.decode(position, finishedText) },
        unit
      )
      const text = Progress.encode(stored.position, stored.finished, Number.POSITIVE_INFINITY)
      const written: Promise<unknown> = send(
        `with written as (
           update ${table} set next_offset = $5::bigint, finished = $6, updated_at = now() ${where} returning 1
         )
         select 1 / count(*) from written`,
        [...place, stored.position.toString(), text === "" ? null : text]
      )
      // Looked at once COMMIT has answered (`commitSession`).
      written.catch(() => undefined)
      return { xid, written }
    }

    const fenced = (
      tx: postgres.TransactionSql,
      handle: PgTransaction,
      unit: CommitUnit
    ): Effect.Effect<never, Fenced | OffsetStoreError | Transient> => {
      const { groupId, partition: { partition, topic } } = unit
      return onUnit(handle, async () =>
        decodeText(
          await tx.unsafe(
            `select epoch::text from ${table} where group_id = $1 and topic = $2 and partition = $3::int`,
            [groupId, topic, partition],
            prepared
          ).values()
        )).pipe(Effect.flatMap((rows) => {
          const epoch = rows.length === 0 || rows[0][0] === null ? 0n : BigInt(rows[0][0])
          return Effect.fail(
            new Fenced({ groupId, topic, partition, epoch: unit.epoch, currentEpoch: epoch === 0n ? null : epoch })
          )
        }))
    }

    // The connection went while COMMIT was on its way: the transaction may have committed or not. The server knows;
    // it is asked on another connection until it answers (a transaction `in progress` is still being ended). Only a
    // unit the server says did not commit is run again.
    const settle = (xid: string, lost: Transient): Effect.Effect<void, OffsetStoreError | Transient> =>
      retrying(
        "commit",
        Effect.tryPromise({
          try: async () =>
            decodeText(await client.sql.unsafe("select txid_status($1::bigint)::text", [xid], prepared).values()),
          catch: onPool("commit")
        }).pipe(Effect.flatMap((rows): Effect.Effect<"committed" | "aborted", OffsetStoreError | Transient> => {
          const status = rows[0]?.[0] ?? null
          switch (status) {
            case "committed":
            case "aborted":
              return Effect.succeed(status)
            case "in progress":
              return Effect.fail(
                new Transient({
                  error: new OffsetStoreError({
                    store: STORE,
                    operation: "commit",
                    reason: `transaction ${xid}, whose connection was lost during COMMIT, is still in progress`
                  })
                })
              )
            default:
              return Effect.fail(
                new OffsetStoreError({
                  store: STORE,
                  operation: "commit",
                  reason: `the connection was lost during COMMIT and the server no longer knows whether transaction ` +
                    `${xid} committed; check the position stored for the partition before going on`,
                  cause: lost.error
                })
              )
          }
        }))
      ).pipe(Effect.flatMap((status) => status === "committed" ? Effect.void : Effect.fail(lost)))

    // A unit's transaction is postgres.js's `sql.begin`, whose connection comes from the pool like every query's, and
    // goes back to it once the transaction ends (the pool's `reserve` loses waiting callers when a connection closes).
    // The callback hands the transaction over and waits for the unit to decide; meanwhile the work runs on the unit's
    // fiber. Its first statement, sent with the callback, hands over postgres.js's connection object through
    // `onexecute`, so that the unit can tell, before sending anything, whether the connection is still its own. Waiting
    // for BEGIN can be interrupted: a transaction that begins after that is rolled back at once.
    const beginOptions = `isolation level ${isolationLevel}`
    const open = Effect.async<Session, OffsetStoreError | Transient>((resume) => {
      let wanted = true
      let session: Session | undefined
      const outcome = client.sql.begin(beginOptions, (tx) =>
        new Promise<void>((resolve, reject) => {
          const finish = (commit: boolean) => commit ? resolve() : reject(new RolledBack())
          if (!wanted) return finish(false)
          const handle = new PgTransaction(tx)
          const attach: postgres.UnsafeQueryOptions & { readonly onexecute: (c: TrackedConnection) => true } = {
            ...prepared,
            onexecute: (connection) => {
              handle.attach(connection)
              return true
            }
          }
          // Its failure, if any, also fails the work's statements and the transaction.
          tx.unsafe("select 1", [], attach).execute().catch(() => undefined)
          session = { tx, handle, outcome, finish }
          resume(Effect.succeed(session))
        }))
      outcome.catch((cause: unknown) => {
        if (session === undefined) {
          if (wanted && !(cause instanceof RolledBack)) resume(Effect.fail(onPool("commit")(cause)))
        } else if (isConnectionLost(errorCode(cause))) {
          session.handle.lose(cause)
        }
      })
      return Effect.sync(() => {
        wanted = false
      })
    })

    // Ends the transaction with COMMIT, unless its connection is gone: then nothing may be sent on it any more. With
    // the position's last statement still on its way, the transaction committed only if that statement did: had it
    // failed, the server rolled the COMMIT behind it back (and answered it as a ROLLBACK, which postgres.js does not
    // tell apart), so its failure is the unit's.
    const commitSession = (session: Session, written: Promise<unknown> | undefined): Effect.Effect<
      void,
      OffsetStoreError | Transient
    > =>
      onUnit(session.handle, async () => {
        session.handle.ending = true
        session.finish(true)
        await session.outcome
        if (written !== undefined) await written
      })

    // Rolls back in the background if it takes longer than the bound: a rollback waits behind the statements still
    // running on the connection. A transaction whose connection is gone is left as it is: the server rolled it back.
    const rollback = (session: Session): Effect.Effect<void> =>
      Effect.suspend(() => {
        session.handle.ending = true
        if (!session.handle.alive()) return Effect.void
        session.finish(false)
        return Effect.tryPromise(() => Promise.race([session.outcome, session.handle.closed])).pipe(
          Effect.interruptible,
          Effect.ignore,
          Effect.timeoutOption("10 seconds"),
          Effect.asVoid
        )
      })

    // One attempt at a unit: the work runs on this fiber, so interrupting the commit interrupts the work. The position
    // is written after the work, so that a zombie stalled in its work holds no lock on it and the partition's new
    // owner is not held up.
    const attempt = <A, E, R>(
      unit: CommitUnit,
      work: Effect.Effect<A, E, R>
    ): Effect.Effect<A, E | Fenced | OffsetStoreError | Transient, Exclude<R, Transaction>> =>
      Effect.uninterruptibleMask((restore) =>
        Effect.flatMap(restore(open), (session) => {
          const { handle, tx } = session
          return restore(Effect.gen(function*() {
            const exit = yield* Effect.exit(
              Effect.provideService(work, Transaction, { store: STORE, handle }).pipe(
                Effect.ensuring(Effect.sync(() => {
                  handle.open = false
                }))
              )
            )
            const interrupted = Exit.isFailure(exit) && Cause.isInterruptedOnly(exit.cause)
            if (!handle.alive() && !interrupted) return yield* lostConnection(handle)
            if (Exit.isFailure(exit)) {
              if (handle.transient !== undefined && !interrupted) {
                return yield* new Transient({ error: handle.transient })
              }
              return yield* exit
            }
            const stored = yield* onUnit(handle, () => storePosition(tx, handle, unit))
            if (stored === undefined) return yield* fenced(tx, handle, unit)
            // Once COMMIT is sent, its answer is awaited: an interruption now could not undo it.
            yield* Effect.uninterruptible(
              commitSession(session, stored.written).pipe(
                Effect.catchIf(isTransientError, (transient) =>
                  handle.lost === undefined ? Effect.fail(transient) : settle(stored.xid, transient))
              )
            )
            return exit.value
          })).pipe(Effect.onExit((exit) => Exit.isSuccess(exit) ? Effect.void : rollback(session)))
        })
      )

    // A unit whose failure passes is run again whole: its writes were rolled back, and the work is an effect.
    const commit = <A, E, R>(
      unit: CommitUnit,
      work: Effect.Effect<A, E, R>
    ): Effect.Effect<A, E | OffsetStoreError | Fenced, Exclude<R, Transaction>> =>
      retrying("commit", attempt(unit, work))

    return { name: STORE, load, claim, commit }
  })

/**
 * The Postgres offset store. Options are checked before anything connects (a bad `table` or `schema` fails with a
 * `InvalidConfig` naming it); the layer then checks that the server answers, and creates or upgrades the table when
 * `migrate: true`.
 *
 * Each unit runs in a transaction begun with an explicit isolation level, `read committed` unless `isolationLevel`
 * says otherwise. Read committed is what the owner-epoch fence needs: the unit's conditional UPDATE of its position,
 * when it finds the row locked by a claim, waits and then checks `epoch` again on the row's newest version, so a
 * claim that committed first fences the unit, and a claim that comes second waits for the unit and returns its
 * position. Under `repeatable read` or `serializable` the fence holds too, but such a conflict fails the unit with a
 * serialization failure, which costs a retry before the unit is fenced.
 *
 * Failures that pass are retried on `retry`, for at most `retryFor`: a lost or refused connection, the server
 * shutting down or starting, a serialization failure, a deadlock. A unit is run again whole (BEGIN, the work, the
 * position, COMMIT). A unit whose connection is lost during COMMIT is not run again before the server says it did not
 * commit. `Fenced` and the work's own failures are never retried. After `retryFor`, the operation fails with an
 * `OffsetStoreError` naming it and the last failure.
 *
 * @since 0.1.0
 * @category layers
 */
export const layer = (options: Options): Layer.Layer<OffsetStore, InvalidConfig | OffsetStoreError> =>
  Layer.scoped(OffsetStore, make(options))

/**
 * {@link layer} with the connection URL read from `DATABASE_URL` through effect's `Config`.
 *
 * @since 0.1.0
 * @category layers
 */
export const layerConfig = (
  options: Omit<Options, "url" | "sql"> = {}
): Layer.Layer<OffsetStore, InvalidConfig | OffsetStoreError> =>
  Layer.unwrapEffect(
    Config.redacted("DATABASE_URL").pipe(
      Effect.mapError((error) =>
        new InvalidConfig({
          field: "DATABASE_URL",
          reason: `${
            EffectConfigError.isMissingDataOnly(error) ? "is not set" : "cannot be read"
          }; set it to a Postgres URL such as postgres://postgres@127.0.0.1:5432/test`
        })
      ),
      Effect.map((url) => layer({ ...options, url }))
    )
  )
