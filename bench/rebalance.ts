/**
 * Benchmark 13: what a membership change costs. Three members read a backlog on 6 partitions with a handler that
 * takes a fixed time per chunk (so the group's rate is the handlers' rate, not the broker's); once they run steadily a
 * fourth member joins. The figure is the records handled per second in the seconds after the join began, against the
 * same group's rate in the seconds before it: eager, cooperative and consumer (KIP-848) on the real broker
 * (@platformatic/kafka) and on the in-memory broker.
 */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as CommitPolicy from "../src/CommitPolicy.js"
import * as Consumer from "../src/Consumer.js"
import type { Driver, RebalanceProtocol } from "../src/Driver.js"
import * as InMemoryKafka from "../src/InMemoryKafka.js"
import * as Platformatic from "../src/Platformatic.js"
import {
  type BenchResult,
  compare,
  pairedRatioInfo,
  type Plan,
  type Sample,
  timed,
  type VariantResult
} from "./harness.js"
import type { Topics } from "./topics.js"

export interface RebalanceSizes {
  /** Records in the backlog: enough for the group to be still busy when the measuring ends. */
  readonly records: number
  readonly partitions: number
  /** How long the rate is measured before the join, and after the join began. */
  readonly beforeMillis: number
  readonly acrossMillis: number
}

/** The handler's time per chunk, and the chunk's largest size. */
const CHUNK_MILLIS = 20
const MAX_POLL_RECORDS = 50
/** How long each partition's `onRevoke` takes. */
const REVOKE_MILLIS = 300

let seq = 0

/** One round: three members run steadily, a fourth joins; the rates before and across the join. */
const joinOnce = (topic: string, sizes: RebalanceSizes): Effect.Effect<Sample, Error, Driver> =>
  Effect.gen(function*() {
    const groupId = `bench-join-${process.pid}-${++seq}`
    let handled = 0
    const member = (name: string) =>
      Consumer.run(
        {
          groupId,
          clientId: name,
          topics: [topic],
          maxPollRecords: MAX_POLL_RECORDS,
          sessionTimeout: "6 seconds",
          rebalanceTimeout: "30 seconds",
          revokeTimeout: "15 seconds"
        },
        (records) =>
          Effect.sleep(Duration.millis(CHUNK_MILLIS)).pipe(Effect.zipRight(Effect.sync(() => {
            handled += records.length
          }))),
        // A revoke that takes a while, as one that flushes what the partition's handler kept would.
        { onRevoke: () => Effect.sleep(Duration.millis(REVOKE_MILLIS)) }
      ).pipe(
        Effect.provide(CommitPolicy.commitAfter({ maxBatch: 500, maxInterval: "200 millis" })),
        Effect.fork
      )
    const first = [yield* member("a"), yield* member("b"), yield* member("c")]
    // Steady: the three have shared the partitions and run for a while.
    yield* Effect.sleep(Duration.millis(20)).pipe(Effect.repeat({ until: () => handled > 0 }))
    yield* Effect.sleep(Duration.millis(sizes.beforeMillis))
    const beforeStart = handled
    yield* Effect.sleep(Duration.millis(sizes.beforeMillis))
    const before = (handled - beforeStart) / (sizes.beforeMillis / 1000)
    const acrossStart = handled
    const d = yield* member("d")
    yield* Effect.sleep(Duration.millis(sizes.acrossMillis))
    const across = (handled - acrossStart) / (sizes.acrossMillis / 1000)
    yield* Fiber.interruptAll([...first, d])
    if (handled >= sizes.records) {
      return yield* Effect.fail(new Error(`the backlog of ${sizes.records} records ran out before the measuring ended`))
    }
    return { value: across, details: { before, acrossOverBefore: across / before } }
  })

const checksOf = (variants: ReadonlyArray<VariantResult>, ids: ReadonlyArray<string>) =>
  ids.slice(1).map((id) => pairedRatioInfo(variants, id, "eager"))

const result = (
  id: string,
  where: string,
  plan: Plan,
  sizes: RebalanceSizes,
  variants: ReadonlyArray<VariantResult>,
  ids: ReadonlyArray<string>
): Omit<BenchResult, "elapsedSeconds" | "load"> => ({
  id,
  title: `13. What a membership change costs, ${where}: a fourth member joins three on ${sizes.partitions} ` +
    `partitions; records/s in the ${sizes.acrossMillis / 1000} s after the join began`,
  unit: "records/s",
  warmup: plan.warmup,
  rounds: plan.rounds,
  variants,
  checks: checksOf(variants, ids),
  notes: [
    `The handler takes ${CHUNK_MILLIS} ms per chunk of at most ${MAX_POLL_RECORDS} records and each revoke's ` +
    `onRevoke ${REVOKE_MILLIS} ms: the group's rate is the handlers', so a pause in handling shows as a lower rate. ` +
    "`before` is the same group's rate in the " +
    `${sizes.beforeMillis / 1000} s before the join; acrossOverBefore is the share of it kept across the join.`
  ]
})

/** On the real broker: eager against cooperative, on @platformatic/kafka. */
export const joinCostKafka = (
  plan: Plan,
  brokers: string,
  topics: Topics,
  sizes: RebalanceSizes
): Promise<BenchResult> =>
  timed(async () => {
    const topic = await topics.get(sizes.records, 256, sizes.partitions)
    // The driver's heartbeat (a third of the 6 s session: 2 s), and a quicker one: a cooperative rebalance's second
    // round starts when the other members hear of it, at their next heartbeat.
    const runs = [
      { id: "eager", rebalance: "eager", heartbeat: undefined },
      { id: "cooperative", rebalance: "cooperative", heartbeat: undefined },
      { id: "cooperative-hb500", rebalance: "cooperative", heartbeat: "500 millis" },
      // KIP-848: the heartbeat is the broker's (`group.consumer.heartbeat.interval.ms`).
      { id: "consumer", rebalance: "consumer", heartbeat: undefined }
    ] as const
    const variants = await compare(
      plan,
      runs.map(({ heartbeat, id, rebalance }) => ({
        id,
        label: `${rebalance} rebalance${heartbeat === undefined ? "" : `, heartbeat ${heartbeat}`}`,
        run: () =>
          Effect.runPromise(
            joinOnce(topic.name, sizes).pipe(
              Effect.provide(Platformatic.layer({
                brokers: brokers.split(","),
                maxWaitTime: "100 millis",
                rebalance,
                ...(heartbeat === undefined ? {} : { heartbeatInterval: heartbeat })
              }))
            )
          )
      }))
    )
    return result("rebalance-kafka", "real broker (@platformatic/kafka)", plan, sizes, variants, runs.map((r) => r.id))
  })

/** On the in-memory broker: eager against cooperative against consumer (KIP-848). */
export const joinCostInMemory = (plan: Plan, sizes: RebalanceSizes): Promise<BenchResult> =>
  timed(async () => {
    const protocols: ReadonlyArray<RebalanceProtocol> = ["eager", "cooperative", "consumer"]
    const variants = await compare(
      plan,
      protocols.map((rebalance) => ({
        id: rebalance,
        label: `${rebalance} rebalance, in memory`,
        run: () =>
          Effect.runPromise(
            Effect.gen(function*() {
              yield* InMemoryKafka.createTopic("join", sizes.partitions)
              const values = Array.from({ length: 1_000 }, (_, i) => ({ value: String(i) }))
              for (let p = 0; p < sizes.partitions; p++) {
                for (let n = 0; n < sizes.records / sizes.partitions; n += values.length) {
                  yield* InMemoryKafka.produce("join", values.map((v) => ({ ...v, partition: p })))
                }
              }
              return yield* joinOnce("join", sizes)
            }).pipe(Effect.provide(InMemoryKafka.layer({ rebalance })))
          )
      }))
    )
    return result("rebalance-inmemory", "in memory", plan, sizes, variants, protocols)
  })
