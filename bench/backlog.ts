/**
 * Benchmark 5: memory under backlog. A consumer whose handler is slower than fetching reads topics with a small and
 * a large backlog; peak resident memory must not follow the backlog. Each run is a child process of its own, so
 * that one run's heap cannot carry into the next.
 */
import { spawn } from "node:child_process"
import * as path from "node:path"
import { fileURLToPath } from "node:url"
import type { ChildArgs, ChildResult } from "./backlogChild.js"
import { type BenchResult, compare, find, type Plan, timed } from "./harness.js"
import type { Topics } from "./topics.js"

const here = path.dirname(fileURLToPath(import.meta.url))
const root = path.resolve(here, "..")

export interface BacklogSizes {
  readonly small: number
  readonly large: number
  readonly partitions: number
  readonly windowMs: number
  readonly chunkDelayMs: number
}

const runChild = (args: ChildArgs): Promise<ChildResult> =>
  new Promise((resolve, reject) => {
    const child = spawn(
      process.execPath,
      ["--import", "tsx", path.join(here, "backlogChild.ts"), JSON.stringify(args)],
      {
        cwd: root,
        stdio: ["ignore", "pipe", "inherit"],
        env: { ...process.env, KAFKAJS_NO_PARTITIONER_WARNING: "1" }
      }
    )
    let stdout = ""
    child.stdout.setEncoding("utf8")
    child.stdout.on("data", (data: string) => {
      stdout += data
    })
    child.once("error", reject)
    child.once("exit", (code) => {
      const line = stdout.trim().split("\n").pop() ?? ""
      if (code !== 0) return reject(new Error(`backlog child exited with ${code}`))
      try {
        resolve(JSON.parse(line) as ChildResult)
      } catch (error) {
        reject(new Error(`backlog child printed no result: ${String(error)}: ${line}`))
      }
    })
  })

export const backlog = (plan: Plan, brokers: string, topics: Topics, sizes: BacklogSizes): Promise<BenchResult> =>
  timed(async () => {
    const small = await topics.get(sizes.small, 256, sizes.partitions)
    const large = await topics.get(sizes.large, 256, sizes.partitions)
    plan.log(
      `5. memory under backlog, ${small.records.toLocaleString("en-US")} and ${large.records.toLocaleString("en-US")}`
    )
    let hungRuns = 0
    const measure = (topic: string) => async () => {
      const result = await runChild({ brokers, topic, windowMs: sizes.windowMs, chunkDelayMs: sizes.chunkDelayMs })
      if (result.shutdownHung > 0) hungRuns++
      return {
        value: result.peakRssMb,
        details: {
          "maxRSS MB": result.maxRssMb,
          "start RSS MB": result.startRssMb,
          "peak heap MB": result.peakHeapUsedMb,
          handled: result.handled,
          "stop ms": result.shutdownMs
        }
      }
    }
    const variants = await compare(plan, [
      { id: "small", label: `backlog ${small.records.toLocaleString("en-US")}`, run: measure(small.name) },
      { id: "large", label: `backlog ${large.records.toLocaleString("en-US")}`, run: measure(large.name) }
    ])
    const ratio = find(variants, "large").median / find(variants, "small").median
    const handledSmall = find(variants, "small").details.handled ?? 0
    return {
      id: "backlog",
      title: `5. Memory under backlog: peak RSS of a consumer with a slow handler, ${sizes.partitions} partitions`,
      unit: "MB peak RSS",
      warmup: plan.warmup,
      rounds: plan.rounds,
      variants,
      checks: [{ name: "large/small", value: ratio, target: "<= 1.2", hit: ratio <= 1.2 && ratio >= 1 / 1.2 }],
      notes: [
        `each run a child process on the real broker: library run, commitAfter, default maxPollRecords/bufferSize, ` +
        `handler sleeps ${sizes.chunkDelayMs} ms per chunk, ${sizes.windowMs} ms window; RSS sampled every 20 ms`,
        handledSmall >= sizes.small
          ? "WARNING: the small backlog was drained within the window; slow the handler down"
          : "neither backlog drains within the window, so both runs read with a full backlog ahead",
        ...(hungRuns > 0
          ? [`WARNING: in ${hungRuns} run(s) (warm-up included) the consumer had not stopped 60 s after the window`]
          : [])
      ]
    }
  })
