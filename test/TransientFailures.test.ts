/**
 * A broker away for less than `reconnectTimeout` does not end a consumer, on every path that talks to it: a Kafka
 * transaction's producer starting on assign, its restart while a transaction of unknown outcome is settled, and the
 * reads of committed positions (which fail retriable while a transaction still completes them). Past the deadline the
 * consumer ends with the error.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Chunk from "effect/Chunk"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as TestClock from "effect/TestClock"
import * as Duration from "effect/Duration"
import { readCommitted } from "../demo/lab.js"
import * as CommitPolicy from "../src/CommitPolicy.js"
import * as Consumer from "../src/Consumer.js"
import { type ConsumerRecord, valueString } from "../src/ConsumerRecord.js"
import { Driver } from "../src/Driver.js"
import * as InMemoryKafka from "../src/InMemoryKafka.js"
import { DriverError, TransactionFailed } from "../src/KafkaError.js"
import * as Producer from "../src/Producer.js"
import { advanceUntil, inMemoryWrapping, settled } from "./support/kit.js"

const topic = "in"
const output = "out"
const config = { groupId: "g", topics: [topic], maxPollRecords: 5, reconnectTimeout: "60 seconds" } as const

const timedOut = (operation: TransactionFailed["operation"]) =>
  new TransactionFailed({ transactionalId: "any", operation, reason: "Timeout", detail: "the cluster is away" })

/**
 * The in-memory transactional producers, made to fail as a cluster that is away would: `make` (the producer's init,
 * which fences earlier owners) fails while `away.init` > 0, and a transaction commits but answers `Timeout` (its
 * outcome unknown to the caller) while `away.lostAnswers` > 0.
 */
const flakyProducers = (away: { init: number; lostAnswers: number; inits: number }) =>
  Layer.effect(
    Producer.TransactionalProducers,
    Effect.map(Producer.TransactionalProducers, (factory) => ({
      make: (transactionalId: string) =>
        Effect.suspend(() => {
          away.inits++
          if (away.init > 0) {
            away.init--
            return Effect.fail(timedOut("init"))
          }
          return Effect.map(factory.make(transactionalId), (producer) => ({
            ...producer,
            transaction: (body, options) =>
              Effect.flatMap(producer.transaction(body, options), (value) => {
                if (away.lostAnswers === 0) return Effect.succeed(value)
                away.lostAnswers--
                // The transaction committed; its answer was lost, and the producer must be started anew.
                away.init = 3
                return Effect.fail(timedOut("commit"))
              })
          } satisfies Context.Tag.Service<typeof Producer.TransactionalProducer>))
        })
    }))
  ).pipe(Layer.provide(InMemoryKafka.layerTransactionalProducers()))

const copy = (records: Chunk.Chunk<ConsumerRecord>) =>
  Producer.sendAll(Chunk.map(records, (r) => ({ topic: output, value: valueString(r) ?? "", partition: 0 })))

const outputValues = Effect.map(readCommitted(output, 1), (records) => records.map((r) => valueString(r)))

/** The group commits `position` for the input partition, as an earlier member would have. */
const commitPosition = (position: bigint) =>
  Effect.flatMap(Driver, (driver) =>
    Effect.scoped(Effect.gen(function*() {
      const session = yield* driver.connect({
        groupId: "g",
        clientId: "earlier",
        subscription: { _tag: "Topics", topics: [topic] },
        maxPollRecords: 1,
        pollTimeout: Duration.millis(1),
        sessionTimeout: Duration.seconds(10),
        rebalanceTimeout: Duration.seconds(10)
      })
      yield* settled("assigned", Effect.map(session.poll, (events) => events.some((e) => e._tag === "Assigned")))
      yield* session.commit({ positions: new Map([[`${topic}-0`, position]]) })
    })))

const seed = (n: number) =>
  Effect.gen(function*() {
    const kafka = yield* InMemoryKafka.InMemoryKafka
    yield* kafka.createTopic(topic, 1)
    yield* kafka.createTopic(output, 1)
    yield* kafka.produce(topic, Array.from({ length: n }, (_, i) => ({ value: String(i), partition: 0 })))
  })

const stillRunning = (fiber: Fiber.RuntimeFiber<unknown, unknown>) =>
  Effect.map(Fiber.poll(fiber), (exit) => {
    if (exit._tag === "Some" && Exit.isFailure(exit.value)) assert.fail(`the consumer ended: ${exit.value.cause}`)
    return exit._tag === "None"
  })

describe("kafkaTransactional while the cluster is away for less than reconnectTimeout", () => {
  it.effect("a partition's producer that cannot start on assign is started again: the consumer goes on", () =>
    Effect.gen(function*() {
      yield* seed(20)
      const away = { init: 12, lostAnswers: 0, inits: 0 }
      const fiber = yield* Consumer.run(config, copy).pipe(
        Effect.provide(CommitPolicy.kafkaTransactional()),
        Effect.provide(flakyProducers(away)),
        Effect.fork
      )
      yield* advanceUntil(
        "every record copied",
        Effect.zipRight(stillRunning(fiber), Effect.map(outputValues, (values) => values.length >= 20)),
        60
      )
      assert.isTrue(yield* stillRunning(fiber))
      assert.deepStrictEqual(yield* outputValues, Array.from({ length: 20 }, (_, i) => String(i)))
      assert.isAtLeast(away.inits, 13, "the producer's start was tried again")
      yield* Fiber.interrupt(fiber)
    }).pipe(Effect.provide(InMemoryKafka.layer())))

  it.effect("a transaction whose answer was lost is settled although the producer's restart fails for a while: once, no duplicate", () =>
    Effect.gen(function*() {
      yield* seed(20)
      const away = { init: 0, lostAnswers: 2, inits: 0 }
      const fiber = yield* Consumer.run(config, copy).pipe(
        Effect.provide(CommitPolicy.kafkaTransactional()),
        Effect.provide(flakyProducers(away)),
        Effect.fork
      )
      const committed = Effect.map(InMemoryKafka.committed("g"), (c) => c.positions.get(`${topic}-0`) === 20n)
      yield* advanceUntil("every position committed", Effect.zipRight(stillRunning(fiber), committed), 60)
      assert.strictEqual(away.lostAnswers, 0, "both lost answers were met")
      assert.deepStrictEqual(yield* outputValues, Array.from({ length: 20 }, (_, i) => String(i)))
      yield* Fiber.interrupt(fiber)
    }).pipe(Effect.provide(InMemoryKafka.layer())))

  it.effect("past reconnectTimeout the consumer ends with the producer's last error", () =>
    Effect.gen(function*() {
      yield* seed(5)
      const away = { init: 1_000_000, lostAnswers: 0, inits: 0 }
      const fiber = yield* Consumer.run(config, copy).pipe(
        Effect.provide(CommitPolicy.kafkaTransactional()),
        Effect.provide(flakyProducers(away)),
        Effect.fork
      )
      yield* advanceUntil("the consumer ends", Effect.map(Fiber.poll(fiber), (exit) => exit._tag === "Some"), 120)
      const exit = yield* Fiber.await(fiber)
      const error = Exit.isFailure(exit) && exit.cause._tag === "Fail" ? exit.cause.error : undefined
      assert.instanceOf(error, TransactionFailed)
      assert.isAtLeast(yield* TestClock.currentTimeMillis, 60_000, "it gave up only after reconnectTimeout")
    }).pipe(Effect.provide(InMemoryKafka.layer())))
})

describe("reads of committed positions that are not stable yet", () => {
  /** The driver's committed reads fail retriable, as Kafka's do while a transaction completes them, `n` times. */
  const unstable = (left: { n: number; reads: number; sessions: number }) =>
    inMemoryWrapping((session) => {
      left.sessions++
      const refuse = <A>(read: Effect.Effect<A, DriverError>) =>
        Effect.suspend(() => {
          left.reads++
          if (left.n === 0) return read
          left.n--
          return Effect.fail(
            new DriverError({ operation: "committed", reason: "UNSTABLE_OFFSET_COMMIT", retriable: true })
          )
        })
      return {
        committed: (partitions) => refuse(session.committed(partitions)),
        committedWithMetadata: (partitions) => refuse(session.committedWithMetadata(partitions))
      }
    })

  for (const policy of ["commitAfter", "atMostOnce", "kafkaTransactional"] as const) {
    it.effect(`${policy}: the read is tried again until it answers; the consumer starts at the committed position`, () => {
      const left = { n: 6, reads: 0, sessions: 0 }
      return Effect.gen(function*() {
        yield* seed(20)
        yield* commitPosition(10n)
        left.sessions = 0
        const seen: Array<string> = []
        const handler = (records: Chunk.Chunk<ConsumerRecord>) =>
          Effect.zipRight(
            Effect.sync(() => {
              for (const r of records) seen.push(valueString(r)!)
            }),
            policy === "kafkaTransactional" ? copy(records) : Effect.void
          )
        const layer = policy === "commitAfter"
          ? CommitPolicy.commitAfter({ maxBatch: 1, maxInterval: "1 second" })
          : policy === "atMostOnce"
          ? CommitPolicy.atMostOnce()
          : CommitPolicy.kafkaTransactional().pipe(Layer.provide(InMemoryKafka.layerTransactionalProducers()))
        // Only kafkaTransactional's handler copies, through the policy's own Producer.
        const fiber = yield* Consumer.run(config, handler).pipe(
          Effect.provide(layer),
          Effect.provide(InMemoryKafka.layerProducer()),
          Effect.fork
        )
        yield* advanceUntil(
          "the records after the committed position",
          Effect.zipRight(stillRunning(fiber), Effect.sync(() => seen.length >= 10)),
          60
        )
        assert.strictEqual(left.n, 0)
        // Tried again in place: the member did not leave the group and join again (a rebalance for everyone).
        assert.strictEqual(left.sessions, 1, "the consumer reconnected instead of reading again")
        assert.deepStrictEqual(seen, Array.from({ length: 10 }, (_, i) => String(10 + i)), "started at 10")
        yield* Fiber.interrupt(fiber)
      }).pipe(Effect.provide(unstable(left)))
    })
  }
})
