/**
 * The revoke contract on each driver, in the states where kafkajs notices a rebalance outside a batch call and would
 * rejoin at once (and @platformatic/kafka rejoins from its heartbeat whatever the member does): a slow member with a backlog (every partition paused, its buffers full), and a member whose workers are
 * busy with records it already fetched. The old owner's work on a partition ends, and its final commit lands, before
 * the new owner is given the partition: the overlap is measured and must not be positive.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import type * as Layer from "effect/Layer"
import { inject } from "vitest"
import * as CommitPolicy from "../src/CommitPolicy.js"
import * as Consumer from "../src/Consumer.js"
import type { Driver } from "../src/Driver.js"
import type { InvalidConfig } from "../src/KafkaError.js"
import * as KafkaJs from "../src/KafkaJs.js"
import * as Platformatic from "../src/Platformatic.js"
import * as TopicPartition from "../src/TopicPartition.js"
import { withAdmin } from "./support/kafkaKit.js"
import { eventually } from "./support/kit.js"

const brokers = process.env.KAFKA_BROKERS || inject("kafkaBrokers")
const unique = (prefix: string) => `${prefix}-${crypto.randomUUID().slice(0, 8)}`

interface Span {
  readonly member: string
  readonly partition: string
  readonly start: number
  end: number
  readonly offsets: ReadonlyArray<bigint>
}

interface Timeline {
  readonly spans: Array<Span>
  /** When each member's onAssign and onRevoke ran, by partition. */
  readonly assigned: Map<string, Array<number>>
  readonly revoked: Map<string, Array<number>>
}

/** The driver a member consumes with. */
type DriverOf = (name: string) => Layer.Layer<Driver, InvalidConfig>

const drivers: ReadonlyArray<readonly [string, DriverOf]> = [
  [
    "kafkajs",
    (name) =>
      KafkaJs.layer({ brokers: brokers.split(","), clientId: name, maxWaitTime: "100 millis", logLevel: "error" })
  ],
  [
    "@platformatic/kafka",
    (name) => Platformatic.layer({ brokers: brokers.split(","), clientId: name, maxWaitTime: "100 millis" })
  ]
]

const member = (
  driver: DriverOf,
  name: string,
  timeline: Timeline,
  config: Omit<Consumer.Config, "onFailure">,
  chunkMillis: number
) =>
  Consumer.run(config, (records, tp) =>
    Effect.gen(function*() {
      const span: Span = {
        member: name,
        partition: TopicPartition.key(tp),
        start: Date.now(),
        end: Number.POSITIVE_INFINITY,
        offsets: Array.from(records, (r) => r.offset)
      }
      timeline.spans.push(span)
      yield* Effect.sleep(chunkMillis)
      span.end = Date.now()
    }), {
    onAssign: (tp) =>
      Effect.sync(() => {
        const key = `${name} ${TopicPartition.key(tp)}`
        timeline.assigned.set(key, [...(timeline.assigned.get(key) ?? []), Date.now()])
      }),
    onRevoke: (tp) =>
      Effect.sync(() => {
        const key = `${name} ${TopicPartition.key(tp)}`
        timeline.revoked.set(key, [...(timeline.revoked.get(key) ?? []), Date.now()])
      })
  }).pipe(
    Effect.provide(CommitPolicy.commitAfter({ maxBatch: 50, maxInterval: "200 millis" })),
    Effect.provide(driver(name))
  )

/**
 * For each partition that moved from `a` to `b`: how long `b` handled it while `a` still did (the overlap: must not
 * be positive), and whether `b` was assigned it only after `a`'s revoke of it had ended.
 */
const handOvers = (timeline: Timeline, partitions: ReadonlyArray<string>) =>
  partitions.flatMap((partition) => {
    const ofA = timeline.spans.filter((s) => s.member === "a" && s.partition === partition)
    const ofB = timeline.spans.filter((s) => s.member === "b" && s.partition === partition)
    if (ofB.length === 0) return []
    const lastEndA = Math.max(...ofA.map((s) => s.end))
    const firstStartB = Math.min(...ofB.map((s) => s.start))
    const revokedByA = timeline.revoked.get(`a ${partition}`)?.[0] ?? Number.POSITIVE_INFINITY
    const assignedToB = timeline.assigned.get(`b ${partition}`)?.[0] ?? Number.NEGATIVE_INFINITY
    return [{ partition, overlapMillis: lastEndA - firstStartB, revokedByA, assignedToB }]
  })

const run = (
  driver: DriverOf,
  topic: string,
  records: number,
  config: (name: string) => Omit<Consumer.Config, "onFailure">,
  chunkMillis: number,
  chunksBeforeB: number
) =>
  Effect.gen(function*() {
    yield* KafkaJs.createTopic(brokers, topic, 4)
    yield* KafkaJs.produce(
      brokers,
      topic,
      Array.from({ length: records }, (_, i) => ({ partition: i % 4, value: String(i) }))
    )
    const timeline: Timeline = { spans: [], assigned: new Map(), revoked: new Map() }
    const a = yield* Effect.fork(member(driver, "a", timeline, config("a"), chunkMillis))
    yield* eventually(
      "a works on every partition",
      Effect.sync(() => timeline.spans.length >= chunksBeforeB),
      "60 seconds"
    )
    return { a, timeline }
  })

if (brokers) {
  for (const [driverName, driver] of drivers) {
    describe(`the revoke contract on ${driverName} when the rebalance is noticed outside a batch call`, () => {
      const partitions = (topic: string) => [0, 1, 2, 3].map((p) => `${topic}-${p}`)
      const configOf =
        (topic: string, groupId: string, maxPollRecords: number, bufferSize: number) =>
        (name: string): Omit<Consumer.Config, "onFailure"> => ({
          groupId,
          clientId: name,
          topics: [topic],
          maxPollRecords,
          bufferSize,
          sessionTimeout: "6 seconds",
          rebalanceTimeout: "30 seconds",
          revokeTimeout: "15 seconds"
        })

      const check = (timeline: Timeline, topic: string, records: number, label: string) => {
        const moves = handOvers(timeline, partitions(topic))
        console.log(
          `${label}: ${
            JSON.stringify(
              moves.map((m) => ({
                partition: m.partition,
                overlapMillis: m.overlapMillis,
                gapMillis: m.assignedToB - m.revokedByA
              }))
            )
          }`
        )
        assert.isAtLeast(moves.length, 1, "no partition moved to the joining member")
        for (const move of moves) {
          assert.isAtMost(move.overlapMillis, 0, `${move.partition}: b handled it while a still did`)
          assert.isAtLeast(
            move.assignedToB,
            move.revokedByA,
            `${move.partition}: b was assigned it before a's revoke ended`
          )
        }
        // Each record handled once: the old owner's final commit landed before the new owner read the position.
        const seen = new Map<string, number>()
        for (const span of timeline.spans) {
          if (span.end === Number.POSITIVE_INFINITY) continue
          for (const offset of span.offsets) {
            seen.set(`${span.partition}@${offset}`, (seen.get(`${span.partition}@${offset}`) ?? 0) + 1)
          }
        }
        assert.strictEqual(seen.size, records, "every record handled")
        assert.deepStrictEqual([...seen.values()].filter((n) => n > 1), [], "no record handled twice")
      }

      it.live(
        "a slow member with a backlog, every partition paused: the new owner starts after the old one stopped",
        () =>
          Effect.gen(function*() {
            const topic = unique("backlog")
            const groupId = `${topic}-group`
            const records = 12_000
            // 10 records a chunk, at most 20 buffered: fetching outruns the 30 ms chunks at once, and every partition
            // waits paused on a full buffer. A needs about 9 seconds for its partitions' 300 chunks each.
            const config = configOf(topic, groupId, 10, 20)
            const { a, timeline } = yield* run(driver, topic, records, config, 30, 40)
            const b = yield* Effect.fork(member(driver, "b", timeline, config("b"), 30))
            const done = withAdmin(brokers, (admin) => admin.fetchOffsets({ groupId, topics: [topic] })).pipe(
              Effect.map((offsets) => offsets[0]!.partitions.every((p) => BigInt(p.offset) === BigInt(records / 4)))
            )
            yield* eventually("every position at the end", done, "120 seconds")
            yield* Fiber.interrupt(b)
            yield* Fiber.interrupt(a)
            check(timeline, topic, records, "backlog")
          }),
        { timeout: 240_000 }
      )

      it.live(
        "a member whose workers are busy with records already fetched: the new owner starts after they ended",
        () =>
          Effect.gen(function*() {
            const topic = unique("busy")
            const groupId = `${topic}-group`
            const records = 160
            // Two chunks of 20 records a partition, 3 seconds each: fetching is done, the workers are busy.
            const config = configOf(topic, groupId, 20, 40)
            const { a, timeline } = yield* run(driver, topic, records, config, 3_000, 4)
            const b = yield* Effect.fork(member(driver, "b", timeline, config("b"), 3_000))
            const done = withAdmin(brokers, (admin) => admin.fetchOffsets({ groupId, topics: [topic] })).pipe(
              Effect.map((offsets) => offsets[0]!.partitions.every((p) => BigInt(p.offset) === BigInt(records / 4)))
            )
            yield* eventually("every position at the end", done, "120 seconds")
            yield* Fiber.interrupt(b)
            yield* Fiber.interrupt(a)
            check(timeline, topic, records, "busy")
          }),
        { timeout: 240_000 }
      )
    })
  }
} else {
  describe("the revoke contract on kafkajs", () => {
    it("needs a Kafka broker", () => {
      assert.fail(`No Kafka broker for this run: ${inject("kafkaSetupError") || "KAFKA_BROKERS is unset"}`)
    })
  })
}
