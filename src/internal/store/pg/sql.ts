/**
 * How the Postgres store talks to the server: statements prepared, array parameters as text, rows read as text.
 */
import * as Schema from "effect/Schema"

/**
 * `unsafe` with parameters is otherwise sent unprepared, which costs a round trip of its own to describe the statement
 * every time. Prepared, it is described once per connection. A client set up with `prepare: false` (for a pooler in
 * transaction mode) keeps its setting.
 *
 * @internal
 */
export const prepared = { prepare: true }

/**
 * Array parameters are sent as Postgres array literals in text (`{"a","b"}`, cast in the statement), so that they do
 * not depend on the client having fetched the server's array types: a client given as `sql` may be set up with
 * `fetch_types: false` (see `Options.sql`).
 *
 * @internal
 */
export const arrayLiteral = (values: ReadonlyArray<string | number>): string =>
  `{${values.map((v) => typeof v === "number" ? String(v) : `"${v.replace(/[\\"]/g, (c) => `\\${c}`)}"`).join(",")}}`

// Rows are read as arrays of text, whatever parsers or column transforms a client passed in `sql` was set up with.

/** @internal */
export const decodePositions = Schema.decodeUnknownSync(
  Schema.Array(Schema.Tuple(Schema.String, Schema.String, Schema.String))
)
/** @internal */
export const decodeClaims = Schema.decodeUnknownSync(
  Schema.Array(
    Schema.Tuple(
      Schema.String,
      Schema.String,
      Schema.NullOr(Schema.String),
      Schema.String,
      Schema.NullOr(Schema.String)
    )
  )
)
/** @internal */
export const decodeText = Schema.decodeUnknownSync(Schema.Array(Schema.Tuple(Schema.NullOr(Schema.String))))
/** @internal */
export const decodeLocked = Schema.decodeUnknownSync(
  Schema.Array(Schema.Tuple(Schema.NullOr(Schema.String), Schema.NullOr(Schema.String), Schema.String))
)

/** @internal */
export const decodeColumns = Schema.decodeUnknownSync(Schema.Array(Schema.Tuple(Schema.String, Schema.Boolean)))

/** @internal */
export const quote = (identifier: string): string => `"${identifier}"`
