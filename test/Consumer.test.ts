import { assert, describe, it } from "@effect/vitest"
import * as Chunk from "effect/Chunk"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Schedule from "effect/Schedule"
import * as TestClock from "effect/TestClock"
import * as CommitPolicy from "../src/CommitPolicy.js"
import * as Consumer from "../src/Consumer.js"
import type { ConsumerRecord } from "../src/ConsumerRecord.js"
import * as InMemoryKafka from "../src/InMemoryKafka.js"
import { InvalidConfig, HandlerFailed } from "../src/KafkaError.js"
import { settled } from "./support/kit.js"

const produce = (topic: string, partitions: number, perPartition: number) =>
  Effect.gen(function*() {
    yield* InMemoryKafka.createTopic(topic, partitions)
    for (let p = 0; p < partitions; p++) {
      yield* InMemoryKafka.produce(
        topic,
        Array.from({ length: perPartition }, (_, i) => ({ value: `${p}:${i}`, partition: p }))
      )
    }
  })

const committedTotal = (groupId: string) =>
  Effect.map(InMemoryKafka.committed(groupId), (b) => [...b.positions.values()].reduce((a, x) => a + x, 0n))

const withKafka = <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.provide(effect, InMemoryKafka.layer())

const commitAfter = CommitPolicy.commitAfter({ maxBatch: 10, maxInterval: "1 second" })

describe("Consumer", () => {
  it.effect("keeps order within a partition and handles partitions concurrently", () =>
    withKafka(Effect.gen(function*() {
      yield* produce("order", 2, 100)
      const seen = new Map<number, Array<bigint>>([[0, []], [1, []]])
      // Partition 0's first chunk waits until partition 1 has been handled: with one partition at a time this
      // would never finish.
      const p1Handled = yield* Deferred.make<void>()
      const fiber = yield* Consumer.run(
        { groupId: "g", topics: ["order"], maxPollRecords: 10 },
        (records, tp) =>
          Effect.gen(function*() {
            if (tp.partition === 0) yield* Deferred.await(p1Handled)
            for (const r of records) seen.get(tp.partition)!.push(r.offset)
            if (tp.partition === 1) yield* Deferred.succeed(p1Handled, undefined)
          })
      ).pipe(Effect.provide(commitAfter), Effect.fork)
      yield* settled("all handled", Effect.sync(() => seen.get(0)!.length === 100 && seen.get(1)!.length === 100))
      yield* Fiber.interrupt(fiber)
      for (const offsets of seen.values()) {
        assert.deepStrictEqual(offsets, Array.from({ length: 100 }, (_, i) => BigInt(i)))
      }
    })))

  it.effect("commitAfter commits by count and by time, never past an unhandled record", () =>
    withKafka(Effect.gen(function*() {
      yield* produce("batching", 1, 15)
      const gate = yield* Deferred.make<void>()
      let handled = 0
      const fiber = yield* Consumer.run(
        { groupId: "g", topics: ["batching"], maxPollRecords: 5 },
        (records) =>
          Effect.gen(function*() {
            if (handled >= 10) yield* Deferred.await(gate)
            handled += Chunk.size(records)
          })
      ).pipe(
        Effect.provide(CommitPolicy.commitAfter({ maxBatch: 10, maxInterval: "5 seconds" })),
        Effect.fork
      )
      // Ten handled records reach maxBatch: committed without any time passing.
      yield* settled("count commit", Effect.map(committedTotal("g"), (n) => n === 10n))
      assert.strictEqual(handled, 10)
      yield* Deferred.succeed(gate, undefined)
      yield* settled("all handled", Effect.sync(() => handled === 15))
      // Five more handled: below maxBatch, so they wait for maxInterval.
      assert.strictEqual(yield* committedTotal("g"), 10n)
      yield* TestClock.adjust("5 seconds")
      yield* settled("time commit", Effect.map(committedTotal("g"), (n) => n === 15n))
      yield* Fiber.interrupt(fiber)
    })))

  it.effect("atMostOnce commits a chunk's position before the handler sees it", () =>
    withKafka(Effect.gen(function*() {
      yield* produce("amo", 2, 50)
      const violations: Array<string> = []
      let handled = 0
      const fiber = yield* Consumer.run({ groupId: "g", topics: ["amo"], maxPollRecords: 7 }, (records, tp) =>
        Effect.gen(function*() {
          const committed = yield* InMemoryKafka.committed("g")
          const position = committed.positions.get(`amo-${tp.partition}`) ?? -1n
          const last = Chunk.unsafeLast(records).offset
          if (position < last + 1n) {
            violations.push(`${tp.partition}@${last}: committed ${position}`)
          }
          handled += Chunk.size(records)
        })).pipe(Effect.provide(CommitPolicy.atMostOnce()), Effect.fork)
      yield* settled(
        "all handled",
        Effect.sync(() =>
          handled === 100
        )
      )
      yield* Fiber.interrupt(fiber)
      assert.deepStrictEqual(violations, [])
    })))

  it.effect("a failing handler is retried on the same records, and the position never passes them", () =>
    withKafka(Effect.gen(function*() {
      yield* produce("retry", 1, 30)
      let attempts = 0
      const handled: Array<bigint> = []
      const fiber = yield* Consumer.runEach(
        { groupId: "g", topics: ["retry"], maxPollRecords: 10, retry: Schedule.recurs(3) },
        (record) =>
          Effect.suspend(() => {
            if (record.offset === 15n && attempts++ < 2) return Effect.fail(new Error("flaky"))
            handled.push(record.offset)
            return Effect.void
          })
      ).pipe(Effect.provide(commitAfter), Effect.fork)
      yield* settled("all handled", Effect.sync(() => handled.includes(29n)))
      yield* TestClock.adjust("1 second")
      yield* settled("committed", Effect.map(committedTotal("g"), (n) => n === 30n))
      yield* Fiber.interrupt(fiber)
      assert.strictEqual(attempts, 3)
      // Every record was handled, in order; the retried chunk started again at its first record, on every attempt.
      assert.deepStrictEqual([...new Set(handled)], Array.from({ length: 30 }, (_, i) => BigInt(i)))
      const range = (from: number, to: number) => Array.from({ length: to - from }, (_, i) => BigInt(from + i))
      assert.deepStrictEqual(handled, [...range(0, 15), ...range(10, 15), ...range(10, 30)])
    })))

  it.effect("when retries run out the consumer fails with HandlerFailed naming the record, and nothing past it is committed", () =>
    withKafka(Effect.gen(function*() {
      yield* produce("poison", 1, 30)
      const exit = yield* Consumer.runEach(
        { groupId: "g", topics: ["poison"], maxPollRecords: 10, retry: Schedule.recurs(2) },
        (record) => record.offset === 17n ? Effect.fail(new Error("poison")) : Effect.void
      ).pipe(Effect.provide(commitAfter), Effect.exit)
      assert.isTrue(Exit.isFailure(exit))
      const error = Exit.isFailure(exit) ? exit.cause : undefined
      const failure = error && error._tag === "Fail" ? error.error : undefined
      assert.instanceOf(failure, HandlerFailed)
      if (failure instanceof HandlerFailed) {
        assert.strictEqual(failure.topic, "poison")
        assert.strictEqual(failure.partition, 0)
        assert.strictEqual(failure.offset, 17n)
        assert.match(failure.message, /poison-0 at offset 17/)
      }
      // The chunk 10..19 failed: the committed position stays at its start.
      assert.strictEqual(yield* committedTotal("g"), 10n)
    })))

  it.effect("a slow handler pauses fetching: buffered records never exceed bufferSize", () =>
    withKafka(Effect.gen(function*() {
      yield* produce("slow", 1, 2_000)
      const kafka = yield* InMemoryKafka.InMemoryKafka
      let handled = 0
      let maxOutstanding = 0
      let member = ""
      const fiber = yield* Consumer.run(
        { groupId: "g", topics: ["slow"], maxPollRecords: 20, bufferSize: 100 },
        (records) =>
          Effect.gen(function*() {
            // Slower than fetching: yield many times per chunk, and measure how far fetching ran ahead.
            for (let i = 0; i < 50; i++) yield* Effect.yieldNow()
            if (member === "") member = (yield* kafka.members("g"))[0]!.memberId
            const fetched = yield* kafka.fetchedCount(member)
            maxOutstanding = Math.max(maxOutstanding, fetched - handled)
            handled += Chunk.size(records)
          })
      ).pipe(Effect.provide(commitAfter), Effect.fork)
      yield* settled("all handled", Effect.sync(() => handled === 2_000), 1_000_000)
      yield* Fiber.interrupt(fiber)
      assert.isAtMost(maxOutstanding, 100)
      assert.isAtLeast(maxOutstanding, 40)
    })))

  it.effect("long processing keeps the partition: heartbeats go on while a handler runs past the session timeout", () =>
    withKafka(Effect.gen(function*() {
      yield* produce("long", 2, 3)
      let handled = 0
      let lost = 0
      const fiber = yield* Consumer.run(
        { groupId: "g", topics: ["long"], sessionTimeout: "10 seconds", maxPollRecords: 1 },
        (records) =>
          Effect.sleep("25 seconds").pipe(Effect.zipRight(Effect.sync(() => (handled += Chunk.size(records))))),
        { onRevoke: () => Effect.sync(() => lost++) }
      ).pipe(Effect.provide(commitAfter), Effect.fork)
      yield* settled(
        "joined",
        Effect.map(InMemoryKafka.InMemoryKafka, (k) => k.generation("g")).pipe(
          Effect.flatten,
          Effect.map((g) => g === 1)
        )
      )
      for (let i = 0; i < 30 && handled < 6; i++) {
        yield* TestClock.adjust("5 seconds")
        yield* Effect.yieldNow()
      }
      yield* settled("all handled", Effect.sync(() => handled === 6))
      const generation = yield* Effect.flatten(Effect.map(InMemoryKafka.InMemoryKafka, (k) => k.generation("g")))
      const revokedWhileRunning = lost
      yield* Fiber.interrupt(fiber)
      assert.strictEqual(generation, 1)
      assert.strictEqual(revokedWhileRunning, 0)
    })))

  it.effect("revoke: partition resources are released, the final position is committed before the next owner starts, and no handler of the partition runs afterwards", () =>
    withKafka(Effect.gen(function*() {
      yield* produce("revoke", 2, 200)
      const kafka = yield* InMemoryKafka.InMemoryKafka
      const events: Array<string> = []
      const handledBy = new Map<string, Array<ConsumerRecord>>()
      const startedAt = new Map<string, bigint>()
      const owned = new Set<string>()
      const member = (name: string) =>
        Consumer.run(
          { groupId: "g", topics: ["revoke"], maxPollRecords: 10 },
          (records, tp) =>
            Effect.gen(function*() {
              if (!owned.has(`${name}-${tp.partition}`)) {
                events.push(`${name} handled ${tp.partition} without owning it`)
              }
              const list = handledBy.get(name) ?? []
              list.push(...records)
              handledBy.set(name, list)
              yield* Effect.yieldNow()
            }),
          {
            onAssign: (tp) =>
              Effect.gen(function*() {
                const committed = yield* kafka.committed("g")
                startedAt.set(`${name}-${tp.partition}`, committed.get(`revoke-${tp.partition}`) ?? 0n)
                yield* Effect.acquireRelease(
                  Effect.sync(() => {
                    owned.add(`${name}-${tp.partition}`)
                    events.push(`${name} acquired ${tp.partition}`)
                  }),
                  () =>
                    Effect.sync(() => {
                      owned.delete(`${name}-${tp.partition}`)
                      events.push(`${name} released ${tp.partition}`)
                    })
                )
              })
          }
        ).pipe(Effect.provide(CommitPolicy.commitAfter({ maxBatch: 1_000, maxInterval: "1 hour" })))
      const a = yield* Effect.fork(member("a"))
      yield* settled("a got going", Effect.sync(() => (handledBy.get("a")?.length ?? 0) >= 50))
      const b = yield* Effect.fork(member("b"))
      yield* settled("b owns a partition", Effect.sync(() => events.some((e) => e.startsWith("b acquired"))))
      const moved = events.find((e) => e.startsWith("b acquired"))!.split(" ")[2]!
      // a released the moved partition before b acquired it, and b started exactly where a had got to.
      assert.isBelow(events.indexOf(`a released ${moved}`), events.indexOf(`b acquired ${moved}`))
      const aLast = handledBy.get("a")!.filter((r) => r.partition === Number(moved)).map((r) => r.offset)
      const aPosition = aLast.length === 0 ? 0n : aLast.reduce((x, y) => (x > y ? x : y)) + 1n
      assert.strictEqual(startedAt.get(`b-${moved}`), aPosition)
      yield* settled(
        "all handled",
        Effect.sync(() => (handledBy.get("a")?.length ?? 0) + (handledBy.get("b")?.length ?? 0) >= 400)
      )
      yield* Fiber.interrupt(b)
      yield* Fiber.interrupt(a)
      assert.deepStrictEqual(events.filter((e) => e.includes("without owning")), [])
      const all = [...(handledBy.get("a") ?? []), ...(handledBy.get("b") ?? [])].map((r) =>
        `${r.partition}@${r.offset}`
      )
      assert.strictEqual(new Set(all).size, 400)
      assert.strictEqual(all.length, 400)
    })))

  it.effect("a member that crashes while it leaves stops at once: nothing of its final commit lands", () =>
    withKafka(Effect.gen(function*() {
      yield* produce("leaving", 2, 30)
      let leaving = false
      let handled = 0
      const fiber = yield* Consumer.run(
        { groupId: "g", topics: ["leaving"], maxPollRecords: 10 },
        (records) => Effect.sync(() => (handled += Chunk.size(records)))
      ).pipe(
        Effect.provide(Layer.merge(
          CommitPolicy.commitAfter({ maxBatch: 1_000, maxInterval: "1 hour" }),
          InMemoryKafka.layerFaults((point) => leaving && point === "beforeCommit")
        )),
        Effect.fork
      )
      yield* settled("all handled", Effect.sync(() => handled === 60))
      // The clean leave revokes and commits; the member dies right before that commit. No deadline has to pass
      // (the TestClock never moves here): the shutdown ends as soon as the crash happens.
      leaving = true
      yield* Fiber.interrupt(fiber)
      assert.strictEqual((yield* InMemoryKafka.committed("g")).positions.size, 0)
    })))

  it.effect("partitions is a stream of per-partition streams that end on revoke", () =>
    withKafka(Effect.gen(function*() {
      yield* produce("streams", 2, 20)
      const kafka = yield* InMemoryKafka.InMemoryKafka
      const ended: Array<number> = []
      let received = 0
      const fiber = yield* Consumer.partitions({ groupId: "g", topics: ["streams"], maxPollRecords: 5 }).pipe(
        Stream_runForEachConcurrent((p) =>
          p.records.pipe(
            Stream_runForEach((chunk) => Effect.sync(() => (received += Chunk.size(chunk)))),
            Effect.zipRight(Effect.sync(() => ended.push(p.partition.partition)))
          )
        ),
        Effect.provide(commitAfter),
        Effect.fork
      )
      yield* settled("all received", Effect.sync(() => received === 40))
      // A second member joins: the first one's partition streams end on the revoke.
      const other = yield* Consumer.run({ groupId: "g", topics: ["streams"] }, () => Effect.void).pipe(
        Effect.provide(commitAfter),
        Effect.fork
      )
      yield* settled("streams ended", Effect.sync(() => ended.length >= 2))
      yield* settled(
        "rebalanced",
        Effect.map(kafka.members("g"), (ms) => ms.length === 2 && ms.every((m) => m.partitions.length === 1))
      )
      yield* Fiber.interrupt(other)
      yield* Fiber.interrupt(fiber)
      assert.sameMembers(ended.slice(0, 2), [0, 1])
    })))
})

describe("Consumer.records", () => {
  it.effect("is one stream of every partition's records, and ending it leaves the group cleanly", () =>
    withKafka(Effect.gen(function*() {
      yield* produce("merged", 3, 20)
      const kafka = yield* InMemoryKafka.InMemoryKafka
      const records = yield* Consumer.records({ groupId: "g", topics: ["merged"], maxPollRecords: 5 }).pipe(
        Stream.take(60),
        Stream.runCollect,
        Effect.provide(commitAfter)
      )
      const keys = Chunk.toReadonlyArray(Chunk.map(records, (r) => `${r.partition}@${r.offset}`))
      assert.strictEqual(new Set(keys).size, 60)
      for (const p of [0, 1, 2]) {
        const offsets = Chunk.toReadonlyArray(records).filter((r) => r.partition === p).map((r) => r.offset)
        assert.deepStrictEqual(offsets, Array.from({ length: 20 }, (_, i) => BigInt(i)))
      }
      assert.deepStrictEqual(yield* kafka.members("g"), [])
    })))
})

describe("Consumer configuration", () => {
  const bad: ReadonlyArray<readonly [string, Omit<Consumer.Config, "onFailure">]> = [
    ["groupId", { groupId: "", topics: ["t"] }],
    ["topics", { groupId: "g", topics: [] }],
    ["topics", { groupId: "g", topics: ["bad topic!"] }],
    ["topics", { groupId: "g" }],
    ["partitions", { groupId: "g", partitions: [] }],
    ["partitions", { groupId: "g", partitions: [{ topic: "t", partition: -1 }] }],
    ["maxPollRecords", { groupId: "g", topics: ["t"], maxPollRecords: 0 }],
    ["maxPollRecords", { groupId: "g", topics: ["t"], maxPollRecords: 1.5 }],
    ["bufferSize", { groupId: "g", topics: ["t"], maxPollRecords: 100, bufferSize: 10 }],
    ["pollTimeout", { groupId: "g", topics: ["t"], pollTimeout: "-1 seconds" }],
    ["sessionTimeout", { groupId: "g", topics: ["t"], sessionTimeout: 0 }],
    ["rebalanceTimeout", { groupId: "g", topics: ["t"], rebalanceTimeout: Duration.infinity }],
    ["revokeTimeout", { groupId: "g", topics: ["t"], revokeTimeout: "2 minutes" }]
  ]
  for (const [field, config] of bad) {
    it.effect(`rejects a bad ${field} before connecting: ${JSON.stringify(config)}`, () =>
      Effect.gen(function*() {
        const error = yield* Consumer.run(config, () => Effect.void).pipe(
          Effect.provide(commitAfter),
          Effect.provide(InMemoryKafka.layer()),
          Effect.flip
        )
        assert.instanceOf(error, InvalidConfig)
        assert.strictEqual((error as InvalidConfig).field, field)
        assert.include((error as InvalidConfig).message, field)
      }))
  }

  it.effect("rejects bad policy settings with the field named", () =>
    Effect.gen(function*() {
      const cases = [
        ["commitAfter.maxBatch", CommitPolicy.commitAfter({ maxBatch: 0, maxInterval: "1 second" })],
        ["commitAfter.maxInterval", CommitPolicy.commitAfter({ maxBatch: 10, maxInterval: "0 millis" })],
        ["autoCommit.interval", CommitPolicy.autoCommit({ interval: -5 })]
      ] as const
      for (const [field, layer] of cases) {
        const error = yield* Layer.build(layer).pipe(Effect.scoped, Effect.flip)
        assert.instanceOf(error, InvalidConfig)
        assert.strictEqual(error.field, field)
      }
    }))

  it.effect("subscribing to a topic that does not exist fails with a DriverError naming it", () =>
    withKafka(Effect.gen(function*() {
      const error = yield* Consumer.run({ groupId: "g", topics: ["missing"] }, () => Effect.void).pipe(
        Effect.provide(commitAfter),
        Effect.flip
      )
      assert.strictEqual(error._tag, "DriverError")
      assert.include(error.message, "missing")
    })))
})

import * as Stream from "effect/Stream"
const Stream_runForEach = <A, E, R>(f: (a: A) => Effect.Effect<void, E, R>) => <E2, R2>(s: Stream.Stream<A, E2, R2>) =>
  Stream.runForEach(s, f)
const Stream_runForEachConcurrent =
  <A, E, R>(f: (a: A) => Effect.Effect<void, E, R>) => <E2, R2>(s: Stream.Stream<A, E2, R2>) =>
    Stream.runDrain(Stream.mapEffect(s, f, { concurrency: "unbounded" }))
