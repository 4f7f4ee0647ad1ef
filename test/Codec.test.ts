/**
 * The codecs at run time: what Kafka cannot carry is refused with an `EncodeFailed` naming the part even when the
 * types are bypassed, and decoding and encoding errors keep the Schema's `ParseError`, which dead-letter headers
 * still render as readable text.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Layer from "effect/Layer"
import * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import * as Codec from "../src/Codec.js"
import type { ConsumerRecord } from "../src/ConsumerRecord.js"
import * as FailureRoute from "../src/FailureRoute.js"
import * as InMemoryKafka from "../src/InMemoryKafka.js"
import { DecodeFailed, EncodeFailed } from "../src/KafkaError.js"
import * as Producer from "../src/Producer.js"
import type { ProducerRecord } from "../src/Producer.js"
import { readTopic } from "./producerSuite.js"

const bytes = (text: string) => new TextEncoder().encode(text)
const text = (value: Uint8Array | undefined) => new TextDecoder().decode(value)

const recordOf = (fields: Partial<ConsumerRecord>): ConsumerRecord => ({
  topic: "orders",
  partition: 2,
  offset: 41n,
  key: null,
  value: null,
  headers: {},
  timestamp: 0,
  ...fields
})

const Order = Schema.Struct({ id: Schema.Number, item: Schema.String })

/** An encoder as a caller that got past the types calls it (from plain JavaScript, or through a cast). */
const untyped = (schemas: Codec.RecordSchemas) =>
  Codec.encoder(schemas) as (record: unknown) => Effect.Effect<ProducerRecord, EncodeFailed>

/** The EncodeFailed an encoding (and what follows it) was refused with; a test that gets anything else fails. */
const refused = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.map(Effect.either(effect), (outcome) => {
    assert.isTrue(Either.isLeft(outcome), "refused")
    const error = (outcome as Either.Left<E, A>).left
    assert.instanceOf(error, EncodeFailed)
    return error as EncodeFailed
  })

describe("Codec: what Kafka cannot carry is refused at run time", () => {
  it.effect("a key, a value or a header the schema encodes to something else: an EncodeFailed naming it", () =>
    Effect.gen(function*() {
      const numberKey = yield* refused(
        untyped({ key: Schema.Number })({ topic: "orders", key: 7, value: null })
      )
      assert.instanceOf(numberKey, EncodeFailed)
      assert.strictEqual(numberKey.field, "key")
      assert.strictEqual(numberKey.topic, "orders")
      assert.isTrue(ParseResult.isParseError(numberKey.cause))
      assert.include(numberKey.message, "Expected Uint8Array | string | null, actual 7")

      const objectValue = yield* refused(
        untyped({ value: Order })({ topic: "orders", key: null, value: { id: 1, item: "tea" } })
      )
      assert.strictEqual(objectValue.field, "value")
      assert.include(objectValue.reason, `actual {"id":1,"item":"tea"}`)

      const numberHeader = yield* refused(
        untyped({ headers: Schema.Struct({ "trace-id": Schema.String, attempts: Schema.Number }) })({
          topic: "orders",
          key: null,
          value: "v",
          headers: { "trace-id": "t-1", attempts: 3 }
        })
      )
      assert.strictEqual(numberHeader.field, "headers")
      assert.deepStrictEqual(
        ParseResult.ArrayFormatter.formatErrorSync(numberHeader.cause).map((issue) => issue.path),
        [["attempts"]]
      )

      const mapOfHeaders = yield* refused(
        untyped({ headers: Schema.Unknown })({
          topic: "orders",
          key: null,
          value: "v",
          headers: new Map([["trace-id", "t-1"]])
        })
      )
      assert.strictEqual(mapOfHeaders.field, "headers")
      assert.include(mapOfHeaders.reason, "Expected a plain object of headers")
    }))

  it.effect("what is carried goes through unchanged: bytes, strings, null, absent keys, header values of both", () =>
    Effect.gen(function*() {
      const encode = untyped({ key: Schema.Unknown, value: Schema.Unknown, headers: Schema.Unknown })
      const record = yield* encode({
        topic: "orders",
        key: undefined,
        value: bytes("v"),
        headers: { a: "x", b: bytes("y") }
      })
      assert.isUndefined(record.key)
      assert.deepStrictEqual(record.value, bytes("v"))
      assert.deepStrictEqual(record.headers, { a: "x", b: bytes("y") })
      const tombstone = yield* encode({ topic: "orders", key: "k", value: null })
      assert.strictEqual(tombstone.key, "k")
      assert.isNull(tombstone.value)
    }))

  it.effect("a record refused by the encoder is not sent: the topic stays empty", () =>
    Effect.gen(function*() {
      yield* InMemoryKafka.createTopic("numbers", 1)
      const encode = untyped({ key: Schema.Number, value: Codec.string })
      const sent = yield* refused(Effect.flatMap(encode({ topic: "numbers", key: 7, value: "seven" }), Producer.send))
      assert.strictEqual(sent.field, "key")
      assert.deepStrictEqual(yield* readTopic("numbers", 1), [[]])
    }).pipe(Effect.provide(Layer.provideMerge(InMemoryKafka.layerProducer({ linger: 0 }), InMemoryKafka.layer()))))
})

describe("Codec: errors keep the ParseError", () => {
  const decode = Codec.decoder({ key: Codec.string, value: Codec.json(Order) })

  it.effect("DecodeFailed: the ParseError as Schema gave it, its issues by path, the message formatted from it", () =>
    Effect.gen(function*() {
      const record = recordOf({ key: bytes("k"), value: bytes(`{"id":"one","item":"tea"}`) })
      const failed = yield* Effect.flip(decode(record))
      assert.instanceOf(failed, DecodeFailed)
      assert.isTrue(ParseResult.isParseError(failed.cause))
      const issues = ParseResult.ArrayFormatter.formatErrorSync(failed.cause)
      assert.deepStrictEqual(issues.map((issue) => [issue._tag, issue.path]), [["Type", ["id"]]])
      // The same error Schema gives for the same bytes.
      const direct = yield* Effect.flip(Schema.decodeUnknown(Codec.json(Order))(bytes(`{"id":"one","item":"tea"}`)))
      assert.strictEqual(failed.reason, ParseResult.TreeFormatter.formatErrorSync(direct))
      assert.strictEqual(failed.message, `Cannot decode the value of orders-2@41: ${failed.reason}`)
    }))

  it.effect("EncodeFailed: the ParseError of the schema's encoding, its issues by path, the message from it", () =>
    Effect.gen(function*() {
      const failed = yield* Effect.flip(
        Codec.encoder({ value: Codec.json(Schema.Struct({ n: Schema.Int })) })({
          topic: "orders",
          key: null,
          value: { n: 1.5 }
        })
      )
      assert.isTrue(ParseResult.isParseError(failed.cause))
      const issues = ParseResult.ArrayFormatter.formatErrorSync(failed.cause)
      assert.deepStrictEqual(issues.map((issue) => issue.path), [["n"]])
      assert.strictEqual(failed.message, `Cannot encode the value of a record for orders: ${failed.reason}`)
      assert.include(failed.reason, "Expected an integer, actual 1.5")
    }))

  it.effect("a dead letter of a record that did not decode says why in readable text: the formatted ParseError", () =>
    Effect.gen(function*() {
      const record = recordOf({ key: bytes("k"), value: bytes(`{"id":"one","item":"tea"}`) })
      const failed = yield* Effect.flip(decode(record))
      const letter = FailureRoute.deadLetterRecord("orders-dlq", record, failed, 1)
      const headers = letter.headers!
      assert.strictEqual(headers[FailureRoute.headers.errorTag], "DecodeFailed")
      const message = headers[FailureRoute.headers.errorMessage] as string
      assert.strictEqual(message, failed.message)
      assert.include(message, `["id"]`)
      assert.include(message, `Expected number, actual "one"`)
      const read = FailureRoute.deadLettered({
        ...record,
        headers: Object.fromEntries(
          Object.entries(headers).map(([name, value]) => [name, typeof value === "string" ? bytes(value) : value])
        )
      })!
      assert.strictEqual(read.errorMessage, failed.message)
      assert.strictEqual(text(bytes(read.errorTag)), "DecodeFailed")
    }))
})
