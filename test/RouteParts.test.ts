/**
 * The failure route's parts on their own: the circuit's count of failures in a row, the failed attempts it keeps,
 * where a failed record goes, and a routed record's letter, which its unit waits for.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Cause from "effect/Cause"
import * as Chunk from "effect/Chunk"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import type { ConsumerRecord } from "../src/ConsumerRecord.js"
import { CircuitOpen, DecodeFailed, ProduceFailed } from "../src/KafkaError.js"
import { Producer, type ProducerRecord, type RecordMetadata } from "../src/Producer.js"
import * as Attempts from "../src/internal/route/attempts.js"
import * as Circuit from "../src/internal/route/circuit.js"
import type { RouteContext } from "../src/internal/route/context.js"
import { park, withPending } from "../src/internal/route/deadLetters.js"
import { failedOffset, Fatal, HandlerFailure, indexOf, retryable } from "../src/internal/route/failures.js"
import { makeSideWrites } from "../src/internal/route/sideWrites.js"
import { retryStepOf, targetOf } from "../src/internal/route/targets.js"

const tp = { topic: "t", partition: 0 }
const record = (offset: number, topic = "t"): ConsumerRecord => ({
  topic,
  partition: 0,
  offset: BigInt(offset),
  key: null,
  value: new TextEncoder().encode(String(offset)),
  headers: {},
  timestamp: 0
})
const chunkOf = (...offsets: Array<number>) => Chunk.unsafeFromArray(offsets.map((offset) => record(offset)))

/** Routes the record at `offset` of a partition read in order, as the route does: the row it makes, then marked. */
const routeInOrder = (state: Circuit.Row, offset: bigint, most: number, counts = true) => {
  const row = Circuit.rowOf(state, offset, undefined, counts, most)
  if (row < most) Circuit.routed(state, offset, undefined, row)
  return row
}

/** The same for a partition whose records finish out of order: record `offset` spans `[offset, offset + 1)`. */
const routeOutOfOrder = (state: Circuit.Row, offset: bigint, most: number) => {
  const range = [offset, offset + 1n] as const
  const row = Circuit.rowOf(state, offset, range, true, most)
  if (row < most) Circuit.routed(state, offset, range, row)
  return row
}

describe("the circuit, on a partition read in order", () => {
  it("records routed one after another make a growing row", () => {
    const state = Circuit.emptyRow()
    assert.deepStrictEqual([0n, 1n, 2n, 3n].map((offset) => routeInOrder(state, offset, 10)), [1, 2, 3, 4])
  })

  it("a record handled in the middle of a run of failures breaks the row", () => {
    const state = Circuit.emptyRow()
    routeInOrder(state, 0n, 10)
    routeInOrder(state, 1n, 10)
    routeInOrder(state, 2n, 10)
    Circuit.handled(state, 3n)
    assert.deepStrictEqual(state.streak, [])
    assert.strictEqual(routeInOrder(state, 4n, 10), 1)
    assert.strictEqual(routeInOrder(state, 5n, 10), 2)
  })

  it("a handled record keeps the failures above it in the row (they finished after it)", () => {
    const state = Circuit.emptyRow()
    routeInOrder(state, 5n, 10)
    routeInOrder(state, 6n, 10)
    Circuit.handled(state, 4n)
    assert.deepStrictEqual(state.streak, [5n, 6n])
    assert.strictEqual(routeInOrder(state, 7n, 10), 3)
  })

  it("a handled position behind the one known changes nothing", () => {
    const state = Circuit.emptyRow()
    Circuit.handled(state, 10n)
    routeInOrder(state, 11n, 10)
    Circuit.handled(state, 3n)
    assert.strictEqual(state.handledUpTo, 10n)
    assert.deepStrictEqual(state.streak, [11n])
  })

  it("a record routed again, one below the records handled, or one that does not count, is not one more", () => {
    const state = Circuit.emptyRow()
    Circuit.handled(state, 4n)
    assert.strictEqual(routeInOrder(state, 3n, 10), 0)
    assert.strictEqual(routeInOrder(state, 5n, 10), 1)
    assert.strictEqual(routeInOrder(state, 5n, 10), 0)
    assert.strictEqual(routeInOrder(state, 6n, 10, false), 0)
    assert.deepStrictEqual(state.streak, [5n])
  })

  it("opens at the maxInARow-th record in a row", () => {
    const state = Circuit.emptyRow()
    assert.deepStrictEqual([0n, 1n, 2n].map((offset) => routeInOrder(state, offset, 3)), [1, 2, 3])
  })
})

describe("the circuit, on a partition whose records finish out of order", () => {
  it("records whose ranges meet are in a row whatever the order they failed in", () => {
    const state = Circuit.emptyRow()
    assert.strictEqual(routeOutOfOrder(state, 2n, 10), 1)
    assert.strictEqual(routeOutOfOrder(state, 0n, 10), 1)
    // Record 1 joins 0 and 2: three in a row.
    assert.strictEqual(routeOutOfOrder(state, 1n, 10), 3)
    assert.strictEqual(routeOutOfOrder(state, 3n, 10), 4)
  })

  it("a record between two routed ones that is not routed breaks the row", () => {
    const state = Circuit.emptyRow()
    routeOutOfOrder(state, 0n, 10)
    routeOutOfOrder(state, 1n, 10)
    // Record 2 was handled: 3 meets nothing routed below it.
    assert.strictEqual(routeOutOfOrder(state, 3n, 10), 1)
    assert.strictEqual(routeOutOfOrder(state, 4n, 10), 2)
  })

  it("a range routed again is not one more, and the count stops at the most asked for", () => {
    const state = Circuit.emptyRow()
    for (let offset = 0n; offset < 5n; offset++) routeOutOfOrder(state, offset, 100)
    assert.strictEqual(Circuit.rowOf(state, 2n, [2n, 3n], true, 100), 0)
    assert.strictEqual(Circuit.inARow(state, [5n, 6n], 100), 6)
    assert.strictEqual(Circuit.inARow(state, [5n, 6n], 3), 3)
  })

  it("ranges behind the position are dropped", () => {
    const state = Circuit.emptyRow()
    for (let offset = 0n; offset < 4n; offset++) routeOutOfOrder(state, offset, 100)
    Circuit.passed(state, 2n)
    assert.deepStrictEqual([...state.routedFrom.keys()], [2n, 3n])
    assert.deepStrictEqual([...state.routedUntil.keys()], [3n, 4n])
    assert.strictEqual(routeOutOfOrder(state, 4n, 100), 3)
  })
})

describe("the failed attempts the route counts", () => {
  it("counts a record's failures, and drops them once it is handled, routed, or behind the position", () => {
    const attempts: Attempts.Attempts = new Map()
    Attempts.failedOnce(attempts, "t-0", 1n)
    Attempts.failedOnce(attempts, "t-0", 1n)
    Attempts.failedOnce(attempts, "t-0", 2n)
    Attempts.failedOnce(attempts, "t-0", 5n)
    Attempts.failedOnce(attempts, "t-1", 9n)
    assert.strictEqual(Attempts.attemptsOf(attempts, "t-0", 1n), 2)
    assert.strictEqual(Attempts.size(attempts), 4)
    Attempts.succeeded(attempts, tp, chunkOf(1, 3))
    assert.strictEqual(Attempts.attemptsOf(attempts, "t-0", 1n), undefined)
    Attempts.dropAttempt(attempts, "t-0", 2n)
    Attempts.passed(attempts, "t-0", 6n)
    assert.isFalse(attempts.has("t-0"))
    Attempts.passed(attempts, "t-1", 9n)
    assert.strictEqual(Attempts.size(attempts), 1)
  })

  it.effect("counts the record a handler failure names, or the only record of its chunk, else none", () =>
    Effect.gen(function*() {
      const attempts: Attempts.Attempts = new Map()
      const fail = (failure: HandlerFailure<string> | Fatal, records: Chunk.Chunk<ConsumerRecord>) =>
        Effect.flip(Attempts.counted(attempts, tp, records, Effect.fail(failure)))
      yield* fail(new HandlerFailure("boom", 4n), chunkOf(3, 4, 5))
      yield* fail(new HandlerFailure("boom", undefined), chunkOf(7))
      yield* fail(new HandlerFailure("boom", undefined), chunkOf(8, 9))
      yield* fail(new Fatal(new ProduceFailed({ reason: "Other", topic: "dlq", detail: "" })), chunkOf(10))
      assert.deepStrictEqual([...attempts.get("t-0")!], [[4n, 1], [7n, 1]])
    }))
})

describe("what the route tells of a failure", () => {
  it("the record a failure is about, and where it is in its chunk", () => {
    assert.strictEqual(failedOffset(new HandlerFailure("e", 5n), chunkOf(4, 5)), 5n)
    assert.strictEqual(failedOffset(new HandlerFailure("e", undefined), chunkOf(4)), 4n)
    assert.strictEqual(failedOffset(new HandlerFailure("e", undefined), chunkOf(4, 5)), undefined)
    const records = chunkOf(2, 3, 5, 8, 13, 21)
    assert.deepStrictEqual([2n, 8n, 21n, 4n].map((offset) => indexOf(records, offset)), [0, 3, 5, -1])
    // Offsets that do not grow are still searched.
    assert.strictEqual(indexOf(chunkOf(9, 3, 7), 3n), 1)
  })

  it("a failure to decode is not retried; the handler's own failure is; the route's are not", () => {
    assert.isTrue(retryable(new HandlerFailure("e", 1n)))
    const undecodable: DecodeFailed = Object.create(DecodeFailed.prototype)
    assert.isFalse(retryable(new HandlerFailure(undecodable, 1n)))
    assert.isFalse(retryable("e"))
  })

  it("a failed record goes through each retry topic in turn, then to the dead-letter topic", () => {
    const settings = { topic: "dlq", maxInARow: 10, delays: [1_000, 5_000] }
    assert.strictEqual(retryStepOf(settings, "orders"), undefined)
    assert.strictEqual(retryStepOf(settings, "orders-retry-1"), 1)
    assert.strictEqual(retryStepOf(settings, "orders-retry-2"), undefined)
    assert.deepStrictEqual(targetOf(settings, "orders", 100), { topic: "orders-retry-0", due: 1_100 })
    assert.deepStrictEqual(targetOf(settings, "orders-retry-0", 100), { topic: "orders-retry-1", due: 5_100 })
    assert.deepStrictEqual(targetOf(settings, "orders-retry-1", 100), { topic: "dlq", due: undefined })
    const plain = { topic: "dlq", maxInARow: 10, delays: [] }
    assert.strictEqual(retryStepOf(plain, "orders-retry-0"), undefined)
    assert.deepStrictEqual(targetOf(plain, "orders", 100), { topic: "dlq", due: undefined })
  })
})

/** A producer whose writes wait for `gate`; what it was asked to write, by call. */
const gatedProducer = (gate: Deferred.Deferred<void>, fail = false) => {
  const calls: Array<ReadonlyArray<ProducerRecord>> = []
  const answer = (records: ReadonlyArray<ProducerRecord>) =>
    Effect.zipRight(
      Deferred.await(gate),
      fail
        ? Effect.fail(new ProduceFailed({ reason: "Other", topic: records[0]!.topic, detail: "refused" }))
        : Effect.succeed(records.map((r, i): RecordMetadata => ({ topic: r.topic, partition: 0, offset: BigInt(i) })))
    )
  const layer = Layer.succeed(Producer, {
    send: (r) => {
      calls.push([r])
      return Effect.map(answer([r]), (metadata) => metadata[0]!)
    },
    sendAll: (records) => {
      const all = Array.from(records)
      calls.push(all)
      return answer(all)
    },
    flush: Effect.void
  })
  return { calls, layer }
}

const contextOf = (most: number, routed: Array<string>): RouteContext<never, never> => ({
  settings: { topic: "dlq", maxInARow: most, delays: [] },
  mode: "inPlace",
  unitHoldsWrites: false,
  work: () => Effect.void,
  retry: (effect) => effect,
  apart: undefined,
  onRouted: (_tp, topic) => {
    routed.push(topic)
  },
  partitions: new Map(),
  locators: new Map(),
  attempts: new Map()
})

describe("a routed record's letter", () => {
  it.live("the unit that routed a record ends only once its letter is acknowledged", () =>
    Effect.gen(function*() {
      const gate = yield* Deferred.make<void>()
      const producer = gatedProducer(gate)
      const routed: Array<string> = []
      const context = contextOf(10, routed)
      const unit = yield* Effect.fork(
        withPending(context, (pending) => park(context, pending, tp, record(3), "boom")).pipe(
          Effect.provide(producer.layer)
        )
      )
      yield* Effect.sleep(Duration.millis(20))
      assert.isTrue(Option.isNone(yield* Fiber.poll(unit)), "the unit ended before its dead letter was written")
      assert.deepStrictEqual(routed, [])
      yield* Deferred.succeed(gate, undefined)
      yield* Fiber.join(unit)
      assert.deepStrictEqual(routed, ["dlq"])
      const letter = producer.calls[0]![0]!
      assert.strictEqual(letter.topic, "dlq")
      assert.deepStrictEqual(letter.value, record(3).value)
    }))

  it.live("the circuit opens before the letter of the maxInARow-th record is written", () =>
    Effect.gen(function*() {
      const gate = yield* Deferred.make<void>()
      yield* Deferred.succeed(gate, undefined)
      const producer = gatedProducer(gate)
      const context = contextOf(2, [])
      const exit = yield* Effect.exit(
        withPending(context, (pending) =>
          Effect.zipRight(park(context, pending, tp, record(0), "a"), park(context, pending, tp, record(1), "b"))).pipe(
            Effect.provide(producer.layer)
          )
      )
      const error = Exit.isFailure(exit) ? Cause.failureOption(exit.cause) : Option.none()
      assert.isTrue(Option.isSome(error) && error.value.error instanceof CircuitOpen, "the circuit did not open")
      const open = Option.getOrThrow(error).error as CircuitOpen
      assert.strictEqual(open.offset, 1n)
      assert.strictEqual(open.count, 2)
      assert.strictEqual(producer.calls.length, 1)
    }))
})

describe("the route's writes apart from the units", () => {
  it.live("records routed close together are written by one sendAll; settled waits for it", () =>
    Effect.gen(function*() {
      const gate = yield* Deferred.make<void>()
      const producer = gatedProducer(gate)
      const side = makeSideWrites(Duration.seconds(10))
      const written: Array<bigint> = []
      for (let i = 0; i < 3; i++) {
        yield* side.start({ topic: "dlq", value: String(i) }, (metadata) =>
          Effect.sync(() => {
            written.push(metadata.offset)
          })).pipe(Effect.provide(producer.layer))
      }
      const settled = yield* Effect.fork(side.settled)
      yield* Effect.sleep(Duration.millis(20))
      assert.isTrue(Option.isNone(yield* Fiber.poll(settled)), "settled before the writes were acknowledged")
      yield* Deferred.succeed(gate, undefined)
      assert.strictEqual(yield* Fiber.join(settled), undefined)
      assert.deepStrictEqual(written, [0n, 1n, 2n])
      assert.deepStrictEqual(producer.calls.map((call) => call.length), [3])
      yield* side.close(Duration.zero)
    }))

  it.live("a write that failed stays failed", () =>
    Effect.gen(function*() {
      const gate = yield* Deferred.make<void>()
      yield* Deferred.succeed(gate, undefined)
      const producer = gatedProducer(gate, true)
      const side = makeSideWrites(Duration.seconds(10))
      yield* side.start({ topic: "dlq", value: "x" }, () => Effect.void).pipe(Effect.provide(producer.layer))
      const first = yield* side.settled
      assert.instanceOf(first, Fatal)
      assert.strictEqual(yield* side.settled, first)
      yield* side.close(Duration.zero)
    }))
})
