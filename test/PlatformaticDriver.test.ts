import * as Layer from "effect/Layer"
import { inject } from "vitest"
import * as Platformatic from "../src/Platformatic.js"
import { driverSuite, DriverTestTransactions } from "./driverSuite.js"
import { openTransaction, testKit } from "./support/kafkaKit.js"

const brokers = process.env.KAFKA_BROKERS || inject("kafkaBrokers")

if (brokers) {
  driverSuite(
    "Platformatic driver",
    Layer.mergeAll(
      Platformatic.layer({
        brokers: brokers.split(","),
        clientId: "driver-suite",
        maxWaitTime: "100 millis",
        heartbeatInterval: "500 millis"
      }),
      testKit(brokers),
      Layer.succeed(DriverTestTransactions, { openTransaction: openTransaction(brokers) })
    ),
    // The broker's smallest session timeout: a revoke held past it shows that the member's session is kept.
    { sessionTimeout: "6 seconds", rebalanceTimeout: "20 seconds", pollTimeout: "200 millis" }
  )
}
