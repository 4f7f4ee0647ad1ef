/**
 * Idempotence seen from outside the library: what the broker keeps of the producers that wrote to a partition, read
 * with the Java admin client's DescribeProducers (kafka-clients on the broker's classpath). An idempotent producer's
 * record batches carry the producer id the broker gave it and their sequence numbers, and the broker keeps both per
 * partition; a producer that is not idempotent writes batches with producer id -1, of which it keeps nothing.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Effect from "effect/Effect"
import { inject } from "vitest"
import * as KafkaJs from "../src/KafkaJs.js"
import * as Producer from "../src/Producer.js"
import { runJava } from "./support/kafkaKit.js"

const brokers = process.env.KAFKA_BROKERS || inject("kafkaBrokers")

interface ProducerState {
  readonly topic: string
  readonly partition: number
  readonly producerId: bigint
  readonly epoch: number
  readonly lastSequence: number
}

/** The producers the broker keeps state for on the partitions of these topics (topic → partition count). */
const describeProducers = (topics: Readonly<Record<string, number>>) =>
  Effect.map(
    runJava("DescribeProducers.java", [brokers, ...Object.entries(topics).map(([topic, n]) => `${topic}:${n}`)]),
    (stdout): ReadonlyArray<ProducerState> =>
      stdout.split("\n").filter((line) => line.startsWith("producer ")).map((line) => {
        const [, topic, partition, producerId, epoch, lastSequence] = line.trim().split(" ")
        return {
          topic: topic!,
          partition: Number(partition),
          producerId: BigInt(producerId!),
          epoch: Number(epoch),
          lastSequence: Number(lastSequence)
        }
      })
  )

if (brokers) {
  const list = brokers.split(",")
  const produce = (topic: string, settings: Producer.Settings) =>
    Effect.gen(function*() {
      yield* KafkaJs.createTopic(list, topic, 1)
      // Three batches of four records: sequence numbers 0 to 11 on the partition.
      for (let batch = 0; batch < 3; batch++) {
        yield* Producer.sendAll(Array.from({ length: 4 }, (_, i) => ({ topic, partition: 0, value: `${batch}-${i}` })))
      }
    }).pipe(Effect.provide(KafkaJs.layerProducer({ brokers: list, logLevel: "nothing", linger: 0, ...settings })))

  describe("KafkaJs producer: idempotence, as the broker sees it", () => {
    it.live(
      "an idempotent producer's batches carry its producer id and sequence numbers; a producer that is not, none",
      () =>
        Effect.gen(function*() {
          const idempotent = `idempotent-${crypto.randomUUID().slice(0, 8)}`
          const plain = `not-idempotent-${crypto.randomUUID().slice(0, 8)}`
          yield* produce(idempotent, {})
          yield* produce(plain, { acks: 1, idempotent: false })
          const states = yield* describeProducers({ [idempotent]: 1, [plain]: 1 })
          const kept = states.filter((s) => s.topic === idempotent)
          const none = states.filter((s) => s.topic === plain)
          assert.strictEqual(kept.length, 1, `one producer id on the partition of the default producer: ${kept.length}`)
          assert.isTrue(kept[0]!.producerId >= 0n, `a producer id the broker gave: ${kept[0]!.producerId}`)
          assert.strictEqual(kept[0]!.lastSequence, 11, "the twelve records numbered 0 to 11")
          assert.deepStrictEqual(none, [], "batches without a producer id leave nothing on the broker")
        }),
      120_000
    )
  })
} else {
  describe("KafkaJs producer: idempotence", () => {
    it("needs a Kafka broker", () => {
      assert.fail(`No Kafka broker for this run: ${inject("kafkaSetupError") || "KAFKA_BROKERS is unset"}`)
    })
  })
}
