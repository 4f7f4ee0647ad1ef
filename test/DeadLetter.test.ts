/**
 * Poison records on the in-memory broker: typed decoding, the dead-letter route under every policy, the circuit.
 */
import { assert, describe, expectTypeOf, it } from "@effect/vitest"
import * as Chunk from "effect/Chunk"
import * as Clock from "effect/Clock"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Schedule from "effect/Schedule"
import * as Schema from "effect/Schema"
import * as Codec from "../src/Codec.js"
import * as CommitPolicy from "../src/CommitPolicy.js"
import * as Consumer from "../src/Consumer.js"
import type { ConsumerRecord } from "../src/ConsumerRecord.js"
import { valueString } from "../src/ConsumerRecord.js"
import type { Driver } from "../src/Driver.js"
import * as FailureRoute from "../src/FailureRoute.js"
import * as InMemoryKafka from "../src/InMemoryKafka.js"
import {
  CircuitOpen,
  InvalidConfig,
  DecodeFailed,
  EncodeFailed,
  HandlerFailed,
  ProduceFailed,
  RecordFailed
} from "../src/KafkaError.js"
import * as OffsetStore from "../src/OffsetStore.js"
import * as Producer from "../src/Producer.js"
import { readTopic } from "./producerSuite.js"

const encoder = new TextEncoder()
const bytes = (text: string) => encoder.encode(text)

const recordOf = (fields: Partial<ConsumerRecord>): ConsumerRecord => ({
  topic: "t",
  partition: 0,
  offset: 7n,
  key: null,
  value: null,
  headers: {},
  timestamp: 0,
  ...fields
})

const Order = Schema.Struct({ id: Schema.Number, item: Schema.String })

describe("Codec: records decoded by Schema", () => {
  const decode = Codec.decoder({ key: Codec.string, value: Codec.json(Order) })

  it.effect("a record that decodes: key, value and the record as fetched", () =>
    Effect.gen(function*() {
      const record = recordOf({ key: bytes("k-1"), value: bytes(`{"id":1,"item":"tea"}`) })
      const decoded = yield* decode(record)
      assert.strictEqual(decoded.key, "k-1")
      assert.deepStrictEqual(decoded.value, { id: 1, item: "tea" })
      assert.strictEqual(decoded.record, record)
      expectTypeOf(decoded.key).toEqualTypeOf<string>()
      expectTypeOf(decoded.value).toEqualTypeOf<{ readonly id: number; readonly item: string }>()
      expectTypeOf(decoded.headers).toEqualTypeOf<Readonly<Record<string, Uint8Array>>>()
    }))

  it.effect("bad input: each a DecodeFailed naming the field, the record and what is wrong", () =>
    Effect.gen(function*() {
      const failure = (record: ConsumerRecord) => Effect.flip(decode(record))

      const notUtf8 = yield* failure(recordOf({ key: bytes("k"), value: new Uint8Array([0x7b, 0xff, 0xfe, 0x7d]) }))
      assert.instanceOf(notUtf8, DecodeFailed)
      assert.strictEqual(notUtf8.field, "value")
      assert.strictEqual(notUtf8.offset, 7n)
      assert.include(notUtf8.reason, "not valid UTF-8")

      const notJson = yield* failure(recordOf({ key: bytes("k"), value: bytes("{id: 1") }))
      assert.strictEqual(notJson.field, "value")
      assert.match(notJson.reason, /JSON/)

      const wrongShape = yield* failure(recordOf({ key: bytes("k"), value: bytes(`{"id":"one","item":"tea"}`) }))
      assert.strictEqual(wrongShape.field, "value")
      assert.include(wrongShape.reason, `["id"]`)

      const noKey = yield* failure(recordOf({ key: null, value: bytes(`{"id":1,"item":"tea"}`) }))
      assert.strictEqual(noKey.field, "key")
      assert.include(noKey.reason, "null")
      assert.include(noKey.message, "t-0@7")

      const withHeaders = Codec.decoder({ headers: Schema.Struct({ "trace-id": Codec.string }) })
      const notBytes = yield* Effect.flip(
        withHeaders(recordOf({ headers: { "trace-id": "abc" as unknown as Uint8Array } }))
      )
      assert.strictEqual(notBytes.field, "headers")
      assert.include(notBytes.reason, `["trace-id"]`)
      const missing = yield* Effect.flip(withHeaders(recordOf({})))
      assert.strictEqual(missing.field, "headers")
      assert.include(missing.reason, `["trace-id"]`)
    }))

  it.effect("a key may be absent when its schema says so; raw bytes stay bytes", () =>
    Effect.gen(function*() {
      const decoded = yield* Codec.decoder({ key: Schema.NullOr(Codec.string), value: Codec.bytes })(
        recordOf({ value: new Uint8Array([1, 2]) })
      )
      expectTypeOf(decoded.key).toEqualTypeOf<string | null>()
      expectTypeOf(decoded.value).toEqualTypeOf<Uint8Array>()
      assert.isNull(decoded.key)
      assert.deepStrictEqual(decoded.value, new Uint8Array([1, 2]))
    }))

  it.effect("the producer encodes with the same schemas; a value that does not encode is an EncodeFailed", () =>
    Effect.gen(function*() {
      const encode = Codec.encoder({ key: Codec.string, value: Codec.json(Order) })
      const record = yield* encode({ topic: "orders", key: "k-1", value: { id: 2, item: "jam" } })
      assert.deepStrictEqual(record.key, bytes("k-1"))
      assert.deepStrictEqual(record.value, bytes(`{"id":2,"item":"jam"}`))
      const decoded = yield* decode(recordOf({ key: record.key as Uint8Array, value: record.value as Uint8Array }))
      assert.deepStrictEqual(decoded.value, { id: 2, item: "jam" })

      const failed = yield* Effect.flip(
        Codec.encoder({ value: Codec.json(Schema.Struct({ n: Schema.Int })) })({
          topic: "orders",
          key: null,
          value: { n: 1.5 }
        })
      )
      assert.instanceOf(failed, EncodeFailed)
      assert.strictEqual(failed.field, "value")
      assert.include(failed.message, "orders")
    }))
})

// ---------------------------------------------------------------------------------------------------------------
// The dead-letter route on the in-memory broker.

const source = "orders"
const dlq = "orders-dlq"
const output = "orders-out"
const produced = 30
const poisonOffsets = [3, 4, 11, 20, 29]
const poisonous = (i: number) => poisonOffsets.includes(i)

/** Records 0..29 on one partition; the poison ones are JSON that does not decode or values the handler refuses. */
const seed = Effect.gen(function*() {
  yield* InMemoryKafka.createTopic(source, 1)
  yield* InMemoryKafka.createTopic(dlq, 1)
  yield* InMemoryKafka.createTopic(output, 1)
  yield* InMemoryKafka.produce(
    source,
    Array.from({ length: produced }, (_, i) => ({
      key: `k-${i % 4}`,
      value: !poisonous(i) ? `{"id":${i},"item":"ok"}` : i % 2 === 0 ? `{"id":${i},"item":"refused"}` : "not json",
      headers: { "trace-id": `t-${i}` },
      partition: 0
    }))
  )
})

class Refused extends Schema.TaggedError<Refused>()("Refused", { id: Schema.Number }) {}

const waitFor = (what: string, condition: () => boolean) =>
  Effect.gen(function*() {
    for (let turn = 0; turn < 2_000; turn++) {
      if (condition()) return
      yield* Effect.sleep("5 millis")
    }
    assert.fail(`waited 10 s for ${what}`)
  })

const deadLetters = readTopic(dlq, 1).pipe(Effect.map(([records]) => records!))

/** Waits until the group "g" has committed `position` on the source partition, for at most 10 seconds. */
const untilCommitted = (position: number) =>
  Effect.repeat(InMemoryKafka.committed("g"), {
    until: (batch) => batch.positions.get(`${source}-0`) === BigInt(position),
    schedule: Schedule.spaced("5 millis")
  }).pipe(Effect.timeout("10 seconds"), Effect.orDie)
const textOf = (record: ConsumerRecord, header: string) => new TextDecoder().decode(record.headers[header])
const settings = { groupId: "g", topics: [source], onFailure: FailureRoute.deadLetter({ topic: dlq }) } as const

const env = Layer.provideMerge(InMemoryKafka.layerProducer(), InMemoryKafka.layer())

describe("the dead-letter route", () => {
  it.live("commitAfter: every record is handled or dead-lettered once, as it was, with headers naming where and why", () =>
    Effect.gen(function*() {
      yield* seed
      const handled: Array<number> = []
      const attempts = new Map<number, number>()
      const consumer = Consumer.runEach(
        { ...settings, retry: Schedule.recurs(2) },
        Consumer.decoded({ key: Codec.string, value: Codec.json(Order) }, (record) =>
          Effect.suspend(() => {
            attempts.set(record.value.id, (attempts.get(record.value.id) ?? 0) + 1)
            if (record.value.item === "refused") return Effect.fail(new Refused({ id: record.value.id }))
            handled.push(record.value.id)
            return Effect.void
          }))
      )
      const fiber = yield* Effect.fork(
        Effect.provide(consumer, CommitPolicy.commitAfter({ maxBatch: 1, maxInterval: "1 second" }))
      )
      yield* waitFor("the good records", () => handled.length === produced - poisonOffsets.length)
      yield* untilCommitted(produced)
      yield* Fiber.interrupt(fiber)
      const letters = yield* deadLetters

      assert.deepStrictEqual(handled, Array.from({ length: produced }, (_, i) => i).filter((i) => !poisonous(i)))
      assert.deepStrictEqual(letters.map((r) => textOf(r, "dead-letter-offset")), poisonOffsets.map(String))
      for (const letter of letters) {
        const offset = Number(textOf(letter, "dead-letter-offset"))
        assert.strictEqual(textOf(letter, "dead-letter-topic"), source)
        assert.strictEqual(textOf(letter, "dead-letter-partition"), "0")
        assert.strictEqual(textOf(letter, "trace-id"), `t-${offset}`, "the record's own headers are kept")
        assert.strictEqual(new TextDecoder().decode(letter.key!), `k-${offset % 4}`)
        const described = FailureRoute.deadLettered(letter)!
        assert.strictEqual(described.offset, BigInt(offset))
        assert.deepStrictEqual(Object.keys(described.headers), ["trace-id"])
        if (offset % 2 === 0) {
          // Refused by the handler: 1 attempt and 2 retries.
          assert.strictEqual(valueString(letter), `{"id":${offset},"item":"refused"}`)
          assert.strictEqual(textOf(letter, "dead-letter-error-tag"), "Refused")
          assert.strictEqual(textOf(letter, "dead-letter-attempts"), "3")
          assert.strictEqual(attempts.get(offset), 3)
        } else {
          // Did not decode: not retried, and the handler never saw it.
          assert.strictEqual(valueString(letter), "not json")
          assert.strictEqual(textOf(letter, "dead-letter-error-tag"), "DecodeFailed")
          assert.include(textOf(letter, "dead-letter-error-message"), "value")
          assert.strictEqual(textOf(letter, "dead-letter-attempts"), "1")
        }
      }
    }).pipe(Effect.provide(env)))

  it.live("replay writes dead letters back to their source partitions, once, and a second replay finds nothing new", () =>
    Effect.gen(function*() {
      yield* seed
      const fiber = yield* Effect.fork(
        Consumer.runEach(
          { ...settings, retry: Schedule.recurs(0) },
          Consumer.decoded(
            { value: Codec.json(Order) },
            (record) =>
              record.value.item === "refused" ? Effect.fail(new Refused({ id: record.value.id })) : Effect.void
          )
        ).pipe(
          Effect.provide(CommitPolicy.commitAfter({ maxBatch: 1, maxInterval: "1 second" }))
        )
      )
      yield* untilCommitted(produced)
      yield* Fiber.interrupt(fiber)
      yield* InMemoryKafka.produce(dlq, [{ value: "written by hand", partition: 0 }])

      const first = yield* FailureRoute.replay({ topic: dlq, groupId: "replayer" })
      assert.deepStrictEqual(first, { replayed: poisonOffsets.length, foreign: 1, removed: 0 })
      const source0 = (yield* readTopic(source, 1))[0]!
      const back = source0.slice(produced)
      assert.deepStrictEqual(
        back.map(valueString),
        poisonOffsets.map((i) => source0[i]!.value).map((v) => new TextDecoder().decode(v!))
      )
      assert.deepStrictEqual(back.map((r) => Object.keys(r.headers)), poisonOffsets.map(() => ["trace-id"]))
      assert.deepStrictEqual(back.map((r) => textOf(r, "trace-id")), poisonOffsets.map((i) => `t-${i}`))

      const second = yield* FailureRoute.replay({ topic: dlq, groupId: "replayer" })
      assert.deepStrictEqual(second, { replayed: 0, foreign: 0, removed: 0 })
      const onlyRefused = yield* FailureRoute.replay({
        topic: dlq,
        groupId: "replayer-2",
        filter: (letter) => letter.errorTag === "Refused"
      })
      assert.strictEqual(onlyRefused.replayed, 2)
    }).pipe(Effect.provide(env)))

  it.live("the circuit: maxInARow failures in a row stop the consumer with CircuitOpen, before the last is routed", () =>
    Effect.gen(function*() {
      yield* InMemoryKafka.createTopic(source, 1)
      yield* InMemoryKafka.createTopic(dlq, 1)
      yield* InMemoryKafka.produce(source, Array.from({ length: 10 }, (_, i) => ({ value: i < 2 ? "ok" : "down" })))
      const handled: Array<bigint> = []
      const consumer = Consumer.runEach(
        { ...settings, onFailure: FailureRoute.deadLetter({ topic: dlq, maxInARow: 3 }), retry: Schedule.recurs(1) },
        (record) =>
          valueString(record) === "down"
            ? Effect.fail(new Refused({ id: Number(record.offset) }))
            : Effect.sync(() => handled.push(record.offset))
      ).pipe(Effect.provide(CommitPolicy.commitAfter({ maxBatch: 1, maxInterval: "1 second" })), Effect.flip)
      const fiber = yield* Effect.fork(consumer)
      // Either the consumer stops, or (were the circuit broken) every record gets routed and committed.
      let ended = false
      const routedAll = Effect.map(InMemoryKafka.committed("g"), (batch) => batch.positions.get(`${source}-0`) === 10n)
      for (let turn = 0; turn < 2_000 && !ended; turn++) {
        ended = (yield* fiber.poll)._tag === "Some" || (yield* routedAll)
        if (!ended) yield* Effect.sleep("5 millis")
      }
      assert.isTrue((yield* fiber.poll)._tag === "Some", "the consumer went on past 3 failures in a row")
      const failure = yield* Fiber.join(fiber)
      expectTypeOf(failure).toEqualTypeOf<Consumer.ConsumerError | ProduceFailed | CircuitOpen<Refused>>()
      assert.instanceOf(failure, CircuitOpen)
      assert.strictEqual((failure as CircuitOpen<Refused>).offset, 4n)
      assert.strictEqual((failure as CircuitOpen<Refused>).count, 3)
      assert.instanceOf((failure as CircuitOpen<Refused>).cause, Refused)
      assert.deepStrictEqual(handled, [0n, 1n])
      const letters = yield* deadLetters
      assert.deepStrictEqual(letters.map((r) => textOf(r, "dead-letter-offset")), ["2", "3"])
      const committed = (yield* InMemoryKafka.committed("g")).positions.get(`${source}-0`)
      assert.isTrue(committed === undefined || committed <= 4n, `committed ${committed}: past the record not routed`)
    }).pipe(Effect.provide(env)))

  // Under commitAfter a unit does not wait for its dead letters: the commit does, once it has taken its positions.
  // The dead-letter writes here wait for a gate, however they are sent; while they wait, no commit passes the record.
  const gatedDeadLetters = (gate: Deferred.Deferred<void, ProduceFailed>) =>
    Layer.effect(
      Producer.Producer,
      Effect.map(Producer.Producer, (producer) => ({
        ...producer,
        send: (record: Producer.ProducerRecord) =>
          record.topic === dlq ? Effect.zipRight(Deferred.await(gate), producer.send(record)) : producer.send(record),
        sendAll: (records: Iterable<Producer.ProducerRecord>) => {
          const all = Array.from(records)
          return all.some((record) => record.topic === dlq)
            ? Effect.zipRight(Deferred.await(gate), producer.sendAll(all))
            : producer.sendAll(all)
        }
      }))
    ).pipe(Layer.provideMerge(env))

  for (const outcome of ["acknowledged", "refused"] as const) {
    it.live(`commitAfter: the position passes a dead-lettered record only once its write is acknowledged (${outcome})`, () =>
      Effect.gen(function*() {
        const gate = yield* Deferred.make<void, ProduceFailed>()
        const run = Effect.gen(function*() {
          yield* seed
          const handled: Array<number> = []
          const consumer = yield* Consumer.runEach(
            { ...settings, retry: Schedule.recurs(0) },
            Consumer.decoded(
              { key: Codec.string, value: Codec.json(Order) },
              (record) =>
                record.value.item === "refused"
                  ? Effect.fail(new Refused({ id: record.value.id }))
                  : Effect.sync(() => handled.push(record.value.id))
            )
          ).pipe(
            Effect.provide(CommitPolicy.commitAfter({ maxBatch: 1, maxInterval: "10 millis" })),
            Effect.flip,
            Effect.fork
          )
          yield* waitFor("the good records", () => handled.length === produced - poisonOffsets.length)
          // Every record is handled and the commit is due: given every chance to run, it does not land.
          const committed = Effect.map(InMemoryKafka.committed("g"), (batch) => batch.positions.get(`${source}-0`))
          for (let turn = 0; turn < 2_000; turn++) yield* Effect.yieldNow()
          assert.strictEqual(yield* committed, undefined, "committed past a dead letter not yet acknowledged")
          assert.isTrue((yield* Fiber.poll(consumer))._tag === "None")
          if (outcome === "acknowledged") {
            yield* Deferred.succeed(gate, undefined)
            yield* untilCommitted(produced)
            assert.deepStrictEqual(
              (yield* deadLetters).map((r) => textOf(r, "dead-letter-offset")),
              poisonOffsets.map(String)
            )
            yield* Fiber.interrupt(consumer)
          } else {
            yield* Deferred.fail(
              gate,
              new ProduceFailed({ reason: "Other", topic: dlq, detail: "refused by the test" })
            )
            // Whichever comes first: the consumer ends, or a commit passes the refused dead letter.
            for (let turn = 0; (yield* Fiber.poll(consumer))._tag === "None"; turn++) {
              assert.strictEqual(yield* committed, undefined, "committed past a dead letter that was refused")
              if (turn > 2_000) assert.fail("the consumer went on after its dead-letter write was refused")
              yield* Effect.sleep("5 millis")
            }
            const failure = yield* Fiber.join(consumer)
            assert.instanceOf(failure, ProduceFailed)
            assert.strictEqual(yield* committed, undefined, "committed past a dead letter that was refused")
            assert.deepStrictEqual(yield* deadLetters, [])
          }
        })
        // Whatever the outcome, the gate opens before the consumer is stopped: a write still waiting for it would
        // hold the consumer's shutdown for as long as a reconnect may take.
        yield* run.pipe(Effect.ensuring(Deferred.succeed(gate, undefined)), Effect.provide(gatedDeadLetters(gate)))
      }))
  }

  it.live("transactional: a unit whose dead-letter write is refused does not commit, and the consumer ends with the ProduceFailed", () =>
    Effect.gen(function*() {
      const gate = yield* Deferred.make<void, ProduceFailed>()
      yield* Deferred.fail(gate, new ProduceFailed({ reason: "Other", topic: dlq, detail: "refused by the test" }))
      yield* Effect.gen(function*() {
        yield* seed
        const consumer = yield* Consumer.runEach(
          { ...settings, maxPollRecords: 8, retry: Schedule.recurs(0) },
          Consumer.decoded({ value: Codec.json(Order) }, (record) =>
            Effect.zipRight(
              OffsetStore.append([record.value.id]),
              record.value.item === "refused" ? Effect.fail(new Refused({ id: record.value.id })) : Effect.void
            ))
        ).pipe(Effect.provide(CommitPolicy.transactional()), Effect.flip, Effect.fork)
        const store = yield* OffsetStore.OffsetStore
        const stored = store.load("g", [{ topic: source, partition: 0 }]).pipe(Effect.map((p) => p.get(`${source}-0`)))
        // The first poison record is at 3: no unit may store a position past it.
        for (let turn = 0; (yield* Fiber.poll(consumer))._tag === "None"; turn++) {
          const at = yield* stored
          assert.isTrue(at === undefined || at <= 3n, `stored ${at}: past a dead letter that was refused`)
          if (turn > 2_000) assert.fail("the consumer went on after its dead-letter write was refused")
          yield* Effect.sleep("5 millis")
        }
        assert.instanceOf(yield* Fiber.join(consumer), ProduceFailed)
        const at = yield* stored
        assert.isTrue(at === undefined || at <= 3n, `stored ${at}: past a dead letter that was refused`)
        const results = (yield* Effect.flatMap(OffsetStore.Results, (r) => r.read("g"))) as ReadonlyArray<number>
        assert.isTrue(results.every((id) => id < 3), `nothing of the unit that routed the record landed: ${results}`)
      }).pipe(Effect.provide(Layer.merge(gatedDeadLetters(gate), OffsetStore.layerMemory)))
    }))

  it.live("atMostOnce: the handler runs once per record; a failed one is dead-lettered at once", () =>
    Effect.gen(function*() {
      yield* seed
      const calls = new Map<number, number>()
      const fiber = yield* Effect.fork(
        Consumer.runEach(
          settings,
          Consumer.decoded({ value: Codec.json(Order) }, (record) =>
            Effect.suspend(() => {
              calls.set(record.value.id, (calls.get(record.value.id) ?? 0) + 1)
              return record.value.item === "refused" ? Effect.fail(new Refused({ id: record.value.id })) : Effect.void
            }))
        ).pipe(Effect.provide(CommitPolicy.atMostOnce()))
      )
      const letters = yield* readTopic(dlq, 1, { atLeast: poisonOffsets.length }).pipe(Effect.map(([r]) => r!))
      // The records that decode: all but 3, 11 and 29.
      yield* waitFor("every decodable record", () => calls.size === produced - 3)
      yield* Fiber.interrupt(fiber)
      assert.isTrue([...calls.values()].every((n) => n === 1), "a record was handed over twice")
      assert.deepStrictEqual(letters.map((r) => textOf(r, "dead-letter-offset")), poisonOffsets.map(String))
      assert.deepStrictEqual(letters.map((r) => textOf(r, "dead-letter-attempts")), poisonOffsets.map(() => "1"))
    }).pipe(Effect.provide(env)))

  it.live("a chunk handler names the record it failed on with RecordFailed: the others are handled once", () =>
    Effect.gen(function*() {
      yield* seed
      const calls = new Map<number, number>()
      const fiber = yield* Effect.fork(
        Consumer.run(
          { ...settings, maxPollRecords: 10, retry: Schedule.recurs(1) },
          Consumer.decodedChunk(
            { value: Codec.json(Order) },
            (records) =>
              Effect.forEach(records, (record) =>
                Effect.suspend(() => {
                  calls.set(record.value.id, (calls.get(record.value.id) ?? 0) + 1)
                  return record.value.item === "refused"
                    ? Effect.fail(new RecordFailed<Refused>({ offset: record.offset, cause: new Refused({ id: 1 }) }))
                    : Effect.void
                }), { discard: true })
          )
        ).pipe(Effect.provide(CommitPolicy.commitAfter({ maxBatch: 1, maxInterval: "1 second" })))
      )
      yield* untilCommitted(produced)
      yield* Fiber.interrupt(fiber)
      const letters = yield* deadLetters
      assert.deepStrictEqual(letters.map((r) => textOf(r, "dead-letter-offset")), poisonOffsets.map(String))
      // Refused records: tried 2 times (an attempt and a retry); every other decodable record once.
      for (const [id, n] of calls) assert.strictEqual(n, poisonous(id) ? 2 : 1, `record ${id} handled ${n} times`)
      assert.strictEqual(textOf(letters[1]!, "dead-letter-error-tag"), "RecordFailed")
    }).pipe(Effect.provide(env)))

  it.live("atMostOnce with a chunk handler that does not say where it failed: the chunk is dead-lettered, counted once by the circuit", () =>
    Effect.gen(function*() {
      yield* InMemoryKafka.createTopic(source, 1)
      yield* InMemoryKafka.createTopic(dlq, 1)
      yield* InMemoryKafka.produce(
        source,
        Array.from({ length: 40 }, (_, i) => ({ value: i % 10 === 5 ? "bad" : "ok" }))
      )
      const handled: Array<bigint> = []
      const fiber = yield* Effect.fork(
        Consumer.run(
          { ...settings, maxPollRecords: 10, onFailure: FailureRoute.deadLetter({ topic: dlq, maxInARow: 5 }) },
          (records) =>
            Chunk.some(records, (r) => valueString(r) === "bad")
              ? Effect.fail(new Refused({ id: 0 }))
              : Effect.sync(() => handled.push(...Chunk.map(records, (r) => r.offset)))
        ).pipe(Effect.provide(CommitPolicy.atMostOnce()))
      )
      const letters = (yield* readTopic(dlq, 1, { atLeast: 40 }))[0]!
      yield* Fiber.interrupt(fiber)
      // Four chunks of ten, each with a bad record: every record dead-lettered, none handled, no circuit opened.
      assert.strictEqual(letters.length, 40)
      assert.deepStrictEqual(handled, [])
    }).pipe(Effect.provide(env)))

  it.live("transactional: a failed record's writes are rolled back; the rest of its unit lands once", () =>
    Effect.gen(function*() {
      yield* seed
      const consumer = Consumer.run(
        { ...settings, maxPollRecords: 8, retry: Schedule.recurs(1) },
        // A chunk handler: it writes each record, and fails on a refused one after writing those before it.
        Consumer.decodedChunk(
          { value: Codec.json(Order) },
          (records) =>
            Effect.forEach(records, (record) =>
              Effect.zipRight(
                OffsetStore.append([record.value.id]),
                record.value.item === "refused" ? Effect.fail(new Refused({ id: record.value.id })) : Effect.void
              ), { discard: true })
        )
      )
      const fiber = yield* Effect.fork(Effect.provide(consumer, CommitPolicy.transactional()))
      const store = yield* OffsetStore.OffsetStore
      const position = store.load("g", [{ topic: source, partition: 0 }]).pipe(Effect.map((p) => p.get(`${source}-0`)))
      yield* Effect.repeat(position, {
        until: (at) => at === BigInt(produced),
        schedule: Schedule.spaced("5 millis")
      }).pipe(Effect.timeout("10 seconds"), Effect.orDie)
      yield* Fiber.interrupt(fiber)
      const letters = yield* deadLetters
      const stored = yield* Effect.flatMap(OffsetStore.Results, (results) => results.read("g"))
      const good = Array.from({ length: produced }, (_, i) => i).filter((i) => !poisonous(i))
      assert.deepStrictEqual(stored, good, "each good record's write once, and no write of a failed attempt")
      assert.deepStrictEqual(letters.map((r) => textOf(r, "dead-letter-offset")), poisonOffsets.map(String))
    }).pipe(Effect.provide(Layer.merge(env, OffsetStore.layerMemory))))

  it.live("kafkaTransactional: the dead-letter write, the other records' output and the position in one transaction", () =>
    Effect.gen(function*() {
      yield* seed
      const consumer = Consumer.runEach(
        { ...settings, maxPollRecords: 8, retry: Schedule.recurs(1) },
        Consumer.decoded({ value: Codec.json(Order) }, (record) =>
          Effect.zipRight(
            Producer.send({ topic: output, value: String(record.value.id), partition: 0 }),
            record.value.item === "refused" ? Effect.fail(new Refused({ id: record.value.id })) : Effect.void
          ))
      )
      const fiber = yield* Effect.fork(
        Effect.provide(
          consumer,
          CommitPolicy.kafkaTransactional().pipe(
            Layer.provide(InMemoryKafka.layerTransactionalProducers())
          )
        )
      )
      yield* untilCommitted(produced)
      yield* Fiber.interrupt(fiber)
      const letters = yield* deadLetters
      const out = (yield* readTopic(output, 1))[0]!
      const good = Array.from({ length: produced }, (_, i) => String(i)).filter((i) => !poisonous(Number(i)))
      assert.deepStrictEqual(out.map(valueString), good, "the output of a failed attempt was aborted")
      assert.deepStrictEqual(letters.map((r) => textOf(r, "dead-letter-offset")), poisonOffsets.map(String))
      const again = yield* readTopic(dlq, 1)
      assert.strictEqual(again[0]!.length, poisonOffsets.length, "a dead letter written twice")
    }).pipe(Effect.provide(env)))

  it.effect("a bad route is a InvalidConfig naming it; a partition stream takes no route", () =>
    Effect.gen(function*() {
      const refused = (config: Consumer.AnyConfig) => Effect.flip(Consumer.validate(config))
      const sameTopic = yield* refused({
        groupId: "g",
        topics: [source],
        onFailure: FailureRoute.deadLetter({ topic: source })
      })
      assert.strictEqual(sameTopic.field, "onFailure.topic")
      const badName = yield* refused({
        groupId: "g",
        topics: [source],
        onFailure: FailureRoute.deadLetter({ topic: "a b" })
      })
      assert.strictEqual(badName.field, "onFailure.topic")
      const badCircuit = yield* refused({
        groupId: "g",
        topics: [source],
        onFailure: FailureRoute.deadLetter({ topic: dlq, maxInARow: 0 })
      })
      assert.strictEqual(badCircuit.field, "onFailure.maxInARow")
      assert.instanceOf(badCircuit, InvalidConfig)
    }))
})

describe("retry topics", () => {
  it.live("a failed record waits in its retry topic until due while its partition goes on; after the last retry, the dead-letter topic", () =>
    Effect.gen(function*() {
      for (const topic of [source, `${source}-retry-0`, `${source}-retry-1`, dlq]) {
        yield* InMemoryKafka.createTopic(topic, 1)
      }
      yield* InMemoryKafka.produce(source, Array.from({ length: 10 }, (_, i) => ({ value: String(i), partition: 0 })))
      const handled: Array<string> = []
      const early: Array<string> = []
      const failures = new Map<string, number>()
      const fiber = yield* Effect.fork(
        Consumer.runEach(
          {
            groupId: "g",
            topics: [source],
            retry: Schedule.recurs(0),
            onFailure: FailureRoute.retryTopics(["150 millis", "300 millis"], { deadLetter: { topic: dlq } })
          },
          (record) =>
            Effect.gen(function*() {
              const value = valueString(record)!
              const due = FailureRoute.dueOf(record)
              if (due !== undefined && (yield* Clock.currentTimeMillis) < due) early.push(value)
              const failed = failures.get(value) ?? 0
              // Record 3 fails on the main topic and on the first retry, then succeeds; record 7 always fails.
              if (value === "7" || (value === "3" && failed < 2)) {
                failures.set(value, failed + 1)
                return yield* Effect.fail(new Refused({ id: Number(value) }))
              }
              handled.push(`${record.topic}:${value}`)
            })
        ).pipe(Effect.provide(CommitPolicy.commitAfter({ maxBatch: 1, maxInterval: "50 millis" })))
      )
      const letters = (yield* readTopic(dlq, 1, { atLeast: 1 }))[0]!
      yield* waitFor("record 3 after its retries", () => handled.length === 9)
      yield* Fiber.interrupt(fiber)

      assert.deepStrictEqual(early, [], "a retry was handed over before it was due")
      // The main partition did not wait for record 3: the records after it came first.
      assert.deepStrictEqual(handled.slice(0, 8), ["0", "1", "2", "4", "5", "6", "8", "9"].map((v) => `${source}:${v}`))
      assert.strictEqual(handled[8], `${source}-retry-1:3`)
      assert.strictEqual(failures.get("7"), 3)
      assert.strictEqual(letters.length, 1)
      const letter = FailureRoute.deadLettered(letters[0]!)!
      assert.deepStrictEqual(
        [letter.topic, letter.partition, letter.offset, letter.attempts, letter.errorTag],
        [source, 0, 7n, 3, "Refused"]
      )
      assert.isUndefined(FailureRoute.dueOf(letters[0]!), "a dead letter is not due anywhere")
    }).pipe(Effect.provide(env)))

  it.live("records routed close together are retried together, none before it is due", () =>
    Effect.gen(function*() {
      for (const topic of [source, `${source}-retry-0`, dlq]) yield* InMemoryKafka.createTopic(topic, 1)
      const count = 40
      yield* InMemoryKafka.produce(
        source,
        Array.from({ length: count }, (_, i) => ({ value: String(i), partition: 0 }))
      )
      const retried: Array<string> = []
      const early: Array<string> = []
      const fiber = yield* Effect.fork(
        Consumer.runEach(
          {
            groupId: "g",
            topics: [source],
            retry: Schedule.recurs(0),
            onFailure: FailureRoute.retryTopics(["200 millis"], { deadLetter: { topic: dlq }, maxInARow: 100 })
          },
          (record) =>
            Effect.gen(function*() {
              const value = valueString(record)!
              // Every record fails once on the main topic, a couple of milliseconds after the one before it: their
              // retries come due a couple of milliseconds apart.
              if (record.topic === source) {
                yield* Effect.sleep("2 millis")
                return yield* Effect.fail(new Refused({ id: Number(value) }))
              }
              const due = FailureRoute.dueOf(record)!
              if ((yield* Clock.currentTimeMillis) < due) early.push(value)
              retried.push(value)
            })
        ).pipe(Effect.provide(CommitPolicy.commitAfter({ maxBatch: 10, maxInterval: "50 millis" })))
      )
      yield* waitFor("every retry", () => retried.length === count)
      yield* Fiber.interrupt(fiber)
      assert.deepStrictEqual(early, [], "a retry was handed over before it was due")
      assert.deepStrictEqual(retried, Array.from({ length: count }, (_, i) => String(i)))
    }).pipe(Effect.provide(env)))

  it.effect("retry topics need a topic subscription and valid delays", () =>
    Effect.gen(function*() {
      const route = FailureRoute.retryTopics(["1 second"], { deadLetter: { topic: dlq } })
      const byPartition = yield* Effect.flip(
        Consumer.validate({ groupId: "g", partitions: [{ topic: source, partition: 0 }], onFailure: route })
      )
      assert.strictEqual(byPartition.field, "onFailure")
      const none = yield* Effect.flip(
        Consumer.validate({
          groupId: "g",
          topics: [source],
          onFailure: FailureRoute.retryTopics([], { deadLetter: { topic: dlq } })
        })
      )
      assert.strictEqual(none.field, "onFailure.delays")
    }))
})

describe("the route in the types", () => {
  const handler = (_: ConsumerRecord) => Effect.fail(new Refused({ id: 1 }))
  it("stop: HandlerFailed, and no Producer needed", () => {
    const stopped = Consumer.runEach({ groupId: "g", topics: [source] }, handler)
    expectTypeOf<Effect.Effect.Error<typeof stopped>>().toEqualTypeOf<Consumer.ConsumerError | HandlerFailed<Refused>>()
    expectTypeOf<Effect.Effect.Context<typeof stopped>>().toEqualTypeOf<Driver | CommitPolicy.CommitPolicy>()
  })
  it("deadLetter: no HandlerFailed; ProduceFailed or CircuitOpen instead, and a Producer needed", () => {
    const routed = Consumer.runEach(settings, handler)
    expectTypeOf<Effect.Effect.Error<typeof routed>>().toEqualTypeOf<
      Consumer.ConsumerError | ProduceFailed | CircuitOpen<Refused>
    >()
    expectTypeOf<Effect.Effect.Context<typeof routed>>().toEqualTypeOf<
      Driver | CommitPolicy.CommitPolicy | Producer.Producer
    >()
    const withPolicy = Effect.provide(routed, CommitPolicy.commitAfter({ maxBatch: 10, maxInterval: "1 second" }))
    // @ts-expect-error a dead-letter route cannot run without a Producer
    const _noProducer: Effect.Effect<never, unknown, Driver> = withPolicy
    // A configuration typed as AnyConfig may carry any route: both kinds of error, and a Producer.
    const anyConfig: Consumer.AnyConfig = settings
    const either = Consumer.runEach(anyConfig, handler)
    expectTypeOf<Effect.Effect.Error<typeof either>>().toEqualTypeOf<
      Consumer.ConsumerError | HandlerFailed<Refused> | ProduceFailed | CircuitOpen<Refused>
    >()
    expectTypeOf<Effect.Effect.Context<typeof either>>().toEqualTypeOf<
      Driver | CommitPolicy.CommitPolicy | Producer.Producer
    >()
    // A configuration built apart from the call and typed as Config has no route: no Producer, HandlerFailed only.
    const plain: Consumer.Config = { groupId: "g", topics: [source], maxPollRecords: 10 }
    const stopping = Consumer.runEach(plain, handler)
    expectTypeOf<Effect.Effect.Error<typeof stopping>>().toEqualTypeOf<
      Consumer.ConsumerError | HandlerFailed<Refused>
    >()
    expectTypeOf<Effect.Effect.Context<typeof stopping>>().toEqualTypeOf<Driver | CommitPolicy.CommitPolicy>()
    // @ts-expect-error a route is part of the type: Config takes none, Config<FailureRoute.DeadLetter> this one
    const _routeInPlainConfig: Consumer.Config = settings
    const typedRoute: Consumer.Config<FailureRoute.DeadLetter> = settings
    expectTypeOf<Effect.Effect.Context<ReturnType<typeof Consumer.runEach<typeof typedRoute, Refused, never>>>>()
      .toEqualTypeOf<Driver | CommitPolicy.CommitPolicy | Producer.Producer>()
  })
})
