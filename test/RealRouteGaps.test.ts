/**
 * On a real broker: a failure route takes a failed unit apart, a record at a time, on a log whose offsets have gaps
 * (it starts with an aborted transaction, and holds markers and aborted records further on). Under key and unordered
 * ordering with `transactional` (Postgres) the records are paired with their offset ranges; looked up where a range
 * starts, they were not found after a gap and the consumer died on every restart.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Cause from "effect/Cause"
import * as Chunk from "effect/Chunk"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import * as Schema from "effect/Schema"
import { inject } from "vitest"
import * as CommitPolicy from "../src/CommitPolicy.js"
import * as Consumer from "../src/Consumer.js"
import * as ConsumerRecord from "../src/ConsumerRecord.js"
import * as FailureRoute from "../src/FailureRoute.js"
import * as KafkaJs from "../src/KafkaJs.js"
import * as OffsetStore from "../src/OffsetStore.js"
import * as PgOffsetStore from "../src/PgOffsetStore.js"
import { DriverTestKit } from "./driverSuite.js"
import { readTopic } from "./producerSuite.js"
import { droppedAfterAll } from "./support/pgTables.js"
import { testKit, withAdmin } from "./support/kafkaKit.js"

const brokers = process.env.KAFKA_BROKERS || inject("kafkaBrokers")
const url = process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test"
const unique = (prefix: string) => `${prefix}-${crypto.randomUUID().slice(0, 8)}`

/** Offset tables of this file's own, dropped when it is done. */
const offsetTable = droppedAfterAll(url)

class Refused extends Schema.TaggedError<Refused>()("Refused", {}) {}

const cases = [
  { policy: "transactional", ordering: "key" },
  { policy: "transactional", ordering: "unordered" },
  { policy: "commitAfter", ordering: "key" }
] as const

if (brokers) {
  describe("a failure route on a real log with gaps", () => {
    it.live(
      "every policy and ordering goes on: each bad record dead-lettered, every other one handled, positions at the end",
      () =>
        Effect.gen(function*() {
          const kit = yield* DriverTestKit
          yield* Effect.forEach(cases, ({ ordering, policy }) =>
            Effect.gen(function*() {
              const source = unique(`route-gaps-${policy}-${ordering}`)
              const dlq = `${source}-dlq`
              yield* kit.createTopic(source, 1)
              yield* kit.createTopic(dlq, 1)
              const visible: Array<string> = []
              let n = 0
              const values = (count: number, keep: boolean) =>
                Array.from({ length: count }, () => {
                  const i = n++
                  const value = keep ? `${i % 5 === 2 ? "bad" : "ok"}-${i}` : `aborted-${i}`
                  if (keep) visible.push(value)
                  return value
                })
              // The log starts with an aborted transaction: the first record is above the start position.
              yield* kit.produceTransaction(source, 0, values(2, false), "abort")
              yield* kit.produce(source, 0, values(9, true))
              yield* kit.produceTransaction(source, 0, values(3, false), "abort")
              yield* kit.produceTransaction(source, 0, values(7, true), "commit")
              yield* kit.produce(source, 0, values(6, true))
              yield* kit.produceTransaction(source, 0, values(2, false), "abort")
              const bad = visible.filter((v) => v.startsWith("bad"))
              const handled = new Set<string>()
              const groupId = `${source}-group`
              let layer: Layer.Layer<CommitPolicy.CommitPolicy, unknown> = CommitPolicy.commitAfter({
                maxBatch: 5,
                maxInterval: "100 millis"
              })
              let stored = (): Effect.Effect<bigint | undefined, unknown> =>
                withAdmin(brokers, async (admin) => {
                  const [found] = await admin.fetchOffsets({ groupId, topics: [source] })
                  const offset = found?.partitions.find((p) => p.partition === 0)?.offset
                  return offset === undefined || BigInt(offset) < 0n ? undefined : BigInt(offset)
                })
              if (policy === "transactional") {
                const table = offsetTable("route_gaps")
                const context = yield* Layer.build(PgOffsetStore.layer({ url, table, migrate: true }))
                const store = Context.get(context, OffsetStore.OffsetStore)
                layer = CommitPolicy.transactional().pipe(Layer.provide(Layer.succeedContext(context)))
                stored = () =>
                  Effect.map(store.load(groupId, [{ topic: source, partition: 0 }]), (p) => p.get(`${source}-0`))
              }
              const consumer = yield* Consumer.run(
                {
                  groupId,
                  topics: [source],
                  ordering,
                  maxPollRecords: 6,
                  retry: Schedule.recurs(1),
                  onFailure: FailureRoute.deadLetter({ topic: dlq, maxInARow: 1_000 })
                },
                // A chunk handler that fails without saying on which record.
                (records) =>
                  Chunk.some(records, (r) => ConsumerRecord.valueString(r)!.startsWith("bad"))
                    ? Effect.fail(new Refused())
                    : Effect.sync(() => {
                      for (const r of records) handled.add(ConsumerRecord.valueString(r)!)
                    })
              ).pipe(
                Effect.provide(layer),
                Effect.provide(
                  KafkaJs.layer({
                    brokers: brokers.split(","),
                    clientId: groupId,
                    maxWaitTime: "100 millis",
                    logLevel: "error"
                  })
                ),
                Effect.provide(KafkaJs.layerProducer({ brokers: brokers.split(","), logLevel: "error" })),
                Effect.fork
              )
              const end = (yield* KafkaJs.endOffsets(brokers, source)).get(0)!
              for (let turn = 0;; turn++) {
                const exit = yield* Fiber.poll(consumer)
                if (Option.isSome(exit)) {
                  assert.fail(
                    `${policy}, ${ordering}: the consumer ended: ${
                      Exit.isFailure(exit.value) ? Cause.pretty(exit.value.cause) : "?"
                    }`
                  )
                }
                if ((yield* stored()) === end) break
                if (turn > 600) assert.fail(`${policy}, ${ordering}: the position did not reach ${end} within 60 s`)
                yield* Effect.sleep("100 millis")
              }
              yield* Fiber.interrupt(consumer)
              const letters = new Set(
                (yield* readTopic(dlq, 1).pipe(
                  Effect.provide(KafkaJs.layer({ brokers: brokers.split(","), logLevel: "error" }))
                ))[0]!
                  .map((r) => ConsumerRecord.valueString(r)!)
              )
              assert.deepStrictEqual(letters, new Set(bad), `${policy}, ${ordering}: the bad records, dead-lettered`)
              for (const value of visible) {
                if (!value.startsWith("bad")) {
                  assert.isTrue(handled.has(value), `${policy}, ${ordering}: ${value} handled`)
                }
              }
            }).pipe(Effect.scoped), { concurrency: "unbounded", discard: true })
        }).pipe(Effect.provide(testKit(brokers))),
      { timeout: 180_000 }
    )
  })
} else {
  describe("a failure route on a real log with gaps", () => {
    it("needs a Kafka broker", () => {
      assert.fail(`No Kafka broker for this run: ${inject("kafkaSetupError") || "KAFKA_BROKERS is unset"}`)
    })
  })
}
