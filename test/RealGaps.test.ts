/**
 * Offset gaps on a real broker, under every policy: a topic with transaction markers and aborted transactions (written
 * by a kafkajs transactional producer), a compacted topic, and records deleted past the group's position, consumed to
 * the end by the library's consumer on kafkajs. Without crashes every policy hands each readable record over once,
 * and its position ends past the last marker.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Cause from "effect/Cause"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import type * as Scope from "effect/Scope"
import { inject } from "vitest"
import * as CommitPolicy from "../src/CommitPolicy.js"
import * as Consumer from "../src/Consumer.js"
import * as ConsumerRecord from "../src/ConsumerRecord.js"
import type { Driver } from "../src/Driver.js"
import * as KafkaJs from "../src/KafkaJs.js"
import * as Platformatic from "../src/Platformatic.js"
import { OffsetOutOfRange } from "../src/KafkaError.js"
import * as OffsetStore from "../src/OffsetStore.js"
import * as PgOffsetStore from "../src/PgOffsetStore.js"
import { DriverTestKit } from "./driverSuite.js"
import { droppedAfterAll } from "./support/pgTables.js"
import { testKit, withAdmin } from "./support/kafkaKit.js"
import { eventually } from "./support/kit.js"

const brokers = process.env.KAFKA_BROKERS || inject("kafkaBrokers")
const url = process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test"
const unique = (prefix: string) => `${prefix}-${crypto.randomUUID().slice(0, 8)}`

/** Offset tables of this file's own, dropped when it is done. */
const offsetTable = droppedAfterAll(url)

const policies = ["atMostOnce", "autoCommit", "commitAfter", "transactional"] as const
type PolicyName = typeof policies[number]

/** A policy as a test runs it: its layer, and where it keeps the group's positions. */
interface UnderTest {
  readonly policy: PolicyName
  readonly layer: Layer.Layer<CommitPolicy.CommitPolicy, unknown>
  readonly positions: (
    groupId: string,
    topics: ReadonlyMap<string, number>
  ) => Effect.Effect<ReadonlyMap<string, bigint>, unknown>
}

/** Kafka's committed offsets of a group. */
const committed = (groupId: string, topics: ReadonlyMap<string, number>) =>
  withAdmin(brokers, async (admin): Promise<ReadonlyMap<string, bigint>> => {
    const out = new Map<string, bigint>()
    for (const { partitions, topic } of await admin.fetchOffsets({ groupId, topics: [...topics.keys()] })) {
      for (const { offset, partition } of partitions) out.set(`${topic}-${partition}`, BigInt(offset))
    }
    return out
  })

/** Each policy; `transactional` keeps its positions in a Postgres table of the test's own. */
const underTest = (policy: PolicyName): Effect.Effect<UnderTest, unknown, Scope.Scope> =>
  Effect.gen(function*() {
    switch (policy) {
      case "atMostOnce":
        return { policy, layer: CommitPolicy.atMostOnce(), positions: committed }
      case "autoCommit":
        return { policy, layer: CommitPolicy.autoCommit({ interval: "200 millis" }), positions: committed }
      case "commitAfter":
        return {
          policy,
          layer: CommitPolicy.commitAfter({ maxBatch: 7, maxInterval: "200 millis" }),
          positions: committed
        }
      case "transactional": {
        const table = offsetTable("gaps_offsets")
        const context = yield* Layer.build(PgOffsetStore.layer({ url, table, migrate: true }))
        const store = Context.get(context, OffsetStore.OffsetStore)
        return {
          policy,
          layer: CommitPolicy.transactional().pipe(Layer.provide(Layer.succeedContext(context))),
          positions: (groupId, topics) =>
            store.load(
              groupId,
              [...topics].flatMap(([topic, n]) => Array.from({ length: n }, (_, partition) => ({ topic, partition })))
            )
        }
      }
    }
  })

/** Each driver, as a member's `Driver` of this client id. */
const drivers: ReadonlyArray<readonly [string, (clientId: string) => Layer.Layer<Driver, never>]> = [
  [
    "kafkajs",
    (clientId) =>
      KafkaJs.layer({ brokers: brokers.split(","), clientId, maxWaitTime: "100 millis", logLevel: "error" }).pipe(
        Layer.orDie
      )
  ],
  [
    "@platformatic/kafka",
    (clientId) =>
      Platformatic.layer({ brokers: brokers.split(","), clientId, maxWaitTime: "100 millis" }).pipe(Layer.orDie)
  ]
]

const ends = (topics: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    const out = new Map<string, bigint>()
    for (const topic of topics) {
      for (const [partition, end] of yield* KafkaJs.endOffsets(brokers, topic)) out.set(`${topic}-${partition}`, end)
    }
    return out
  })

const label = (record: ConsumerRecord.ConsumerRecord) =>
  `${record.topic}-${record.partition}:${ConsumerRecord.valueString(record)}`

if (brokers) {
  for (const [driverName, driver] of drivers) {
    describe(`offset gaps on a real broker, under every policy, on ${driverName}`, () => {
      it.live(
        "transaction markers, aborted transactions and a compacted topic are consumed to the end, each record once",
        () =>
          Effect.gen(function*() {
            const kit = yield* DriverTestKit
            const gaps = unique("gaps")
            const compacted = unique("compacted")
            yield* kit.createTopic(gaps, 3)
            yield* kit.createTopic(compacted, 2, { compacted: true })
            const expected = new Set<string>()
            for (let partition = 0; partition < 3; partition++) {
              const values = (tag: string, n: number) => Array.from({ length: n }, (_, i) => `${tag}${i}`)
              const readable = (topic: string, vs: ReadonlyArray<string>) => {
                for (const v of vs) expected.add(`${topic}-${partition}:${v}`)
                return vs
              }
              yield* kit.produce(gaps, partition, readable(gaps, values("plain", 5)))
              yield* kit.produceTransaction(gaps, partition, readable(gaps, values("committed", 5)), "commit")
              yield* kit.produceTransaction(gaps, partition, values("aborted", 5), "abort")
              yield* kit.produce(gaps, partition, readable(gaps, values("after", 3)))
              // The log ends with a commit marker: every position must pass it.
              yield* kit.produceTransaction(gaps, partition, readable(gaps, values("last", 4)), "commit")
            }
            for (let partition = 0; partition < 2; partition++) {
              const entries = Array.from({ length: 30 }, (_, i) => [`k${i % 4}`, `v${i}`] as const)
              yield* kit.produceKeyed(compacted, partition, entries)
              // After compaction the latest value of each of the 4 keys is left.
              for (const [, value] of entries.slice(-4)) expected.add(`${compacted}-${partition}:${value}`)
            }
            yield* kit.compact(compacted)
            const end = yield* ends([gaps, compacted])
            const topics = new Map([[gaps, 3], [compacted, 2]])

            const outcomes = yield* Effect.forEach(policies, (name) =>
              Effect.gen(function*() {
                const { layer, policy, positions } = yield* underTest(name)
                const groupId = unique(`gaps-${policy}`)
                const handled: Array<string> = []
                const fiber = yield* Consumer.run(
                  { groupId, topics: [gaps, compacted], maxPollRecords: 4 },
                  (records) =>
                    Effect.sync(() => {
                      for (const r of records) handled.push(label(r))
                    })
                ).pipe(Effect.provide(layer), Effect.provide(driver(groupId)), Effect.fork)
                yield* eventually(
                  `${policy}: every position at the end of its log`,
                  Effect.map(positions(groupId, topics), (at) => [...end].every(([k, e]) => at.get(k) === e)),
                  "90 seconds"
                )
                yield* Fiber.interrupt(fiber)
                return { policy, handled }
              }).pipe(Effect.scoped), { concurrency: "unbounded" })
            for (const { handled, policy } of outcomes) {
              assert.strictEqual(handled.length, expected.size, `${policy}: each record once`)
              assert.deepStrictEqual(new Set(handled), expected, policy)
            }
          }).pipe(Effect.provide(testKit(brokers))),
        { timeout: 240_000 }
      )

      it.live(
        "records deleted past the group's position: it starts at the log's new start, or stops with OffsetOutOfRange when offsetReset is none",
        () =>
          Effect.forEach(policies, (name) =>
            Effect.gen(function*() {
              const { layer, policy, positions } = yield* underTest(name)
              const topic = unique(`deleted-${policy}`)
              const groupId = `${topic}-group`
              yield* KafkaJs.createTopic(brokers, topic, 1)
              yield* KafkaJs.produce(
                brokers,
                topic,
                Array.from({ length: 10 }, (_, i) => ({ partition: 0, value: String(i) }))
              )
              const topics = new Map([[topic, 1]])
              const at = (position: bigint) =>
                Effect.map(positions(groupId, topics), (p) => p.get(`${topic}-0`) === position)
              const consume = (offsetReset: "earliest" | "none") =>
                Effect.gen(function*() {
                  const handled: Array<bigint> = []
                  const fiber = yield* Consumer.run({ groupId, topics: [topic], offsetReset }, (records) =>
                    Effect.sync(() => {
                      for (const r of records) handled.push(r.offset)
                    })).pipe(Effect.provide(layer), Effect.provide(driver(groupId)), Effect.fork)
                  return { fiber, handled }
                })

              const first = yield* consume("earliest")
              yield* eventually(`${policy}: position 10`, at(10n), "60 seconds")
              yield* Fiber.interrupt(first.fiber)
              yield* KafkaJs.produce(
                brokers,
                topic,
                Array.from({ length: 20 }, (_, i) => ({ partition: 0, value: String(10 + i) }))
              )
              yield* withAdmin(brokers, async (admin) => {
                await admin.fetchTopicMetadata({ topics: [topic] })
                await admin.deleteTopicRecords({ topic, partitions: [{ partition: 0, offset: "15" }] })
              })

              const refused = yield* consume("none")
              const exit = yield* Fiber.await(refused.fiber)
              const error = Exit.isFailure(exit) && exit.cause._tag === "Fail" ? exit.cause.error : undefined
              assert.instanceOf(
                error,
                OffsetOutOfRange,
                `${policy}: ${Exit.isFailure(exit) ? Cause.pretty(exit.cause) : "ran on"}`
              )
              if (error instanceof OffsetOutOfRange) {
                assert.deepInclude(error, { topic, partition: 0, position: 10n, earliest: 15n, latest: 30n })
              }
              assert.deepStrictEqual(refused.handled, [], policy)

              const second = yield* consume("earliest")
              yield* eventually(`${policy}: position 30`, at(30n), "60 seconds")
              yield* Fiber.interrupt(second.fiber)
              assert.deepStrictEqual(
                second.handled,
                Array.from({ length: 15 }, (_, i) => BigInt(15 + i)),
                policy
              )
            }).pipe(Effect.scoped), { concurrency: "unbounded", discard: true }),
        { timeout: 240_000 }
      )
    })
  }
} else {
  describe("offset gaps on a real broker", () => {
    it("needs a Kafka broker", () => {
      assert.fail(`No Kafka broker for this run: ${inject("kafkaSetupError") || "KAFKA_BROKERS is unset"}`)
    })
  })
}
