/**
 * Starts a single-node Kafka broker for the test run when `KAFKA_BROKERS` is unset, and stops it afterwards.
 *
 * The address reaches the test workers twice: in `process.env.KAFKA_BROKERS` (workers are started after global setup
 * and inherit the environment) and through `inject("kafkaBrokers")`. When no broker can be started (no Java, no
 * Maven), the reason is provided as `kafkaSetupError` and only the tests that need Kafka fail, with that message.
 */
import { execFile, execFileSync } from "node:child_process"
import * as net from "node:net"
import * as path from "node:path"
import { fileURLToPath } from "node:url"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Schedule from "effect/Schedule"
import type { TestProject } from "vitest/node"
import { Driver } from "../../src/Driver.js"
import * as KafkaJs from "../../src/KafkaJs.js"

declare module "vitest" {
  export interface ProvidedContext {
    kafkaBrokers: string
    kafkaSetupError: string
  }
}

const script = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../scripts/kafka.sh")

const run = (command: "start" | "stop", port: number) =>
  new Promise<{ readonly ok: boolean; readonly stdout: string; readonly stderr: string }>((resolve) => {
    const env = { ...process.env, KAFKA_PORT: String(port), KAFKA_WATCH_PID: String(process.pid) }
    execFile("bash", [script, command], { timeout: 600_000, env }, (error, stdout, stderr) => {
      resolve({ ok: error === null, stdout, stderr })
    })
  })

const isFree = (port: number) =>
  new Promise<boolean>((resolve) => {
    const server = net.createServer()
    server.once("error", () => resolve(false))
    server.listen(port, "127.0.0.1", () => server.close(() => resolve(true)))
  })

/**
 * A port whose successor is free too (the controller listens on port + 1). Each run gets its own broker, so runs
 * started side by side never stop each other's broker. `KAFKA_PORT` pins it.
 */
const choosePort = async (): Promise<number> => {
  const pinned = Number(process.env.KAFKA_PORT)
  if (Number.isInteger(pinned) && pinned > 0) return pinned
  for (let attempt = 0; attempt < 50; attempt++) {
    const port = 20000 + 2 * Math.floor(Math.random() * 4000)
    if ((await isFree(port)) && (await isFree(port + 1))) return port
  }
  return 19092
}

/**
 * The first group request on a fresh broker answers COORDINATOR_NOT_AVAILABLE while `__consumer_offsets` is
 * created; join a throwaway group once so that the tests' first joins do not pay for it.
 */
const warmGroupCoordinator = (brokers: string) =>
  Effect.gen(function*() {
    const topic = `warmup-${crypto.randomUUID()}`
    yield* KafkaJs.createTopic(brokers, topic, 1)
    const driver = yield* Driver
    yield* driver.connect({
      groupId: `warmup-${crypto.randomUUID()}`,
      clientId: "warmup",
      subscription: { _tag: "Topics", topics: [topic] },
      maxPollRecords: 1,
      pollTimeout: Duration.millis(100),
      sessionTimeout: Duration.seconds(10),
      rebalanceTimeout: Duration.seconds(10)
    }).pipe(Effect.scoped)
  }).pipe(
    Effect.retry({ schedule: Schedule.spaced("500 millis"), times: 60 }),
    Effect.timeout("60 seconds"),
    Effect.provide(KafkaJs.layer({ brokers: [brokers], maxWaitTime: 100, logLevel: "nothing" }))
  )

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
  const port = await choosePort()
  const result = await run("start", port)
  const line = result.stdout.split("\n").find((l) => l.startsWith("KAFKA_BROKERS="))
  if (!result.ok || line === undefined) {
    // A broker that came up half-way must not outlive the run.
    await run("stop", port)
    return unavailable(result.stderr.trim() || "scripts/kafka.sh start failed")
  }
  const brokers = line.slice("KAFKA_BROKERS=".length).trim()
  // Backstop for a runner that exits without calling teardown: the broker is detached and would keep running.
  const onExit = () => {
    try {
      execFileSync("bash", [script, "stop"], { env: { ...process.env, KAFKA_PORT: String(port) }, stdio: "ignore" })
    } catch {
      // nothing more can be done while exiting
    }
  }
  process.once("exit", onExit)
  const teardown = async () => {
    process.removeListener("exit", onExit)
    const stopped = await run("stop", port)
    if (!stopped.ok) process.stderr.write(`[kafka] stop failed: ${stopped.stderr}\n`)
  }
  try {
    await Effect.runPromise(warmGroupCoordinator(brokers))
  } catch (error) {
    await teardown()
    return unavailable(`the broker on ${brokers} started but its group coordinator did not answer: ${String(error)}`)
  }
  process.env.KAFKA_BROKERS = brokers
  project.provide("kafkaBrokers", brokers)
  project.provide("kafkaSetupError", "")
  process.stderr.write(`[kafka] broker ${brokers} ready in ${((Date.now() - started) / 1000).toFixed(1)}s\n`)
  return async () => {
    delete process.env.KAFKA_BROKERS
    await teardown()
  }
}
