/**
 * Benchmark 4: the in-memory kit. Records through the whole consumer (in-memory broker, runloop, commitAfter) with a
 * chunk handler, against a bare stream of the same records in chunks of the same size.
 */
import * as Chunk from "effect/Chunk"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as ManagedRuntime from "effect/ManagedRuntime"
import * as Stream from "effect/Stream"
import * as CommitPolicy from "../src/CommitPolicy.js"
import * as Consumer from "../src/Consumer.js"
import type { ConsumerRecord } from "../src/ConsumerRecord.js"
import * as InMemoryKafka from "../src/InMemoryKafka.js"
import { type BenchResult, compare, type Plan, ratioAtLeast, timed } from "./harness.js"

export interface InMemoryOptions {
  /** Records per chunk, for the library and the bare stream alike. Default 500 (the library's default). */
  readonly maxPollRecords?: number | undefined
  /** `commitAfter.maxBatch`. Default 1,000. */
  readonly commitEvery?: number | undefined
}

export const inMemory = (
  plan: Plan,
  records: number,
  partitions: number,
  /** Wraps the measured rounds (not the setup), e.g. in a profiler. */
  around: <A>(body: () => Promise<A>) => Promise<A> = (body) => body(),
  options: InMemoryOptions = {}
): Promise<BenchResult> =>
  timed(async () => {
    const maxPollRecords = options.maxPollRecords ?? 500
    const commitEvery = options.commitEvery ?? 1000
    plan.log(`4. in-memory kit, ${records.toLocaleString("en-US")} records`)
    const runtime = ManagedRuntime.make(InMemoryKafka.layer())
    try {
      const topic = "bench"
      const value = new Uint8Array(256).fill(0x61)
      await runtime.runPromise(Effect.gen(function*() {
        yield* InMemoryKafka.createTopic(topic, partitions)
        const batch: Array<InMemoryKafka.ProducerRecord> = []
        for (let i = 0; i < records; i++) batch.push({ partition: i % partitions, value })
        yield* InMemoryKafka.produce(topic, batch)
      }))

      // The same records as the broker holds, in the chunks a consumer gets: up to maxPollRecords per partition,
      // partitions taking turns.
      const logs: Array<Array<ConsumerRecord>> = Array.from({ length: partitions }, () => [])
      const now = Date.now()
      for (let i = 0; i < records; i++) {
        const partition = i % partitions
        const log = logs[partition]!
        log.push({ topic, partition, offset: BigInt(log.length), key: null, value, headers: {}, timestamp: now })
      }
      const chunks: Array<Chunk.Chunk<ConsumerRecord>> = []
      for (let at = 0;; at += maxPollRecords) {
        let any = false
        for (const log of logs) {
          if (at < log.length) {
            chunks.push(Chunk.unsafeFromArray(log.slice(at, at + maxPollRecords)))
            any = true
          }
        }
        if (!any) break
      }

      let group = 0
      const variants = await around(() =>
        compare(plan, [
          {
            id: "bare",
            label: "bare Stream.fromChunks + runForEachChunk",
            run: async () => {
              let count = 0
              const started = performance.now()
              await Effect.runPromise(
                Stream.fromChunks(...chunks).pipe(
                  Stream.runForEachChunk((chunk) =>
                    Effect.sync(() => {
                      count += Chunk.size(chunk)
                    })
                  )
                )
              )
              const millis = performance.now() - started
              if (count !== records) throw new Error(`bare stream saw ${count} records`)
              return { value: count / (millis / 1000), details: { "total ms": millis } }
            }
          },
          {
            id: "lib",
            label: "library run, chunk handler, commitAfter",
            run: () =>
              runtime.runPromise(Effect.gen(function*() {
                const done = yield* Deferred.make<void>()
                let count = 0
                let first = 0
                let atFirst = 0
                let last = 0
                const started = performance.now()
                const consumer = Consumer.run(
                  { groupId: `bench-${++group}`, topics: [topic], maxPollRecords, bufferSize: 2 * maxPollRecords },
                  (chunk) =>
                    Effect.sync(() => {
                      if (first === 0) {
                        first = performance.now()
                        atFirst = Chunk.size(chunk)
                      }
                      count += Chunk.size(chunk)
                      if (count >= records && last === 0) {
                        last = performance.now()
                        Deferred.unsafeDone(done, Exit.void)
                      }
                    })
                ).pipe(
                  Effect.provide(CommitPolicy.commitAfter({ maxBatch: commitEvery, maxInterval: Duration.seconds(1) }))
                )
                const fiber = yield* Effect.fork(consumer)
                yield* Effect.raceFirst(Deferred.await(done), Fiber.join(fiber))
                yield* Fiber.interrupt(fiber)
                const millis = last - started
                // As in benchmarks 1 and 2: the steady rate after the first delivery; starting the consumer (join,
                // assignment, a worker per partition) is reported next to it.
                return {
                  value: (count - atFirst) / ((last - first) / 1000),
                  details: {
                    "to 1st rec ms": first - started,
                    "total ms": millis,
                    "rec/s incl. start": count / (millis / 1000)
                  }
                }
              }))
          }
        ])
      )
      const lib = variants.find((v) => v.id === "lib")!
      const bare = variants.find((v) => v.id === "bare")!
      return {
        id: "in-memory",
        title: `4. In-memory kit: ${
          records.toLocaleString("en-US")
        } records, ${partitions} partitions, chunks of ${maxPollRecords}`,
        unit: "records/s",
        warmup: plan.warmup,
        rounds: plan.rounds,
        variants,
        checks: [
          ratioAtLeast(variants, "lib", "bare", 0.5),
          {
            name: "lib/bare incl. start",
            value: (lib.details["rec/s incl. start"] ?? Number.NaN) / bare.median,
            target: "(reported)",
            hit: true
          },
          { name: "lib records/s", value: lib.median, target: "> 1,000,000", hit: lib.median > 1_000_000 }
        ],
        notes: [
          `lib: join, assign, fetch, per-partition workers, commitAfter({ maxBatch: ${commitEvery}, maxInterval: 1 s }), ` +
          "the steady rate after the first chunk (the start is reported next to it); bare: the same record objects, " +
          "already chunked, timed from start to end"
        ]
      }
    } finally {
      await runtime.dispose()
    }
  })
