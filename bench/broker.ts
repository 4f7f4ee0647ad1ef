/**
 * The broker the benchmarks run against: `KAFKA_BROKERS` when set, otherwise one of our own started with
 * scripts/kafka.sh on a free port and stopped at the end, on failure and on Ctrl-C too.
 */
import { execFile, execFileSync } from "node:child_process"
import * as net from "node:net"
import * as path from "node:path"
import { fileURLToPath } from "node:url"
import { Kafka, logLevel } from "kafkajs"

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..")
const script = path.join(root, "scripts", "kafka.sh")

const isFree = (port: number) =>
  new Promise<boolean>((resolve) => {
    const server = net.createServer()
    server.once("error", () => resolve(false))
    server.listen(port, "127.0.0.1", () => server.close(() => resolve(true)))
  })

/** A port whose successor is free too: the controller listens on port + 1. */
const choosePort = async (): Promise<number> => {
  for (let attempt = 0; attempt < 50; attempt++) {
    const port = 30000 + 2 * Math.floor(Math.random() * 4000)
    if ((await isFree(port)) && (await isFree(port + 1))) return port
  }
  throw new Error("no free port pair found for the broker")
}

const kafkaSh = (command: "start" | "stop", port: number) =>
  new Promise<{ readonly ok: boolean; readonly stdout: string; readonly stderr: string }>((resolve) => {
    const env = { ...process.env, KAFKA_PORT: String(port), KAFKA_WATCH_PID: String(process.pid) }
    execFile("bash", [script, command], { timeout: 600_000, env }, (error, stdout, stderr) => {
      resolve({ ok: error === null, stdout, stderr })
    })
  })

/** The first group call on a fresh broker answers COORDINATOR_NOT_AVAILABLE while `__consumer_offsets` is made. */
const warmGroupCoordinator = async (brokers: string): Promise<void> => {
  const kafka = new Kafka({ clientId: "bench-warmup", brokers: brokers.split(","), logLevel: logLevel.NOTHING })
  const admin = kafka.admin()
  await admin.connect()
  const topic = `bench-warmup-${crypto.randomUUID()}`
  try {
    await admin.createTopics({ topics: [{ topic, numPartitions: 1 }], waitForLeaders: true })
    const deadline = Date.now() + 60_000
    while (true) {
      try {
        await admin.fetchOffsets({ groupId: `bench-warmup-${crypto.randomUUID()}`, topics: [topic] })
        return
      } catch (error) {
        if (Date.now() > deadline) throw error
        await new Promise((r) => setTimeout(r, 500))
      }
    }
  } finally {
    await admin.deleteTopics({ topics: [topic] }).catch(() => undefined)
    await admin.disconnect()
  }
}

/** Runs `body` with a broker address; a broker started here is stopped however `body` ends. */
export const withBroker = async <A>(
  log: (line: string) => void,
  body: (brokers: string) => Promise<A>
): Promise<A> => {
  const existing = process.env.KAFKA_BROKERS?.trim()
  if (existing !== undefined && existing.length > 0) {
    log(`broker: KAFKA_BROKERS=${existing} (not started here)`)
    return body(existing)
  }
  const port = await choosePort()
  const started = Date.now()
  let stopped = false
  const stopSync = () => {
    if (stopped) return
    stopped = true
    try {
      execFileSync("bash", [script, "stop"], { env: { ...process.env, KAFKA_PORT: String(port) }, stdio: "ignore" })
    } catch {
      // nothing more can be done while exiting
    }
  }
  const onSignal = (signal: NodeJS.Signals) => {
    stopSync()
    process.exit(signal === "SIGINT" ? 130 : 143)
  }
  process.once("exit", stopSync)
  process.once("SIGINT", onSignal)
  process.once("SIGTERM", onSignal)
  try {
    const result = await kafkaSh("start", port)
    const line = result.stdout.split("\n").find((l) => l.startsWith("KAFKA_BROKERS="))
    if (!result.ok || line === undefined) {
      throw new Error(`scripts/kafka.sh start failed: ${result.stderr.trim()}`)
    }
    const brokers = line.slice("KAFKA_BROKERS=".length).trim()
    await warmGroupCoordinator(brokers)
    log(`broker: started on ${brokers} in ${((Date.now() - started) / 1000).toFixed(1)} s`)
    return await body(brokers)
  } finally {
    if (!stopped) {
      stopped = true
      const result = await kafkaSh("stop", port)
      log(result.ok ? "broker: stopped" : `broker: stop failed: ${result.stderr.trim()}`)
    }
    process.removeListener("exit", stopSync)
    process.removeListener("SIGINT", onSignal)
    process.removeListener("SIGTERM", onSignal)
  }
}
