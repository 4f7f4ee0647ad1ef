/**
 * Starts a single-node Kafka broker for the test run when `KAFKA_BROKERS` is unset, and stops it afterwards
 * (`KAFKA_VERSION` picks its release, as for scripts/kafka.sh).
 *
 * The address reaches the test workers twice: in `process.env.KAFKA_BROKERS` (workers are started after global setup
 * and inherit the environment) and through `inject("kafkaBrokers")`. When no broker can be started (no Java, no
 * Maven), the reason is provided as `kafkaSetupError` and only the tests that need Kafka fail, with that message.
 */
import type { TestProject } from "vitest/node"
import * as Broker from "../../scripts/broker.js"

declare module "vitest" {
  export interface ProvidedContext {
    kafkaBrokers: string
    kafkaSetupError: string
  }
}

export default async function setup(project: TestProject): Promise<(() => Promise<void>) | undefined> {
  const existing = process.env.KAFKA_BROKERS
  if (existing !== undefined && existing.trim().length > 0) {
    project.provide("kafkaBrokers", existing)
    project.provide("kafkaSetupError", "")
    return undefined
  }
  const unavailable = (reason: string) => {
    process.stderr.write(`[kafka] no broker for this run: ${reason}\n`)
    project.provide("kafkaBrokers", "")
    project.provide("kafkaSetupError", reason)
    return undefined
  }
  const started = Date.now()
  let port: number
  try {
    port = await Broker.choosePort()
  } catch (error) {
    return unavailable(String(error))
  }
  const result = await Broker.start(port)
  if ("failure" in result) return unavailable(result.failure)
  const brokers = result.brokers
  // Backstop for a runner that exits without calling teardown: the broker is detached and would keep running.
  const onExit = () => Broker.stopSync(port)
  process.once("exit", onExit)
  const teardown = async () => {
    process.removeListener("exit", onExit)
    const stopped = await Broker.kafkaSh("stop", port)
    if (!stopped.ok) process.stderr.write(`[kafka] stop failed: ${stopped.stderr}\n`)
  }
  try {
    await Broker.warmGroupCoordinator(brokers)
  } catch (error) {
    await teardown()
    return unavailable(`the broker on ${brokers} started but its group coordinator did not answer: ${String(error)}`)
  }
  process.env.KAFKA_BROKERS = brokers
  project.provide("kafkaBrokers", brokers)
  project.provide("kafkaSetupError", "")
  // scripts/kafka.sh runs the release KAFKA_VERSION names (4.4.0 when unset).
  const version = process.env.KAFKA_VERSION ?? "4.4.0"
  process.stderr.write(
    `[kafka] Apache Kafka ${version} broker ${brokers} ready in ${((Date.now() - started) / 1000).toFixed(1)}s\n`
  )
  return async () => {
    delete process.env.KAFKA_BROKERS
    await teardown()
  }
}
