/**
 * Static membership (KIP-345) on the in-memory broker: a member with a `groupInstanceId` that stops does not leave its
 * group; started again with the same id within its session timeout it gets its partitions back with no rebalance of
 * the others; past its session the group moves them. A second member running with the same id fences the first, which
 * ends rather than take the id back. kafkajs refuses the setting.
 */
import { assert, describe, it } from "@effect/vitest"
import type * as Chunk from "effect/Chunk"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as CommitPolicy from "../src/CommitPolicy.js"
import type { ConsumerRecord } from "../src/ConsumerRecord.js"
import * as Consumer from "../src/Consumer.js"
import { InvalidConfig } from "../src/KafkaError.js"
import * as InMemoryKafka from "../src/InMemoryKafka.js"
import * as KafkaJs from "../src/KafkaJs.js"
import * as TopicPartition from "../src/TopicPartition.js"
import { advanceUntil } from "./support/kit.js"

interface Journal {
  readonly events: Array<string>
  readonly handled: Array<{ readonly member: string; readonly partition: number; readonly offset: bigint }>
}

const member = (name: string, instanceId: string | undefined, journal: Journal) =>
  Consumer.run(
    {
      groupId: "g",
      clientId: name,
      topics: ["t"],
      sessionTimeout: "30 seconds",
      rebalanceTimeout: "60 seconds",
      revokeTimeout: "20 seconds",
      ...(instanceId === undefined ? {} : { groupInstanceId: instanceId })
    },
    (records: Chunk.Chunk<ConsumerRecord>) =>
      Effect.sync(() => {
        for (const r of records) journal.handled.push({ member: name, partition: r.partition, offset: r.offset })
      }),
    {
      onAssign: (tp) => Effect.sync(() => journal.events.push(`assign ${name} ${TopicPartition.key(tp)}`)),
      onRevoke: (tp) => Effect.sync(() => journal.events.push(`revoke ${name} ${TopicPartition.key(tp)}`))
    }
  ).pipe(Effect.provide(CommitPolicy.commitAfter({ maxBatch: 1, maxInterval: "1 second" })), Effect.fork)

const members = Effect.flatMap(InMemoryKafka.InMemoryKafka, (kafka) => kafka.members("g"))
const generation = Effect.flatMap(InMemoryKafka.InMemoryKafka, (kafka) => kafka.generation("g"))

const produceOneEach = (value: string) =>
  Effect.forEach([0, 1, 2, 3, 4, 5], (partition) => InMemoryKafka.produce("t", [{ value, partition }]), {
    discard: true
  })

/** Three members with instance ids share six partitions, and have handled one record on each. */
const threeStatic = (journal: Journal) =>
  Effect.gen(function*() {
    yield* InMemoryKafka.createTopic("t", 6)
    const a = yield* member("a", "instance-a", journal)
    const b = yield* member("b", "instance-b", journal)
    const c = yield* member("c", "instance-c", journal)
    yield* advanceUntil(
      "three members own two partitions each",
      Effect.map(members, (ms) => ms.length === 3 && ms.every((m) => m.partitions.length === 2)),
      5
    )
    yield* produceOneEach("first")
    yield* advanceUntil("the first records are handled", Effect.sync(() => journal.handled.length === 6), 5)
    const ofA = (yield* members).find((m) => m.memberId.startsWith("a-"))!.partitions.map(TopicPartition.key)
    return { a, b, c, ofA }
  })

describe("static membership on the in-memory broker", () => {
  it.effect(
    "a member stopped and started again with its instance id within its session gets its partitions back, with no rebalance of the others",
    () =>
      Effect.gen(function*() {
        const journal: Journal = { events: [], handled: [] }
        const { a, b, c, ofA } = yield* threeStatic(journal)
        const generationBefore = yield* generation
        const from = journal.events.length
        yield* Fiber.interrupt(a)
        // Still the group's: its partitions wait for it, and nobody else handles their records meanwhile.
        assert.strictEqual((yield* members).length, 3)
        yield* produceOneEach("second")
        yield* advanceUntil(
          "the records of the partitions that did not move are handled",
          Effect.sync(() => journal.handled.length === 10),
          5
        )
        assert.deepStrictEqual(
          journal.handled.slice(6).filter((h) => ofA.includes(`t-${h.partition}`)),
          [],
          "a's partitions waited for it"
        )
        const a2 = yield* member("a2", "instance-a", journal)
        yield* advanceUntil("every record is handled", Effect.sync(() => journal.handled.length === 12), 5)
        const after = journal.events.slice(from)
        // The restarted member got exactly its partitions back; the others revoked nothing.
        assert.sameMembers(
          after.filter((e) => e.startsWith("assign")),
          ofA.map((k) => `assign a2 ${k}`),
          after.join("\n")
        )
        assert.deepStrictEqual(after.filter((e) => e.startsWith("revoke b") || e.startsWith("revoke c")), [])
        assert.strictEqual(yield* generation, generationBefore, "no rebalance")
        // Each record once: a2 went on from a's committed positions.
        assert.sameMembers(
          journal.handled.slice(10).map((h) => `${h.member} t-${h.partition}`),
          ofA.map((k) => `a2 ${k}`)
        )
        yield* Fiber.interruptAll([a2, b, c])
      }).pipe(Effect.provide(InMemoryKafka.layer()))
  )

  it.effect("a member that does not come back within its session timeout loses its partitions to the others", () =>
    Effect.gen(function*() {
      const journal: Journal = { events: [], handled: [] }
      const { a, b, c, ofA } = yield* threeStatic(journal)
      yield* Fiber.interrupt(a)
      yield* advanceUntil(
        "two members share the six partitions",
        Effect.map(members, (ms) => ms.length === 2 && ms.reduce((n, m) => n + m.partitions.length, 0) === 6),
        45
      )
      yield* produceOneEach("second")
      yield* advanceUntil("every record is handled", Effect.sync(() => journal.handled.length === 12), 5)
      assert.isTrue(journal.handled.slice(6).every((h) => h.member === "b" || h.member === "c"))
      assert.isAtLeast(journal.handled.slice(6).filter((h) => ofA.includes(`t-${h.partition}`)).length, 2)
      yield* Fiber.interruptAll([b, c])
    }).pipe(Effect.provide(InMemoryKafka.layer())))

  it.effect(
    "a second member with the same instance id fences the first, which ends with FENCED_INSTANCE_ID rather than take the id back",
    () =>
      Effect.gen(function*() {
        const journal: Journal = { events: [], handled: [] }
        const { a, b, c, ofA } = yield* threeStatic(journal)
        const a2 = yield* member("a2", "instance-a", journal)
        yield* advanceUntil("the first member ended", Effect.map(Fiber.poll(a), (exit) => exit._tag === "Some"), 10)
        const exit = yield* Fiber.await(a)
        assert.isTrue(Exit.isFailure(exit))
        assert.include(String(Exit.isFailure(exit) ? exit.cause : ""), "FENCED_INSTANCE_ID")
        yield* produceOneEach("second")
        yield* advanceUntil("every record is handled", Effect.sync(() => journal.handled.length === 12), 5)
        assert.sameMembers(
          journal.handled.slice(6).filter((h) => ofA.includes(`t-${h.partition}`)).map((h) => h.member),
          ["a2", "a2"]
        )
        // The second member kept the id: it is still in the group, with a's partitions.
        const ms = yield* members
        assert.strictEqual(ms.length, 3)
        assert.sameMembers(ms.find((m) => m.memberId.startsWith("a2-"))!.partitions.map(TopicPartition.key), ofA)
        yield* Fiber.interruptAll([a2, b, c])
      }).pipe(Effect.provide(InMemoryKafka.layer()))
  )

  it.effect("the setting is checked: not blank, not with partitions assigned by hand; kafkajs refuses it", () =>
    Effect.gen(function*() {
      const error = (config: Omit<Consumer.Config, "onFailure">) => Effect.flip(Consumer.validate(config))
      for (const bad of ["", "a b"]) {
        const e = yield* error({ groupId: "g", topics: ["t"], groupInstanceId: bad })
        assert.instanceOf(e, InvalidConfig)
        assert.strictEqual(e.field, "groupInstanceId")
      }
      const e = yield* error({
        groupId: "g",
        partitions: [TopicPartition.make("t", 0)],
        groupInstanceId: "x"
      })
      assert.strictEqual(e.field, "groupInstanceId")
      // kafkajs has no static membership: the consumer ends when it joins, saying so (nothing connects).
      const failure = yield* Effect.flip(
        Consumer.run({ groupId: "g", topics: ["t"], groupInstanceId: "x", rejoin: false }, () => Effect.void).pipe(
          Effect.provide(CommitPolicy.atMostOnce()),
          Effect.provide(KafkaJs.layer({ brokers: ["127.0.0.1:1"] }))
        )
      )
      assert.include(String(failure), "static membership")
    }).pipe(Effect.provide(InMemoryKafka.layer())))
})
