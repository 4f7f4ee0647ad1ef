import { assert, describe, it } from "@effect/vitest"
import * as Chunk from "effect/Chunk"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import { Driver, type DriverEvent } from "../src/Driver.js"
import * as InMemoryKafka from "../src/InMemoryKafka.js"

const decoder = new TextDecoder()

const options = {
  groupId: "reader",
  clientId: "reader",
  subscription: { _tag: "Topics", topics: ["t"] } as const,
  maxPollRecords: 100,
  pollTimeout: Duration.millis(10),
  sessionTimeout: Duration.seconds(10),
  rebalanceTimeout: Duration.seconds(30)
}

/** The error of an operation of a fenced producer, which must not succeed. */
const refused = <A, E>(operation: string, effect: Effect.Effect<A, E>): Effect.Effect<E> =>
  Effect.flatMap(Effect.either(effect), (result) =>
    Either.isLeft(result)
      ? Effect.succeed(result.left)
      : Effect.sync(() => assert.fail(`the fenced producer's ${operation} was accepted`)))

describe("InMemoryKafka transactional producers", () => {
  it.scoped("a producer started again fences the earlier epoch: its open transaction is aborted on every partition it wrote to, and its writes, positions and commit are refused", () =>
    Effect.gen(function*() {
      const kafka = yield* InMemoryKafka.InMemoryKafka
      const driver = yield* Driver
      yield* kafka.createTopic("t", 3)
      const zombie = yield* kafka.initProducer("p", "1 minute")
      yield* kafka.transactionalProduce("p", zombie, "t", [
        { value: "zombie-0", partition: 0 },
        { value: "zombie-1", partition: 1 }
      ])
      yield* kafka.sendOffsets("p", zombie, "g", [{ topic: "t", partition: 0, next: 1n }])

      const current = yield* kafka.initProducer("p", "1 minute")
      assert.strictEqual(current, zombie + 1)
      // The earlier epoch's transaction was aborted: a marker follows its record on each partition it wrote to.
      assert.deepStrictEqual(
        (yield* kafka.offsets("t")).map(({ lastStable, latest }) => [latest, lastStable]),
        [[2n, 2n], [2n, 2n], [0n, 0n]]
      )

      const write = yield* refused(
        "write",
        kafka.transactionalProduce("p", zombie, "t", [{ value: "late", partition: 2 }])
      )
      assert.strictEqual(write.reason, "Fenced")
      assert.strictEqual(write.code, "PRODUCER_FENCED")
      const send = yield* refused(
        "sendOffsets",
        kafka.sendOffsets("p", zombie, "g", [{ topic: "t", partition: 2, next: 1n }])
      )
      assert.strictEqual(send.reason, "Fenced")
      const commit = yield* refused("commit", kafka.endTransaction("p", zombie, "commit"))
      assert.strictEqual(commit.reason, "Fenced")
      assert.strictEqual((yield* kafka.offsets("t"))[2]!.latest, 0n, "the fenced write took no offset")
      assert.isFalse((yield* kafka.committed("g")).has("t-0"), "the fenced producer's position never lands")

      const written = yield* kafka.transactionalProduce("p", current, "t", [{ value: "fresh", partition: 0 }])
      assert.deepStrictEqual(written, [[0, 2n]])
      yield* kafka.endTransaction("p", current, "commit", [
        { groupId: "g", positions: [{ topic: "t", partition: 0, next: 3n }] }
      ])
      assert.strictEqual((yield* kafka.committed("g")).get("t-0"), 3n)

      // A read-committed consumer reads the current epoch's record only.
      const session = yield* driver.connect(options)
      const values: Array<string> = []
      const seen = new Set<DriverEvent["_tag"]>()
      for (let i = 0; i < 10 && !seen.has("Records"); i++) {
        for (const event of yield* session.poll) {
          seen.add(event._tag)
          if (event._tag === "Assigned") {
            for (const tp of event.partitions) yield* session.seek(tp, 0n)
          }
          if (event._tag === "Records") {
            for (const record of Chunk.toReadonlyArray(event.records)) values.push(decoder.decode(record.value!))
          }
        }
      }
      assert.deepStrictEqual(values, ["fresh"])
    }).pipe(Effect.provide(InMemoryKafka.layer())))
})
