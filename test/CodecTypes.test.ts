/**
 * What the codecs' types promise, checked by the compiler: an encoder's schemas encode to what Kafka carries (bytes,
 * a string or null; headers of bytes or strings), and a schema that encodes to anything else does not compile.
 */
import { assert, describe, expectTypeOf, it } from "@effect/vitest"
import * as Effect from "effect/Effect"
import type * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import * as Codec from "../src/Codec.js"
import { type DecodeFailed, EncodeFailed } from "../src/KafkaError.js"
import type { ProducerRecord } from "../src/Producer.js"

const Order = Schema.Struct({ id: Schema.Number, item: Schema.String })

describe("Codec in the types", () => {
  it.effect("schemas that encode to bytes, a string or null compile, and their records are typed by them", () =>
    Effect.gen(function*() {
      const encode = Codec.encoder({
        key: Schema.NullOr(Codec.string),
        value: Codec.json(Order),
        headers: Schema.Struct({ "trace-id": Schema.String, raw: Codec.bytes })
      })
      expectTypeOf(encode).parameter(0).toHaveProperty("key").toEqualTypeOf<string | null>()
      expectTypeOf(encode).parameter(0).toHaveProperty("value").toEqualTypeOf<{
        readonly id: number
        readonly item: string
      }>()
      expectTypeOf(encode).returns.toEqualTypeOf<Effect.Effect<ProducerRecord, EncodeFailed, never>>()
      const record = yield* encode({
        topic: "orders",
        key: null,
        value: { id: 1, item: "tea" },
        headers: { "trace-id": "t-1", raw: new Uint8Array([1]) }
      })
      assert.isNull(record.key)
      assert.deepStrictEqual(record.headers, { "trace-id": "t-1", raw: new Uint8Array([1]) })
      // Strings are carried as they are (written as UTF-8), so a plain `Schema.String` key is fine.
      Codec.encoder({ key: Schema.String, value: Schema.NullOr(Schema.String) })
    }))

  it("a schema whose encoded side Kafka cannot carry does not compile", () => {
    // @ts-expect-error a number key is not bytes, a string or null
    Codec.encoder({ key: Schema.Number })
    // @ts-expect-error a value encoded to an object (not yet to JSON text) is not carried
    Codec.encoder({ value: Order })
    // @ts-expect-error a bigint value
    Codec.encoder({ key: Codec.string, value: Schema.BigIntFromSelf })
    // @ts-expect-error a header encoded to a number
    Codec.encoder({ headers: Schema.Struct({ attempts: Schema.Number }) })
    // @ts-expect-error headers that may encode to undefined: the header would be lost
    Codec.encoder({ headers: Schema.Struct({ "trace-id": Schema.optional(Schema.String) }) })
    // @ts-expect-error a schema whose encoded side could be anything
    Codec.encoder({ value: Schema.Unknown })
    // The same header, absent rather than undefined, is carried.
    Codec.encoder({ headers: Schema.Struct({ "trace-id": Schema.optionalWith(Schema.String, { exact: true }) }) })

    expectTypeOf<Codec.Writable<{ readonly key: typeof Schema.Number }>>().toEqualTypeOf<{
      readonly key: "the key schema must encode to Uint8Array, string or null"
    }>()
    expectTypeOf<Codec.Writable<{ readonly key: typeof Codec.string }>>().toEqualTypeOf<{
      readonly key: typeof Codec.string
    }>()
  })

  it("DecodeFailed and EncodeFailed carry the Schema's ParseError", () => {
    expectTypeOf<DecodeFailed["cause"]>().toEqualTypeOf<ParseResult.ParseError>()
    expectTypeOf<EncodeFailed["cause"]>().toEqualTypeOf<ParseResult.ParseError>()
    expectTypeOf<DecodeFailed["reason"]>().toEqualTypeOf<string>()
  })
})
