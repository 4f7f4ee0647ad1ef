/**
 * The fifth policy, consume-transform-produce exactly-once, on the in-memory broker: the handler's records and the
 * input positions in one Kafka transaction per chunk, checked by reading the output topic read_committed.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Chunk from "effect/Chunk"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import { kafkaTransactionalPlan, outputTopic, readCommitted, runWorkload } from "../demo/lab.js"
import * as CommitPolicy from "../src/CommitPolicy.js"
import * as Consumer from "../src/Consumer.js"
import { type ConsumerRecord, valueString } from "../src/ConsumerRecord.js"
import * as InMemoryKafka from "../src/InMemoryKafka.js"
import { ProduceFailed, TransactionFailed } from "../src/KafkaError.js"
import * as Producer from "../src/Producer.js"

const policy = CommitPolicy.kafkaTransactional().pipe(Layer.provide(InMemoryKafka.layerTransactionalProducers()))

describe("kafkaTransactional on the in-memory broker", () => {
  it.live(
    "with crashes, rebalances and zombies, the output holds every input record exactly once",
    () =>
      Effect.gen(function*() {
        const outcome = yield* runWorkload({
          policy: "kafkaTransactional",
          records: 10_000,
          partitions: 6,
          consumers: 3,
          crashes: 60,
          crashRate: 0.15,
          rebalances: true,
          maxPollRecords: 25,
          zombies: 3,
          seed: 111
        }, kafkaTransactionalPlan)
        const text = `results ${outcome.delivered}, lost ${outcome.lost}, duplicated ${outcome.duplicated}, ` +
          `crashes ${outcome.crashes}, zombies ${outcome.zombies}, rebalances ${outcome.rebalances}`
        assert.strictEqual(outcome.lost, 0, text)
        assert.strictEqual(outcome.duplicated, 0, text)
        assert.strictEqual(outcome.delivered, 10_000, text)
        assert.isAtLeast(outcome.crashes, 50, text)
        // Zombies whose late transactions the broker must fence: without it, their records would be there twice.
        assert.isAtLeast(outcome.zombies, 1, text)
        assert.strictEqual(outcome.rebalances, 3, text)
      }).pipe(Effect.provide(InMemoryKafka.layer())),
    { timeout: 120_000 }
  )

  it.live(
    "a zombie's late transaction is fenced: it ends with TransactionFailed when rejoin is off, and lands nothing",
    () =>
      Effect.gen(function*() {
        const kafka = yield* InMemoryKafka.InMemoryKafka
        const topic = `zombie-${crypto.randomUUID().slice(0, 6)}`
        const groupId = `${topic}-group`
        yield* kafka.createTopic(topic, 1)
        yield* kafka.createTopic(outputTopic(topic), 1)
        yield* kafka.produce(topic, Array.from({ length: 20 }, (_, i) => ({ value: String(i) })))
        const config = { groupId, topics: [topic], maxPollRecords: 5, sessionTimeout: "300 millis" } as const
        const aInBatch = yield* Deferred.make<void>()
        const wakeA = yield* Deferred.make<void>()
        let aBatches = 0
        const copy = (records: Chunk.Chunk<ConsumerRecord>, by: string) =>
          Producer.sendAll(
            Chunk.map(records, (r) => ({ topic: outputTopic(topic), value: `${valueString(r)}`, key: by }))
          )
        const a = yield* Consumer.run({ ...config, rejoin: false }, (records) =>
          Effect.gen(function*() {
            yield* copy(records, "a")
            aBatches++
            if (aBatches > 1) return
            yield* Deferred.succeed(aInBatch, undefined)
            yield* Deferred.await(wakeA)
          })).pipe(Effect.provide(policy), Effect.fork)
        yield* Deferred.await(aInBatch)
        const aMember = (yield* kafka.members(groupId))[0]!.memberId
        yield* kafka.freeze(aMember)
        // B joins once A is evicted, fences A's producer, and copies everything.
        const b = yield* Consumer.run(config, (records) => copy(records, "b")).pipe(Effect.provide(policy), Effect.fork)
        const done = Effect.map(kafka.committed(groupId), (c) => c.get(`${topic}-0`) === 20n)
        // B's producer must have fenced A's and aborted its open transaction, which would hold B's output back.
        for (let i = 0; i < 2000 && !(yield* done); i++) yield* Effect.sleep("5 millis")
        assert.isTrue(yield* done, "B committed past A's batch: A's open transaction was aborted when B took over")
        // A's handler returns while A is still frozen: its transaction goes on to commit before A can poll and learn
        // that it was evicted.
        yield* Deferred.succeed(wakeA, undefined)
        const ended = yield* Effect.flip(Fiber.join(a)).pipe(Effect.timeoutOption("10 seconds"))
        yield* kafka.thaw(aMember)
        assert.isTrue(Option.isSome(ended), "A's late transaction was refused, which ended A")
        const error = Option.getOrThrow(ended)
        assert.instanceOf(error, TransactionFailed)
        assert.strictEqual((error as TransactionFailed).reason, "Fenced")
        yield* Fiber.interrupt(b)
        const output = yield* readCommitted(outputTopic(topic), 1)
        assert.deepStrictEqual(output.map(valueString), Array.from({ length: 20 }, (_, i) => String(i)))
        assert.isTrue(
          output.every((r) => new TextDecoder().decode(r.key!) === "b"),
          "nothing of A's transaction landed"
        )
      }).pipe(Effect.provide(InMemoryKafka.layer())),
    { timeout: 60_000 }
  )

  it.live("a handler that catches a failed send: its transaction cannot commit, and the consumer ends with TransactionFailed (Aborted), nothing of the chunk landed", () =>
    Effect.gen(function*() {
      const kafka = yield* InMemoryKafka.InMemoryKafka
      const topic = `caught-${crypto.randomUUID().slice(0, 6)}`
      const groupId = `${topic}-group`
      yield* kafka.createTopic(topic, 1)
      yield* kafka.createTopic(outputTopic(topic), 1)
      yield* kafka.produce(topic, Array.from({ length: 10 }, (_, i) => ({ value: String(i) })))
      const failure = yield* Consumer.run(
        { groupId, topics: [topic], maxPollRecords: 5 },
        (records) =>
          Effect.gen(function*() {
            yield* Producer.sendAll(
              Chunk.map(records, (r) => ({ topic: outputTopic(topic), value: `${valueString(r)}` }))
            )
            // A send to a topic that does not exist, whose failure the handler keeps to itself.
            if (Chunk.unsafeHead(records).offset === 5n) {
              yield* Effect.ignore(Producer.send({ topic: `${topic}-missing`, value: "x" }))
            }
          })
      ).pipe(Effect.provide(policy), Effect.flip, Effect.timeout("10 seconds"))
      assert.instanceOf(failure, TransactionFailed)
      assert.strictEqual((failure as TransactionFailed).reason, "Aborted")
      const output = yield* readCommitted(outputTopic(topic), 1)
      assert.deepStrictEqual(output.map(valueString), ["0", "1", "2", "3", "4"], "nothing of the aborted chunk landed")
      assert.strictEqual((yield* kafka.committed(groupId)).get(`${topic}-0`), 5n)
    }).pipe(Effect.provide(InMemoryKafka.layer())))

  // Another member takes the partition and commits its records 0 to 7 (position 8) in a transaction of the partition's
  // transactional id, while this member still handles the chunk 0 to 4: what this member does next must not write
  // any of 0 to 7 again.
  const takeover = (topic: string, groupId: string, transactionalId: string) =>
    Effect.flatMap(
      Producer.TransactionalProducers,
      (factory) =>
        Effect.scoped(Effect.flatMap(factory.make(transactionalId), (other) =>
          other.transaction(
            Producer.sendAll(Array.from({ length: 8 }, (_, i) => ({ topic: outputTopic(topic), value: String(i) }))),
            { offsets: { groupId, positions: [{ topic, partition: 0, next: 8n }] } }
          )))
    )

  const exactlyOnceAfterTakeover = (
    topic: string,
    policy: Layer.Layer<CommitPolicy.CommitPolicy | Producer.Producer, unknown, InMemoryKafka.InMemoryKafka>,
    handler: (topic: string, groupId: string, records: Chunk.Chunk<ConsumerRecord>, first: boolean) => Effect.Effect<
      void,
      unknown,
      Producer.Producer | Producer.TransactionalProducers
    >
  ) =>
    Effect.gen(function*() {
      const kafka = yield* InMemoryKafka.InMemoryKafka
      const groupId = `${topic}-group`
      yield* kafka.createTopic(topic, 1)
      yield* kafka.createTopic(outputTopic(topic), 1)
      yield* kafka.produce(topic, Array.from({ length: 10 }, (_, i) => ({ value: String(i) })))
      let calls = 0
      const factory = yield* Effect.provide(
        Producer.TransactionalProducers,
        InMemoryKafka.layerTransactionalProducers()
      )
      const consumer = yield* Consumer.run(
        { groupId, topics: [topic], maxPollRecords: 5 },
        (records) =>
          handler(topic, groupId, records, calls++ === 0).pipe(
            Effect.provideService(Producer.TransactionalProducers, factory)
          )
      ).pipe(Effect.provide(policy), Effect.fork)
      const done = Effect.map(kafka.committed(groupId), (c) => c.get(`${topic}-0`) === 10n)
      for (let i = 0; i < 2000 && !(yield* done); i++) yield* Effect.sleep("5 millis")
      assert.isTrue(yield* done, "the consumer committed every record")
      yield* Fiber.interrupt(consumer)
      const output = yield* readCommitted(outputTopic(topic), 1)
      assert.deepStrictEqual(output.map(valueString), Array.from({ length: 10 }, (_, i) => String(i)))
    })

  // Both ways of fencing: a producer per partition, whose id names the partition (the other member took it by
  // starting that producer), and one per member (KIP-447), whose id names the member (the other took it with a
  // producer of its own, which fences nothing: the group's generation and the committed position do).
  const modes = [
    {
      producers: "partition" as const,
      policy: (factory: Layer.Layer<Producer.TransactionalProducers, unknown, InMemoryKafka.InMemoryKafka>) =>
        CommitPolicy.kafkaTransactional({ producers: "partition" }).pipe(Layer.provide(factory)),
      idOf: (topic: string, groupId: string) => `${groupId}-${topic}-0`
    },
    {
      producers: "member" as const,
      policy: (factory: Layer.Layer<Producer.TransactionalProducers, unknown, InMemoryKafka.InMemoryKafka>) =>
        CommitPolicy.kafkaTransactional({ instanceId: "m" }).pipe(Layer.provide(factory)),
      idOf: (_topic: string, groupId: string) => `${groupId}-m`
    }
  ]

  for (const mode of modes) {
    it.live(
      `a producer per ${mode.producers}: a transaction whose outcome is unknown, while another member took the ` +
        "partition and went on: the member joins again and goes on from the other's position, writing nothing twice",
      () =>
        Effect.gen(function*() {
          const topic = `unknown-outcome-${crypto.randomUUID().slice(0, 6)}`
          const groupId = `${topic}-group`
          // The first transaction of the producer: the other member takes over, then the commit's outcome is unknown
          // to this member (a timeout).
          let first = true
          const unknownOutcome = Layer.effect(
            Producer.TransactionalProducers,
            Effect.map(Producer.TransactionalProducers, (inner) => ({
              make: (id: string) =>
                Effect.map(inner.make(id), (producer) => ({
                  transactionalId: producer.transactionalId,
                  transaction: <A, E, R>(body: Effect.Effect<A, E, R>, options?: Producer.TransactionOptions) => {
                    if (!first) return producer.transaction(body, options)
                    first = false
                    return Effect.zipRight(
                      Effect.orDie(
                        Effect.provideService(
                          takeover(topic, groupId, `${groupId}-other`),
                          Producer.TransactionalProducers,
                          inner
                        )
                      ),
                      Effect.fail(
                        new TransactionFailed({ transactionalId: id, operation: "commit", reason: "Timeout" })
                      )
                    )
                  }
                }))
            }))
          ).pipe(Layer.provide(InMemoryKafka.layerTransactionalProducers()))
          yield* exactlyOnceAfterTakeover(
            topic,
            mode.policy(unknownOutcome),
            (topic, _groupId, records) =>
              Producer.sendAll(Chunk.map(records, (r) => ({ topic: outputTopic(topic), value: valueString(r) })))
          )
        }).pipe(Effect.provide(InMemoryKafka.layer())),
      { timeout: 60_000 }
    )

    it.live(
      `a producer per ${mode.producers}: a send refused because another producer took the transactional id fails ` +
        "the transaction as fenced, even when the handler fails with it: the member joins again rather than retry " +
        "the chunk, writing nothing twice",
      () =>
        Effect.gen(function*() {
          const topic = `fenced-send-${crypto.randomUUID().slice(0, 6)}`
          yield* exactlyOnceAfterTakeover(
            topic,
            mode.policy(InMemoryKafka.layerTransactionalProducers()),
            (topic, groupId, records, first) =>
              Effect.zipRight(
                first ? takeover(topic, groupId, mode.idOf(topic, groupId)) : Effect.void,
                Producer.sendAll(Chunk.map(records, (r) => ({ topic: outputTopic(topic), value: valueString(r) })))
              )
          )
        }).pipe(Effect.provide(InMemoryKafka.layer())),
      { timeout: 60_000 }
    )
  }

  it.live("outside a handler the policy's Producer has no transaction: a send fails, saying so", () =>
    Effect.gen(function*() {
      const error = yield* Effect.flip(Producer.send({ topic: "t", value: "v" }))
      assert.instanceOf(error, ProduceFailed)
      assert.include(error.message, "kafkaTransactional")
    }).pipe(Effect.provide(policy), Effect.provide(InMemoryKafka.layer())))
})
