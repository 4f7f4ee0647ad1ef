/**
 * `kafkaTransactional` on @platformatic/kafka against the real broker: one transactional producer per member, its
 * transactions' positions sent with the member's group metadata (KIP-447), so that the group's coordinator refuses a
 * zombie's.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Chunk from "effect/Chunk"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Schedule from "effect/Schedule"
import { inject } from "vitest"
import * as CommitPolicy from "../src/CommitPolicy.js"
import * as Consumer from "../src/Consumer.js"
import { Driver } from "../src/Driver.js"
import type { GroupMetadata } from "../src/Driver.js"
import { TransactionFailed } from "../src/KafkaError.js"
import * as Platformatic from "../src/Platformatic.js"
import * as Producer from "../src/Producer.js"
import { readKeys, withAdmin } from "./support/kafkaKit.js"
import { eventually } from "./support/kit.js"

const brokers = process.env.KAFKA_BROKERS || inject("kafkaBrokers")

const unique = (name: string) => `${name}-${crypto.randomUUID().slice(0, 8)}`

const createTopics = (topics: ReadonlyArray<string>, partitions: number) =>
  withAdmin(
    brokers!,
    (admin) =>
      admin.createTopics({
        topics: topics.map((topic) => ({ topic, numPartitions: partitions })),
        waitForLeaders: true
      })
  )

const driver = Platformatic.layer({
  brokers: brokers?.split(",") ?? [],
  clientId: "ktx-member",
  maxWaitTime: "100 millis",
  heartbeatInterval: "500 millis"
})

/** The transactional producers, with the ids asked for noted. */
const counting = (made: Array<string>) =>
  Layer.effect(
    Producer.TransactionalProducers,
    Effect.map(Producer.TransactionalProducers, (inner) => ({
      make: (id: string) => Effect.zipRight(Effect.sync(() => made.push(id)), inner.make(id))
    }))
  ).pipe(Layer.provide(Platformatic.layerTransactionalProducers({ brokers: brokers!.split(","), clientId: "ktx" })))

const committedKeys = (topic: string, partitions: number) =>
  Effect.map(
    Effect.forEach(Array.from({ length: partitions }, (_, p) => p), (p) =>
      Effect.flatMap(endOf(topic, p), (end) => end === 0n ? Effect.succeed([]) : readKeys(brokers!, topic, p, end))),
    (lists) =>
      lists.flat()
  )

const endOf = (topic: string, partition: number) =>
  Effect.map(
    withAdmin(brokers!, (admin) => admin.fetchTopicOffsets(topic)),
    (offsets) => BigInt(offsets.find((o) => o.partition === partition)?.high ?? "0")
  )

if (brokers) {
  describe("kafkaTransactional on @platformatic/kafka (KIP-447)", () => {
    it.live(
      "one transactional producer per member, named by its instance id: two members write every record of four " +
        "partitions exactly once",
      () =>
        Effect.gen(function*() {
          const topic = unique("ktx-in")
          const output = `${topic}-out`
          const groupId = unique("ktx-group")
          yield* createTopics([topic, output], 4)
          const records = 400
          yield* Effect.flatMap(
            Producer.Producer,
            (producer) =>
              producer.sendAll(Array.from({ length: records }, (_, i) => ({
                topic,
                partition: i % 4,
                key: String(i),
                value: String(i)
              })))
          ).pipe(Effect.provide(Platformatic.layerProducer({ brokers: brokers.split(","), clientId: "ktx-in" })))
          const made: Array<string> = []
          let handled = 0
          const member = (name: string) =>
            Consumer.run(
              { groupId, topics: [topic], maxPollRecords: 20 },
              (chunk) =>
                Effect.zipRight(
                  Producer.sendAll(Chunk.map(chunk, (r) => ({ topic: output, key: r.key, value: r.value }))),
                  Effect.sync(() => (handled += Chunk.size(chunk)))
                )
            ).pipe(
              Effect.provide(CommitPolicy.kafkaTransactional({ instanceId: name }).pipe(Layer.provide(counting(made)))),
              Effect.provide(driver)
            )
          const a = yield* Effect.fork(member("a"))
          const b = yield* Effect.fork(member("b"))
          yield* eventually("every record handled", Effect.sync(() => handled >= records), "60 seconds")
          const keys = yield* Effect.flatMap(
            eventually(
              "every record in the output, committed",
              Effect.map(committedKeys(output, 4), (keys) => keys.length >= records),
              "60 seconds"
            ),
            () => committedKeys(output, 4)
          )
          yield* Fiber.interrupt(a)
          yield* Fiber.interrupt(b)
          assert.strictEqual(keys.length, records, "every input record once in the output")
          assert.strictEqual(new Set(keys).size, records)
          // No producer per partition: only the members' own ids were asked for.
          assert.isAbove(made.length, 0)
          assert.includeMembers([`${groupId}-a`, `${groupId}-b`], made, `producers made: ${made.join(", ")}`)
        }),
      { timeout: 120_000 }
    )

    it.live(
      "positions sent with a generation the member does not have are refused: the transaction fails and lands " +
        "nothing, while the member's own generation commits",
      () =>
        Effect.gen(function*() {
          const topic = unique("ktx-fence")
          const output = `${topic}-out`
          const groupId = unique("ktx-fence-group")
          yield* createTopics([topic, output], 1)
          // A member of the group: its session's metadata is the group's current generation.
          const session = yield* (yield* Driver).connect({
            groupId,
            clientId: "ktx-fence",
            subscription: { _tag: "Topics", topics: [topic] },
            maxPollRecords: 10,
            pollTimeout: Duration.millis(100),
            sessionTimeout: Duration.seconds(10),
            rebalanceTimeout: Duration.seconds(10)
          })
          yield* eventually(
            "the member assigned",
            Effect.map(session.poll, (events) => events.some((e) => e._tag === "Assigned")),
            "30 seconds"
          )
          const current: GroupMetadata = session.groupMetadata!()
          // A stable read: while a transaction's positions are being written, it is asked again.
          const committed = session.committed([{ topic, partition: 0 }]).pipe(
            Effect.retry({ while: (e) => e.retriable, schedule: Schedule.spaced("50 millis"), times: 200 })
          )
          const producers = yield* Producer.TransactionalProducers
          const producer = yield* producers.make(unique("ktx-fence-producer"))
          const write = (member: GroupMetadata, value: string) =>
            producer.transaction(Producer.send({ topic: output, key: value, value }), {
              offsets: { groupId, positions: [{ topic, partition: 0, next: 7n }], member }
            })
          const stale = yield* Effect.flip(write({ ...current, generationId: current.generationId + 5 }, "stale"))
          assert.instanceOf(stale, TransactionFailed)
          assert.strictEqual((stale as TransactionFailed).code, "ILLEGAL_GENERATION", stale.message)
          assert.deepStrictEqual(yield* committed, new Map())
          yield* write(current, "current")
          assert.deepStrictEqual(yield* committed, new Map([[`${topic}-0`, 7n]]))
          assert.deepStrictEqual(yield* committedKeys(output, 1), ["current"])
        }).pipe(
          Effect.scoped,
          Effect.provide(Layer.merge(
            driver,
            Platformatic.layerTransactionalProducers({ brokers: brokers.split(","), clientId: "ktx-fence" })
          ))
        ),
      { timeout: 120_000 }
    )
  })
}
