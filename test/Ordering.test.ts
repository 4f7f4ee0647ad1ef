import { assert, describe, expectTypeOf, it } from "@effect/vitest"
import * as Cause from "effect/Cause"
import * as Chunk from "effect/Chunk"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as FiberId from "effect/FiberId"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import * as Stream from "effect/Stream"
import * as TestClock from "effect/TestClock"
import * as CommitPolicy from "../src/CommitPolicy.js"
import * as Consumer from "../src/Consumer.js"
import type { ConsumerRecord } from "../src/ConsumerRecord.js"
import * as InMemoryKafka from "../src/InMemoryKafka.js"
import { lanes } from "../src/internal/consumer/ordering.js"
import * as Permits from "../src/internal/consumer/permits.js"
import { decode as decodeFinished } from "../src/internal/consumer/progress.js"
import { InvalidConfig, HandlerFailed } from "../src/KafkaError.js"
import { settled } from "./support/kit.js"

const withKafka = <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.provide(effect, InMemoryKafka.layer())

const commitAfter = CommitPolicy.commitAfter({ maxBatch: 1, maxInterval: "1 second" })

const decode = (bytes: Uint8Array | null) => bytes === null ? "" : new TextDecoder().decode(bytes)

/** One partition of `count` records whose keys cycle through `keys` names. */
const produceKeyed = (topic: string, count: number, keys: number) =>
  Effect.gen(function*() {
    yield* InMemoryKafka.createTopic(topic, 1)
    yield* InMemoryKafka.produce(
      topic,
      Array.from({ length: count }, (_, i) => ({ key: `k${i % keys}`, value: `${i}`, partition: 0 }))
    )
  })

describe("ordering: lanes of a chunk", () => {
  const record = (offset: number, key: string | null): ConsumerRecord => ({
    topic: "t",
    partition: 0,
    offset: BigInt(offset),
    key: key === null ? null : new TextEncoder().encode(key),
    value: null,
    headers: {},
    timestamp: 0
  })

  it("key: a lane per key in offset order; a record without a key is a lane of its own", () => {
    const chunk = Chunk.make(record(0, "a"), record(1, "b"), record(2, null), record(3, "a"), record(4, null))
    const split = lanes(chunk, "key").map((lane) => Chunk.toReadonlyArray(lane).map((r) => Number(r.offset)))
    assert.deepStrictEqual(split, [[0, 3], [1], [2], [4]])
  })

  it("key: keys that differ in any byte are different lanes, equal bytes the same lane", () => {
    const keyed = (offset: number, bytes: Array<number>): ConsumerRecord => ({
      ...record(offset, null),
      key: new Uint8Array(bytes)
    })
    const chunk = Chunk.make(keyed(0, [0xff, 1]), keyed(1, [0xff, 2]), keyed(2, [0xff, 1]), keyed(3, []))
    const split = lanes(chunk, "key").map((lane) => Chunk.toReadonlyArray(lane).map((r) => Number(r.offset)))
    assert.deepStrictEqual(split, [[0, 2], [1], [3]])
  })

  it("unordered: every record a lane", () => {
    const chunk = Chunk.make(record(0, "a"), record(1, "a"))
    assert.strictEqual(lanes(chunk, "unordered").length, 2)
  })
})

describe("ordering: key", () => {
  it.effect("a key waits for its own earlier record only: other keys of the partition go on meanwhile", () =>
    withKafka(Effect.gen(function*() {
      yield* produceKeyed("keyed", 40, 4)
      const release = yield* Deferred.make<void>()
      const handled: Array<{ readonly key: string; readonly offset: bigint }> = []
      const fiber = yield* Consumer.runEach(
        { groupId: "g", topics: ["keyed"], maxPollRecords: 40, ordering: "key", concurrency: 8 },
        (record) =>
          Effect.gen(function*() {
            // k0's first record waits until every record of the other keys has been handled.
            if (record.offset === 0n) yield* Deferred.await(release)
            handled.push({ key: decode(record.key), offset: record.offset })
          })
      ).pipe(Effect.provide(commitAfter), Effect.fork)
      yield* settled("the other keys' 30 records handled", Effect.sync(() => handled.length >= 30))
      const early = handled.slice()
      // Released before anything is asserted: a consumer interrupted with a handler stuck would wait for revokeTimeout.
      yield* Deferred.succeed(release, undefined)
      yield* settled("all handled", Effect.sync(() => handled.length === 40))
      yield* Fiber.interrupt(fiber)
      assert.isTrue(early.every((h) => h.key !== "k0"), "k0's later records wait behind its first")
      for (let k = 0; k < 4; k++) {
        const offsets = handled.filter((h) => h.key === `k${k}`).map((h) => Number(h.offset))
        assert.deepStrictEqual(offsets, Array.from({ length: 10 }, (_, i) => i * 4 + k), `k${k} in offset order`)
      }
    })))

  it.effect("handlers in flight never exceed concurrency, over all partitions, and reach it", () =>
    withKafka(Effect.gen(function*() {
      yield* InMemoryKafka.createTopic("many", 3)
      for (let p = 0; p < 3; p++) {
        yield* InMemoryKafka.produce(
          "many",
          Array.from({ length: 60 }, (_, i) => ({ key: `p${p}-k${i % 20}`, value: `${i}`, partition: p }))
        )
      }
      let inFlight = 0
      let most = 0
      let done = 0
      const fiber = yield* Consumer.runEach(
        { groupId: "g", topics: ["many"], maxPollRecords: 60, ordering: "key", concurrency: 5 },
        () =>
          Effect.gen(function*() {
            inFlight++
            most = Math.max(most, inFlight)
            yield* Effect.sleep("10 millis")
            inFlight--
            done++
          })
      ).pipe(Effect.provide(commitAfter), Effect.fork)
      while (done < 180) {
        yield* TestClock.adjust("10 millis")
        yield* settled("handlers waiting or done", Effect.sync(() => true), 100)
      }
      yield* Fiber.interrupt(fiber)
      assert.strictEqual(most, 5)
    })))

  it.effect("commitAfter: free keys go on past a slow one, across chunks; the position stays at the lowest unfinished offset and the records finished past it ride in its metadata", () => {
    // Released whatever happens, so that a failed assertion ends the test rather than a revoke waiting for it.
    const release = Deferred.unsafeMake<void>(FiberId.none)
    return withKafka(Effect.gen(function*() {
      yield* produceKeyed("slow", 20, 2)
      const handled: Array<bigint> = []
      const fiber = yield* Consumer.runEach(
        { groupId: "g", topics: ["slow"], maxPollRecords: 10, ordering: "key", concurrency: 4 },
        (record) =>
          Effect.gen(function*() {
            // k1's first record (offset 1) waits; k0's records, in both chunks, are handled meanwhile.
            if (record.offset === 1n) yield* Deferred.await(release)
            handled.push(record.offset)
          })
      ).pipe(Effect.provide(commitAfter), Effect.fork)
      const committedAt = (position: bigint) =>
        Effect.map(InMemoryKafka.committed("g"), (b) => b.positions.get("slow-0") === position)
      yield* settled("k0's ten handled and committed", committedAt(1n))
      yield* settled("k0's ten handled", Effect.sync(() => handled.length === 10))
      for (let i = 0; i < 100; i++) yield* Effect.yieldNow()
      const early = [...handled]
      const gap = yield* InMemoryKafka.committed("g")
      yield* Deferred.succeed(release, undefined)
      yield* settled("all committed", committedAt(20n))
      yield* Fiber.interrupt(fiber)
      assert.deepStrictEqual(
        early,
        [0n, 2n, 4n, 6n, 8n, 10n, 12n, 14n, 16n, 18n],
        "k1 waits, k0 goes on past the chunk"
      )
      assert.strictEqual(gap.positions.get("slow-0"), 1n, "never past the unfinished offset 1")
      assert.deepStrictEqual(
        decodeFinished(1n, gap.metadata?.get("slow-0")),
        [2n, 4n, 6n, 8n, 10n, 12n, 14n, 16n, 18n].map((o) => [o, o + 1n])
      )
      const k1 = handled.filter((o) => o % 2n === 1n)
      assert.deepStrictEqual(k1, [1n, 3n, 5n, 7n, 9n, 11n, 13n, 15n, 17n, 19n], "k1's records in offset order")
      assert.isUndefined((yield* InMemoryKafka.committed("g")).metadata?.get("slow-0"), "nothing finished past 20")
    })).pipe(Effect.ensuring(Deferred.succeed(release, undefined)))
  })
})

describe("ordering: failures", () => {
  for (const ordering of ["key", "unordered"] as const) {
    it.effect(`${ordering}: a handler that keeps failing ends the consumer with HandlerFailed naming its record, after retrying the chunk`, () =>
      withKafka(Effect.gen(function*() {
        yield* produceKeyed("failing", 30, 5)
        const attempts = new Map<bigint, number>()
        const fiber = yield* Consumer.runEach(
          { groupId: "g", topics: ["failing"], ordering, concurrency: 4, retry: Schedule.recurs(2) },
          (record) =>
            Effect.suspend(() => {
              attempts.set(record.offset, (attempts.get(record.offset) ?? 0) + 1)
              return record.offset === 12n ? Effect.fail("refused" as const) : Effect.void
            })
        ).pipe(Effect.provide(commitAfter), Effect.fork)
        // A consumer that skipped the failed chunk on a retry would go on forever: wait a bounded while, then look.
        yield* settled("the consumer ended", Effect.map(Fiber.poll(fiber), Option.isSome), 20_000).pipe(
          Effect.catchAll(() => Effect.void)
        )
        const error = yield* Fiber.interrupt(fiber).pipe(
          Effect.zipRight(Fiber.await(fiber)),
          Effect.map((exit) => exit._tag === "Failure" ? Cause.failureOption(exit.cause) : Option.none()),
          Effect.map(Option.getOrUndefined)
        )
        assert.isTrue(
          error instanceof HandlerFailed && error.offset === 12n && error.cause === "refused",
          String(error)
        )
        // Each retry hands the failing record again: a retry that skipped its chunk would leave it at one attempt.
        assert.strictEqual(attempts.get(12n), 3, "the record was tried once and retried twice")
        const committed = yield* InMemoryKafka.committed("g")
        assert.isTrue(
          (committed.positions.get("failing-0") ?? 0n) <= 12n,
          "nothing is committed past the failed record"
        )
      })))
  }
})

describe("ordering: settings", () => {
  it.effect("a bad ordering or concurrency is refused, naming the field", () =>
    Effect.gen(function*() {
      const ordering = yield* Effect.flip(
        // @ts-expect-error: not an ordering
        Consumer.validate({ groupId: "g", topics: ["t"], ordering: "random" })
      )
      assert.instanceOf(ordering, InvalidConfig)
      assert.strictEqual(ordering.field, "ordering")
      for (const concurrency of [0, -1, 1.5]) {
        const error = yield* Effect.flip(Consumer.validate({ groupId: "g", topics: ["t"], concurrency }))
        assert.strictEqual(error.field, "concurrency")
      }
    }))

  it.effect("a partition stream refuses an ordering other than partition", () =>
    withKafka(Effect.gen(function*() {
      yield* InMemoryKafka.createTopic("t", 1)
      const error = yield* Consumer.partitions({ groupId: "g", topics: ["t"], ordering: "key" }).pipe(
        Stream.runDrain,
        Effect.provide(commitAfter),
        Effect.flip
      )
      assert.isTrue(error instanceof InvalidConfig && error.field === "ordering", String(error))
    })))

  it("ordering is one of three names", () => {
    expectTypeOf<NonNullable<Consumer.Config["ordering"]>>().toEqualTypeOf<"partition" | "key" | "unordered">()
  })
})

describe("ordering: permits", () => {
  it.effect("a released permit goes to the oldest waiter; an interrupted waiter gives its place or its permit on", () =>
    Effect.gen(function*() {
      const permits = Permits.make(1)
      const order: Array<string> = []
      const hold = yield* Deferred.make<void>()
      const first = yield* Effect.fork(
        permits.withPermit(Effect.zipRight(Deferred.await(hold), Effect.sync(() => order.push("first"))))
      )
      yield* settled("first holds the permit", Effect.sync(() => permits.state().free === 0))
      const waiters = yield* Effect.forEach(
        ["a", "b", "c"],
        (name) => Effect.fork(permits.withPermit(Effect.sync(() => order.push(name)))),
        { concurrency: 1 }
      )
      yield* settled("three waiting", Effect.sync(() => permits.state().waiting === 3))
      yield* Fiber.interrupt(waiters[1]!)
      yield* Deferred.succeed(hold, undefined)
      yield* Fiber.join(first)
      yield* Fiber.join(waiters[0]!)
      yield* Fiber.join(waiters[2]!)
      assert.deepStrictEqual(order, ["first", "a", "c"])
      assert.deepStrictEqual(permits.state(), { free: 1, waiting: 0 })
    }))
})
