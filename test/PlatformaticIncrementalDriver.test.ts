/**
 * The driver suite on @platformatic/kafka under KIP-848 groups (`rebalance: "consumer"`), where the driver runs the
 * group member itself and commits with its member epoch: fetching, seeking, pausing, commits and their metadata,
 * stable reads and transactions hold under the broker's group protocol too. The suite's hand-over tests expect eager
 * revokes and are left out here; the incremental hand-overs are tested in test/RealIncremental.test.ts (a join,
 * against eager) and test/RealKafka.test.ts (every policy, SIGKILL and SIGSTOP).
 */
import * as Layer from "effect/Layer"
import { inject } from "vitest"
import * as Platformatic from "../src/Platformatic.js"
import { driverSuite, DriverTestTransactions } from "./driverSuite.js"
import { openTransaction, testKit } from "./support/kafkaKit.js"

const brokers = process.env.KAFKA_BROKERS || inject("kafkaBrokers")

if (brokers) {
  driverSuite(
    "Platformatic driver, consumer (KIP-848) groups",
    Layer.mergeAll(
      Platformatic.layer({
        brokers: brokers.split(","),
        clientId: "driver-suite-kip848",
        maxWaitTime: "100 millis",
        rebalance: "consumer"
      }),
      testKit(brokers),
      Layer.succeed(DriverTestTransactions, { openTransaction: openTransaction(brokers) })
    ),
    // The test broker's session for consumer groups (group.consumer.session.timeout.ms). The suite's hand-over tests
    // expect eager revokes; the incremental hand-overs are test/RealIncremental.test.ts's and test/RealKafka.test.ts's.
    { sessionTimeout: "6 seconds", rebalanceTimeout: "20 seconds", pollTimeout: "200 millis", eagerRevokes: false }
  )
}
