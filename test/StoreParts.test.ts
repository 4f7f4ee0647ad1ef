/**
 * The Postgres store's options are declared twice: in `PgOffsetStore`, where users read them, and inside the store,
 * which must not import the public module. The type-level lines are checked by `tsc` (part of `npm test`): a field
 * added to, dropped from or changed in one of them and not the other fails the type check.
 */
import { describe, expectTypeOf, it } from "@effect/vitest"
import type * as pgClient from "../src/internal/store/pg/client.js"
import type * as PgOffsetStore from "../src/PgOffsetStore.js"

describe("the Postgres store's options", () => {
  it("are inside the store what PgOffsetStore declares", () => {
    expectTypeOf<PgOffsetStore.Options>().toEqualTypeOf<pgClient.Options>()
    expectTypeOf<PgOffsetStore.IsolationLevel>().toEqualTypeOf<pgClient.IsolationLevel>()
  })
})
