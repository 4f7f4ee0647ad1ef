import { assert, describe, it } from "@effect/vitest"
import * as Chunk from "effect/Chunk"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Schedule from "effect/Schedule"
import * as CommitPolicy from "../src/CommitPolicy.js"
import * as Consumer from "../src/Consumer.js"
import * as InMemoryKafka from "../src/InMemoryKafka.js"

describe("smoke", () => {
  it.live("commitAfter delivers everything", () =>
    Effect.gen(function*() {
      yield* InMemoryKafka.createTopic("t", 3)
      yield* InMemoryKafka.produce("t", Array.from({ length: 1000 }, (_, i) => ({ value: String(i) })))
      const seen: Array<string> = []
      const fiber = yield* Consumer.run({ groupId: "g", topics: ["t"], maxPollRecords: 50 }, (records) =>
        Effect.sync(() => Chunk.forEach(records, (r) => seen.push(`${r.partition}-${r.offset}`)))
      ).pipe(Effect.fork)
      yield* Effect.sync(() => seen.length).pipe(Effect.repeat({ schedule: Schedule.spaced("5 millis"), until: (n) => n >= 1000 }), Effect.timeout("5 seconds"))
      yield* Fiber.interrupt(fiber)
      const committed = yield* InMemoryKafka.committed("g")
      assert.strictEqual(seen.length, 1000)
      assert.strictEqual(new Set(seen).size, 1000)
      const total = [...committed.positions.values()].reduce((a, b) => a + b, 0n)
      assert.strictEqual(total, 1000n)
    }).pipe(Effect.provide(Layer.mergeAll(InMemoryKafka.layer(), CommitPolicy.commitAfter({ maxBatch: 100, maxInterval: "1 second" })))))
})
