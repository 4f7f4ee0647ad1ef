/**
 * The examples against a real broker: the one the test setup starts (or KAFKA_BROKERS), through `KafkaJs.layer`.
 * Each must print the same facts as on the in-memory broker (see Runtimes.test.ts).
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

describe.concurrent("examples on a real Kafka broker", () => {
  for (const example of [quickStart, ...examples]) {
    it(example.file, async () => {
      assert.isNotEmpty(brokers, `no Kafka broker for this run: ${setupError}`)
      const run = await runScript("node", example.file, [], { brokers, timeoutMillis: 90_000 })
      assert.strictEqual(run.code, 0, `exit ${run.code} after ${run.millis} ms\n${run.stdout}\n${run.stderr}`)
      assert.isUndefined(example.check(run.stdout), `expected ${example.check(run.stdout)}; got\n${run.stdout}`)
    }, 120_000)
  }
})
