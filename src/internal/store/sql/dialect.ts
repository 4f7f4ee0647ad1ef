/**
 * What differs between the databases the `@effect/sql` store runs on: quoting, placeholders, how a number is read
 * as text, how a transaction begins, how a row is locked, and the upsert of a claim. MySQL and MariaDB, Postgres and
 * SQLite; the store refuses the others when its layer starts.
 */

/** The dialects the store speaks, by `@effect/sql`'s names for them. @internal */
export type Dialect = "mysql" | "pg" | "sqlite"

/** @internal */
export const DIALECTS: ReadonlyArray<Dialect> = ["mysql", "pg", "sqlite"]

/** @internal */
export type IsolationLevel = "read committed" | "repeatable read" | "serializable"

/** @internal */
export const ISOLATION_LEVELS: ReadonlyArray<IsolationLevel> = ["read committed", "repeatable read", "serializable"]

/** @internal */
export const databaseName = (dialect: Dialect): string =>
  dialect === "mysql" ? "MySQL/MariaDB" : dialect === "pg" ? "Postgres" : "SQLite"

/** A quoted identifier; the names given to it are checked to be plain identifiers first. @internal */
export const quote = (dialect: Dialect, name: string): string => dialect === "mysql" ? `\`${name}\`` : `"${name}"`

/** The `partition` column, a reserved word in MySQL. @internal */
export const partitionColumn = (dialect: Dialect): string => quote(dialect, "partition")

/** A table name, with its schema (a database, on MySQL) when given. @internal */
export const tableName = (dialect: Dialect, table: string, schema: string | undefined): string =>
  schema === undefined ? quote(dialect, table) : `${quote(dialect, schema)}.${quote(dialect, table)}`

/**
 * Statements are written with `?` placeholders; Postgres numbers them. None of the store's statements has a `?`
 * anywhere else.
 *
 * @internal
 */
export const placeholders = (dialect: Dialect, text: string): string => {
  if (dialect !== "pg") return text
  let n = 0
  return text.replace(/\?/g, () => `$${++n}`)
}

/** A 64-bit column read as text, so that no client turns it into a number that loses digits. @internal */
export const asText = (dialect: Dialect, column: string): string =>
  dialect === "mysql" ? `cast(${column} as char)` : `cast(${column} as text)`

/** @internal */
export const now = (dialect: Dialect): string =>
  dialect === "mysql" ? "current_timestamp(3)" : dialect === "pg" ? "now()" : "strftime('%Y-%m-%dT%H:%M:%fZ')"

/**
 * The statements that begin a unit's transaction. SQLite's takes the database's write lock at once, so that a unit
 * never fails halfway for another writer (`BEGIN IMMEDIATE` waits, up to the connection's busy timeout).
 *
 * @internal
 */
export const begin = (dialect: Dialect, isolationLevel: IsolationLevel | undefined): ReadonlyArray<string> => {
  switch (dialect) {
    case "mysql":
      return isolationLevel === undefined
        ? ["start transaction"]
        : [`set transaction isolation level ${isolationLevel}`, "start transaction"]
    case "pg":
      return [isolationLevel === undefined ? "begin" : `begin isolation level ${isolationLevel}`]
    case "sqlite":
      return ["begin immediate"]
  }
}

/** Locks the rows a select reads until the transaction ends (SQLite's transaction holds the whole database). @internal */
export const forUpdate = (dialect: Dialect): string => dialect === "sqlite" ? "" : " for update"

/**
 * Locks and reads a row, waiting for a transaction that holds it to end: what the store reads once COMMIT's answer
 * was lost, so that it sees that transaction's outcome and not an older version.
 *
 * @internal
 */
export const forShare = (dialect: Dialect): string =>
  dialect === "mysql" ? " lock in share mode" : dialect === "pg" ? " for share" : ""

/**
 * The table, created if it does not exist. On Postgres it is the table `PgOffsetStore` keeps, with the column a unit
 * names itself in (`unit_id`), so that a group can move between the two stores.
 *
 * @internal
 */
export const createTable = (dialect: Dialect, table: string): string => {
  switch (dialect) {
    case "mysql":
      return `create table if not exists ${table} (
        group_id varchar(255) not null,
        topic varchar(255) not null,
        \`partition\` int not null,
        next_offset bigint null,
        epoch bigint not null default 0,
        finished longtext null,
        unit_id varchar(64) null,
        updated_at timestamp(3) not null default current_timestamp(3),
        primary key (group_id, topic, \`partition\`)
      ) engine = InnoDB`
    case "pg":
      return `create table if not exists ${table} (
        group_id text not null,
        topic text not null,
        partition integer not null,
        next_offset bigint,
        epoch bigint not null default 0,
        finished text,
        unit_id text,
        updated_at timestamptz not null default now(),
        primary key (group_id, topic, partition)
      )`
    case "sqlite":
      return `create table if not exists ${table} (
        group_id text not null,
        topic text not null,
        "partition" integer not null,
        next_offset integer,
        epoch integer not null default 0,
        finished text,
        unit_id text,
        updated_at text not null default (strftime('%Y-%m-%dT%H:%M:%fZ')),
        primary key (group_id, topic, "partition")
      )`
  }
}
