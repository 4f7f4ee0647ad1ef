/**
 * Runs one variant of a benchmark on its own, for profiling and for trying settings:
 *
 *   node --import tsx bench/profile.ts overhead-chunk --records 200000 --bytes 256 --cpu-prof .cache/prof/chunk.cpuprofile
 *   node --import tsx bench/profile.ts overhead-chunk --max-poll 500 --buffer 20000 --commit-every 1000000
 *
 * `--cpu-prof <file>` records a V8 CPU profile of the measured runs only (not of producing the topic), viewable in
 * Chrome DevTools or summarized with `node bench/profileSummary.ts <file>`.
 *
 * Every kafkajs consumer of the process (the library's too) is watched: the records kafkajs fetched and handed to
 * `eachBatch`, and the fetch requests it made, are printed next to the records the variant handled.
 *
 * Variants: overhead-raw-batch, overhead-raw-message, overhead-chunk, overhead-each, inmemory.
 * Uses KAFKA_BROKERS when set, otherwise starts (and stops) a broker as `npm run bench` does.
 */
import * as fs from "node:fs"
import * as inspector from "node:inspector/promises"
import { Kafka } from "kafkajs"
import { withBroker } from "./broker.js"
import { driverLayer, library, rawKafkajs } from "./consumers.js"
import { compare, formatNumber, type Plan } from "./harness.js"
import { inMemory } from "./inMemory.js"
import { makeTopics } from "./topics.js"

process.env.KAFKAJS_NO_PARTITIONER_WARNING = "1"

const args = process.argv.slice(2)
const variant = args[0] ?? ""
const option = (name: string, fallback: number): number => {
  const at = args.indexOf(`--${name}`)
  return at === -1 ? fallback : Number(args[at + 1])
}
const records = option("records", 200_000)
const bytes = option("bytes", 256)
const runs = option("runs", 2)
const maxPoll = option("max-poll", Number.NaN)
const buffer = option("buffer", Number.NaN)
const commitEvery = option("commit-every", Number.NaN)
const profileAt = args.indexOf("--cpu-prof")
const profileFile = profileAt === -1 ? undefined : args[profileAt + 1]
const log = (line: string) => process.stderr.write(`${line}\n`)
const plan: Plan = { warmup: 0, rounds: runs, runTimeoutMillis: 600_000, log }

// Counts what every kafkajs consumer in this process fetches, through kafkajs's own instrumentation events.
const fetched = { records: 0, batches: 0, fetches: 0 }
const makeConsumer = Kafka.prototype.consumer
Kafka.prototype.consumer = function(this: Kafka, ...config: Parameters<Kafka["consumer"]>) {
  const consumer = makeConsumer.apply(this, config)
  consumer.on(consumer.events.START_BATCH_PROCESS, (event) => {
    fetched.records += event.payload.batchSize
    fetched.batches++
  })
  consumer.on(consumer.events.FETCH, () => {
    fetched.fetches++
  })
  return consumer
}

/** Runs `body` under the V8 profiler when `--cpu-prof` is given. */
const profiled = async <A>(body: () => Promise<A>): Promise<A> => {
  if (profileFile === undefined) return body()
  const session = new inspector.Session()
  session.connect()
  await session.post("Profiler.enable")
  await session.post("Profiler.setSamplingInterval", { interval: 200 })
  await session.post("Profiler.start")
  try {
    return await body()
  } finally {
    const { profile } = await session.post("Profiler.stop")
    fs.writeFileSync(profileFile, JSON.stringify(profile))
    log(`wrote ${profileFile}`)
    session.disconnect()
  }
}

const main = async () => {
  if (variant === "inmemory") {
    await inMemory(plan, records, 6, profiled, {
      maxPollRecords: Number.isNaN(maxPoll) ? undefined : maxPoll,
      commitEvery: Number.isNaN(commitEvery) ? undefined : commitEvery
    })
    return
  }
  await withBroker(log, async (brokers) => {
    const topics = makeTopics(brokers, `${process.pid}-prof`, log)
    try {
      const topic = await topics.get(records, bytes, 6)
      const driver = driverLayer(brokers)
      const tuning = {
        ...(Number.isNaN(maxPoll) ? {} : { maxPollRecords: maxPoll }),
        ...(Number.isNaN(buffer) ? {} : { bufferSize: buffer }),
        ...(Number.isNaN(commitEvery) ? {} : { commitEvery })
      }
      const run = (): ReturnType<typeof rawKafkajs> => {
        switch (variant) {
          case "overhead-raw-batch":
            return rawKafkajs(brokers, topic, "eachBatch", "count", false)
          case "overhead-raw-message":
            return rawKafkajs(brokers, topic, "eachMessage", "count", false)
          case "overhead-chunk":
            return library(driver, topic, "chunk", "count", tuning)
          case "overhead-each":
            return library(driver, topic, "each", "count", tuning)
          default:
            throw new Error(`unknown variant ${variant}`)
        }
      }
      const [result] = await profiled(() => compare(plan, [{ id: variant, label: variant, run }]))
      log(`${variant}: median ${formatNumber(result!.median)} records/s ${JSON.stringify(result!.details)}`)
      log(
        `kafkajs fetched ${fetched.records.toLocaleString("en-US")} records in ${fetched.batches} batches and ` +
          `${fetched.fetches} fetch requests for ${(records * runs).toLocaleString("en-US")} records handled ` +
          `(${(fetched.records / (records * runs)).toFixed(2)} x)`
      )
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
