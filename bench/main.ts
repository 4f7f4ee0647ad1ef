/**
 * The benchmarks (`npm run bench`). Every comparison runs in this one process, variants interleaved round by round
 * after a warm-up, and reports medians and ratios against its targets.
 *
 *   npm run bench                               the full run (about 40 minutes on 2 cores, most of it the 16 B run)
 *   npm run bench -- --smoke                    every benchmark at tiny sizes, for CI (under a minute)
 *   npm run bench -- --json out.json            also write the results as JSON
 *   npm run bench -- --only overhead,postgres   a subset: overhead, realistic, postgres, sql, inmemory, backlog, producer,
 *                                               ordering, retries, observability, drivers, rebalance,
 *                                               transactions
 *   npm run bench -- --rounds 7 --warmup 2      more rounds
 *
 * A broker is started with scripts/kafka.sh on a free port (and stopped at the end) unless KAFKA_BROKERS is set.
 * Postgres is read from DATABASE_URL, by default postgres://postgres@127.0.0.1:5432/test; MariaDB from MYSQL_URL, by
 * default mysql://root@127.0.0.1:3306/test.
 */
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { backlog, type BacklogSizes } from "./backlog.js"
import { withBroker } from "./broker.js"
import { type BenchResult, loadAverage, type Plan, renderResult } from "./harness.js"
import { type DriverSizes, driversConsumer, driversProducer } from "./drivers.js"
import { inMemory } from "./inMemory.js"
import { observabilityInMemory, observabilityKafka, type ObservabilitySizes } from "./observability.js"
import { exactlyOnce, type PostgresSizes } from "./postgres.js"
import { exactlyOnceSql, type SqlStoreSizes } from "./sqlStore.js"
import { orderingInMemory, orderingKafka, orderingPostgres, type OrderingSizes } from "./ordering.js"
import { manyFibers, pipeline, producerThroughput, type ProducerSizes } from "./producer.js"
import { overhead, realistic, type RealBrokerSizes } from "./realBroker.js"
import { joinCostInMemory, joinCostKafka, type RebalanceSizes } from "./rebalance.js"
import { type TransactionSizes, transactionsKafka } from "./transactions.js"
import { retriesInMemory, retriesKafka, type RetrySizes } from "./retries.js"
import { makeTopics } from "./topics.js"

process.env.KAFKAJS_NO_PARTITIONER_WARNING = "1"

const benchmarkIds = [
  "overhead",
  "realistic",
  "postgres",
  "sql",
  "inmemory",
  "backlog",
  "producer",
  "ordering",
  "retries",
  "observability",
  "drivers",
  "rebalance",
  "transactions"
] as const
type BenchmarkId = (typeof benchmarkIds)[number]

interface Sizes {
  readonly realBroker: RealBrokerSizes
  readonly postgres: PostgresSizes
  readonly sql: SqlStoreSizes
  readonly inMemoryRecords: number
  readonly backlog: BacklogSizes
  readonly producer: ProducerSizes
  readonly ordering: OrderingSizes
  readonly retries: { readonly inMemory: RetrySizes; readonly kafka: RetrySizes }
  readonly observability: ObservabilitySizes
  readonly drivers: DriverSizes
  readonly transactions: TransactionSizes
  readonly rebalance: RebalanceSizes
}

const full: Sizes = {
  realBroker: { overheadRecords: 1_000_000, overheadValueBytes: [256, 16], realisticRecords: 20_000, partitions: 6 },
  postgres: { recordsPerBatchSize: [[1, 2_000], [100, 30_000], [1000, 100_000]] },
  sql: { recordsPerBatchSize: [[100, 30_000], [1000, 100_000]] },
  inMemoryRecords: 1_000_000,
  backlog: { small: 100_000, large: 1_000_000, partitions: 6, windowMs: 8_000, chunkDelayMs: 500 },
  producer: {
    throughputRecords: 100_000,
    valueBytes: [256, 16],
    fiberRecords: 20_000,
    pipelineRecords: 200_000,
    partitions: 6
  },
  ordering: { records: 20_000, keys: 10_000, partitions: 6, concurrency: 100 },
  retries: {
    inMemory: { records: 200_000, timedRecords: 12_000, partitions: 6 },
    kafka: { records: 100_000, timedRecords: 12_000, partitions: 6 }
  },
  observability: { inMemoryRecords: 1_000_000, kafkaRecords: 500_000, partitions: 6 },
  drivers: { consumerRecords: 500_000, producerRecords: 200_000, partitions: 6 },
  rebalance: { records: 300_000, partitions: 6, beforeMillis: 3_000, acrossMillis: 6_000 },
  transactions: { records: 60_000, partitions: 6 }
}

const smoke: Sizes = {
  realBroker: { overheadRecords: 3_000, overheadValueBytes: [256, 16], realisticRecords: 600, partitions: 6 },
  postgres: { recordsPerBatchSize: [[1, 20], [100, 500], [1000, 3_000]] },
  sql: { recordsPerBatchSize: [[100, 500], [1000, 3_000]] },
  inMemoryRecords: 20_000,
  backlog: { small: 6_000, large: 30_000, partitions: 6, windowMs: 1_500, chunkDelayMs: 500 },
  producer: { throughputRecords: 3_000, valueBytes: [256, 16], fiberRecords: 500, pipelineRecords: 600, partitions: 6 },
  ordering: { records: 600, keys: 100, partitions: 6, concurrency: 20 },
  retries: {
    inMemory: { records: 2_000, timedRecords: 300, partitions: 6 },
    kafka: { records: 2_000, timedRecords: 300, partitions: 6 }
  },
  observability: { inMemoryRecords: 20_000, kafkaRecords: 3_000, partitions: 6 },
  drivers: { consumerRecords: 3_000, producerRecords: 3_000, partitions: 6 },
  rebalance: { records: 100_000, partitions: 6, beforeMillis: 500, acrossMillis: 1_500 },
  transactions: { records: 600, partitions: 6 }
}

export interface Options {
  readonly smoke: boolean
  readonly json: string | undefined
  readonly only: ReadonlyArray<BenchmarkId>
  readonly rounds: number | undefined
  readonly warmup: number | undefined
}

export const parseArgs = (argv: ReadonlyArray<string>): Options => {
  let smokeMode = false
  let json: string | undefined
  let only: ReadonlyArray<BenchmarkId> = benchmarkIds
  let rounds: number | undefined
  let warmup: number | undefined
  const count = (flag: string, value: string | undefined, min: number) => {
    const n = Number(value)
    if (!Number.isInteger(n) || n < min) throw new Error(`${flag} needs an integer >= ${min}, got ${value}`)
    return n
  }
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!
    if (arg === "--smoke") smokeMode = true
    else if (arg === "--json") {
      json = argv[++i]
      if (json === undefined || json.startsWith("--")) throw new Error("--json needs a file name")
    } else if (arg === "--only") {
      const list = (argv[++i] ?? "").split(",").filter((s) => s.length > 0)
      const unknown = list.filter((s) => !(benchmarkIds as ReadonlyArray<string>).includes(s))
      if (list.length === 0 || unknown.length > 0) {
        throw new Error(`--only takes a comma-separated list of ${benchmarkIds.join(", ")}; got ${argv[i]}`)
      }
      only = list as Array<BenchmarkId>
    } else if (arg === "--rounds") rounds = count("--rounds", argv[++i], 1)
    else if (arg === "--warmup") warmup = count("--warmup", argv[++i], 0)
    else throw new Error(`unknown argument ${arg}; see bench/main.ts`)
  }
  return { smoke: smokeMode, json, only, rounds, warmup }
}

const machine = () => ({
  nproc: os.availableParallelism(),
  cpu: os.cpus()[0]?.model ?? "unknown",
  memoryGiB: Math.round((os.totalmem() / 1024 ** 3) * 10) / 10,
  node: process.version,
  platform: `${os.platform()} ${os.release()}`,
  loadAverage: os.loadavg().map((l) => Math.round(l * 100) / 100)
})

export interface Report {
  readonly command: string
  readonly mode: "full" | "smoke"
  readonly startedAt: string
  readonly finishedAt: string
  readonly machine: ReturnType<typeof machine>
  readonly results: ReadonlyArray<BenchResult>
  readonly failures: ReadonlyArray<{ readonly benchmark: string; readonly error: string }>
}

const main = async (): Promise<number> => {
  const options = parseArgs(process.argv.slice(2))
  const sizes = options.smoke ? smoke : full
  const log = (line: string) => process.stderr.write(`${line}\n`)
  const plan: Plan = {
    warmup: options.warmup ?? (options.smoke ? 0 : 1),
    rounds: options.rounds ?? (options.smoke ? 1 : 5),
    runTimeoutMillis: options.smoke ? 60_000 : 600_000,
    log
  }
  const startedAt = new Date().toISOString()
  const info = machine()
  log(
    `bench (${
      options.smoke ? "smoke" : "full"
    }): ${info.nproc} cpus (${info.cpu}), ${info.memoryGiB} GiB, node ${info.node}, ` +
      `load ${info.loadAverage.join(" ")}`
  )
  const results: Array<BenchResult> = []
  const failures: Array<{ benchmark: string; error: string }> = []
  const attempt = async (benchmark: string, body: () => Promise<BenchResult | ReadonlyArray<BenchResult>>) => {
    try {
      const out = await body()
      for (const result of Array.isArray(out) ? out : [out as BenchResult]) {
        results.push(result)
        process.stdout.write(`\n${renderResult(result)}\n`)
      }
    } catch (error) {
      const message = error instanceof Error ? error.stack ?? error.message : String(error)
      failures.push({ benchmark, error: message })
      log(`${benchmark} FAILED: ${message}`)
    }
  }
  const wants = (id: BenchmarkId) => options.only.includes(id)

  if (wants("inmemory")) await attempt("inmemory", () => inMemory(plan, sizes.inMemoryRecords, 6))
  if (wants("ordering")) {
    await attempt("ordering-inmemory", () => orderingInMemory(plan, sizes.ordering))
    const url = process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test"
    await attempt("ordering-postgres", () => orderingPostgres(plan, url, sizes.ordering))
  }
  if (wants("retries")) await attempt("retries-inmemory", () => retriesInMemory(plan, sizes.retries.inMemory))
  if (wants("observability")) {
    await attempt("observability-inmemory", () => observabilityInMemory(plan, sizes.observability))
  }
  if (wants("rebalance")) await attempt("rebalance-inmemory", () => joinCostInMemory(plan, sizes.rebalance))
  if (wants("postgres")) {
    const url = process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test"
    await attempt("postgres", () => exactlyOnce(plan, url, sizes.postgres))
  }
  if (wants("sql")) {
    for (const database of ["mysql", "sqlite"] as const) {
      await attempt(`sql-${database}`, () => exactlyOnceSql(plan, database, sizes.sql))
    }
  }
  if (
    wants("overhead") || wants("realistic") || wants("backlog") || wants("producer") || wants("ordering") ||
    wants("retries") || wants("observability") || wants("drivers") || wants("rebalance") || wants("transactions")
  ) {
    try {
      await withBroker(log, async (brokers) => {
        const runId = `${process.pid}-${Date.now().toString(36)}`
        const topics = makeTopics(brokers, runId, log)
        try {
          if (wants("overhead")) {
            for (const bytes of sizes.realBroker.overheadValueBytes) {
              await attempt(`overhead-${bytes}b`, () => overhead(plan, brokers, topics, sizes.realBroker, bytes))
            }
          }
          if (wants("realistic")) await attempt("realistic", () => realistic(plan, brokers, topics, sizes.realBroker))
          if (wants("backlog")) await attempt("backlog", () => backlog(plan, brokers, topics, sizes.backlog))
          if (wants("producer")) {
            for (const bytes of sizes.producer.valueBytes) {
              await attempt(`producer-${bytes}b`, () => producerThroughput(plan, brokers, sizes.producer, bytes))
            }
            await attempt("producer-fibers", () => manyFibers(plan, brokers, sizes.producer))
            await attempt("pipeline", () => pipeline(plan, brokers, sizes.producer))
          }
          if (wants("ordering")) await attempt("ordering-kafka", () => orderingKafka(plan, brokers, sizes.ordering))
          if (wants("retries")) await attempt("retries-kafka", () => retriesKafka(plan, brokers, sizes.retries.kafka))
          if (wants("observability")) {
            await attempt("observability-kafka", () => observabilityKafka(plan, brokers, sizes.observability))
          }
          if (wants("drivers")) {
            await attempt("drivers-consumer", () => driversConsumer(plan, brokers, topics, sizes.drivers))
            await attempt("drivers-producer", () => driversProducer(plan, brokers, sizes.drivers))
          }
          if (wants("rebalance")) {
            await attempt("rebalance-kafka", () => joinCostKafka(plan, brokers, topics, sizes.rebalance))
          }
          if (wants("transactions")) {
            await attempt("transactions-kafka", () => transactionsKafka(plan, brokers, topics, sizes.transactions))
          }
        } finally {
          await topics.close()
        }
      })
    } catch (error) {
      failures.push({ benchmark: "broker", error: error instanceof Error ? error.message : String(error) })
      log(`broker FAILED: ${String(error)}`)
    }
  }

  const report: Report = {
    command: `npm run bench --${process.argv.slice(2).map((a) => ` ${a}`).join("")}`.replace(/ --$/, ""),
    mode: options.smoke ? "smoke" : "full",
    startedAt,
    finishedAt: new Date().toISOString(),
    machine: { ...info, loadAverage: [...info.loadAverage, Math.round(loadAverage() * 100) / 100] },
    results,
    failures
  }
  const misses = results.flatMap((r) => r.checks.filter((c) => !c.hit).map((c) => `${r.id} ${c.name}`))
  process.stdout.write(
    `\n${results.length} results, ${failures.length} failures; targets missed: ${
      misses.length === 0 ? "none" : misses.join(", ")
    }\n`
  )
  if (options.json !== undefined) {
    fs.mkdirSync(path.dirname(path.resolve(options.json)), { recursive: true })
    fs.writeFileSync(options.json, `${JSON.stringify(report, null, 2)}\n`)
    log(`wrote ${options.json}`)
  }
  return failures.length === 0 ? 0 : 1
}

main().then(
  (code) => process.exit(code),
  (error: unknown) => {
    process.stderr.write(`${error instanceof Error ? error.message : String(error)}\n`)
    process.exit(2)
  }
)
