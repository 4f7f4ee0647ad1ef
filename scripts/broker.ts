/**
 * Starting and stopping a broker with scripts/kafka.sh from Node, for the test run (test/setup/kafkaGlobalSetup.ts)
 * and the benchmarks (bench/broker.ts).
 */
import { execFile, execFileSync } from "node:child_process"
import * as net from "node:net"
import * as path from "node:path"
import { fileURLToPath } from "node:url"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Schedule from "effect/Schedule"
import { Driver } from "../src/Driver.js"
import * as KafkaJs from "../src/KafkaJs.js"

const script = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "kafka.sh")

export interface ScriptResult {
  readonly ok: boolean
  readonly stdout: string
  readonly stderr: string
}

/** Runs `scripts/kafka.sh start|stop` for `port`; the broker's watcher stops it if this process dies. */
export const kafkaSh = (command: "start" | "stop", port: number): Promise<ScriptResult> =>
  new Promise((resolve) => {
    const env = { ...process.env, KAFKA_PORT: String(port), KAFKA_WATCH_PID: String(process.pid) }
    execFile("bash", [script, command], { timeout: 600_000, env }, (error, stdout, stderr) => {
      resolve({ ok: error === null, stdout, stderr })
    })
  })

/** The same stop, for an `exit` handler, where nothing asynchronous runs any more. */
export const stopSync = (port: number): void => {
  try {
    execFileSync("bash", [script, "stop"], { env: { ...process.env, KAFKA_PORT: String(port) }, stdio: "ignore" })
  } catch {
    // nothing more can be done while exiting
  }
}

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
export const choosePort = async (): Promise<number> => {
  const pinned = Number(process.env.KAFKA_PORT)
  if (Number.isInteger(pinned) && pinned > 0) return pinned
  for (let attempt = 0; attempt < 50; attempt++) {
    const port = 20000 + 2 * Math.floor(Math.random() * 4000)
    if ((await isFree(port)) && (await isFree(port + 1))) return port
  }
  throw new Error("no free port pair found for the broker; set KAFKA_PORT")
}

/** Starts a broker on `port`: its address, or why it did not start (a broker that came up half-way is stopped). */
export const start = async (port: number): Promise<{ readonly brokers: string } | { readonly failure: string }> => {
  const result = await kafkaSh("start", port)
  const line = result.stdout.split("\n").find((l) => l.startsWith("KAFKA_BROKERS="))
  if (result.ok && line !== undefined) return { brokers: line.slice("KAFKA_BROKERS=".length).trim() }
  await kafkaSh("stop", port)
  return { failure: result.stderr.trim() || "scripts/kafka.sh start failed" }
}

/**
 * The first group request on a fresh broker answers COORDINATOR_NOT_AVAILABLE while `__consumer_offsets` is
 * created; join a throwaway group once so that the first real joins do not pay for it.
 */
export const warmGroupCoordinator = (brokers: string): Promise<void> =>
  Effect.runPromise(
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
  )
