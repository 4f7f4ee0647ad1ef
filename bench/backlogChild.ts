/**
 * One measurement of benchmark 5, in a process of its own: a consumer with a handler slower than fetching reads a
 * topic with a large backlog for a fixed window while its resident memory is sampled. Prints one JSON line.
 *
 *   node --import tsx bench/backlogChild.ts '{"brokers":"127.0.0.1:9092","topic":"t","windowMs":8000,"chunkDelayMs":500}'
 */
import * as Chunk from "effect/Chunk"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Consumer from "../src/Consumer.js"
import { driverLayer, policyLayer } from "./consumers.js"

export interface ChildArgs {
  readonly brokers: string
  readonly topic: string
  readonly windowMs: number
  readonly chunkDelayMs: number
}

export interface ChildResult {
  /** Highest resident set size sampled during the window (every 20 ms), in MB. */
  readonly peakRssMb: number
  /** The kernel's high-water mark of resident memory over the whole process life, in MB. */
  readonly maxRssMb: number
  /** Resident memory when the consumer started, in MB. */
  readonly startRssMb: number
  readonly peakHeapUsedMb: number
  readonly handled: number
  /** How long the consumer took to stop after the window (a clean revoke, a final commit, leaving the group). */
  readonly shutdownMs: number
  /** 1 when the consumer had not stopped `shutdownLimitMs` after the window; the memory figures stand regardless. */
  readonly shutdownHung: number
}

const shutdownLimitMs = 60_000

const mb = (bytes: number) => bytes / (1024 * 1024)

const main = async (args: ChildArgs): Promise<ChildResult> => {
  let handled = 0
  let peakRss = 0
  let peakHeap = 0
  const sampleMemory = () => {
    const usage = process.memoryUsage()
    peakRss = Math.max(peakRss, usage.rss)
    peakHeap = Math.max(peakHeap, usage.heapUsed)
  }
  const startRss = process.memoryUsage().rss
  const sampler = setInterval(sampleMemory, 20)
  let windowEnd = 0
  let hung = false
  try {
    const consume = Effect.runPromise(Effect.gen(function*() {
      const consumer = Consumer.run(
        { groupId: `bench-backlog-${crypto.randomUUID()}`, topics: [args.topic] },
        (records) =>
          Effect.sleep(Duration.millis(args.chunkDelayMs)).pipe(
            Effect.zipRight(Effect.sync(() => {
              handled += Chunk.size(records)
            }))
          )
      ).pipe(Effect.provide(Layer.merge(driverLayer(args.brokers), policyLayer)))
      const fiber = yield* Effect.fork(consumer)
      yield* Effect.raceFirst(Effect.sleep(Duration.millis(args.windowMs)), Fiber.join(fiber))
      windowEnd = performance.now()
      yield* Fiber.interrupt(fiber)
    }))
    // The window ends after `windowMs`; a consumer that does not stop after that is reported, not waited for.
    await Promise.race([
      consume,
      new Promise<void>((resolve) => {
        const check = setInterval(() => {
          if (windowEnd > 0 && performance.now() - windowEnd > shutdownLimitMs) {
            hung = true
            clearInterval(check)
            resolve()
          }
        }, 100)
        consume.finally(() => clearInterval(check)).catch(() => undefined)
      })
    ])
  } finally {
    clearInterval(sampler)
  }
  sampleMemory()
  const shutdownMs = performance.now() - windowEnd
  return {
    peakRssMb: mb(peakRss),
    maxRssMb: process.resourceUsage().maxRSS / 1024,
    startRssMb: mb(startRss),
    peakHeapUsedMb: mb(peakHeap),
    handled,
    shutdownMs,
    shutdownHung: hung ? 1 : 0
  }
}

main(JSON.parse(process.argv[2] ?? "{}") as ChildArgs).then(
  (result) => {
    process.stdout.write(`${JSON.stringify(result)}\n`)
    process.exit(0)
  },
  (error: unknown) => {
    process.stderr.write(`backlog child failed: ${String(error)}\n`)
    process.exit(1)
  }
)
