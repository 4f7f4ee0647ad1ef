/**
 * examples/support/sqlite.ts: the SqlClient over node:sqlite that the examples, the semantics lab and the tests use.
 * One connection shared by every fiber, so a transaction holds it alone, and a statement outside a transaction waits
 * for another fiber's open transaction rather than joining it.
 */
import * as Reactivity from "@effect/experimental/Reactivity"
import * as SqlClient from "@effect/sql/SqlClient"
import { SqlError } from "@effect/sql/SqlError"
import { assert, describe, it } from "@effect/vitest"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Option from "effect/Option"
import * as Ref from "effect/Ref"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import * as Sqlite from "../examples/support/sqlite.js"
import { runScript } from "./support/examples.js"

/** A fresh directory, removed when the scope closes. */
const tempDir = Effect.acquireRelease(
  Effect.sync(() => Fs.mkdtempSync(Path.join(Os.tmpdir(), "sqlite-client-"))),
  (dir) => Effect.sync(() => Fs.rmSync(dir, { recursive: true, force: true }))
)

/** A client on a new file with table `items`, closed when the scope closes. */
const withItems = Effect.gen(function*() {
  const filename = Path.join(yield* tempDir, "test.db")
  const sql = yield* Effect.provide(Sqlite.make({ filename }), Reactivity.layer)
  yield* sql`create table items (id integer primary key autoincrement, name text not null unique)`
  return { sql, filename }
})

const names = (sql: SqlClient.SqlClient) =>
  Effect.map(sql<{ name: string }>`select name from items order by id`, (rows) => rows.map((row) => row.name))

const insert = (sql: SqlClient.SqlClient, name: string) => sql`insert into items (name) values (${name})`

/** Lets every other fiber that is ready run until it suspends. */
const settle = Effect.repeatN(Effect.yieldNow(), 50)

describe("SqliteClient (node:sqlite)", () => {
  it.scoped("an insert and a select round-trip every parameter type, on a file in WAL mode", () =>
    Effect.gen(function*() {
      const filename = Path.join(yield* tempDir, "round-trip.db")
      const sql = yield* Effect.provide(Sqlite.make({ filename }), Reactivity.layer)
      yield* sql`create table t (id integer primary key, s text, n real, big integer, yes integer, no integer,
        bytes blob, absent text)`
      yield* sql`insert into t ${
        sql.insert({
          id: 1,
          s: "text",
          n: 1.5,
          big: 9007199254740991n,
          yes: true,
          no: false,
          bytes: new Uint8Array([0, 1, 255]),
          absent: null
        })
      }`
      const rows = yield* sql`select * from t`
      assert.deepStrictEqual(rows, [{
        id: 1,
        s: "text",
        n: 1.5,
        big: 9007199254740991,
        yes: 1,
        no: 0,
        bytes: new Uint8Array([0, 1, 255]),
        absent: null
      }])
      assert.strictEqual(Object.getPrototypeOf(rows[0]), Object.prototype, "rows are plain objects")
      assert.deepStrictEqual(yield* sql`select id, s from t where id = ${1}`.values, [[1, "text"]])
      assert.deepStrictEqual(yield* sql`pragma journal_mode`, [{ journal_mode: "wal" }])
      assert.deepStrictEqual(yield* sql`pragma busy_timeout`, [{ timeout: 5000 }])
      assert.isTrue(Fs.existsSync(filename))
      // A second connection (as another process would open it) sees the committed row.
      const other = yield* Effect.provide(Sqlite.make({ filename, busyTimeoutMillis: 100 }), Reactivity.layer)
      assert.deepStrictEqual(yield* other`select s from t`, [{ s: "text" }])
      assert.deepStrictEqual(yield* other`pragma busy_timeout`, [{ timeout: 100 }])
    }))

  it.scoped("an in-memory database stays out of WAL mode; raw gives the changes of a write", () =>
    Effect.gen(function*() {
      const sql = yield* Effect.provide(Sqlite.make({ filename: ":memory:" }), Reactivity.layer)
      assert.deepStrictEqual(yield* sql`pragma journal_mode`, [{ journal_mode: "memory" }])
      yield* sql`create table t (x integer)`
      const raw = (yield* sql`insert into t values (${1}), (${2})`.raw) as { changes: number }
      assert.strictEqual(raw.changes, 2)
      assert.deepStrictEqual(yield* sql`select x from t order by x`.raw, [{ x: 1 }, { x: 2 }])
    }))

  it.scoped("a rolled-back transaction leaves nothing", () =>
    Effect.gen(function*() {
      const { sql } = yield* withItems
      const error = yield* sql.withTransaction(
        Effect.zipRight(Effect.zipRight(insert(sql, "a"), insert(sql, "b")), Effect.fail("undo" as const))
      ).pipe(Effect.flip)
      assert.strictEqual(error, "undo")
      assert.deepStrictEqual(yield* names(sql), [])
      // The connection is free again.
      yield* sql.withTransaction(insert(sql, "c"))
      assert.deepStrictEqual(yield* names(sql), ["c"])
    }))

  it.scoped("a nested withTransaction that fails rolls back its savepoint only", () =>
    Effect.gen(function*() {
      const { sql } = yield* withItems
      yield* sql.withTransaction(Effect.gen(function*() {
        yield* insert(sql, "outer before")
        const inner = yield* sql.withTransaction(
          Effect.zipRight(insert(sql, "inner"), Effect.fail("undo inner" as const))
        ).pipe(Effect.flip)
        assert.strictEqual(inner, "undo inner")
        yield* insert(sql, "outer after")
      }))
      assert.deepStrictEqual(yield* names(sql), ["outer before", "outer after"])
    }))

  it.scoped("two fibers' transactions do not interleave: both commit, each one's rows together", () =>
    Effect.gen(function*() {
      const { sql } = yield* withItems
      const events = yield* Ref.make<ReadonlyArray<string>>([])
      const log = (event: string) => Ref.update(events, (all) => [...all, event])
      const transaction = (tag: string) =>
        Effect.zipRight(
          log(`${tag} starts`),
          sql.withTransaction(Effect.gen(function*() {
            yield* log(`${tag} open`)
            yield* insert(sql, `${tag}1`)
            yield* Effect.yieldNow()
            yield* settle
            yield* insert(sql, `${tag}2`)
            yield* log(`${tag} ends`)
          }))
        )
      yield* Effect.all([transaction("A"), transaction("B")], { concurrency: "unbounded", discard: true })

      const rows = yield* names(sql)
      assert.strictEqual(rows.length, 4)
      assert.oneOf(rows.join(","), ["A1,A2,B1,B2", "B1,B2,A1,A2"])
      // They did run at the same time: the second asked for the connection while the first held it.
      const log_ = yield* Ref.get(events)
      const [first, second] = log_[0] === "A starts" ? ["A", "B"] : ["B", "A"]
      assert.deepStrictEqual(log_, [
        `${first} starts`,
        `${first} open`,
        `${second} starts`,
        `${first} ends`,
        `${second} open`,
        `${second} ends`
      ])
    }))

  it.scoped("a statement outside a transaction waits for another fiber's and is not rolled back with it", () =>
    Effect.gen(function*() {
      const { sql } = yield* withItems
      const opened = yield* Deferred.make<void>()
      const finish = yield* Deferred.make<void>()
      const transaction = yield* sql.withTransaction(Effect.gen(function*() {
        yield* insert(sql, "in the transaction")
        yield* Deferred.succeed(opened, undefined)
        yield* Deferred.await(finish)
        return yield* Effect.fail("undo" as const)
      })).pipe(Effect.fork)
      yield* Deferred.await(opened)

      const outside = yield* Effect.fork(insert(sql, "outside"))
      yield* settle
      assert.isTrue(Option.isNone(yield* Fiber.poll(outside)), "the outside statement waits for the transaction")

      yield* Deferred.succeed(finish, undefined)
      const error = yield* Fiber.join(transaction).pipe(Effect.flip)
      assert.strictEqual(error, "undo")
      yield* Fiber.join(outside)
      assert.deepStrictEqual(yield* names(sql), ["outside"])
    }))

  it.scoped("a reserved connection holds it as a transaction does", () =>
    Effect.gen(function*() {
      const { sql } = yield* withItems
      const release = yield* Deferred.make<void>()
      const reserved = yield* Effect.fork(Effect.scoped(Effect.gen(function*() {
        const connection = yield* sql.reserve
        yield* connection.execute("insert into items (name) values (?)", ["reserved"], undefined)
        yield* Deferred.await(release)
      })))
      yield* settle
      const outside = yield* Effect.fork(insert(sql, "outside"))
      yield* settle
      assert.isTrue(Option.isNone(yield* Fiber.poll(outside)))
      yield* Deferred.succeed(release, undefined)
      yield* Fiber.join(reserved)
      yield* Fiber.join(outside)
      assert.deepStrictEqual(yield* names(sql), ["reserved", "outside"])
    }))

  it.scoped("a constraint violation is a SqlError whose cause carries SQLite's code", () =>
    Effect.gen(function*() {
      const { sql } = yield* withItems
      yield* insert(sql, "a")
      const error = yield* insert(sql, "a").pipe(Effect.flip)
      assert.instanceOf(error, SqlError)
      assert.strictEqual(error._tag, "SqlError")
      assert.include(error.message, "UNIQUE constraint failed: items.name")
      assert.include(error.message, "insert into items")
      const cause = error.cause as { code: string; errcode: number; errstr: string }
      assert.instanceOf(cause, Error)
      assert.strictEqual(cause.code, "ERR_SQLITE_ERROR")
      // node:sqlite gives the extended code: SQLITE_CONSTRAINT_UNIQUE (19 | 8 << 8). Its primary code is 19.
      assert.strictEqual(cause.errcode, 2067)
      assert.strictEqual(cause.errcode & 0xff, 19)
      assert.strictEqual(Sqlite.primaryCode(error), 19)
      assert.strictEqual(cause.errstr, "constraint failed")

      const notNull = yield* sql`insert into items (name) values (${null})`.pipe(Effect.flip)
      assert.strictEqual(Sqlite.primaryCode(notNull), 19)
      // Inside a transaction too; the transaction rolls back.
      const inTransaction = yield* sql.withTransaction(Effect.zipRight(insert(sql, "b"), insert(sql, "a"))).pipe(
        Effect.flip
      )
      assert.strictEqual(Sqlite.primaryCode(inTransaction), 19)
      assert.deepStrictEqual(yield* names(sql), ["a"])
    }))

  it.scoped("a write while another connection writes fails with SQLITE_BUSY (5) once the busy timeout is over", () =>
    Effect.gen(function*() {
      const { filename, sql } = yield* withItems
      // A timeout of 0: in one process, a wait would block the thread that must end the other transaction.
      const other = yield* Effect.provide(Sqlite.make({ filename, busyTimeoutMillis: 0 }), Reactivity.layer)
      const opened = yield* Deferred.make<void>()
      const finish = yield* Deferred.make<void>()
      const transaction = yield* sql.withTransaction(Effect.gen(function*() {
        yield* insert(sql, "first")
        yield* Deferred.succeed(opened, undefined)
        yield* Deferred.await(finish)
      })).pipe(Effect.fork)
      yield* Deferred.await(opened)
      // Outside the transaction's fiber: inside it, any client's statement would run on the transaction's connection
      // (@effect/sql's TransactionConnection is one tag for every client).
      const error = yield* Effect.flip(insert(other, "second"))
      assert.instanceOf(error, SqlError)
      assert.strictEqual(Sqlite.primaryCode(error), 5)
      assert.strictEqual((error.cause as { errstr: string }).errstr, "database is locked")
      yield* Deferred.succeed(finish, undefined)
      yield* Fiber.join(transaction)
      assert.deepStrictEqual(yield* names(other), ["first"])
    }))

  it.scoped("layer provides a client, and a bad file name fails as SqlError", () =>
    Effect.gen(function*() {
      const dir = yield* tempDir
      const count = yield* Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        yield* sql`create table t (x integer)`
        yield* sql.withTransaction(sql`insert into t values (${1})`)
        return (yield* sql<{ n: number }>`select count(*) as n from t`)[0]!.n
      }).pipe(Effect.provide(Sqlite.layer({ filename: Path.join(dir, "layer.db") })))
      assert.strictEqual(count, 1)

      const error = yield* Effect.flip(
        Effect.provide(SqlClient.SqlClient, Sqlite.layer({ filename: Path.join(dir, "missing", "x.db") }))
      )
      assert.instanceOf(error, SqlError)
      assert.include(error.message, "Failed to open SQLite database")
    }))
})

describe("SqliteClient on each runtime's node:sqlite", () => {
  for (const runtime of ["node", "deno", "bun"] as const) {
    it(runtime, async () => {
      const dir = Fs.mkdtempSync(Path.join(Os.tmpdir(), `sqlite-${runtime}-`))
      try {
        const run = await runScript(runtime, "test/fixtures/sqliteRuntime.ts", [Path.join(dir, "runtime.db")], {
          timeoutMillis: 60_000
        })
        assert.strictEqual(run.code, 0, `exit ${run.code} after ${run.millis} ms\n${run.stdout}\n${run.stderr}`)
        assert.include(run.stdout, `count 2, journal wal, runtime ${runtime}`)
      } finally {
        Fs.rmSync(dir, { recursive: true, force: true })
      }
    }, 90_000)
  }
})
