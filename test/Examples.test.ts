/**
 * The examples against a real broker: the one the test setup starts (or KAFKA_BROKERS), through
 * `Platformatic.layer` (examples/broker.ts's default), and the ones that consume, produce and commit in Kafka
 * transactions through `KafkaJs.layer` too (KAFKA_DRIVER=kafkajs). Each must print the same facts as on the in-memory
 * broker (see Runtimes.test.ts). The quick start runs on Node, Deno and Bun.
 */
import { assert, describe, it } from "@effect/vitest"
import { inject } from "vitest"
import { examples, runScript } from "./support/examples.js"

const brokers = process.env.KAFKA_BROKERS || inject("kafkaBrokers")
const setupError = inject("kafkaSetupError")

// The README's quick start (Readme.test.ts runs it on the in-memory broker). Its topic and group keep their names from
// run to run, so each run ships the orders it produced, or earlier ones the group had not committed: three either way.
const quickStart = {
  file: "examples/00-quick-start.ts",
  check: (out: string) => /^3 orders shipped$/m.test(out) ? undefined : "3 orders shipped"
}

/** The examples run on kafkajs as well: a plain consumer, a producer, the dead-letter route, Kafka transactions. */
const onKafkaJs = new Set([
  "examples/03-at-least-once.ts",
  "examples/11-producer.ts",
  "examples/12-pipeline.ts",
  "examples/14-dead-letter.ts"
])

describe.concurrent("examples on a real Kafka broker", () => {
  const runs = [quickStart, ...examples].flatMap((example) => [
    { example, driver: "platformatic" },
    ...(onKafkaJs.has(example.file) ? [{ example, driver: "kafkajs" }] : [])
  ])
  for (const { driver, example } of runs) {
    it(`${example.file} on ${driver}`, async () => {
      assert.isNotEmpty(brokers, `no Kafka broker for this run: ${setupError}`)
      const run = await runScript("node", example.file, [], {
        brokers,
        timeoutMillis: 90_000,
        env: { KAFKA_DRIVER: driver }
      })
      assert.strictEqual(run.code, 0, `exit ${run.code} after ${run.millis} ms\n${run.stdout}\n${run.stderr}`)
      assert.isUndefined(example.check(run.stdout), `expected ${example.check(run.stdout)}; got\n${run.stdout}`)
    }, 120_000)
  }
})

// One after the other, after the Node runs: the quick start's group ships what no run before it committed.
describe("the quick start on a real Kafka broker through @platformatic/kafka, on Deno and Bun", () => {
  for (const runtime of ["deno", "bun"] as const) {
    it(runtime, async () => {
      assert.isNotEmpty(brokers, `no Kafka broker for this run: ${setupError}`)
      const run = await runScript(runtime, quickStart.file, [], { brokers, timeoutMillis: 90_000 })
      assert.strictEqual(run.code, 0, `exit ${run.code} after ${run.millis} ms\n${run.stdout}\n${run.stderr}`)
      assert.isUndefined(quickStart.check(run.stdout), `expected ${quickStart.check(run.stdout)}; got\n${run.stdout}`)
    }, 120_000)
  }
})
