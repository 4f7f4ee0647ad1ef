/**
 * A partition's log cut back below where the consumer had come (an unclean leader election truncates it, and the
 * offsets are written again with other records): the partition starts again lower, as `offsetReset` says, and what
 * was handled of the old records above that point no longer counts. No commit may pass a record written there again
 * before it is handled.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Chunk from "effect/Chunk"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as CommitPolicy from "../src/CommitPolicy.js"
import * as Consumer from "../src/Consumer.js"
import type { ConsumerRecord } from "../src/ConsumerRecord.js"
import { Driver, type DriverEvent } from "../src/Driver.js"
import * as InMemoryKafka from "../src/InMemoryKafka.js"
import * as OffsetBatch from "../src/OffsetBatch.js"
import { decode, Progress } from "../src/internal/consumer/progress.js"
import { inMemoryWrapping } from "./support/kit.js"

describe("Progress.rewind", () => {
  it("forgets what was added at or above the new start, cuts what reached past it, and starts there again", () => {
    // Records at 0, 2, 4, ... 18 (each covering the offset after it), and an earlier owner's ranges above.
    const progress = new Progress(0n, [[30n, 34n], [40n, 44n]])
    const indexes = Array.from({ length: 10 }, (_, i) => progress.add(BigInt(2 * i + 2), false))
    for (const i of [1, 2, 3, 6, 7, 8]) progress.finish(indexes[i]!)
    assert.strictEqual(progress.position(), 0n)
    assert.deepStrictEqual(progress.finished(), [[2n, 8n], [12n, 18n]])

    progress.rewind(13n)
    // Below 13 nothing changed; [12, 14) now ends at 13; everything from 14 on is gone.
    assert.strictEqual(progress.position(), 0n)
    assert.deepStrictEqual(progress.finished(), [[2n, 8n], [12n, 13n]])
    assert.isFalse(progress.finishedBefore(30n), "an earlier owner's range above the new start still counts")
    // Work in flight on a forgotten record finishes: nothing moves.
    progress.finish(indexes[9]!)
    assert.deepStrictEqual(progress.finished(), [[2n, 8n], [12n, 13n]])
    // The next record starts at 13, not at 20.
    const next = progress.add(15n, false)
    assert.deepStrictEqual(progress.rangeOf(next), [13n, 15n])
    for (const i of [0, 4, 5]) progress.finish(indexes[i]!)
    assert.strictEqual(progress.position(), 13n, "the position stops at the first record written again")
    progress.finish(next)
    assert.strictEqual(progress.position(), 15n)
  })

  it("a start at or above where it had come changes nothing but the earlier owner's ranges above it", () => {
    const progress = new Progress(0n, [[30n, 34n]])
    progress.finish(progress.add(5n, false))
    progress.rewind(32n)
    assert.strictEqual(progress.position(), 5n)
    assert.isTrue(progress.finishedBefore(31n))
    assert.isFalse(progress.finishedBefore(33n), "a range above the new start is cut there")
  })
})

describe("a log cut back under key ordering", () => {
  it.live("commitAfter: no commit passes a record written again before it is handled; every one is handled", () => {
    const cut = makeCut()
    return Effect.gen(function*() {
      const kafka = yield* InMemoryKafka.InMemoryKafka
      yield* kafka.createTopic("t", 1)
      yield* kafka.produce("t", Array.from({ length: 100 }, (_, i) => ({ key: `k${i % 10}`, value: String(i) })))
      // The group starts at 0; when the log is cut back, offsetReset "latest" takes the partition to its new end.
      yield* commitZero
      const released = yield* Deferred.make<void>()
      const slow = yield* Deferred.make<void>()
      const handler = (records: Chunk.Chunk<ConsumerRecord>) =>
        Effect.gen(function*() {
          for (const r of records) {
            const written = r.headers["written"] !== undefined
            // Record 10 holds its key until the log was cut back: the position stays at 10 meanwhile, with ranges
            // finished above it.
            if (r.offset === 10n && !written) yield* Deferred.await(released)
            // Record 50 of the log written again (key k0, after the old records of its key) is slow: the position
            // must wait for it.
            if (r.offset === 50n && written) yield* Deferred.await(slow)
            if (written) cut.handledAgain.add(r.offset)
          }
        })
      const fiber = yield* Consumer.run(
        { groupId: "g", topics: ["t"], ordering: "key", maxPollRecords: 20, offsetReset: "latest" },
        handler
      ).pipe(Effect.provide(CommitPolicy.commitAfter({ maxBatch: 1, maxInterval: "5 millis" })), Effect.fork)
      const until = (what: string, condition: () => boolean) =>
        Effect.gen(function*() {
          for (let turn = 0; !condition(); turn++) {
            if (turn > 2_500) assert.fail(`waited 5 s for ${what}`)
            yield* Effect.sleep("2 millis")
          }
        })
      yield* until("every record fetched and a few commits", () => cut.fetchedAll && cut.commits > 3)
      // The log is cut back to 50 and written again: the consumer's position (100) is out of its log.
      cut.cut = true
      yield* until("the seek back to 50", () => cut.seekedBack)
      yield* Deferred.succeed(released, undefined)
      // Every record written again but 50 and the records of its key after it (60, 70, 80, 90).
      yield* until("every record written again but key k0's handled", () => cut.handledAgain.size === 45)
      // A commit that carries 99, the last record written again, finished (as the position or in its ranges).
      yield* until(
        "a commit that carries every record handled",
        () =>
          cut.violations.length > 0 || cut.lastCommitted === 100n ||
          cut.lastRanges.some(([from, until]) => from <= 99n && 99n < until)
      )
      assert.deepStrictEqual(cut.violations, [], "a commit passed a record written again that was not handled")
      assert.isAtMost(Number(cut.lastCommitted), 50)
      yield* Deferred.succeed(slow, undefined)
      yield* until(
        "every record written again handled and committed",
        () => cut.handledAgain.size === 50 && cut.lastCommitted === 100n
      )
      yield* Fiber.interrupt(fiber)
      assert.deepStrictEqual(cut.violations, [])
    }).pipe(Effect.provide(cut.layer))
  })
})

/**
 * The in-memory broker with the cut played by the driver: once `cut` is set, the next poll reports the partition's
 * position out of its log, whose offsets then read 0 to 50; fetches after the seek back return the records from 50 on
 * with a `written` header (the records written there again). Every commit is checked: its position and its finished
 * ranges must not pass a record written again that the handler has not finished.
 */
const makeCut = () => {
  const state = {
    fetchedAll: false,
    cut: false,
    injected: false,
    seekedBack: false,
    commits: 0,
    lastCommitted: -1n,
    lastRanges: [] as ReadonlyArray<readonly [bigint, bigint]>,
    handledAgain: new Set<bigint>(),
    violations: [] as Array<string>
  }
  const layer = inMemoryWrapping((session) => ({
    poll: Effect.map(session.poll, (events): ReadonlyArray<DriverEvent> => {
      const out: Array<DriverEvent> = []
      if (state.cut && !state.injected) {
        state.injected = true
        out.push({ _tag: "OutOfRange", partition: { topic: "t", partition: 0 }, position: 100n })
      }
      for (const event of events) {
        if (event._tag === "Records" && event.next === 100n) state.fetchedAll = true
        if (event._tag !== "Records" || !state.seekedBack) {
          out.push(event)
          continue
        }
        const records = Chunk.map(
          event.records,
          (r) => ({ ...copyOf(r), headers: { ...r.headers, written: new Uint8Array([1]) } })
        )
        out.push({ ...event, records })
      }
      return out
    }),
    offsets: (partitions) =>
      state.injected && !state.seekedBack
        ? Effect.succeed(
          new Map(
            partitions.map((tp) => [`${tp.topic}-${tp.partition}`, { earliest: 0n, latest: 50n, lastStable: 50n }])
          )
        )
        : session.offsets(partitions),
    seek: (tp, position) =>
      Effect.zipRight(
        Effect.sync(() => {
          if (state.injected && position === 50n) state.seekedBack = true
        }),
        session.seek(tp, position)
      ),
    commit: (offsets) =>
      Effect.zipRight(
        Effect.sync(() => {
          state.commits++
          for (const [tp, position] of OffsetBatch.entries(offsets)) {
            state.lastCommitted = position
            if (!state.seekedBack) continue
            const ranges = decode(position, offsets.metadata?.get(`${tp.topic}-${tp.partition}`))
            state.lastRanges = ranges
            for (const [from, until] of [[50n, position] as const, ...ranges]) {
              for (let o = from < 50n ? 50n : from; o < until; o++) {
                if (!state.handledAgain.has(o)) {
                  state.violations.push(`committed ${position} [${ranges.join(" ")}] past ${o}`)
                }
              }
            }
          }
        }),
        session.commit(offsets)
      )
  }))
  return Object.assign(state, { layer })
}

const commitZero = Effect.flatMap(Driver, (driver) =>
  Effect.scoped(Effect.gen(function*() {
    const session = yield* driver.connect({
      groupId: "g",
      clientId: "earlier",
      subscription: { _tag: "Topics", topics: ["t"] },
      maxPollRecords: 1,
      pollTimeout: Duration.millis(1),
      sessionTimeout: Duration.seconds(10),
      rebalanceTimeout: Duration.seconds(10)
    })
    while (!(yield* session.poll).some((e) => e._tag === "Assigned")) yield* Effect.yieldNow()
    yield* session.commit({ positions: new Map([["t-0", 0n]]) })
  })))

/** A plain copy of a record read through getters. */
const copyOf = (r: ConsumerRecord): ConsumerRecord => ({
  topic: r.topic,
  partition: r.partition,
  offset: r.offset,
  key: r.key,
  value: r.value,
  headers: r.headers,
  timestamp: r.timestamp
})
