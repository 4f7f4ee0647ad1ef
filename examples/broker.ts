/**
 * Where the examples run: the in-memory broker by default, or Kafka when KAFKA_BROKERS is set (`host:port,...`), with
 * the driver KAFKA_DRIVER names: `platformatic` (@platformatic/kafka, the default) or `kafkajs`. Either way you get the
 * consumer's `Driver` and `Topics`, a small service to create a topic and produce to it.
 */
import { type Driver, InMemoryKafka, type Producer } from "effect-kafka-delivery"
import * as KafkaJs from "effect-kafka-delivery/KafkaJs"
import * as Platformatic from "effect-kafka-delivery/Platformatic"
import * as Config from "effect/Config"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"

export interface Produce {
  readonly key?: string
  readonly value: string
  readonly partition?: number
}

export class Topics extends Context.Tag("examples/Topics")<Topics, {
  readonly where: string
  readonly create: (topic: string, partitions: number) => Effect.Effect<void, unknown>
  readonly produce: (topic: string, records: ReadonlyArray<Produce>) => Effect.Effect<void, unknown>
  /** A `Producer` with these settings, on the same broker. */
  readonly producer: (settings: Producer.Settings) => Layer.Layer<Producer.Producer, unknown>
  /** Transactional producers on the same broker, for `CommitPolicy.kafkaTransactional`. */
  readonly transactionalProducers: Layer.Layer<Producer.TransactionalProducers, unknown>
}>() {}

const inMemory: Layer.Layer<Topics | Driver.Driver> = Layer.effect(
  Topics,
  Effect.map(InMemoryKafka.InMemoryKafka, (kafka) => {
    const broker = Layer.succeed(InMemoryKafka.InMemoryKafka, kafka)
    return {
      where: "the in-memory broker",
      create: kafka.createTopic,
      produce: (topic, records) => Effect.asVoid(kafka.produce(topic, records)),
      producer: (settings) => Layer.provide(InMemoryKafka.layerProducer(settings), broker),
      transactionalProducers: Layer.provide(InMemoryKafka.layerTransactionalProducers(), broker)
    }
  })
).pipe(Layer.provideMerge(InMemoryKafka.layer()))

const onKafkaJs = (brokers: string, list: ReadonlyArray<string>) =>
  Layer.merge(
    KafkaJs.layer({ brokers: list, clientId: "examples", logLevel: "error" }),
    Layer.succeed(Topics, {
      where: `Kafka at ${brokers} (kafkajs)`,
      create: (topic, partitions) => KafkaJs.createTopic(list, topic, partitions),
      produce: (topic, records) => KafkaJs.produce(list, topic, records),
      producer: (settings) => KafkaJs.layerProducer({ brokers: list, logLevel: "error", ...settings }),
      transactionalProducers: KafkaJs.layerTransactionalProducers({ brokers: list, logLevel: "error" })
    })
  )

const onPlatformatic = (brokers: string, list: ReadonlyArray<string>) =>
  Layer.merge(
    Platformatic.layer({ brokers: list, clientId: "examples" }),
    Layer.succeed(Topics, {
      where: `Kafka at ${brokers} (@platformatic/kafka)`,
      create: (topic, partitions) => Platformatic.createTopic(list, topic, partitions),
      produce: (topic, records) => Platformatic.produce(list, topic, records),
      producer: (settings) => Platformatic.layerProducer({ brokers: list, ...settings }),
      transactionalProducers: Platformatic.layerTransactionalProducers({ brokers: list })
    })
  )

const kafka = (brokers: string): Layer.Layer<Topics | Driver.Driver, unknown> =>
  Layer.unwrapEffect(Effect.gen(function*() {
    const list = yield* Platformatic.parseBrokers(brokers)
    const driver = yield* Config.literal("platformatic", "kafkajs")("KAFKA_DRIVER").pipe(
      Config.withDefault("platformatic")
    )
    return driver === "kafkajs" ? onKafkaJs(brokers, list) : onPlatformatic(brokers, list)
  }))

/** The in-memory broker, or Kafka at KAFKA_BROKERS. */
export const layer: Layer.Layer<Topics | Driver.Driver, unknown> = Layer.unwrapEffect(
  Effect.map(Config.option(Config.string("KAFKA_BROKERS")), Option.match({ onNone: () => inMemory, onSome: kafka }))
)

/** A name of its own for each run, so that a run on a real broker never sees an earlier run's records. */
export const unique = (name: string): string => `${name}-${Date.now().toString(36)}`
