import { assert, describe, expectTypeOf, it } from "@effect/vitest"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Scope from "effect/Scope"
import * as TestClock from "effect/TestClock"
import * as fc from "effect/FastCheck"
import * as InMemoryKafka from "../src/InMemoryKafka.js"
import { murmur2, partitionOfKey } from "../src/internal/shared/murmur2.js"
import { utf8Encode, utf8Length } from "../src/internal/shared/utf8.js"
import * as internal from "../src/internal/producer/producer.js"
import { ProduceFailed, type TransactionFailed } from "../src/KafkaError.js"
import { Producer as ProducerTag } from "../src/Producer.js"
import * as Producer from "../src/Producer.js"
import { producerSuite, ProducerTestKit } from "./producerSuite.js"
import { settled } from "./support/kit.js"

producerSuite(
  "InMemoryKafka producer",
  (settings) => InMemoryKafka.layerProducer(settings),
  (settings) => InMemoryKafka.layerTransactionalProducer(settings),
  () =>
    Layer.provideMerge(
      Layer.effect(
        ProducerTestKit,
        Effect.map(InMemoryKafka.InMemoryKafka, (kafka) => ({ createTopic: kafka.createTopic }))
      ),
      InMemoryKafka.layer()
    )
)

describe("UTF-8 of keys and sizes", () => {
  it("gives TextEncoder's bytes and length for any string, lone surrogates included", () => {
    const encoder = new TextEncoder()
    fc.assert(
      fc.property(fc.oneof(fc.string({ unit: "binary" }), fc.string({ unit: "grapheme" }), fc.string()), (text) => {
        const expected = encoder.encode(text)
        assert.strictEqual(utf8Length(text), expected.length)
        assert.deepStrictEqual(utf8Encode(text), expected)
      }),
      { numRuns: 2_000 }
    )
    for (const text of ["\ud800", "a\udc00b", "\ud83d\ude00", "\ud83d", "é€😀"]) {
      assert.deepStrictEqual(utf8Encode(text), encoder.encode(text), JSON.stringify(text))
    }
  })
})

describe("murmur2, as the Java client computes it", () => {
  // Hashes published in Kafka's own tests (UtilsTest.testMurmur2) and in other clients' tests of the same function.
  const published: ReadonlyArray<readonly [string, number]> = [
    ["21", -973932308],
    ["foobar", -790332482],
    ["a-little-bit-long-string", -985981536],
    ["a-little-bit-longer-string", -1486304829],
    ["lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971],
    ["abc", 479470107],
    ["1", -1993445489],
    ["12", 126087238],
    ["123", -267702483],
    ["1234", -1614185708],
    ["12345", -1188365604]
  ]
  it("gives the published hash of every key, whatever its length modulo 4", () => {
    for (const [key, hash] of published) assert.strictEqual(murmur2(new TextEncoder().encode(key)), hash, key)
  })
  it("picks the partition with the sign bit cleared, as Utils.toPositive does", () => {
    const key = new TextEncoder().encode("foobar")
    assert.strictEqual(partitionOfKey(key, 7), (-790332482 & 0x7fffffff) % 7)
    assert.notStrictEqual(partitionOfKey(key, 7), Math.abs(-790332482) % 7)
  })
})

/** A transport that records each batch and answers when the test says. */
const fakeTransport = () => {
  const batches: Array<ReadonlyArray<Producer.ProducerRecord>> = []
  const gates: Array<Deferred.Deferred<void>> = []
  let offset = 0n
  let holding = false
  const transport: internal.Transport = {
    write: (batch) =>
      Effect.gen(function*() {
        batches.push(batch)
        const gate = yield* Deferred.make<void>()
        gates.push(gate)
        if (!holding) yield* Deferred.succeed(gate, undefined)
        yield* Deferred.await(gate)
        return batch.map((r): internal.Written => ({ topic: r.topic, partition: 0, offset: offset++ }))
      })
  }
  return {
    batches,
    transport,
    hold: () => {
      holding = true
    },
    openAll: Effect.suspend(() => Effect.forEach(gates, (g) => Deferred.succeed(g, undefined), { discard: true })),
    /** Stops holding: what is held is answered, and what comes next at once (a test's scope can close). */
    release: Effect.suspend(() => {
      holding = false
      return Effect.forEach(gates, (g) => Deferred.succeed(g, undefined), { discard: true })
    })
  }
}

/** A transport whose answers to each batch `answer` gives, told the write's number (1 for the first). */
const answering = (
  answer: (call: number, batch: ReadonlyArray<Producer.ProducerRecord>) => Array<internal.Written>
): internal.Transport => {
  let calls = 0
  return { write: (batch) => Effect.sync(() => answer(++calls, batch)) }
}

const producerOn = (settings: Producer.Settings, transport: internal.Transport) =>
  Effect.flatMap(internal.resolve(settings), (resolved) => internal.make(resolved, transport))

describe("batching: linger, batchSize, maxInFlightRequests", () => {
  it.scoped("sends from many fibers within linger go out as one batch, each answered on its own", () =>
    Effect.gen(function*() {
      const fake = fakeTransport()
      const producer = yield* producerOn({ linger: "10 millis" }, fake.transport)
      const fibers = yield* Effect.forEach(
        Array.from({ length: 100 }, (_, i) => i),
        (i) => Effect.fork(producer.send({ topic: "t", value: `${i}` }))
      )
      yield* TestClock.adjust("9 millis")
      assert.strictEqual(fake.batches.length, 0, "nothing is sent before linger has passed")
      yield* TestClock.adjust("1 millis")
      const answers = yield* Effect.forEach(fibers, Fiber.join)
      assert.strictEqual(fake.batches.length, 1)
      assert.strictEqual(fake.batches[0]!.length, 100)
      assert.deepStrictEqual(answers.map((m) => m.offset), Array.from({ length: 100 }, (_, i) => BigInt(i)))
    }))

  it.scoped("a full batch goes at once, without waiting for linger; batches hold at most batchSize bytes", () =>
    Effect.gen(function*() {
      const fake = fakeTransport()
      const producer = yield* producerOn({ linger: "1 hour", batchSize: 1000 }, fake.transport)
      // Each record counts 100 bytes of value plus its overhead: 8 fit in 1000 bytes.
      const all = yield* Effect.fork(
        producer.sendAll(Array.from({ length: 20 }, () => ({ topic: "t", value: new Uint8Array(100) })))
      )
      yield* settled("two full batches sent", Effect.sync(() => fake.batches.length === 2))
      assert.deepStrictEqual(fake.batches.map((b) => b.length), [8, 8])
      assert.isTrue(fake.batches.every((b) => b.reduce((n, r) => n + internal.sizeOf(r), 0) <= 1000))
      yield* TestClock.adjust("1 hour")
      yield* Fiber.join(all)
      assert.deepStrictEqual(fake.batches.map((b) => b.length), [8, 8, 4])
    }))

  it.scoped("at most maxInFlightRequests batches are written at once, in the order they were cut", () =>
    Effect.gen(function*() {
      const fake = fakeTransport()
      fake.hold()
      const producer = yield* producerOn(
        { linger: 0, batchSize: 200, idempotent: false, maxInFlightRequests: 2 },
        fake.transport
      )
      const all = yield* Effect.fork(
        producer.sendAll(
          Array.from({ length: 10 }, (_, i) => ({ topic: "t", value: new Uint8Array(150), key: `${i}` }))
        )
      )
      yield* settled("two batches in flight", Effect.sync(() => fake.batches.length === 2))
      for (let i = 0; i < 100; i++) yield* Effect.yieldNow()
      assert.strictEqual(fake.batches.length, 2, "a third batch waits for a free slot")
      yield* fake.openAll
      yield* settled("third batch", Effect.sync(() => fake.batches.length >= 3))
      const order = fake.batches.flatMap((b) => b.map((r) => String(r.key)))
      assert.deepStrictEqual(order.slice(0, 3), ["0", "1", "2"])
      const drain = Effect.gen(function*() {
        while (fake.batches.length < 10) {
          yield* fake.openAll
          yield* Effect.yieldNow()
        }
        yield* fake.openAll
      })
      yield* drain
      yield* Fiber.join(all)
      assert.deepStrictEqual(
        fake.batches.flatMap((b) => b.map((r) => String(r.key))),
        Array.from({ length: 10 }, (_, i) => `${i}`)
      )
    }))

  it.scoped("a sendAll cut across batches, with a record refused in its middle: the others are written in order", () =>
    Effect.gen(function*() {
      const fake = fakeTransport()
      const producer = yield* producerOn({ linger: "1 hour", batchSize: 520, maxRequestSize: 300 }, fake.transport)
      // 150 bytes of value each (172 with key and overhead): three fit in a batch of 520 bytes; the fourth is larger
      // than maxRequestSize.
      const records = Array.from({ length: 8 }, (_, i) => ({
        topic: "t",
        key: `${i}`,
        value: new Uint8Array(i === 3 ? 400 : 150)
      }))
      const all = yield* Effect.fork(Effect.either(producer.sendAll(records)))
      yield* settled("two full batches sent", Effect.sync(() => fake.batches.length === 2))
      yield* TestClock.adjust("1 hour")
      const answer = yield* Fiber.join(all)
      assert.isTrue(
        answer._tag === "Left" && answer.left.reason === "RecordTooLarge",
        "the call fails with the refusal"
      )
      assert.deepStrictEqual(fake.batches.map((b) => b.map((r) => r.key)), [["0", "1", "2"], ["4", "5", "6"], ["7"]])
      const after = yield* Effect.fork(producer.send({ topic: "t", value: "next" }))
      yield* TestClock.adjust("1 hour")
      assert.strictEqual((yield* Fiber.join(after)).offset, 7n, "the seven records were written, each once, before it")
    }))

  it.scoped("a batch the transport refuses fails each of its records; the next batch goes on", () =>
    Effect.gen(function*() {
      const transport = answering((call, batch) =>
        batch.map((r, i): internal.Written =>
          call === 1
            ? new ProduceFailed({ reason: "NotEnoughReplicas", topic: r.topic, partition: 0 })
            : { topic: r.topic, partition: 0, offset: BigInt(i) }
        )
      )
      const producer = yield* producerOn({ linger: 0 }, transport)
      const first = yield* Effect.flip(producer.sendAll([{ topic: "t", value: "a" }, { topic: "t", value: "b" }]))
      assert.strictEqual(first.reason, "NotEnoughReplicas")
      assert.isTrue(first.retriable)
      const second = yield* producer.send({ topic: "t", value: "c" })
      assert.strictEqual(second.offset, 0n)
    }))

  it.scoped("a transport that leaves a record unanswered fails that record with Other; the others keep theirs", () =>
    Effect.gen(function*() {
      // The first batch's answers have a hole in the middle; the second's are one short; the third's are whole.
      const transport = answering((call, batch) => {
        const out: Array<internal.Written> = new Array(call === 2 ? batch.length - 1 : batch.length)
        batch.forEach((r, i) => {
          if ((call === 1 && i === 1) || i >= out.length) return
          out[i] = { topic: r.topic, partition: 0, offset: BigInt(i) }
        })
        return out
      })
      const producer = yield* producerOn({ linger: 0 }, transport)
      const three = [{ topic: "t", value: "a" }, { topic: "t", value: "b" }, { topic: "t", value: "c" }]
      for (const _ of [1, 2]) {
        const error = yield* Effect.flip(producer.sendAll(three))
        assert.strictEqual(error.reason, "Other")
        assert.include(error.message, "no answer")
      }
      const next = yield* producer.sendAll([{ topic: "t", value: "d" }, { topic: "t", value: "e" }])
      assert.deepStrictEqual(next, [{ topic: "t", partition: 0, offset: 0n }, { topic: "t", partition: 0, offset: 1n }])
    }))

  it.scoped("a transport that dies fails its batch's records with Other, naming the defect", () =>
    Effect.gen(function*() {
      const transport: internal.Transport = { write: () => Effect.die(new Error("socket exploded")) }
      const producer = yield* producerOn({ linger: 0 }, transport)
      const error = yield* Effect.flip(producer.send({ topic: "t", value: "a" }))
      assert.strictEqual(error.reason, "Other")
      assert.include(error.message, "socket exploded")
    }))

  it.effect("on close, records still unwritten after closeTimeout fail with Closed", () =>
    Effect.gen(function*() {
      const fake = fakeTransport()
      fake.hold()
      const scope = yield* Scope.make()
      const producer = yield* producerOn({ linger: 0, closeTimeout: "2 seconds" }, fake.transport).pipe(
        Scope.extend(scope)
      )
      const pending = yield* Effect.fork(producer.send({ topic: "t", value: "never answered" }))
      yield* settled("in flight", Effect.sync(() => fake.batches.length === 1))
      const closing = yield* Effect.fork(Scope.close(scope, Exit.void))
      // The finalizer starts its closeTimeout clock once it runs; move the clock on until it has given up.
      for (let i = 0; i < 19; i++) {
        yield* Effect.yieldNow()
        yield* TestClock.adjust("100 millis")
      }
      assert.isTrue(
        (yield* Fiber.poll(pending))._tag === "None",
        "the record in flight is waited for until closeTimeout"
      )
      for (let i = 0; i < 100 && (yield* Fiber.poll(closing))._tag === "None"; i++) {
        yield* TestClock.adjust("100 millis")
        yield* Effect.yieldNow()
      }
      yield* Fiber.join(closing)
      const error = yield* Effect.flip(Fiber.join(pending))
      assert.strictEqual(error.reason, "Closed")
    }))
})

describe("the layout of a batch", () => {
  const counts = new Map<string, number | ProduceFailed>([
    ["a", 3],
    ["b", 2],
    ["gone", internal.unknownTopic("gone")]
  ])
  const record = fc.record({
    topic: fc.constantFrom("a", "b", "gone"),
    partition: fc.option(fc.integer({ min: 0, max: 3 }), { nil: undefined }),
    key: fc.option(fc.string({ maxLength: 4 }), { nil: undefined })
  }).map(({ key, partition, topic }): Producer.ProducerRecord => ({
    topic,
    value: "v",
    ...(partition === undefined ? {} : { partition }),
    ...(key === undefined ? {} : { key })
  }))

  it("gives each topic the places of its records that can be sent, in order, and answers the others", () => {
    const layOut = internal.makePartitioner()
    fc.assert(
      fc.property(fc.array(record, { maxLength: 40 }), (batch) => {
        const { out, partitionOf, topics } = layOut(batch, counts)
        const sendable = (r: Producer.ProducerRecord) => {
          const count = counts.get(r.topic)
          return typeof count === "number" && (r.partition === undefined || r.partition < count)
        }
        const expected = new Map<string, Array<number>>()
        batch.forEach((r, i) => {
          if (sendable(r)) expected.set(r.topic, [...(expected.get(r.topic) ?? []), i])
        })
        assert.deepStrictEqual(topics.map((t) => [t.topic, [...t.indexes]]), [...expected])
        batch.forEach((r, i) => {
          if (sendable(r)) {
            assert.isTrue(partitionOf[i]! >= 0 && partitionOf[i]! < (counts.get(r.topic) as number))
            if (r.partition !== undefined) assert.strictEqual(partitionOf[i], r.partition)
            assert.isUndefined(out[i])
          } else {
            assert.strictEqual(partitionOf[i], -1)
            assert.isTrue(internal.isFailure(out[i]!))
          }
        })
      }),
      { numRuns: 500 }
    )
  })
})

describe("transactions: a client whose send failed starts over", () => {
  /** A client that counts its inits; its writes fail while `failing` is set. */
  const countingClient = () => {
    const state = { inits: 0, failing: false, begun: 0 }
    const client: internal.TxnClient = {
      transactionalId: "t-1",
      init: Effect.sync(() => {
        state.inits++
      }),
      begin: Effect.sync(() => {
        state.begun++
        return {
          write: (batch) =>
            Effect.succeed(batch.map((r, i): internal.Written =>
              state.failing
                ? new ProduceFailed({ reason: "Disconnected", topic: r.topic })
                : { topic: r.topic, partition: 0, offset: BigInt(i) }
            )),
          sendOffsets: () => Effect.void,
          commit: Effect.void,
          abort: Effect.void
        }
      })
    }
    return { client, state }
  }
  const sendOne = Effect.flatMap(ProducerTag, (p) => p.send({ topic: "t", value: "v" }))

  it.scoped("after a failed send, the next transaction inits the client again before it begins; after a clean one, not", () =>
    Effect.gen(function*() {
      const { client, state } = countingClient()
      const resolved = yield* internal.resolve({ linger: 0 })
      const producer = yield* internal.makeTransactional(resolved, client)
      assert.strictEqual(state.inits, 1)
      yield* producer.transaction(sendOne)
      assert.strictEqual(state.inits, 1, "a clean transaction leaves the client as it is")
      state.failing = true
      const failed = yield* Effect.flip(producer.transaction(sendOne))
      assert.instanceOf(failed, ProduceFailed)
      state.failing = false
      yield* producer.transaction(sendOne)
      assert.strictEqual(state.inits, 2, "the transaction after the failed send started over")
      yield* producer.transaction(sendOne)
      assert.strictEqual(state.inits, 2)
    }))
})

describe("bufferMemory and maxBlock: the records held are bounded", () => {
  /** A record of `bytes` bytes as the producer counts them (value, key and overhead). */
  const sized = (key: string, bytes: number): Producer.ProducerRecord => {
    const record = { topic: "t", key, value: "" }
    return { ...record, value: "v".repeat(bytes - internal.sizeOf(record)) }
  }
  const bounded = { linger: 0, bufferMemory: 1_000, maxRequestSize: 1_000 } as const
  /** Lets the other fibers run until `condition` holds, for a bounded number of turns; fails by assertion if not. */
  const eventually = (what: string, condition: Effect.Effect<boolean>, turns = 1_000) =>
    Effect.gen(function*() {
      for (let i = 0; i < turns; i++) {
        if (yield* condition) return
        yield* Effect.yieldNow()
      }
      assert.fail(`never happened: ${what}`)
    })
  const keysOf = (batches: ReadonlyArray<ReadonlyArray<Producer.ProducerRecord>>) =>
    batches.flatMap((b) => b.map((r) => String(r.key)))

  it.scoped("a send that does not fit waits maxBlock for room, then fails with BufferFull; none of it is sent", () =>
    Effect.gen(function*() {
      const fake = fakeTransport()
      fake.hold()
      const producer = yield* producerOn({ ...bounded, maxBlock: "5 seconds" }, fake.transport)
      yield* Effect.addFinalizer(() => fake.release)
      const first = yield* Effect.fork(producer.send(sized("first", 600)))
      yield* eventually("first in flight", Effect.sync(() => fake.batches.length === 1))
      const second = yield* Effect.fork(producer.send(sized("second", 600)))
      yield* eventually("second waits for room", Effect.map(TestClock.sleeps(), (sleeps) => sleeps.length === 1))
      yield* TestClock.adjust("4999 millis")
      assert.isTrue(Option.isNone(yield* Fiber.poll(second)), "the send waits until maxBlock has passed")
      yield* TestClock.adjust("1 millis")
      for (let i = 0; i < 100 && Option.isNone(yield* Fiber.poll(second)); i++) yield* Effect.yieldNow()
      assert.isTrue(Option.isSome(yield* Fiber.poll(second)), "the send is answered once maxBlock has passed")
      const error = yield* Effect.flip(Fiber.join(second))
      assert.strictEqual(error.reason, "BufferFull")
      assert.include(error.message, "maxBlock")
      yield* fake.openAll
      assert.strictEqual((yield* Fiber.join(first)).offset, 0n)
      // Room again: the next send goes through, and the refused one was never sent.
      const third = yield* Effect.fork(producer.send(sized("third", 600)))
      yield* eventually("third in flight", Effect.sync(() => fake.batches.length === 2))
      yield* fake.openAll
      yield* Fiber.join(third)
      assert.deepStrictEqual(keysOf(fake.batches), ["first", "third"])
    }))

  it.scoped("waiting sends get in, in the order they came, once the records ahead are answered", () =>
    Effect.gen(function*() {
      const fake = fakeTransport()
      fake.hold()
      const producer = yield* producerOn(bounded, fake.transport)
      yield* Effect.addFinalizer(() => fake.release)
      const three = yield* Effect.fork(producer.sendAll(["a", "b", "c"].map((key) => sized(key, 300))))
      yield* eventually("a, b and c in flight", Effect.sync(() => fake.batches.length === 1))
      const d = yield* Effect.fork(producer.send(sized("d", 300)))
      // e would fit beside a, b and c; it must not pass d, which came first.
      const e = yield* Effect.fork(producer.send(sized("e", 50)))
      for (let i = 0; i < 100; i++) yield* Effect.yieldNow()
      assert.deepStrictEqual(keysOf(fake.batches), ["a", "b", "c"], "nothing passes the bound")
      const done = Effect.map(Effect.all([Fiber.poll(d), Fiber.poll(e)]), (polls) => polls.every(Option.isSome))
      for (let i = 0; i < 1_000 && !(yield* done); i++) {
        yield* fake.openAll
        yield* Effect.yieldNow()
      }
      assert.isTrue(yield* done, "d and e got in")
      yield* Fiber.join(three)
      yield* Fiber.join(d)
      assert.deepStrictEqual(keysOf(fake.batches), ["a", "b", "c", "d", "e"])
    }))

  it.scoped("the bytes in flight and in the buffer never pass bufferMemory, whatever the senders do", () =>
    Effect.gen(function*() {
      // A transport that answers a batch a few steps after it got it, and measures the batches it has not answered
      // yet: up to three in flight, of up to 400 bytes each, would pass 1,000 bytes without the bound.
      let unanswered = 0
      let most = 0
      const transport: internal.Transport = {
        write: (batch) =>
          Effect.gen(function*() {
            const bytes = batch.reduce((n, r) => n + internal.sizeOf(r), 0)
            unanswered += bytes
            most = Math.max(most, unanswered)
            for (let i = 0; i < 5; i++) yield* Effect.yieldNow()
            unanswered -= bytes
            return batch.map((r, i): internal.Written => ({ topic: r.topic, partition: 0, offset: BigInt(i) }))
          })
      }
      const producer = yield* producerOn(
        { ...bounded, batchSize: 400, idempotent: false, maxInFlightRequests: 3 },
        transport
      )
      const sizes = Array.from({ length: 60 }, (_, i) => 30 + ((i * 37) % 250))
      const senders = yield* Effect.fork(Effect.forEach(sizes, (bytes, i) =>
        i % 3 === 0
          ? Effect.asVoid(producer.sendAll([sized(`${i}`, bytes), sized(`${i}b`, 30)]))
          : Effect.asVoid(producer.send(sized(`${i}`, bytes))), { concurrency: "unbounded", discard: true }))
      yield* eventually("every send answered", Effect.map(Fiber.poll(senders), Option.isSome), 20_000)
      yield* Fiber.join(senders)
      assert.isAtMost(most, 1_000)
      assert.isAbove(most, 500, "the bound was reached: the test measured something")
    }))

  it.scoped("flush waits for the sends waiting for room too, and sends them without waiting for linger", () =>
    Effect.gen(function*() {
      const fake = fakeTransport()
      fake.hold()
      const producer = yield* producerOn({ ...bounded, linger: "1 hour" }, fake.transport)
      yield* Effect.addFinalizer(() => fake.release)
      const a = yield* Effect.fork(producer.send(sized("a", 600)))
      yield* Effect.yieldNow()
      const b = yield* Effect.fork(producer.send(sized("b", 600)))
      // b waits for room, so a goes out at once, though linger is an hour.
      yield* eventually("a in flight", Effect.sync(() => fake.batches.length === 1))
      const flushing = yield* Effect.fork(producer.flush)
      for (let i = 0; i < 1_000 && Option.isNone(yield* Fiber.poll(flushing)); i++) {
        yield* fake.openAll
        yield* Effect.yieldNow()
      }
      assert.isTrue(Option.isSome(yield* Fiber.poll(flushing)), "the flush ended without waiting for linger")
      assert.deepStrictEqual(keysOf(fake.batches), ["a", "b"])
      yield* Fiber.join(a)
      yield* Fiber.join(b)
    }))

  it.scoped("a send interrupted while it waits for room is never sent", () =>
    Effect.gen(function*() {
      const fake = fakeTransport()
      fake.hold()
      const producer = yield* producerOn(bounded, fake.transport)
      yield* Effect.addFinalizer(() => fake.release)
      const first = yield* Effect.fork(producer.send(sized("first", 700)))
      yield* eventually("first in flight", Effect.sync(() => fake.batches.length === 1))
      const waiting = yield* Effect.fork(producer.send(sized("interrupted", 700)))
      yield* eventually("waits for room", Effect.map(TestClock.sleeps(), (sleeps) => sleeps.length === 1))
      yield* Fiber.interrupt(waiting)
      yield* fake.openAll
      yield* Fiber.join(first)
      const next = yield* Effect.fork(producer.send(sized("next", 700)))
      yield* eventually("next in flight", Effect.sync(() => fake.batches.length === 2))
      yield* fake.openAll
      yield* Fiber.join(next)
      assert.deepStrictEqual(keysOf(fake.batches), ["first", "next"])
    }))

  it.scoped("closing the producer fails the sends that wait for room with Closed", () =>
    Effect.gen(function*() {
      const fake = fakeTransport()
      fake.hold()
      const scope = yield* Scope.make()
      const producer = yield* producerOn({ ...bounded, closeTimeout: "1 second" }, fake.transport).pipe(
        Scope.extend(scope)
      )
      yield* Effect.addFinalizer(() => fake.release)
      yield* Effect.fork(producer.send(sized("first", 700)))
      yield* eventually("first in flight", Effect.sync(() => fake.batches.length === 1))
      const waiting = yield* Effect.fork(producer.send(sized("waiting", 700)))
      yield* eventually("waits for room", Effect.map(TestClock.sleeps(), (sleeps) => sleeps.length === 1))
      const closing = yield* Effect.fork(Scope.close(scope, Exit.void))
      const error = yield* Effect.flip(Fiber.join(waiting))
      assert.strictEqual(error.reason, "Closed")
      yield* fake.openAll
      yield* Fiber.join(closing)
      assert.deepStrictEqual(keysOf(fake.batches), ["first"])
    }))
})

describe("transactions: one rule for a failed send", () => {
  const okClient = (): internal.TxnClient => ({
    transactionalId: "t-rule",
    init: Effect.void,
    begin: Effect.succeed({
      write: (batch) =>
        Effect.succeed(
          batch.map((r, i): internal.Written =>
            r.topic === "missing"
              ? internal.unknownTopic("missing")
              : { topic: r.topic, partition: 0, offset: BigInt(i) }
          )
        ),
      sendOffsets: () => Effect.void,
      commit: Effect.void,
      abort: Effect.void
    })
  })

  it.scoped("a send refused before it is sent (RecordTooLarge) or by the cluster (UnknownTopic), caught, aborts", () =>
    Effect.gen(function*() {
      const resolved = yield* internal.resolve({ linger: 0, maxRequestSize: 100 })
      const producer = yield* internal.makeTransactional(resolved, okClient())
      for (const refused of [{ topic: "t", value: "x".repeat(200) }, { topic: "missing", value: "x" }]) {
        const body = Effect.flatMap(
          ProducerTag,
          (p) => Effect.zipRight(p.send({ topic: "t", value: "ok" }), Effect.either(p.send(refused)))
        )
        const result = yield* Effect.either(producer.transaction(body))
        assert.isTrue(
          result._tag === "Left" && result.left._tag === "TransactionFailed" && result.left.reason === "Aborted",
          `a caught failure of ${refused.topic} aborts the transaction`
        )
      }
    }))
})

describe("Producer.transaction, the module's accessor", () => {
  it.effect("commits offsets with the transaction, as the service's own transaction does", () =>
    Effect.gen(function*() {
      const kafka = yield* InMemoryKafka.InMemoryKafka
      yield* kafka.createTopic("orders", 1)
      yield* kafka.createTopic("invoices", 1)
      const offsets = { groupId: "billing", positions: [{ topic: "orders", partition: 0, next: 7n }] }
      yield* Producer.transaction(Producer.send({ topic: "invoices", value: "invoice" }), { offsets }).pipe(
        Effect.provide(InMemoryKafka.layerTransactionalProducer({ transactionalId: "accessor", linger: 0 }))
      )
      const committed = yield* InMemoryKafka.committed("billing")
      assert.strictEqual(committed.positions.get("orders-0"), 7n)
    }).pipe(Effect.provide(InMemoryKafka.layer())))

  it("takes the options the service's transaction takes, and keeps the body's types", () => {
    const offsets = { groupId: "g", positions: [{ topic: "t", partition: 0, next: 1n }] }
    const program = Producer.transaction(Producer.send({ topic: "t", value: "v" }), { offsets })
    expectTypeOf(program).toEqualTypeOf<
      Effect.Effect<Producer.RecordMetadata, ProduceFailed | TransactionFailed, Producer.TransactionalProducer>
    >()
    expectTypeOf(Producer.transaction<number, never, never>).parameter(1).toEqualTypeOf<
      Parameters<Producer.TransactionalProducer["Type"]["transaction"]>[1]
    >()
    // @ts-expect-error a position is a bigint, the next offset to read
    Producer.transaction(Effect.void, { offsets: { groupId: "g", positions: [{ topic: "t", partition: 0, next: 1 }] } })
    // @ts-expect-error offsets name their group
    Producer.transaction(Effect.void, { offsets: { positions: [] } })
  })
})
