/**
 * Benchmark 1's variants for several commits of the library in one process, interleaved round by round, next to raw
 * kafkajs: an A/B of a change that the machine's drift hits alike on both sides.
 *
 *   node --import tsx bench/ab.ts --commits 360cdeb,HEAD --bytes 256 --rounds 7 --work count,read
 *   node --import tsx bench/ab.ts --commits HEAD~1,HEAD --handler chunk,each --records 300000
 *
 * Each commit's `src/` and `bench/` are taken with `git archive` into `.cache/ab/<commit>/` and imported from there;
 * the raw variants are this checkout's. Besides records/s (median of the rounds, and the median of each round's ratio
 * to raw kafkajs), it reports the process's CPU time per record from the first delivery to the last record, which a
 * busy machine moves less than the rate. Uses KAFKA_BROKERS when set, otherwise starts (and stops) a broker.
 */
import { execFileSync } from "node:child_process"
import * as fs from "node:fs"
import * as path from "node:path"
import { withBroker } from "./broker.js"
import * as here from "./consumers.js"
import { compare, formatNumber, loadAverage, median, type Plan, type Sample, type Variant } from "./harness.js"
import { makeTopics } from "./topics.js"

process.env.KAFKAJS_NO_PARTITIONER_WARNING = "1"

const args = process.argv.slice(2)
const option = (name: string, fallback: string): string => {
  const at = args.indexOf(`--${name}`)
  return at === -1 ? fallback : args[at + 1] ?? fallback
}
const list = (name: string, fallback: string) => option(name, fallback).split(",").filter((s) => s.length > 0)
const records = Number(option("records", "1000000"))
const bytes = Number(option("bytes", "256"))
const rounds = Number(option("rounds", "5"))
const warmup = Number(option("warmup", "1"))
const commits = list("commits", "HEAD")
const works = list("work", "count") as Array<"count" | "read" | "timer1ms">
const handlers = list("handler", "chunk") as Array<"chunk" | "each">
const log = (line: string) => process.stderr.write(`${line}\n`)
const plan: Plan = { warmup, rounds, runTimeoutMillis: 600_000, log }

type Consumers = typeof here

/** The commit's `src/` and `bench/`, unpacked once, and its `bench/consumers.ts`. */
const snapshot = async (commit: string): Promise<{ readonly name: string; readonly consumers: Consumers }> => {
  const hash = execFileSync("git", ["rev-parse", "--short", commit], { encoding: "utf8" }).trim()
  const dir = path.resolve(".cache", "ab", hash)
  if (!fs.existsSync(path.join(dir, "bench", "consumers.ts"))) {
    fs.mkdirSync(dir, { recursive: true })
    const tar = execFileSync("git", ["archive", hash, "src", "bench"])
    execFileSync("tar", ["-x", "-C", dir], { input: tar })
  }
  const consumers: Consumers = await import(path.join(dir, "bench", "consumers.ts"))
  return { name: commit === hash ? hash : `${commit} (${hash})`, consumers }
}

/** CPU time of the process per record handled after the first delivery, of the run that finished last. */
let cpuPerRecord = Number.NaN
const watchCpu = (counter: Consumers["Counter"]) => {
  const add = counter.prototype.add
  const started = new WeakMap<object, NodeJS.CpuUsage>()
  counter.prototype.add = function(this: InstanceType<Consumers["Counter"]>, n: number) {
    if (this.count === 0) started.set(this, process.cpuUsage())
    const before = this.last
    add.call(this, n)
    const from = started.get(this)
    if (before === 0 && this.last !== 0 && from !== undefined) {
      const used = process.cpuUsage(from)
      cpuPerRecord = (used.user + used.system) / (this.count - this.firstCount)
    }
  }
}
const withCpu = (run: (round: number) => Promise<Sample>) => async (round: number): Promise<Sample> => {
  const sample = await run(round)
  return { value: sample.value, details: { ...sample.details, "cpu us/rec": cpuPerRecord } }
}

const main = async () => {
  watchCpu(here.Counter)
  const snapshots: Array<{ readonly name: string; readonly consumers: Consumers }> = []
  for (const commit of commits) {
    const s = await snapshot(commit)
    watchCpu(s.consumers.Counter)
    snapshots.push(s)
  }
  await withBroker(log, async (brokers) => {
    const topics = makeTopics(brokers, `${process.pid}-ab`, log)
    try {
      const topic = await topics.get(records, bytes, 6)
      const variants: Array<Variant> = []
      const raw = (handler: "chunk" | "each", work: "count" | "read" | "timer1ms") => `raw ${handler} ${work}`
      for (const work of works) {
        for (const handler of handlers) {
          const mode = handler === "chunk" ? "eachBatch" : "eachMessage"
          variants.push({
            id: raw(handler, work),
            label: `raw kafkajs ${mode} ${work}`,
            run: () => here.rawKafkajs(brokers, topic, mode, work, false)
          })
          for (const { consumers, name } of snapshots) {
            const driver = consumers.driverLayer(brokers)
            variants.push({
              id: `${name} ${handler} ${work}`,
              label: `${name} ${handler} ${work}`,
              run: () => consumers.library(driver, topic, handler, work)
            })
          }
        }
      }
      const load = loadAverage()
      const results = await compare(plan, variants.map((v) => ({ ...v, run: withCpu(v.run) })))
      const byId = new Map(results.map((r) => [r.id, r]))
      const loads = `load ${load.toFixed(2)} -> ${loadAverage().toFixed(2)}`
      log(`\n${records.toLocaleString("en-US")} records x ${bytes} B; ${loads}`)
      for (const work of works) {
        for (const handler of handlers) {
          const base = byId.get(raw(handler, work))!
          const count = byId.get(raw(handler, "count"))
          for (const r of results) {
            if (!r.id.endsWith(` ${handler} ${work}`)) continue
            const perRound = median(r.samples.map((v, i) => v / base.samples[i]!))
            const ratios = r === base
              ? ""
              : `  /raw ${(r.median / base.median).toFixed(3)} (per round ${perRound.toFixed(3)})` +
                (work === "read" && count !== undefined ? `  /raw count ${(r.median / count.median).toFixed(3)}` : "")
            log(
              `${r.label.padEnd(34)} ${formatNumber(r.median).padStart(9)} records/s  [${formatNumber(r.min)} - ${
                formatNumber(r.max)
              }]  cpu ${(r.details["cpu us/rec"] ?? Number.NaN).toFixed(3)} us/rec${ratios}`
            )
          }
        }
      }
    } finally {
      await topics.close()
    }
  })
}

main().then(
  () => process.exit(0),
  (error: unknown) => {
    log(String(error))
    process.exit(1)
  }
)
