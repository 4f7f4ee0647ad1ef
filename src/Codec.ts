/**
 * Typed records: Effect `Schema`s for a record's key, value and headers, the same on both sides. The consumer decodes
 * with them (`Consumer.decoded`), the producer encodes with them (`encoder`). Codecs for the usual wire formats are
 * here: `bytes`, `string` (UTF-8) and `json(schema)`.
 *
 * A record that does not decode is a `DecodeFailed` naming the field and the path in it; the consumer routes it as
 * its failure route says, never drops it.
 *
 * @since 0.1.0
 */
import * as Effect from "effect/Effect"
import * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import type { ConsumerRecord } from "./ConsumerRecord.js"
import { DecodeFailed, EncodeFailed } from "./KafkaError.js"
import type { ProducerRecord } from "./Producer.js"

/**
 * Bytes as they are.
 *
 * @since 0.1.0
 * @category codecs
 */
export const bytes: Schema.Schema<Uint8Array> = Schema.Uint8ArrayFromSelf

const strictUtf8 = new TextDecoder("utf-8", { fatal: true })
const textEncoder = new TextEncoder()

/**
 * Text as UTF-8. Bytes that are not valid UTF-8 do not decode (no replacement characters: a value that is not text
 * is an error, not a string).
 *
 * @since 0.1.0
 * @category codecs
 */
export const string: Schema.Schema<string, Uint8Array> = Schema.transformOrFail(
  Schema.Uint8ArrayFromSelf,
  Schema.String,
  {
    strict: true,
    decode: (input, _options, ast) => {
      try {
        return ParseResult.succeed(strictUtf8.decode(input))
      } catch {
        return ParseResult.fail(new ParseResult.Type(ast, input, `${input.length} bytes that are not valid UTF-8`))
      }
    },
    encode: (text) => ParseResult.succeed(textEncoder.encode(text))
  }
)

/**
 * JSON text in UTF-8, parsed and then decoded by `schema`.
 *
 * @example
 * ```ts
 * import { Codec } from "effect-kafka-delivery"
 * import * as Schema from "effect/Schema"
 *
 * const Payment = Schema.Struct({ id: Schema.String, cents: Schema.Number })
 * const bytes = new TextEncoder().encode(JSON.stringify({ id: "p-1", cents: 1250 }))
 * assert.deepStrictEqual(Schema.decodeUnknownSync(Codec.json(Payment))(bytes), { id: "p-1", cents: 1250 })
 * ```
 *
 * @since 0.1.0
 * @category codecs
 */
export const json = <A, I, R>(schema: Schema.Schema<A, I, R>): Schema.Schema<A, Uint8Array, R> =>
  Schema.compose(string, Schema.parseJson(schema))

/**
 * Schemas for the parts of a record; a part without one stays as bytes. The key's schema is given `null` for a record
 * without a key (use `Schema.NullOr` to accept one), the value's `null` for a tombstone, the headers' a record of
 * header names to bytes.
 *
 * @since 0.1.0
 * @category models
 */
export interface RecordSchemas {
  // Any encoded side is accepted here: `decoder` checks the bytes it is given when decoding, and `encoder` narrows
  // this to what Kafka carries (`Writable`).
  readonly key?: Schema.Schema<any, any, any> | undefined
  readonly value?: Schema.Schema<any, any, any> | undefined
  readonly headers?: Schema.Schema<any, any, any> | undefined
}

type Part<S, F extends keyof RecordSchemas, Raw> = S extends { readonly [K in F]: infer X }
  ? X extends Schema.Schema.All ? Schema.Schema.Type<X> : Raw
  : Raw

/**
 * The services the schemas need.
 *
 * @since 0.1.0
 * @category models
 */
export type Context<S extends RecordSchemas> = {
  [F in keyof S]-?: S[F] extends Schema.Schema.All ? Schema.Schema.Context<S[F]> : never
}[keyof S]

/**
 * A record decoded: its parts as the schemas give them, and the record as fetched in `record`.
 *
 * @since 0.1.0
 * @category models
 */
export interface Decoded<S extends RecordSchemas> {
  readonly topic: string
  readonly partition: number
  readonly offset: bigint
  readonly timestamp: number
  readonly key: Part<S, "key", Uint8Array | null>
  readonly value: Part<S, "value", Uint8Array | null>
  readonly headers: Part<S, "headers", Readonly<Record<string, Uint8Array>>>
  readonly record: ConsumerRecord
}

/**
 * Decodes records with `schemas`; a part that does not decode fails with `DecodeFailed` naming it.
 *
 * @since 0.1.0
 * @category decoding
 */
export const decoder = <const S extends RecordSchemas>(
  schemas: S
): (record: ConsumerRecord) => Effect.Effect<Decoded<S>, DecodeFailed, Context<S>> => {
  const part = (field: "key" | "value" | "headers") => {
    const schema = schemas[field]
    if (schema === undefined) return undefined
    const decode = Schema.decodeUnknown(schema)
    return (record: ConsumerRecord, input: unknown): Effect.Effect<unknown, DecodeFailed, unknown> =>
      Effect.mapError(decode(input), (error) =>
        new DecodeFailed({
          topic: record.topic,
          partition: record.partition,
          offset: record.offset,
          field,
          cause: error
        }))
  }
  const key = part("key")
  const value = part("value")
  const headers = part("headers")
  return (record) =>
    Effect.gen(function*() {
      const decoded = {
        topic: record.topic,
        partition: record.partition,
        offset: record.offset,
        timestamp: record.timestamp,
        key: key === undefined ? record.key : yield* key(record, record.key),
        value: value === undefined ? record.value : yield* value(record, record.value),
        headers: headers === undefined ? record.headers : yield* headers(record, record.headers),
        record
      }
      return decoded as Decoded<S>
    }) as Effect.Effect<Decoded<S>, DecodeFailed, Context<S>>
}

/**
 * What Kafka carries in each part of a record the producer writes: a key of bytes, text (written as UTF-8) or none, a
 * value of bytes, text or `null` (a tombstone), headers of bytes or text each. An encoder's schemas must encode to
 * these.
 *
 * @since 0.2.0
 * @category models
 */
export interface Carried {
  readonly key: Uint8Array | string | null | undefined
  readonly value: Uint8Array | string | null
  readonly headers: Readonly<Record<string, Uint8Array | string>>
}

/**
 * What a part's schema is told when its encoded side is not what Kafka carries.
 *
 * @since 0.2.0
 * @category models
 */
export type NotCarried<F extends keyof Carried> = F extends "headers"
  ? "the headers schema must encode to an object of header names to Uint8Array or string"
  : `the ${F} schema must encode to Uint8Array, string or null`

/**
 * The schemas, with each one whose encoded side Kafka cannot carry replaced by {@link NotCarried}: what `encoder`
 * asks for, so that such a schema does not compile.
 *
 * @since 0.2.0
 * @category models
 */
export type Writable<S extends RecordSchemas> = {
  readonly [F in keyof S]: F extends keyof Carried
    ? [Schema.Schema.Encoded<Exclude<S[F], undefined>>] extends [Carried[F]] ? S[F] : NotCarried<F>
    : S[F]
}

/**
 * A record to write, its parts as the schemas take them.
 *
 * @since 0.1.0
 * @category models
 */
export interface Encodable<S extends RecordSchemas> {
  readonly topic: string
  readonly key: Part<S, "key", Uint8Array | string | null | undefined>
  readonly value: Part<S, "value", Uint8Array | string | null>
  readonly headers?: Part<S, "headers", Readonly<Record<string, Uint8Array | string>>> | undefined
  readonly partition?: number | undefined
  readonly timestamp?: number | undefined
}

const isText = (u: unknown): u is Uint8Array | string => u instanceof Uint8Array || typeof u === "string"

const isPlainObject = (u: unknown): u is object => {
  if (typeof u !== "object" || u === null) return false
  const prototype = Object.getPrototypeOf(u)
  return prototype === Object.prototype || prototype === null
}

const headerValues = Schema.validate(
  Schema.Record({ key: Schema.String, value: Schema.declare(isText, { identifier: "Uint8Array | string" }) })
)
const plainObject = Schema.validate(Schema.declare(isPlainObject, { identifier: "a plain object of headers" }))

/**
 * The encoded side of each part, checked once more for a caller that got past the types: anything else would be sent
 * as something it is not, or not at all (a number, a `Map` of headers, whose entries are not its properties).
 */
const carried: Record<keyof Carried, (encoded: unknown) => Effect.Effect<unknown, ParseResult.ParseError>> = {
  key: Schema.validate(
    Schema.declare((u): u is Carried["key"] => u == null || isText(u), { identifier: "Uint8Array | string | null" })
  ),
  value: Schema.validate(
    Schema.declare((u): u is Carried["value"] => u === null || isText(u), { identifier: "Uint8Array | string | null" })
  ),
  headers: (encoded) => Effect.zipRight(plainObject(encoded), headerValues(encoded))
}

/**
 * Encodes records with `schemas`, for `Producer.send`; a part that does not encode fails with `EncodeFailed` naming
 * it. Parts without a schema are written as given. Each schema must encode to what Kafka carries ({@link Carried}):
 * one that does not, a number key say, does not compile, and fails with `EncodeFailed` when the types are bypassed.
 *
 * @since 0.1.0
 * @category encoding
 */
export const encoder = <const S extends RecordSchemas>(
  schemas: S & Writable<S>
): (record: Encodable<S>) => Effect.Effect<ProducerRecord, EncodeFailed, Context<S>> => {
  const part = (field: "key" | "value" | "headers") => {
    const schema: Schema.Schema<any, any, any> | undefined = schemas[field]
    if (schema === undefined) return undefined
    const encode = Schema.encode(schema)
    const check = carried[field]
    return (topic: string, input: unknown): Effect.Effect<unknown, EncodeFailed, unknown> =>
      Effect.mapError(Effect.tap(encode(input), check), (cause) => new EncodeFailed({ topic, field, cause }))
  }
  const key = part("key")
  const value = part("value")
  const headers = part("headers")
  return (record) =>
    Effect.gen(function*() {
      const encoded: ProducerRecord = {
        topic: record.topic,
        key: (key === undefined ? record.key : yield* key(record.topic, record.key)) as ProducerRecord["key"],
        value:
          (value === undefined ? record.value : yield* value(record.topic, record.value)) as ProducerRecord["value"],
        headers: (headers === undefined || record.headers === undefined
          ? record.headers
          : yield* headers(record.topic, record.headers)) as ProducerRecord["headers"],
        partition: record.partition,
        timestamp: record.timestamp
      }
      return encoded
    }) as Effect.Effect<ProducerRecord, EncodeFailed, Context<S>>
}
