import { assert, describe, it } from "@effect/vitest"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as FiberId from "effect/FiberId"
import * as Layer from "effect/Layer"
import * as TestClock from "effect/TestClock"
import * as fc from "effect/FastCheck"
import * as CommitPolicy from "../src/CommitPolicy.js"
import * as Consumer from "../src/Consumer.js"
import * as InMemoryKafka from "../src/InMemoryKafka.js"
import * as OffsetStore from "../src/OffsetStore.js"
import { decode, encode, Progress, type Range } from "../src/internal/consumer/progress.js"
import { settled } from "./support/kit.js"

const withKafka = <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.provide(effect, InMemoryKafka.layer())

const text = (bytes: Uint8Array | null) => bytes === null ? "" : new TextDecoder().decode(bytes)

describe("progress of a partition whose records finish out of order", () => {
  it("the position is the lowest unfinished offset; finished ranges above it merge where they meet", () => {
    const progress = new Progress(10n)
    // Records at 10, 11, 13 (12 holds a transaction marker: 11's range covers it), and the fetch continues at 15.
    const a = progress.add(11n, false)
    const b = progress.add(13n, false)
    const c = progress.add(15n, false)
    assert.strictEqual(progress.position(), 10n)
    progress.finish(c)
    assert.deepStrictEqual(progress.finished(), [[13n, 15n]])
    progress.finish(b)
    assert.deepStrictEqual(progress.finished(), [[11n, 15n]])
    assert.strictEqual(progress.window, 3)
    progress.finish(a)
    assert.strictEqual(progress.position(), 15n)
    assert.deepStrictEqual(progress.finished(), [])
    assert.strictEqual(progress.window, 0)
    // A fetch with nothing to read moves the position by itself.
    progress.add(18n, true)
    assert.strictEqual(progress.position(), 18n)
  })

  it("matches a model for any order of finishing, across compactions", () =>
    fc.assert(
      fc.property(
        fc.array(fc.integer({ min: 1, max: 3 }), { minLength: 1, maxLength: 3000 }),
        fc.integer({ min: 0, max: 2 ** 31 }),
        (widths, seed) => {
          const progress = new Progress(0n)
          const ranges: Array<[bigint, bigint]> = []
          let at = 0n
          for (const w of widths) {
            ranges.push([at, at + BigInt(w)])
            at += BigInt(w)
          }
          const indexes = ranges.map(([, until]) => progress.add(until, false))
          // A permutation from the seed.
          const order = indexes.map((_, i) => i)
          let x = seed
          for (let i = order.length - 1; i > 0; i--) {
            x = (x * 1103515245 + 12345) % 2 ** 31
            const j = x % (i + 1)
            ;[order[i], order[j]] = [order[j]!, order[i]!]
          }
          const done = new Set<number>()
          for (const i of order) {
            progress.finish(indexes[i]!)
            done.add(i)
            let first = 0
            while (done.has(first)) first++
            const position = first < ranges.length ? ranges[first]![0] : at
            if (progress.position() !== position) return false
            if (done.size % 97 !== 0) continue
            // The finished ranges above the position, merged, as the model sees them.
            const model: Array<Range> = []
            for (let k = first; k < ranges.length; k++) {
              if (!done.has(k)) continue
              const last = model[model.length - 1]
              if (last !== undefined && last[1] === ranges[k]![0]) model[model.length - 1] = [last[0], ranges[k]![1]]
              else model.push(ranges[k]!)
            }
            if (JSON.stringify(progress.finished().map(String)) !== JSON.stringify(model.map(String))) return false
          }
          return progress.position() === at && progress.window === 0
        }
      ),
      { numRuns: 50 }
    ))

  it("metadata: finished ranges round-trip; what does not fit is left out, foreign or damaged metadata reads as none", () => {
    const ranges: Array<Range> = [[5n, 6n], [8n, 100n], [1_000_000_000_000n, 1_000_000_000_003n]]
    assert.deepStrictEqual(decode(3n, encode(3n, ranges)), ranges)
    assert.strictEqual(encode(3n, []), "")
    const many: Array<Range> = Array.from({ length: 5000 }, (_, i) => [BigInt(2 * i + 1), BigInt(2 * i + 2)])
    const encoded = encode(0n, many)
    assert.isAtMost(encoded.length, 4000)
    const kept = decode(0n, encoded)
    assert.isAbove(kept.length, 500)
    assert.deepStrictEqual(kept, many.slice(0, kept.length), "the lowest ranges are kept")
    for (const foreign of ["", "event-id-3", "fin1:", "fin1:1.", "fin1:1.0", "fin1:-1.2", "fin1:1.2,x"]) {
      assert.deepStrictEqual(decode(0n, foreign), [], foreign)
    }
  })

  it("a record finished by an earlier owner is known by its offset", () => {
    const progress = new Progress(0n, [[2n, 4n], [7n, 8n]])
    assert.deepStrictEqual([0n, 1n, 2n, 3n, 4n, 6n, 7n, 8n].map((o) => progress.finishedBefore(o)), [
      false,
      false,
      true,
      true,
      false,
      false,
      true,
      false
    ])
  })
})

describe("commitAfter with records finishing out of order", () => {
  const policy = CommitPolicy.commitAfter({ maxBatch: 100, maxInterval: "1 second" })

  it.effect("a slow key holds the gap while thousands of later records finish; after a crash, only the record in flight is handled again", () =>
    withKafka(Effect.gen(function*() {
      yield* InMemoryKafka.createTopic("gap", 1)
      yield* InMemoryKafka.produce(
        "gap",
        Array.from({ length: 3000 }, (_, i) => ({ key: i === 0 ? "slow" : `k${i % 300}`, value: `${i}`, partition: 0 }))
      )
      const never = yield* Deferred.make<void>()
      let handledA = 0
      const config = { groupId: "g", topics: ["gap"], maxPollRecords: 500, ordering: "key", concurrency: 16 } as const
      // The first member: its slow record never finishes. It is killed, like a process, and never revokes.
      yield* Consumer.runEach(
        config,
        (record) =>
          text(record.key) === "slow" ? Deferred.await(never) : Effect.sync(() => {
            handledA++
          })
      ).pipe(Effect.provide(policy), Effect.forkDaemon)
      yield* settled("every record but the slow one handled", Effect.sync(() => handledA === 2999))
      yield* TestClock.adjust("1 second")
      yield* settled(
        "the gap committed",
        Effect.map(InMemoryKafka.committed("g"), (b) => b.positions.get("gap-0") === 0n && b.metadata !== undefined)
      )
      const committed = yield* InMemoryKafka.committed("g")
      const kafka = yield* InMemoryKafka.InMemoryKafka
      const [member] = yield* kafka.members("g")
      yield* kafka.kill(member!.memberId)

      const handledB: Array<bigint> = []
      const b = yield* Consumer.runEach(config, (record) =>
        Effect.sync(() => {
          handledB.push(record.offset)
        })).pipe(Effect.provide(policy), Effect.fork)
      yield* settled("the new owner handled", Effect.sync(() => handledB.length > 0))
      yield* TestClock.adjust("1 second")
      yield* settled(
        "the new owner done",
        Effect.map(InMemoryKafka.committed("g"), (b) => b.positions.get("gap-0") === 3000n)
      )
      yield* Fiber.interrupt(b)
      assert.strictEqual(committed.positions.get("gap-0"), 0n, "the position never passes the unfinished record")
      assert.deepStrictEqual(decode(0n, committed.metadata?.get("gap-0")), [[1n, 3000n]])
      assert.deepStrictEqual(handledB, [0n], "the new owner handles the record that was in flight, and no other")
    })))

  it.effect("a slow key pauses its partition once the window behind it reaches ten times bufferSize", () => {
    let release: Deferred.Deferred<void> | undefined
    return withKafka(Effect.gen(function*() {
      yield* InMemoryKafka.createTopic("window", 1)
      yield* InMemoryKafka.produce(
        "window",
        Array.from({ length: 1000 }, (_, i) => ({ key: i === 0 ? "slow" : `k${i % 50}`, value: `${i}`, partition: 0 }))
      )
      const gate = yield* Deferred.make<void>()
      release = gate
      const handled: Array<bigint> = []
      const fiber = yield* Consumer.runEach(
        { groupId: "g", topics: ["window"], maxPollRecords: 10, bufferSize: 20, ordering: "key", concurrency: 8 },
        (record) =>
          Effect.zipRight(
            text(record.key) === "slow" ? Deferred.await(gate) : Effect.void,
            Effect.sync(() => {
              handled.push(record.offset)
            })
          )
      ).pipe(Effect.provide(policy), Effect.fork)
      yield* settled("the window filled", Effect.sync(() => handled.length >= 190), 20_000)
      for (let i = 0; i < 2000; i++) yield* Effect.yieldNow()
      const whilePaused = handled.length
      const kafka = yield* InMemoryKafka.InMemoryKafka
      const [member] = yield* kafka.members("g")
      const fetched = yield* kafka.fetchedCount(member!.memberId)
      yield* Deferred.succeed(gate, undefined)
      yield* settled("all handled", Effect.sync(() => handled.length === 1000))
      yield* Fiber.interrupt(fiber)
      assert.isAtMost(whilePaused, 200, "at most the window's records finish while the slow one holds it")
      assert.isAtMost(fetched, 210, "fetching paused")
      assert.strictEqual(new Set(handled).size, 1000)
    })).pipe(
      Effect.ensuring(Effect.suspend(() => release === undefined ? Effect.void : Deferred.succeed(release, undefined)))
    )
  })
})

describe("revoke with records finishing out of order", () => {
  it.live("takes no new record, waits for the handlers in flight, commits what finished, then releases; the next owner handles the rest once", () => {
    const gate = Deferred.unsafeMake<void>(FiberId.none)
    return withKafka(Effect.gen(function*() {
      yield* InMemoryKafka.createTopic("rv", 1)
      yield* InMemoryKafka.produce(
        "rv",
        Array.from({ length: 100 }, (_, i) => ({ key: `k${i}`, value: `${i}`, partition: 0 }))
      )
      const handled: Array<readonly [string, bigint]> = []
      // Each member's assignments are counted: `a1` is a's first, whose revoke is the one under test.
      const member = (name: string) => {
        let assigns = 0
        return Consumer.runEach(
          { groupId: "g", topics: ["rv"], maxPollRecords: 100, ordering: "key", concurrency: 2 },
          (record) =>
            Effect.zipRight(
              record.offset === 10n || record.offset === 20n ? Deferred.await(gate) : Effect.void,
              Effect.sync(() => {
                handled.push([`${name}${assigns}`, record.offset])
              })
            ),
          {
            onAssign: () =>
              Effect.sync(() => {
                assigns++
              })
          }
        ).pipe(Effect.provide(CommitPolicy.commitAfter({ maxBatch: 1, maxInterval: "1 hour" })), Effect.fork)
      }
      const a = yield* member("a")
      // Both permits held by the two waiting records; the records after 20 wait for a permit.
      yield* settled("a handled all it could", Effect.sync(() => handled.length === 19), 1_000_000)
      yield* settled(
        "the position committed up to the first record in flight",
        Effect.map(InMemoryKafka.committed("g"), (c) => c.positions.get("rv-0") === 10n),
        1_000_000
      )
      const before = yield* InMemoryKafka.committed("g")
      const b = yield* member("b")
      yield* Effect.sleep("300 millis")
      const whileRevoking = yield* InMemoryKafka.committed("g")
      const ownersWhileRevoking = yield* Effect.flatMap(InMemoryKafka.InMemoryKafka, (k) => k.members("g"))
      const handledByBWhileRevoking = handled.filter(([n]) => n.startsWith("b")).length
      yield* Deferred.succeed(gate, undefined)
      yield* settled(
        "every record handled",
        Effect.sync(() => new Set(handled.map(([, o]) => o)).size === 100),
        1_000_000
      )
      yield* Effect.sleep("100 millis")
      yield* Fiber.interruptAll([a, b])
      assert.deepStrictEqual(whileRevoking.positions, before.positions, "nothing more committed while the revoke waits")
      assert.strictEqual(ownersWhileRevoking.length, 2)
      assert.isAtMost(ownersWhileRevoking.filter((m) => m.partitions.length > 0).length, 1, "one owner at a time")
      assert.strictEqual(handledByBWhileRevoking, 0, "the partition is not handed on while its handlers run")
      const offsets = handled.map(([, o]) => o)
      assert.strictEqual(offsets.length, 100, "each record once")
      const firstAssignment = handled.filter(([n]) => n === "a1").map(([, o]) => o)
      assert.deepStrictEqual(
        firstAssignment.filter((o) => o > 20n),
        [],
        "after the revoke began, a started nothing new: the records after 20 went to the next assignment"
      )
      assert.includeMembers(firstAssignment, [10n, 20n], "the handlers in flight finished within the revoke")
    })).pipe(Effect.ensuring(Deferred.succeed(gate, undefined)))
  })
})

describe("transactional with records finishing out of order", () => {
  it.effect("a slow key holds the gap while later records commit unit by unit; after a crash, only the records of the unit in flight are handled again, and every result is stored once", () =>
    Effect.gen(function*() {
      yield* InMemoryKafka.createTopic("eos", 1)
      yield* InMemoryKafka.produce(
        "eos",
        // A key per record besides the slow one: the keys that share the slow record's unit have nothing behind them.
        Array.from({ length: 1000 }, (_, i) => ({ key: i === 0 ? "slow" : `k${i}`, value: `${i}`, partition: 0 }))
      )
      const never = yield* Deferred.make<void>()
      let handledA = 0
      const config = { groupId: "g", topics: ["eos"], maxPollRecords: 100, ordering: "key", concurrency: 8 } as const
      const policy = CommitPolicy.transactional()
      yield* Consumer.runEach(config, (record) =>
        text(record.key) === "slow"
          ? Deferred.await(never)
          : Effect.zipRight(
            OffsetStore.append([String(record.offset)]),
            Effect.sync(() => {
              handledA++
            })
          )).pipe(Effect.provide(policy), Effect.forkDaemon)
      // A unit takes up to 32 records of several keys when many wait: the slow record holds those of its unit.
      yield* settled("every record but the slow one's unit stored", Effect.sync(() => handledA >= 1000 - 32))
      for (let i = 0; i < 1000; i++) yield* Effect.yieldNow()
      const stuck = 1000 - handledA
      const store = yield* OffsetStore.OffsetStore
      assert.deepStrictEqual(yield* store.load("g", [{ topic: "eos", partition: 0 }]), new Map([["eos-0", 0n]]))
      const kafka = yield* InMemoryKafka.InMemoryKafka
      const [member] = yield* kafka.members("g")
      yield* kafka.kill(member!.memberId)

      const handledB: Array<bigint> = []
      const b = yield* Consumer.runEach(config, (record) =>
        Effect.zipRight(
          OffsetStore.append([String(record.offset)]),
          Effect.sync(() => {
            handledB.push(record.offset)
          })
        )).pipe(Effect.provide(policy), Effect.fork)
      yield* settled(
        "the new owner done",
        Effect.map(store.load("g", [{ topic: "eos", partition: 0 }]), (p) => p.get("eos-0") === 1000n)
      )
      yield* Fiber.interrupt(b)
      assert.isAtMost(stuck, 32)
      assert.strictEqual(handledB.length, stuck, "the new owner handles the records that were in flight, and no other")
      assert.include(handledB, 0n)
      const results = (yield* OffsetStore.results("g")).map(Number).sort((x, y) => x - y)
      assert.deepStrictEqual(results, Array.from({ length: 1000 }, (_, i) => i), "every result once")
    }).pipe(Effect.provide(Layer.mergeAll(InMemoryKafka.layer(), OffsetStore.layerMemory))))
})

describe("key ordering with members joining and leaving", () => {
  it.live.prop(
    "commitAfter with clean revokes: every record handled once, each key's records in offset order, never more than concurrency in flight per member, never two of a key at once",
    {
      seed: fc.integer({ min: 1, max: 2 ** 30 }),
      partitions: fc.integer({ min: 1, max: 6 }),
      keys: fc.integer({ min: 1, max: 300 }),
      concurrency: fc.integer({ min: 1, max: 16 }),
      maxPollRecords: fc.integer({ min: 1, max: 64 }),
      members: fc.integer({ min: 1, max: 3 })
    },
    ({ concurrency, keys, maxPollRecords, members, partitions, seed }) =>
      withKafka(Effect.gen(function*() {
        let x = seed
        const random = (n: number) => {
          x = (x * 1103515245 + 12345) % 2 ** 31
          return x % n
        }
        const records = 600
        yield* InMemoryKafka.createTopic("joins", partitions)
        yield* InMemoryKafka.produce(
          "joins",
          Array.from({ length: records }, (_, i) => ({
            key: `k${random(keys)}`,
            value: `${i}`,
            partition: i % partitions
          }))
        )
        const handled: Array<{ readonly tp: string; readonly key: string; readonly offset: bigint }> = []
        const violations: Array<string> = []
        const member = (name: string) => {
          let inFlight = 0
          const keysInFlight = new Set<string>()
          return Consumer.runEach(
            { groupId: "g", topics: ["joins"], maxPollRecords, ordering: "key", concurrency },
            (record) =>
              Effect.gen(function*() {
                const key = `${record.partition}/${text(record.key)}`
                inFlight++
                if (inFlight > concurrency) violations.push(`${name}: ${inFlight} in flight`)
                if (keysInFlight.has(key)) violations.push(`${name}: two records of ${key} at once`)
                keysInFlight.add(key)
                for (let i = random(20); i > 0; i--) yield* Effect.yieldNow()
                handled.push({ tp: `${record.partition}`, key, offset: record.offset })
                keysInFlight.delete(key)
                inFlight--
              })
          ).pipe(Effect.provide(CommitPolicy.commitAfter({ maxBatch: 20, maxInterval: "50 millis" })), Effect.fork)
        }
        const fibers = [yield* member("m0")]
        for (let m = 1; m < members; m++) {
          const at = (records * m) / (members + 1)
          yield* settled(`${at} handled`, Effect.sync(() => handled.length >= at), 1_000_000)
          fibers.push(yield* member(`m${m}`))
          // The oldest member leaves while the others go on.
          if (m === members - 1 && members > 1) yield* Fiber.interrupt(fibers[0]!)
        }
        yield* settled("all handled", Effect.sync(() => handled.length >= records), 1_000_000)
        yield* Effect.forEach(fibers, Fiber.interrupt, { discard: true })
        assert.deepStrictEqual(violations, [])
        const seen = new Set(handled.map((h) => `${h.tp}@${h.offset}`))
        assert.strictEqual(handled.length, records, "each record once")
        assert.strictEqual(seen.size, records)
        const last = new Map<string, bigint>()
        for (const h of handled) {
          const before = last.get(h.key)
          if (before !== undefined && h.offset <= before) assert.fail(`${h.key}: ${h.offset} after ${before}`)
          last.set(h.key, h.offset)
        }
      })),
    { fastCheck: { numRuns: 20 }, timeout: 120_000 }
  )
})
