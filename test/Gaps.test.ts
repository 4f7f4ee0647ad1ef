/**
 * Offsets are not contiguous: transaction markers, aborted transactions, compaction and retention leave gaps. Every
 * policy consumes such logs to the end, each record once, and the committed or stored position passes the gaps (a
 * trailing marker included). A position that is no longer in the log follows `offsetReset`.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Chunk from "effect/Chunk"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as CommitPolicy from "../src/CommitPolicy.js"
import * as Consumer from "../src/Consumer.js"
import type { ConsumerRecord } from "../src/ConsumerRecord.js"
import { Driver } from "../src/Driver.js"
import * as InMemoryKafka from "../src/InMemoryKafka.js"
import { OffsetOutOfRange } from "../src/KafkaError.js"
import * as OffsetStore from "../src/OffsetStore.js"
import { advanceUntil, inMemoryWrapping, logCollector, settled } from "./support/kit.js"

const policies = {
  atMostOnce: CommitPolicy.atMostOnce(),
  autoCommit: CommitPolicy.autoCommit({ interval: "1 second" }),
  commitAfter: CommitPolicy.commitAfter({ maxBatch: 7, maxInterval: "1 second" }),
  transactional: CommitPolicy.transactional()
} as const
type PolicyName = keyof typeof policies

/** Where the group's positions are: Kafka's committed offsets, or the offset store under `transactional`. */
const positionsOf = (
  policy: PolicyName,
  groupId: string,
  topics: ReadonlyArray<readonly [string, number]>
): Effect.Effect<
  ReadonlyMap<string, bigint>,
  OffsetStore.OffsetStoreError,
  InMemoryKafka.InMemoryKafka | OffsetStore.OffsetStore
> =>
  policy === "transactional"
    ? Effect.flatMap(OffsetStore.OffsetStore, (store) =>
      store.load(
        groupId,
        topics.flatMap(([topic, n]) => Array.from({ length: n }, (_, partition) => ({ topic, partition })))
      ))
    : Effect.flatMap(InMemoryKafka.InMemoryKafka, (kafka) => kafka.committed(groupId))

/** The in-memory broker with a driver that counts seeks: a consumer that seeks again and again is stuck in a loop. */
const countingSeeks = (seeks: { count: number }) =>
  inMemoryWrapping((session) => ({
    seek: (tp, position) => Effect.zipRight(Effect.sync(() => seeks.count++), session.seek(tp, position))
  }))

const key = (r: { readonly topic: string; readonly partition: number; readonly offset: bigint }) =>
  `${r.topic}-${r.partition}@${r.offset}`

describe("logs with gaps, under every policy", () => {
  for (const policy of Object.keys(policies) as Array<PolicyName>) {
    it.effect(`${policy}: transaction markers, aborted transactions and compaction are consumed to the end, each record once`, () => {
      const seeks = { count: 0 }
      return Effect.gen(function*() {
        const kafka = yield* InMemoryKafka.InMemoryKafka
        yield* kafka.createTopic("gaps", 3)
        yield* kafka.createTopic("compacted", 2, { compacted: true })
        const expected = new Set<string>()
        const visible = (written: ReadonlyArray<readonly [number, bigint]>, topic: string) => {
          for (const [partition, offset] of written) expected.add(key({ topic, partition, offset }))
        }
        for (let partition = 0; partition < 3; partition++) {
          const batch = (n: number, tag: string) =>
            Array.from({ length: n }, (_, i) => ({ value: `${tag}${i}`, partition }))
          visible(yield* kafka.produce("gaps", batch(5, "plain")), "gaps")
          visible(yield* kafka.produceTransaction("gaps", batch(5, "committed"), "commit"), "gaps")
          yield* kafka.produceTransaction("gaps", batch(5, "aborted"), "abort")
          visible(yield* kafka.produce("gaps", batch(3, "plain")), "gaps")
          visible(yield* kafka.produceTransaction("gaps", batch(4, "last"), "commit"), "gaps")
          // The log ends with an aborted transaction, nothing to read: the position must pass it.
          yield* kafka.produceTransaction("gaps", batch(2, "aborted-last"), "abort")
        }
        for (let partition = 0; partition < 2; partition++) {
          const written = yield* kafka.produce(
            "compacted",
            Array.from({ length: 30 }, (_, i) => ({ key: `k${i % 4}`, value: `v${i}`, partition }))
          )
          // After compaction the latest record of each of the 4 keys is left.
          for (const [p, offset] of written.slice(-4)) expected.add(key({ topic: "compacted", partition: p, offset }))
        }
        yield* kafka.compact("compacted")

        const handled: Array<string> = []
        const fiber = yield* Consumer.run(
          { groupId: "g", topics: ["gaps", "compacted"], maxPollRecords: 4 },
          (records: Chunk.Chunk<ConsumerRecord>) =>
            Effect.sync(() => {
              for (const r of records) handled.push(key(r))
            })
        ).pipe(Effect.provide(policies[policy]), Effect.fork)
        const ends = new Map<string, bigint>()
        for (const topic of ["gaps", "compacted"]) {
          ;(yield* kafka.endOffsets(topic)).forEach((end, partition) => ends.set(`${topic}-${partition}`, end))
        }
        const atEnd = Effect.map(
          positionsOf(policy, "g", [["gaps", 3], ["compacted", 2]]),
          (positions) => [...ends].every(([k, end]) => positions.get(k) === end)
        )
        yield* advanceUntil("every position at the end of its log", atEnd, 30)
        yield* Fiber.interrupt(fiber)
        assert.strictEqual(handled.length, expected.size, "each record once")
        assert.deepStrictEqual(new Set(handled), expected)
        // One seek per partition, when it was assigned: a gap never sends the consumer back.
        assert.strictEqual(seeks.count, 5)
      }).pipe(Effect.provide(Layer.merge(countingSeeks(seeks), OffsetStore.layerMemory)))
    })
  }
})

describe("positions outside the log follow offsetReset", () => {
  /** Partition 0 of "t" has 30 records; the group committed 10; then records below 15 are deleted. */
  const setup = Effect.gen(function*() {
    const kafka = yield* InMemoryKafka.InMemoryKafka
    yield* kafka.createTopic("t", 1)
    yield* kafka.produce("t", Array.from({ length: 30 }, (_, i) => ({ value: String(i) })))
    yield* Effect.flatMap(Driver, (driver) =>
      Effect.scoped(Effect.gen(function*() {
        const session = yield* driver.connect({
          groupId: "g",
          clientId: "setter",
          subscription: { _tag: "Topics", topics: ["t"] },
          maxPollRecords: 1,
          pollTimeout: Duration.millis(1),
          sessionTimeout: Duration.seconds(10),
          rebalanceTimeout: Duration.seconds(10)
        })
        yield* settled("assigned", Effect.map(session.poll, (events) => events.some((e) => e._tag === "Assigned")))
        yield* session.commit({ positions: new Map([["t-0", 10n]]) })
      })))
    yield* kafka.deleteRecords("t", 0, 15n)
  })

  const consume = (offsetReset: "earliest" | "latest" | "none") =>
    Effect.gen(function*() {
      const handled: Array<bigint> = []
      const fiber = yield* Consumer.run({ groupId: "g", topics: ["t"], offsetReset }, (records) =>
        Effect.sync(() => {
          for (const r of records) handled.push(r.offset)
        })).pipe(Effect.provide(CommitPolicy.commitAfter({ maxBatch: 5, maxInterval: "1 second" })), Effect.fork)
      return { handled, fiber }
    })

  it.effect("earliest: a committed position below the log start starts at the log start, with a warning saying how many offsets were removed unread", () => {
    const logs = logCollector()
    return Effect.gen(function*() {
      yield* setup
      const { fiber, handled } = yield* consume("earliest")
      yield* settled("the rest handled", Effect.sync(() => handled.includes(29n)))
      yield* Fiber.interrupt(fiber)
      assert.deepStrictEqual(handled, Array.from({ length: 15 }, (_, i) => BigInt(15 + i)))
      assert.isTrue(
        logs.lines.some((l) =>
          l.startsWith("WARN") && l.includes("position 10 of t-0 is out of its log (offsets 15 to 30)") &&
          l.includes("5 offsets were removed unread")
        ),
        logs.lines.join("\n")
      )
    }).pipe(Effect.provide(InMemoryKafka.layer()), Effect.provide(logs.layer))
  })

  it.effect("latest: it starts at the end, and reads what comes next", () =>
    Effect.gen(function*() {
      yield* setup
      const { fiber, handled } = yield* consume("latest")
      yield* Effect.repeatN(Effect.yieldNow(), 1_000)
      yield* InMemoryKafka.produce("t", [{ value: "new" }])
      yield* settled("the new record handled", Effect.sync(() => handled.length > 0))
      yield* Fiber.interrupt(fiber)
      assert.deepStrictEqual(handled, [30n])
    }).pipe(Effect.provide(InMemoryKafka.layer())))

  it.effect("none: the consumer ends with OffsetOutOfRange naming the partition, its position and the log's range", () =>
    Effect.gen(function*() {
      yield* setup
      const { fiber, handled } = yield* consume("none")
      const exit = yield* Fiber.await(fiber)
      const error = Exit.isFailure(exit) && exit.cause._tag === "Fail" ? exit.cause.error : undefined
      assert.instanceOf(error, OffsetOutOfRange)
      if (error instanceof OffsetOutOfRange) {
        assert.deepStrictEqual(
          {
            topic: error.topic,
            partition: error.partition,
            position: error.position,
            earliest: error.earliest,
            latest: error.latest
          },
          { topic: "t", partition: 0, position: 10n, earliest: 15n, latest: 30n }
        )
        assert.include(error.message, "t-0")
      }
      assert.deepStrictEqual(handled, [])
    }).pipe(Effect.provide(InMemoryKafka.layer())))

  it.effect("none, with nothing committed: OffsetOutOfRange without a position", () =>
    Effect.gen(function*() {
      yield* InMemoryKafka.createTopic("t", 1)
      const exit = yield* Consumer.run({ groupId: "fresh", topics: ["t"], offsetReset: "none" }, () => Effect.void)
        .pipe(
          Effect.provide(CommitPolicy.commitAfter({ maxBatch: 5, maxInterval: "1 second" })),
          Effect.exit
        )
      const error = Exit.isFailure(exit) && exit.cause._tag === "Fail" ? exit.cause.error : undefined
      assert.instanceOf(error, OffsetOutOfRange)
      if (error instanceof OffsetOutOfRange) {
        assert.strictEqual(error.position, null)
        assert.include(error.message, "No position for t-0")
      }
    }).pipe(Effect.provide(InMemoryKafka.layer())))

  it.effect("transactional: a stored position below the log start follows offsetReset too", () =>
    Effect.gen(function*() {
      const kafka = yield* InMemoryKafka.InMemoryKafka
      const store = yield* OffsetStore.OffsetStore
      yield* kafka.createTopic("t", 1)
      yield* kafka.produce("t", Array.from({ length: 30 }, (_, i) => ({ value: String(i) })))
      const { epoch } = (yield* store.claim("g", [{ topic: "t", partition: 0 }])).get("t-0")!
      yield* store.commit({ groupId: "g", partition: { topic: "t", partition: 0 }, epoch, next: 10n }, Effect.void)
      yield* kafka.deleteRecords("t", 0, 15n)
      const handled: Array<bigint> = []
      const fiber = yield* Consumer.run({ groupId: "g", topics: ["t"] }, (records) =>
        Effect.sync(() => {
          for (const r of records) handled.push(r.offset)
        })).pipe(Effect.provide(CommitPolicy.transactional()), Effect.fork)
      yield* settled(
        "the rest stored",
        Effect.map(store.load("g", [{ topic: "t", partition: 0 }]), (p) => p.get("t-0") === 30n)
      )
      yield* Fiber.interrupt(fiber)
      assert.deepStrictEqual(handled, Array.from({ length: 15 }, (_, i) => BigInt(15 + i)))
    }).pipe(Effect.provide(Layer.merge(InMemoryKafka.layer(), OffsetStore.layerMemory))))

  it.effect("the log start passing a running consumer's position: it resets there and goes on", () => {
    const logs = logCollector()
    return Effect.gen(function*() {
      const kafka = yield* InMemoryKafka.InMemoryKafka
      yield* kafka.createTopic("t", 1)
      yield* kafka.produce("t", Array.from({ length: 40 }, (_, i) => ({ value: String(i) })))
      const gate = yield* Deferred.make<void>()
      const handled: Array<bigint> = []
      // The first chunk waits; the consumer fetches ahead to its buffer's bound (20 records) and pauses there.
      const fiber = yield* Consumer.run(
        { groupId: "g", topics: ["t"], maxPollRecords: 10, bufferSize: 20 },
        (records) =>
          Effect.gen(function*() {
            if (Chunk.unsafeHead(records).offset === 0n) yield* Deferred.await(gate)
            for (const r of records) handled.push(r.offset)
          })
      ).pipe(Effect.provide(CommitPolicy.commitAfter({ maxBatch: 5, maxInterval: "1 second" })), Effect.fork)
      const [member] = yield* kafka.members("g").pipe(
        Effect.repeat({ until: (ms) => ms.length === 1 && ms[0]!.partitions.length === 1 })
      )
      yield* settled("fetched ahead to the bound", Effect.map(kafka.fetchedCount(member!.memberId), (n) => n === 20))
      // Retention removes records the consumer has not fetched yet.
      yield* kafka.deleteRecords("t", 0, 30n)
      yield* Deferred.succeed(gate, undefined)
      yield* settled("the rest handled", Effect.sync(() => handled.includes(39n)))
      yield* Fiber.interrupt(fiber)
      assert.deepStrictEqual(handled, [
        ...Array.from({ length: 20 }, (_, i) => BigInt(i)),
        ...Array.from({ length: 10 }, (_, i) => BigInt(30 + i))
      ])
      assert.isTrue(
        logs.lines.some((l) => l.includes("position 20 of t-0 is out of its log (offsets 30 to 40)")),
        logs.lines.join("\n")
      )
    }).pipe(Effect.provide(InMemoryKafka.layer()), Effect.provide(logs.layer))
  })

  it.effect("latest, read_committed: a partition with nothing committed starts at the last stable offset, and an open transaction's records are handled once it commits", () =>
    Effect.gen(function*() {
      const kafka = yield* InMemoryKafka.InMemoryKafka
      yield* kafka.createTopic("t", 1)
      yield* kafka.produce("t", Array.from({ length: 10 }, (_, i) => ({ value: String(i) })))
      const epoch = yield* kafka.initProducer("tx", "1 hour")
      yield* kafka.transactionalProduce("tx", epoch, "t", Array.from({ length: 5 }, (_, i) => ({ value: `tx-${i}` })))
      const handled: Array<string> = []
      const assigned = yield* Deferred.make<void>()
      const fiber = yield* Consumer.run(
        { groupId: "g", topics: ["t"], offsetReset: "latest" },
        (records) =>
          Effect.sync(() => {
            for (const r of records) handled.push(new TextDecoder().decode(r.value!))
          }),
        // Runs once the partition was sought to its start.
        { onAssign: () => Deferred.succeed(assigned, undefined) }
      ).pipe(Effect.provide(CommitPolicy.commitAfter({ maxBatch: 1, maxInterval: "1 second" })), Effect.fork)
      yield* Deferred.await(assigned)
      yield* kafka.endTransaction("tx", epoch, "commit")
      yield* settled("the transaction's records handled", Effect.sync(() => handled.length === 5))
      yield* Fiber.interrupt(fiber)
      // Started at the last stable offset (10), not at the end of the log (15): the transaction's records are read.
      assert.deepStrictEqual(handled, ["tx-0", "tx-1", "tx-2", "tx-3", "tx-4"])
    }).pipe(Effect.provide(InMemoryKafka.layer())))
})
