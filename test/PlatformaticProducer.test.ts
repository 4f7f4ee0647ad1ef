import * as Layer from "effect/Layer"
import { inject } from "vitest"
import * as KafkaJs from "../src/KafkaJs.js"
import * as Platformatic from "../src/Platformatic.js"
import { producerSuite, ProducerTestKit } from "./producerSuite.js"

const brokers = process.env.KAFKA_BROKERS || inject("kafkaBrokers")

if (brokers) {
  const list = brokers.split(",")
  producerSuite(
    "Platformatic producer",
    (settings) => Platformatic.layerProducer({ brokers: list, clientId: "producer-suite", ...settings }),
    (settings) => Platformatic.layerTransactionalProducer({ brokers: list, ...settings }),
    () =>
      Layer.merge(
        Platformatic.layer({ brokers: list, clientId: "producer-suite-reader", maxWaitTime: "100 millis" }),
        Layer.succeed(ProducerTestKit, {
          createTopic: (topic, partitions) => KafkaJs.createTopic(list, topic, partitions)
        })
      )
  )
}
