/**
 * A broker of the test's own, on ports of its own, so that stopping it disturbs nobody else. `scripts/kafka.sh` starts
 * and stops it; a restart keeps its data (the script's `stop` deletes it), so it relaunches the same java command line.
 */
import { execFile, spawn } from "node:child_process"
import * as fs from "node:fs"
import * as net from "node:net"
import * as path from "node:path"
import { fileURLToPath } from "node:url"
import * as Data from "effect/Data"
import * as Effect from "effect/Effect"
import * as Schedule from "effect/Schedule"
import type * as Scope from "effect/Scope"

export class BrokerError extends Data.TaggedError("BrokerError")<{ readonly message: string }> {}

const projectDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..")
const script = path.join(projectDir, "scripts/kafka.sh")
const cacheDir = process.env.KAFKA_CACHE_DIR ?? path.join(projectDir, ".cache/kafka")

const runScript = (command: "start" | "stop", port: number) =>
  Effect.async<string, BrokerError>((resume) => {
    const env = { ...process.env, KAFKA_PORT: String(port), KAFKA_WATCH_PID: String(process.pid) }
    execFile("bash", [script, command], { timeout: 300_000, env }, (error, stdout, stderr) => {
      if (error === null) resume(Effect.succeed(stdout))
      else resume(Effect.fail(new BrokerError({ message: `kafka.sh ${command} failed: ${stderr || error.message}` })))
    })
  })

const isFree = (port: number) =>
  new Promise<boolean>((resolve) => {
    const server = net.createServer()
    server.once("error", () => resolve(false))
    server.listen(port, "127.0.0.1", () => server.close(() => resolve(true)))
  })

const freePort = Effect.promise(async () => {
  for (let attempt = 0; attempt < 50; attempt++) {
    const port = 40000 + 2 * Math.floor(Math.random() * 4000)
    if ((await isFree(port)) && (await isFree(port + 1))) return port
  }
  return 39092
})

const alive = (pid: number) => {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

export interface Broker {
  readonly brokers: string
  /**
   * Stops the broker, with SIGTERM (a clean shutdown) or SIGKILL (the process dies with whatever it had not written),
   * keeps it down for `downMillis`, then starts it again on the same data and ports.
   */
  readonly restart: (options?: {
    readonly signal?: "SIGTERM" | "SIGKILL"
    readonly downMillis?: number
  }) => Effect.Effect<void, BrokerError>
}

/** A broker for the scope: started on free ports, stopped (and its data deleted) when the scope closes. */
export const broker: Effect.Effect<Broker, BrokerError, Scope.Scope> = Effect.gen(function*() {
  const port = yield* freePort
  const runDir = path.join(cacheDir, `run-${port}`)
  const pidFile = path.join(runDir, "kafka.pid")
  const serverLog = path.join(runDir, "logs/server.log")
  const stdoutLog = path.join(runDir, "logs/stdout.log")
  yield* Effect.acquireRelease(
    runScript("start", port),
    () => runScript("stop", port).pipe(Effect.timeoutOption("60 seconds"), Effect.ignore)
  )
  // Backstop for a runner that exits without closing the scope.
  const onExit = () => {
    try {
      const pid = Number(fs.readFileSync(pidFile, "utf8"))
      if (Number.isInteger(pid) && pid > 0) process.kill(pid, "SIGKILL")
    } catch {
      // already gone
    }
  }
  process.once("exit", onExit)
  yield* Effect.addFinalizer(() => Effect.sync(() => process.removeListener("exit", onExit)))

  const startedCount = () =>
    fs.existsSync(serverLog) ? fs.readFileSync(serverLog, "utf8").split("Kafka Server started").length - 1 : 0

  const waitUntil = (what: string, condition: () => boolean, deadline: "60 seconds" | "120 seconds") =>
    Effect.sync(condition).pipe(
      Effect.repeat({ schedule: Schedule.spaced("200 millis"), until: (ok) => ok }),
      Effect.timeoutFail({ duration: deadline, onTimeout: () => new BrokerError({ message: `timed out: ${what}` }) })
    )

  const restart = (options: { readonly signal?: "SIGTERM" | "SIGKILL"; readonly downMillis?: number } = {}) =>
    Effect.gen(function*() {
      const pid = Number(fs.readFileSync(pidFile, "utf8"))
      const argv = fs.readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").filter((a) => a.length > 0)
      if (!argv.some((a) => a === "kafka.Kafka")) {
        return yield* new BrokerError({ message: `pid ${pid} is not the broker: ${argv.join(" ")}` })
      }
      const before = startedCount()
      process.kill(pid, options.signal ?? "SIGTERM")
      yield* waitUntil("the broker to stop", () => !alive(pid), "60 seconds").pipe(
        Effect.catchAll(() => Effect.sync(() => alive(pid) && process.kill(pid, "SIGKILL")))
      )
      yield* waitUntil("the broker's process to go", () => !alive(pid), "60 seconds")
      if (options.downMillis !== undefined) yield* Effect.sleep(options.downMillis)
      const out = fs.openSync(stdoutLog, "a")
      const child = spawn(argv[0]!, argv.slice(1), { detached: true, stdio: ["ignore", out, out] })
      fs.closeSync(out)
      child.unref()
      fs.writeFileSync(pidFile, String(child.pid))
      // Stops the relaunched broker once this process is gone, as the script's own watcher did for the first one.
      spawn(
        "bash",
        [
          "-c",
          "while kill -0 \"$1\" 2>/dev/null && kill -0 \"$2\" 2>/dev/null; do sleep 2; done; " +
          "if kill -0 \"$2\" 2>/dev/null; then KAFKA_PORT=\"$3\" bash \"$4\" stop; fi",
          "kafka-watch",
          String(process.pid),
          String(child.pid),
          String(port),
          script
        ],
        { detached: true, stdio: "ignore" }
      ).unref()
      yield* waitUntil("the broker to start again", () => startedCount() > before, "120 seconds")
    })

  return { brokers: `127.0.0.1:${port}`, restart }
})
