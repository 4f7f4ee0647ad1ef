/**
 * A fetch that starts past the partition's position skipped offsets (a driver that lost track of a seek): the
 * runloop seeks the partition back to its position, so that the records in between are handled; a driver that keeps
 * skipping ends the consumer with a `DriverError` that says so.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Chunk from "effect/Chunk"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as CommitPolicy from "../src/CommitPolicy.js"
import * as Consumer from "../src/Consumer.js"
import type { DriverEvent } from "../src/Driver.js"
import * as InMemoryKafka from "../src/InMemoryKafka.js"
import { DriverError } from "../src/KafkaError.js"
import { advanceUntil, inMemoryWrapping } from "./support/kit.js"

/** The driver drops the first `drop` records of the partition's fetches, `times` times, as if it skipped them. */
const skipping = (drop: number, times: number) => {
  let left = times
  return inMemoryWrapping((session) => ({
    poll: Effect.map(session.poll, (events): ReadonlyArray<DriverEvent> =>
      events.map((event) => {
        if (event._tag !== "Records" || left === 0 || Chunk.size(event.records) <= drop) return event
        left--
        const records = Chunk.drop(event.records, drop)
        return { ...event, records, from: Chunk.unsafeHead(records).offset }
      }))
  }))
}

const ordering = ["partition", "key"] as const

describe("a fetch that starts past the position", () => {
  for (const order of ordering) {
    it.effect(`${order} ordering: the partition is sought back, and every record is handled once`, () =>
      Effect.gen(function*() {
        const kafka = yield* InMemoryKafka.InMemoryKafka
        yield* kafka.createTopic("t", 1)
        yield* kafka.produce("t", Array.from({ length: 30 }, (_, i) => ({ key: `k${i % 3}`, value: String(i) })))
        const handled: Array<bigint> = []
        const fiber = yield* Consumer.run(
          { groupId: "g", topics: ["t"], maxPollRecords: 10, ordering: order },
          (records) =>
            Effect.sync(() => {
              for (const r of records) handled.push(r.offset)
            })
        ).pipe(Effect.provide(CommitPolicy.commitAfter({ maxBatch: 5, maxInterval: "1 second" })), Effect.fork)
        yield* advanceUntil("everything committed", Effect.map(kafka.committed("g"), (c) => c.get("t-0") === 30n), 20)
        yield* Fiber.interrupt(fiber)
        assert.deepStrictEqual(
          [...handled].sort((a, b) => Number(a - b)),
          Array.from({ length: 30 }, (_, i) => BigInt(i)),
          "the skipped records were handled, once each"
        )
      }).pipe(Effect.provide(skipping(3, 2))))
  }

  it.effect("a driver that keeps skipping ends the consumer with a DriverError naming the partition", () =>
    Effect.gen(function*() {
      const kafka = yield* InMemoryKafka.InMemoryKafka
      yield* kafka.createTopic("t", 1)
      yield* kafka.produce("t", Array.from({ length: 30 }, (_, i) => ({ value: String(i) })))
      const fiber = yield* Consumer.run({ groupId: "g", topics: ["t"], maxPollRecords: 10 }, () => Effect.void).pipe(
        Effect.provide(CommitPolicy.commitAfter({ maxBatch: 5, maxInterval: "1 second" })),
        Effect.fork
      )
      yield* advanceUntil("the consumer ends", Effect.map(Fiber.poll(fiber), (exit) => exit._tag === "Some"), 20)
      const exit = yield* Fiber.await(fiber)
      const error = Exit.isFailure(exit) && exit.cause._tag === "Fail" ? exit.cause.error : undefined
      assert.instanceOf(error, DriverError)
      assert.include((error as DriverError).message, "t-0")
      assert.include((error as DriverError).message, "skips offsets")
      assert.deepStrictEqual(yield* kafka.committed("g"), new Map(), "nothing committed past the skipped records")
    }).pipe(Effect.provide(skipping(3, 1_000))))
})
