/**
 * Observability on the in-memory broker: metrics read from Effect's registry, spans from an in-memory tracer, lag
 * from `Observability.lag`. Every test uses a group and topics of its own: the metric registry is global.
 */
import { assert, describe, expectTypeOf, it } from "@effect/vitest"
import * as Chunk from "effect/Chunk"
import * as Clock from "effect/Clock"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import * as Stream from "effect/Stream"
import * as CommitPolicy from "../src/CommitPolicy.js"
import * as Consumer from "../src/Consumer.js"
import * as FailureRoute from "../src/FailureRoute.js"
import type { ConsumerRecord } from "../src/ConsumerRecord.js"
import * as InMemoryKafka from "../src/InMemoryKafka.js"
import { InvalidConfig } from "../src/KafkaError.js"
import * as Observability from "../src/Observability.js"
import * as OffsetStore from "../src/OffsetStore.js"
import * as Producer from "../src/Producer.js"
import { linksOf, parseTraceparent } from "../src/internal/telemetry/telemetry.js"
import * as TopicPartition from "../src/TopicPartition.js"
import { eventually } from "./support/kit.js"
import { histogramSum, metricValue, recordingTracer } from "./support/tracing.js"

let seq = 0
const fresh = (what: string) => `${what}-${++seq}-${crypto.randomUUID().slice(0, 8)}`

const observed = Observability.layer({ lagInterval: "20 millis" })

const produce = (topic: string, partitions: number, perPartition: number, from = 0) =>
  Effect.forEach(Array.from({ length: partitions }, (_, p) => p), (p) =>
    InMemoryKafka.produce(
      topic,
      Array.from({ length: perPartition }, (_, i) => ({ value: `${p}:${from + i}`, partition: p }))
    ), { discard: true })

/** The first snapshot of the group reported after now, with the partitions it owns. */
const nextSnapshot = (groupId: string) =>
  Effect.gen(function*() {
    const now = yield* Clock.currentTimeMillis
    const next = yield* Observability.lag({ groupId }).pipe(
      Stream.filter((s) => s.at > now && s.partitions.length > 0),
      Stream.runHead,
      Effect.timeoutFail({ duration: "5 seconds", onTimeout: () => new Error(`no lag snapshot of ${groupId}`) })
    )
    return Option.getOrThrow(next)
  })

class Boom {
  readonly _tag = "Boom"
}

describe("Observability: metrics", () => {
  it.live("records received and handled, handler calls and their failures, commits: each counted as it happened", () =>
    Effect.gen(function*() {
      const topic = fresh("obs-count")
      const groupId = fresh("g")
      yield* InMemoryKafka.createTopic(topic, 3)
      yield* produce(topic, 3, 100)
      let calls = 0
      let records = 0
      let failedOnce = false
      const fiber = yield* Consumer.run(
        { groupId, topics: [topic], maxPollRecords: 25, retry: Schedule.recurs(2) },
        (chunk, tp) =>
          Effect.suspend(() => {
            calls++
            records += Chunk.size(chunk)
            if (tp.partition === 1 && !failedOnce) {
              failedOnce = true
              return Effect.fail(new Boom())
            }
            return Effect.void
          })
      ).pipe(
        Effect.provide(CommitPolicy.commitAfter({ maxBatch: 50, maxInterval: "20 millis" })),
        Effect.fork
      )
      const group = { "messaging.consumer.group.name": groupId }
      yield* eventually(
        "every record handled and committed",
        Effect.zipWith(
          metricValue("kafka.consumer.handled.records", group),
          Effect.map(
            InMemoryKafka.committed(groupId),
            (batch) => [...batch.positions.values()].reduce((a, b) => a + b, 0n)
          ),
          (handled, committed) => handled === 300 && committed === 300n
        )
      )
      assert.strictEqual(yield* metricValue("messaging.client.consumed.messages", group), 300)
      for (let p = 0; p < 3; p++) {
        const labels = {
          ...group,
          "messaging.destination.name": topic,
          "messaging.destination.partition.id": String(p)
        }
        assert.strictEqual(yield* metricValue("kafka.consumer.handled.records", labels), 100, `partition ${p}`)
        assert.strictEqual(yield* metricValue("messaging.client.consumed.messages", labels), 100, `partition ${p}`)
      }
      // Every handler call is timed, the failed one with its error.type; the chunk sizes add up to what the handler saw.
      assert.strictEqual(yield* metricValue("messaging.process.duration", group), calls)
      assert.strictEqual(yield* metricValue("messaging.process.duration", { ...group, "error.type": "Boom" }), 1)
      assert.strictEqual(yield* metricValue("kafka.consumer.handler.failures", group), 1)
      assert.strictEqual(
        yield* metricValue("kafka.consumer.handler.failures", { ...group, "error.type": "Boom" }),
        1
      )
      assert.strictEqual(yield* histogramSum("kafka.consumer.chunk.records", group), records)
      assert.strictEqual(records, 325, "the failed chunk of 25 was handed twice")
      assert.isAtLeast(yield* metricValue("kafka.consumer.commits", group), 1)
      assert.strictEqual(
        yield* metricValue("kafka.consumer.commit.duration", group),
        yield* metricValue("kafka.consumer.commits", group)
      )
      assert.strictEqual(yield* metricValue("kafka.consumer.commit.failures", group), 0)
      assert.strictEqual(
        yield* metricValue("kafka.consumer.rebalance.partitions", { ...group, "kafka.rebalance.event": "assigned" }),
        3
      )
      yield* Fiber.interrupt(fiber)
    }).pipe(Effect.provide(Layer.merge(InMemoryKafka.layer(), observed))))

  it.live("a refused commit is counted with its reason", () =>
    Effect.gen(function*() {
      const topic = fresh("obs-refused")
      const groupId = fresh("g")
      yield* InMemoryKafka.createTopic(topic, 1)
      yield* produce(topic, 1, 20)
      yield* (yield* InMemoryKafka.InMemoryKafka).refuseCommits(groupId, "Timeout", 2)
      const fiber = yield* Consumer.run({ groupId, topics: [topic] }, () => Effect.void).pipe(
        Effect.provide(CommitPolicy.commitAfter({ maxBatch: 5, maxInterval: "20 millis" })),
        Effect.fork
      )
      yield* eventually(
        "committed after the refusals",
        Effect.map(InMemoryKafka.committed(groupId), (batch) => batch.positions.get(`${topic}-0`) === 20n)
      )
      const group = { "messaging.consumer.group.name": groupId }
      assert.strictEqual(yield* metricValue("kafka.consumer.commit.failures", { ...group, "error.type": "Timeout" }), 2)
      assert.isAtLeast(yield* metricValue("kafka.consumer.commits", group), 1)
      yield* Fiber.interrupt(fiber)
    }).pipe(Effect.provide(Layer.merge(InMemoryKafka.layer(), observed))))

  it.live("a rebalance counts the partitions assigned and revoked", () =>
    Effect.gen(function*() {
      const topic = fresh("obs-rebalance")
      const groupId = fresh("g")
      yield* InMemoryKafka.createTopic(topic, 4)
      const member = Consumer.run({ groupId, topics: [topic] }, () => Effect.void).pipe(
        Effect.provide(CommitPolicy.commitAfter({ maxBatch: 5, maxInterval: "20 millis" })),
        Effect.fork
      )
      const event = (name: string) =>
        metricValue("kafka.consumer.rebalance.partitions", {
          "messaging.consumer.group.name": groupId,
          "messaging.destination.name": topic,
          "kafka.rebalance.event": name
        })
      const first = yield* member
      yield* eventually("the first member owns all four", Effect.map(event("assigned"), (n) => n === 4))
      const second = yield* member
      // The second member takes two of them: the first gives them up (all four, then gets two back: the group
      // rebalances eagerly). Whatever the protocol, what is owned is what was assigned and not revoked.
      const kafka = yield* InMemoryKafka.InMemoryKafka
      yield* eventually(
        "two each",
        Effect.map(kafka.members(groupId), (members) =>
          members.length === 2 && members.every((m) => m.partitions.length === 2))
      )
      yield* eventually(
        "the counters caught up",
        Effect.zipWith(event("assigned"), event("revoked"), (assigned, revoked) =>
          assigned - revoked === 4 && revoked >= 2)
      )
      assert.strictEqual(yield* event("lost"), 0)
      yield* Fiber.interrupt(second)
      yield* Fiber.interrupt(first)
    }).pipe(Effect.provide(Layer.merge(InMemoryKafka.layer(), observed))))

  it.live("a zombie's late unit is fenced, and counted: the fenced counter goes up by one", () =>
    Effect.gen(function*() {
      const topic = fresh("obs-fenced")
      const groupId = fresh("g")
      const tp = TopicPartition.make(topic, 0)
      yield* InMemoryKafka.createTopic(topic, 1)
      yield* produce(topic, 1, 30)
      const store = yield* OffsetStore.OffsetStore
      const inUnit = yield* Deferred.make<void>()
      const claimed = yield* Deferred.make<void>()
      let held = false
      const fiber = yield* Consumer.run(
        { groupId, topics: [topic], maxPollRecords: 10 },
        (records) =>
          Effect.gen(function*() {
            // The first unit waits while another owner claims the partition: its commit is then fenced.
            if (!held) {
              held = true
              yield* Deferred.succeed(inUnit, undefined)
              yield* Deferred.await(claimed)
            }
            yield* OffsetStore.append(Chunk.toReadonlyArray(records).map((r) => String(r.offset)))
          })
      ).pipe(
        Effect.provide(CommitPolicy.transactional()),
        Effect.fork
      )
      yield* Deferred.await(inUnit)
      yield* store.claim(groupId, [tp])
      yield* Deferred.succeed(claimed, undefined)
      const labels = { "messaging.consumer.group.name": groupId, "messaging.destination.name": topic }
      // The member rejoins, claims the partition again, and stores every record once.
      yield* eventually(
        "every record stored",
        Effect.map(OffsetStore.results(groupId), (stored) => stored.length === 30)
      )
      assert.strictEqual(yield* metricValue("kafka.consumer.units.fenced", labels), 1)
      assert.strictEqual(yield* metricValue("kafka.consumer.unit.duration", { ...labels, "error.type": "Fenced" }), 1)
      assert.strictEqual(yield* metricValue("kafka.consumer.units", labels), 3)
      assert.deepStrictEqual(
        yield* OffsetStore.results(groupId),
        Array.from({ length: 30 }, (_, i) => String(i))
      )
      yield* Fiber.interrupt(fiber)
    }).pipe(Effect.provide(Layer.mergeAll(InMemoryKafka.layer(), OffsetStore.layerMemory, observed))))

  it.live("the producer counts records, bytes, failures by reason and transactions by outcome", () =>
    Effect.gen(function*() {
      const topic = fresh("obs-produce")
      yield* InMemoryKafka.createTopic(topic, 2)
      const producer = yield* Producer.Producer
      yield* producer.sendAll(Array.from({ length: 10 }, (_, i) => ({ topic, key: `k${i}`, value: "0123456789" })))
      const missing = fresh("obs-missing")
      const refused = yield* Effect.flip(producer.send({ topic: missing, value: "x" }))
      assert.strictEqual(refused.reason, "UnknownTopic")
      const labels = { "messaging.destination.name": topic }
      assert.strictEqual(yield* metricValue("messaging.client.sent.messages", labels), 10)
      // As the batcher counts them: 21 bytes of framing, two of key, ten of value, and the traceparent header.
      assert.strictEqual(yield* metricValue("kafka.producer.sent.bytes", labels), 10 * (21 + 2 + 10 + (11 + 55 + 2)))
      assert.strictEqual(yield* metricValue("messaging.client.operation.duration", labels), 1)
      assert.strictEqual(
        yield* metricValue("kafka.producer.errors", {
          "messaging.destination.name": missing,
          "error.type": "UnknownTopic"
        }),
        1
      )
      const before = {
        committed: yield* metricValue("kafka.producer.transactions", { "kafka.transaction.outcome": "committed" }),
        aborted: yield* metricValue("kafka.producer.transactions", { "kafka.transaction.outcome": "aborted" })
      }
      yield* Effect.scoped(Effect.gen(function*() {
        const context = yield* Layer.build(InMemoryKafka.layerTransactionalProducer({ transactionalId: fresh("tx") }))
        const tx = yield* Effect.provide(Producer.TransactionalProducer, context)
        yield* tx.transaction(Producer.send({ topic, value: "in" }))
        yield* Effect.flip(
          tx.transaction(Effect.zipRight(Producer.send({ topic, value: "out" }), Effect.fail(new Boom())))
        )
      }))
      assert.strictEqual(
        yield* metricValue("kafka.producer.transactions", { "kafka.transaction.outcome": "committed" }),
        before.committed + 1
      )
      assert.strictEqual(
        yield* metricValue("kafka.producer.transactions", { "kafka.transaction.outcome": "aborted" }),
        before.aborted + 1
      )
    }).pipe(
      Effect.provide(
        Layer.merge(Layer.provideMerge(InMemoryKafka.layerProducer({ linger: 0 }), InMemoryKafka.layer()), observed)
      )
    ))

  it.live("without the layer nothing is recorded: no series for the group, no traceparent in the records", () =>
    Effect.gen(function*() {
      const topic = fresh("obs-off")
      const groupId = fresh("g")
      yield* InMemoryKafka.createTopic(topic, 1)
      yield* Producer.send({ topic, value: "plain" })
      const seen: Array<ConsumerRecord> = []
      const fiber = yield* Consumer.runEach(
        { groupId, topics: [topic] },
        (record) => Effect.sync(() => seen.push(record))
      )
        .pipe(Effect.provide(CommitPolicy.commitAfter({ maxBatch: 1, maxInterval: "20 millis" })), Effect.fork)
      yield* eventually("the record handled", Effect.sync(() => seen.length === 1))
      assert.deepStrictEqual(Object.keys(seen[0]!.headers), [])
      const group = { "messaging.consumer.group.name": groupId }
      assert.strictEqual(yield* metricValue("messaging.client.consumed.messages", group), 0)
      assert.strictEqual(yield* metricValue("kafka.consumer.handled.records", group), 0)
      assert.strictEqual(
        yield* metricValue("messaging.client.sent.messages", { "messaging.destination.name": topic }),
        0
      )
      yield* Fiber.interrupt(fiber)
    }).pipe(Effect.provide(Layer.provideMerge(InMemoryKafka.layerProducer({ linger: 0 }), InMemoryKafka.layer()))))
})

describe("Observability: lag", () => {
  it.live("lag grows while the consumer is held and its partition paused, and falls to 0 once it catches up", () =>
    Effect.gen(function*() {
      const topic = fresh("obs-lag")
      const groupId = fresh("g")
      yield* InMemoryKafka.createTopic(topic, 1)
      yield* produce(topic, 1, 50)
      const gate = yield* Deferred.make<void>()
      const fiber = yield* Consumer.run({ groupId, topics: [topic], maxPollRecords: 10 }, () => Deferred.await(gate))
        .pipe(Effect.provide(CommitPolicy.commitAfter({ maxBatch: 10, maxInterval: "20 millis" })), Effect.fork)
      const latestLag = Effect.gen(function*() {
        const observability = yield* Observability.Observability
        return yield* observability.lag.pipe(
          Stream.filter((s) => s.groupId === groupId && s.partitions.length === 1),
          Stream.take(1),
          Stream.runHead,
          Effect.map(Option.map((s) => s.partitions[0]!))
        )
      })
      yield* eventually("lag of all 50", Effect.map(latestLag, (p) => Option.isSome(p) && p.value.lag === 50n))
      // The handler is held: its buffer fills, the partition is paused; what is produced meanwhile adds to the lag.
      const paused = { "messaging.consumer.group.name": groupId }
      yield* eventually(
        "the partition paused",
        Effect.map(metricValue("kafka.consumer.paused.partitions", paused), (n) => n === 1)
      )
      yield* produce(topic, 1, 30, 50)
      yield* eventually("lag of 80", Effect.map(latestLag, (p) => Option.isSome(p) && p.value.lag === 80n))
      const labels = { ...paused, "messaging.destination.name": topic, "messaging.destination.partition.id": "0" }
      yield* eventually("the gauge says 80", Effect.map(metricValue("kafka.consumer.lag", labels), (n) => n === 80))
      assert.isAtLeast(yield* metricValue("kafka.consumer.buffered.records", labels), 10)
      yield* Deferred.succeed(gate, undefined)
      yield* eventually(
        "every record committed",
        Effect.map(InMemoryKafka.committed(groupId), (batch) => batch.positions.get(`${topic}-0`) === 80n)
      )
      // The first snapshot after that commit: the lag counts from the committed position.
      const after = yield* nextSnapshot(groupId)
      assert.deepStrictEqual(after.partitions, [{ topic, partition: 0, position: 80n, latest: 80n, lag: 0n }])
      assert.strictEqual(yield* metricValue("kafka.consumer.lag", labels), 0)
      assert.strictEqual(yield* metricValue("kafka.consumer.paused.partitions", paused), 0)
      assert.strictEqual(yield* metricValue("kafka.consumer.buffered.records", labels), 0)
      yield* Fiber.interrupt(fiber)
    }).pipe(Effect.provide(Layer.merge(InMemoryKafka.layer(), observed))))

  for (const isolationLevel of ["read_committed", "read_uncommitted"] as const) {
    it.live(`${isolationLevel}: the lag counts to what the consumer can read (${isolationLevel === "read_committed" ? "the last stable offset" : "the high watermark"})`, () =>
      Effect.gen(function*() {
        const kafka = yield* InMemoryKafka.InMemoryKafka
        const topic = fresh("obs-lag-open")
        const groupId = fresh("g")
        yield* kafka.createTopic(topic, 1)
        yield* produce(topic, 1, 10)
        // A transaction left open on the partition: 5 records past the last stable offset (10).
        const epoch = yield* kafka.initProducer(`${topic}-tx`, "1 hour")
        yield* kafka.transactionalProduce(
          `${topic}-tx`,
          epoch,
          topic,
          Array.from({ length: 5 }, () => ({ value: "t" }))
        )
        const fiber = yield* Consumer.run({ groupId, topics: [topic], isolationLevel }, () => Effect.void).pipe(
          Effect.provide(CommitPolicy.commitAfter({ maxBatch: 1, maxInterval: "10 millis" })),
          Effect.fork
        )
        const reachable = isolationLevel === "read_committed" ? 10n : 15n
        yield* eventually(
          "what can be read committed",
          Effect.map(InMemoryKafka.committed(groupId), (batch) => batch.positions.get(`${topic}-0`) === reachable)
        )
        const snapshot = yield* nextSnapshot(groupId)
        assert.deepStrictEqual(snapshot.partitions, [{
          topic,
          partition: 0,
          position: reachable,
          latest: reachable,
          lag: 0n
        }])
        yield* Fiber.interrupt(fiber)
      }).pipe(Effect.provide(Layer.merge(InMemoryKafka.layer(), observed))))
  }

  it.live("under transactional, the lag counts from the stored position", () =>
    Effect.gen(function*() {
      const topic = fresh("obs-lag-stored")
      const groupId = fresh("g")
      yield* InMemoryKafka.createTopic(topic, 2)
      yield* produce(topic, 2, 40)
      const fiber = yield* Consumer.run(
        { groupId, topics: [topic], maxPollRecords: 10 },
        (records) => OffsetStore.append(Chunk.toReadonlyArray(records).map((r) => String(r.offset)))
      ).pipe(Effect.provide(CommitPolicy.transactional()), Effect.fork)
      yield* eventually(
        "every record stored",
        Effect.map(OffsetStore.results(groupId), (stored) => stored.length === 80)
      )
      const after = yield* nextSnapshot(groupId)
      assert.deepStrictEqual(
        after.partitions.map((p) => [p.partition, p.position, p.lag]).sort(),
        [[0, 40n, 0n], [1, 40n, 0n]]
      )
      // Nothing was committed to Kafka: the lag is the store's.
      assert.strictEqual((yield* InMemoryKafka.committed(groupId)).positions.size, 0)
      yield* Fiber.interrupt(fiber)
    }).pipe(Effect.provide(Layer.mergeAll(InMemoryKafka.layer(), OffsetStore.layerMemory, observed))))
})

describe("Observability: lag of members that ended", () => {
  const commitAfter = CommitPolicy.commitAfter({ maxBatch: 5, maxInterval: "20 millis" })

  /** The first snapshot reported after now by a member that owns partitions and passes `which`. */
  const snapshotOf = (groupId: string, which: (memberId: string) => boolean) =>
    Effect.gen(function*() {
      const now = yield* Clock.currentTimeMillis
      const next = yield* Observability.lag({ groupId }).pipe(
        Stream.filter((s) => s.at > now && s.partitions.length > 0 && which(s.memberId)),
        Stream.runHead,
        Effect.timeoutFail({ duration: "5 seconds", onTimeout: () => new Error(`no such lag snapshot of ${groupId}`) })
      )
      return Option.getOrThrow(next)
    })

  /** What a subscriber that comes now gets first: the snapshots kept, up to the first of `until`'s member. */
  const keptUntil = (groupId: string, until: string) =>
    Observability.lag({ groupId }).pipe(
      Stream.takeUntil((s) => s.memberId === until),
      Stream.runCollect,
      Effect.map(Chunk.toReadonlyArray),
      Effect.timeoutFail({ duration: "5 seconds", onTimeout: () => new Error(`no snapshot of ${until}`) })
    )

  it.live("ended sessions are forgotten: a later subscriber gets only the live member, an early one saw each end", () =>
    Effect.gen(function*() {
      const topic = fresh("obs-ended")
      const groupId = fresh("g")
      yield* InMemoryKafka.createTopic(topic, 2)
      yield* produce(topic, 2, 10)
      const member = Consumer.run({ groupId, topics: [topic] }, () => Effect.void).pipe(
        Effect.provide(commitAfter),
        Effect.fork
      )
      const early: Array<Observability.LagSnapshot> = []
      yield* Effect.fork(Stream.runForEach(Observability.lag({ groupId }), (s) => Effect.sync(() => early.push(s))))
      // A consumer that restarts again and again: each session a member of its own, ended once it reported its lag.
      const ended: Array<string> = []
      for (let i = 0; i < 20; i++) {
        const fiber = yield* member
        const { memberId } = yield* snapshotOf(groupId, () => true)
        const heard = Effect.sync(() => early.some((s) => s.memberId === memberId))
        yield* eventually("the early subscriber heard of it", heard)
        ended.push(memberId)
        yield* Fiber.interrupt(fiber)
      }
      assert.strictEqual(new Set(ended).size, 20)
      const live = yield* member
      const current = yield* snapshotOf(groupId, (id) => !ended.includes(id))

      const kept = yield* keptUntil(groupId, current.memberId)
      assert.deepStrictEqual(kept.map((s) => s.memberId), [current.memberId])
      assert.deepStrictEqual(kept[0]!.partitions.map((p) => p.partition), [0, 1])
      // The subscriber that was there all along was told each one ended: its last snapshot owns nothing.
      for (const memberId of ended) {
        assert.deepStrictEqual(early.filter((s) => s.memberId === memberId).at(-1)?.partitions, [], memberId)
      }
      yield* Fiber.interrupt(live)
    }).pipe(Effect.provide(Layer.merge(InMemoryKafka.layer(), observed))))

  it.live("a member evicted and back under a new member id: its old id is forgotten, the new one shows", () =>
    Effect.gen(function*() {
      const topic = fresh("obs-rejoined")
      const groupId = fresh("g")
      const kafka = yield* InMemoryKafka.InMemoryKafka
      yield* InMemoryKafka.createTopic(topic, 2)
      yield* produce(topic, 2, 10)
      const member = Consumer.run({ groupId, topics: [topic], sessionTimeout: "300 millis" }, () => Effect.void).pipe(
        Effect.provide(commitAfter),
        Effect.fork
      )
      const first = yield* member
      const old = (yield* snapshotOf(groupId, () => true)).memberId
      const second = yield* member
      const other = (yield* snapshotOf(groupId, (id) => id !== old)).memberId
      // The first member pauses past its session: the group evicts it; back, it rejoins in the same session.
      yield* kafka.freeze(old)
      yield* eventually(
        "the paused member evicted",
        Effect.map(kafka.members(groupId), (members) => !members.some((m) => m.memberId === old))
      )
      yield* kafka.thaw(old)
      const rejoined = (yield* snapshotOf(groupId, (id) => id !== old && id !== other)).memberId

      const kept = yield* keptUntil(groupId, rejoined)
      assert.deepStrictEqual(kept.filter((s) => s.memberId === old), [], "the old member id is not kept")
      assert.isNotEmpty(kept.at(-1)!.partitions)
      yield* Fiber.interrupt(second)
      yield* Fiber.interrupt(first)
    }).pipe(Effect.provide(Layer.merge(InMemoryKafka.layer(), observed))))
})

describe("Observability: spans and trace context", () => {
  it.live("the producer's send span is linked from the span of the chunk its record was handled in", () => {
    const tracing = recordingTracer()
    return Effect.gen(function*() {
      const topic = fresh("obs-trace")
      const groupId = fresh("g")
      yield* InMemoryKafka.createTopic(topic, 1)
      yield* Producer.send({ topic, key: "order-1", value: "placed" }).pipe(Effect.withSpan("checkout"))
      const seen: Array<ConsumerRecord> = []
      const fiber = yield* Consumer.runEach(
        { groupId, topics: [topic] },
        (record) => Effect.sync(() => seen.push(record))
      )
        .pipe(Effect.provide(CommitPolicy.commitAfter({ maxBatch: 1, maxInterval: "20 millis" })), Effect.fork)
      yield* eventually("the record handled", Effect.sync(() => seen.length === 1))
      yield* eventually("a commit span", Effect.sync(() => tracing.spans.some((s) => s.name === "commit")))
      const checkout = tracing.spans.find((s) => s.name === "checkout")!
      const send = tracing.spans.find((s) => s.name === `send ${topic}`)!
      assert.strictEqual(send.kind, "producer")
      assert.strictEqual(send.parentSpanId, checkout.spanId)
      assert.strictEqual(send.traceId, checkout.traceId)
      const header = new TextDecoder().decode(seen[0]!.headers["traceparent"])
      assert.strictEqual(header, `00-${send.traceId}-${send.spanId}-01`)
      const consumer = tracing.spans.find((s) => s.name === "kafka.consumer")!
      const process = tracing.spans.find((s) => s.name === `process ${topic}`)!
      assert.strictEqual(process.kind, "consumer")
      assert.strictEqual(process.parentSpanId, consumer.spanId)
      assert.strictEqual(process.attributes.get("messaging.consumer.group.name"), groupId)
      assert.strictEqual(process.attributes.get("messaging.batch.message_count"), 1)
      assert.deepStrictEqual(
        process.links.map((link) => [link.span.traceId, link.span.spanId]),
        [[checkout.traceId, send.spanId]]
      )
      const commit = tracing.spans.find((s) => s.name === "commit")!
      assert.strictEqual(commit.parentSpanId, consumer.spanId)
      yield* Fiber.interrupt(fiber)
    }).pipe(
      Effect.provide(Layer.mergeAll(
        Layer.provideMerge(InMemoryKafka.layerProducer({ linger: 0 }), InMemoryKafka.layer()),
        observed,
        tracing.layer
      ))
    )
  })

  it.live("a store unit has a span of its own, inside its chunk's", () => {
    const tracing = recordingTracer()
    return Effect.gen(function*() {
      const topic = fresh("obs-unit-span")
      const groupId = fresh("g")
      yield* InMemoryKafka.createTopic(topic, 1)
      yield* produce(topic, 1, 5)
      const fiber = yield* Consumer.run(
        { groupId, topics: [topic] },
        (records) => OffsetStore.append(Chunk.toReadonlyArray(records).map((r) => String(r.offset)))
      ).pipe(
        Effect.provide(CommitPolicy.transactional()),
        Effect.fork
      )
      yield* eventually("stored", Effect.map(OffsetStore.results(groupId), (stored) => stored.length === 5))
      yield* eventually(
        "the unit span ended",
        Effect.sync(() => tracing.spans.some((s) => s.name === `store ${topic}` && s.status._tag === "Ended"))
      )
      const unit = tracing.spans.find((s) => s.name === `store ${topic}`)!
      const chunk = tracing.spans.find((s) => s.spanId === unit.parentSpanId)!
      assert.strictEqual(chunk.name, `process ${topic}`)
      yield* Fiber.interrupt(fiber)
    }).pipe(Effect.provide(Layer.mergeAll(InMemoryKafka.layer(), OffsetStore.layerMemory, observed, tracing.layer)))
  })
})

describe("Observability: the policies' own writes", () => {
  it.live("kafkaTransactional: a transaction per chunk, counted, traced, committed; the lag counts from its offsets", () => {
    const tracing = recordingTracer()
    return Effect.gen(function*() {
      const topic = fresh("obs-ctp")
      const output = `${topic}-out`
      const groupId = fresh("g")
      yield* InMemoryKafka.createTopic(topic, 1)
      yield* InMemoryKafka.createTopic(output, 1)
      yield* produce(topic, 1, 20)
      const committedBefore = yield* metricValue("kafka.producer.transactions", {
        "kafka.transaction.outcome": "committed"
      })
      let chunks = 0
      const fiber = yield* Consumer.run({ groupId, topics: [topic], maxPollRecords: 5 }, (records) =>
        Effect.zipRight(
          Effect.sync(() => chunks++),
          Producer.sendAll(Chunk.toReadonlyArray(records).map((r) => ({ topic: output, value: r.value })))
        )).pipe(
          Effect.provide(
            CommitPolicy.kafkaTransactional().pipe(Layer.provide(InMemoryKafka.layerTransactionalProducers()))
          ),
          Effect.fork
        )
      yield* eventually(
        "every input record's position committed",
        Effect.map(InMemoryKafka.committed(groupId), (batch) => batch.positions.get(`${topic}-0`) === 20n)
      )
      const after = yield* nextSnapshot(groupId)
      assert.deepStrictEqual(after.partitions, [{ topic, partition: 0, position: 20n, latest: 20n, lag: 0n }])
      const labels = { "messaging.consumer.group.name": groupId, "messaging.destination.name": topic }
      assert.strictEqual(yield* metricValue("kafka.consumer.units", labels), chunks)
      assert.strictEqual(
        yield* metricValue("kafka.producer.transactions", { "kafka.transaction.outcome": "committed" }),
        committedBefore + chunks
      )
      assert.strictEqual(
        yield* metricValue("messaging.client.sent.messages", { "messaging.destination.name": output }),
        20
      )
      const transactions = tracing.spans.filter((s) => s.name === `transaction ${topic}`)
      assert.strictEqual(transactions.length, chunks)
      // The records sent inside a transaction carry the context of their send span, a child of the chunk's.
      const send = tracing.spans.find((s) => s.name === `send ${output}`)!
      const transaction = tracing.spans.find((s) => s.spanId === send.parentSpanId)!
      assert.strictEqual(transaction.name, `transaction ${topic}`)
      yield* Fiber.interrupt(fiber)
    }).pipe(Effect.provide(Layer.mergeAll(InMemoryKafka.layer(), observed, tracing.layer)))
  })

  it.live("the failure route: each dead-lettered record is counted by its topic", () =>
    Effect.gen(function*() {
      const topic = fresh("obs-dlq")
      const dlq = `${topic}-dlq`
      const groupId = fresh("g")
      yield* InMemoryKafka.createTopic(topic, 1)
      yield* InMemoryKafka.createTopic(dlq, 1)
      yield* produce(topic, 1, 10)
      let handled = 0
      const fiber = yield* Consumer.runEach(
        { groupId, topics: [topic], retry: Schedule.recurs(0), onFailure: FailureRoute.deadLetter({ topic: dlq }) },
        (record) =>
          Effect.suspend(() => {
            handled++
            return record.offset % 5n === 0n ? Effect.fail(new Boom()) : Effect.void
          })
      ).pipe(Effect.provide(CommitPolicy.commitAfter({ maxBatch: 5, maxInterval: "20 millis" })), Effect.fork)
      const group = { "messaging.consumer.group.name": groupId }
      yield* eventually(
        "both poison records routed",
        Effect.map(metricValue("kafka.consumer.routed.records", { ...group, "messaging.destination.name": dlq }), (n) =>
          n === 2)
      )
      yield* eventually(
        "all handled",
        Effect.map(metricValue("kafka.consumer.handled.records", group), (n) =>
          n === 10)
      )
      assert.strictEqual(yield* metricValue("kafka.consumer.handler.failures", { ...group, "error.type": "Boom" }), 2)
      yield* Fiber.interrupt(fiber)
    }).pipe(
      Effect.provide(
        Layer.merge(Layer.provideMerge(InMemoryKafka.layerProducer({ linger: 0 }), InMemoryKafka.layer()), observed)
      )
    ))
})

describe("trace context: traceparent headers", () => {
  const traceId = "4bf92f3577b34da6a3ce929d0e0e4736"
  const spanId = "00f067aa0ba902b7"
  it("a well-formed header names its span, sampled or not; anything else names none", () => {
    const named = parseTraceparent(`00-${traceId}-${spanId}-01`)
    assert.deepStrictEqual([named?.traceId, named?.spanId, named?.sampled], [traceId, spanId, true])
    assert.strictEqual(parseTraceparent(`00-${traceId}-${spanId}-00`)?.sampled, false)
    // A later version may add fields after a dash; version 00 may not.
    assert.strictEqual(parseTraceparent(`01-${traceId}-${spanId}-01-extra`)?.spanId, spanId)
    for (
      const bad of [
        `00-${traceId}-${spanId}-01-extra`,
        `ff-${traceId}-${spanId}-01`,
        `00-${"0".repeat(32)}-${spanId}-01`,
        `00-${traceId}-${"0".repeat(16)}-01`,
        `00-${traceId.toUpperCase()}-${spanId}-01`,
        `00-${traceId}_${spanId}-01`,
        `00-${traceId}-${spanId}`,
        `00-${traceId.slice(1)}x-${spanId}-01`,
        ""
      ]
    ) {
      assert.isUndefined(parseTraceparent(bad), bad)
    }
  })

  it("a chunk links each span its records name once, and skips records without one or with a bad one", () => {
    const record = (offset: number, header?: string): ConsumerRecord => ({
      topic: "t",
      partition: 0,
      offset: BigInt(offset),
      key: null,
      value: null,
      headers: header === undefined ? {} : { traceparent: new TextEncoder().encode(header) },
      timestamp: 0
    })
    const other = "1111111111111111"
    const links = linksOf([
      record(0, `00-${traceId}-${spanId}-01`),
      record(1, `00-${traceId}-${spanId}-01`),
      record(2),
      record(3, "garbage"),
      record(4, `00-${traceId}-${other}-01`),
      record(5, `00-${traceId}-${spanId}-01`)
    ])
    assert.deepStrictEqual(
      links.map((l) => [l.span.spanId, l.attributes["messaging.kafka.offset"]]),
      [[spanId, "0"], [other, "4"]]
    )
    assert.strictEqual(
      linksOf(Array.from({ length: 300 }, (_, i) => record(i, `00-${traceId}-${i.toString(16).padStart(16, "1")}-01`)))
        .length,
      128
    )
  })
})

describe("Observability in the types", () => {
  it.effect("the layer needs nothing and fails with a InvalidConfig naming a bad option; the consumer does not need it", () =>
    Effect.gen(function*() {
      expectTypeOf(Observability.layer()).toEqualTypeOf<Layer.Layer<Observability.Observability, InvalidConfig>>()
      const run = Consumer.run({ groupId: "g", topics: ["t"] }, () => Effect.void)
      type Needs = Effect.Effect.Context<typeof run>
      expectTypeOf<Extract<Needs, Observability.Observability>>().toEqualTypeOf<never>()
      expectTypeOf(Observability.lag()).toEqualTypeOf<
        Stream.Stream<Observability.LagSnapshot, never, Observability.Observability>
      >()
      // @ts-expect-error lagInterval is a duration
      Observability.layer({ lagInterval: true })
      const error = yield* Effect.flip(Layer.build(Observability.layer({ lagInterval: "-1 seconds" })))
      assert.instanceOf(error, InvalidConfig)
      assert.strictEqual(error.field, "Observability.lagInterval")
    }).pipe(Effect.scoped))
})
