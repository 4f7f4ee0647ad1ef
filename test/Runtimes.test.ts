/**
 * The in-memory examples and the demo, run as a user runs them, on Node (tsx), Deno and Bun. Deno resolves every
 * package from node_modules (deno.json: nodeModulesDir "manual") and runs with --cached-only: nothing is downloaded.
 */
import { assert, describe, it } from "@effect/vitest"
import { examples, type Run, type Runtime, runScript } from "./support/examples.js"

// Two child processes at a time: this suite shares a small machine with the rest of the run.
let running = 0
const waiting: Array<() => void> = []
const limited = async <A>(task: () => Promise<A>): Promise<A> => {
  if (running >= 2) await new Promise<void>((resume) => waiting.push(resume))
  running++
  try {
    return await task()
  } finally {
    running--
    waiting.shift()?.()
  }
}

const failed = (run: Run) => `exit ${run.code} after ${run.millis} ms\n${run.stdout}\n${run.stderr}`

interface DemoOutcome {
  readonly policy: string
  readonly produced: number
  readonly delivered: number
  readonly lost: number
  readonly duplicated: number
  readonly crashes: number
  readonly finalLag?: ReadonlyArray<{ readonly partition: number; readonly lag: number }>
}

// stdout must hold nothing but the JSON: logs go to stderr.
const parseReport = (run: Run): { outcomes: ReadonlyArray<DemoOutcome> } => {
  try {
    return JSON.parse(run.stdout)
  } catch (error) {
    return assert.fail(`stdout is not the JSON report (${String(error)}):\n${run.stdout}\nstderr:\n${run.stderr}`)
  }
}

for (const runtime of ["node", "deno", "bun"] satisfies ReadonlyArray<Runtime>) {
  describe.concurrent(`on ${runtime}`, () => {
    it(`demo --json: atMostOnce never duplicates, commitAfter never loses, the exactly-once policies neither`, async () => {
      const run = await limited(() =>
        runScript(runtime, "demo/main.ts", ["--json", "--records", "3000", "--crash-rate", "0.05", "--seed", "7"])
      )
      assert.strictEqual(run.code, 0, failed(run))
      const report = parseReport(run)
      const outcome = (policy: string) => report.outcomes.find((o) => o.policy === policy)!
      assert.deepStrictEqual(report.outcomes.map((o) => o.policy), [
        "atMostOnce",
        "autoCommit",
        "commitAfter",
        "transactional",
        "kafkaTransactional"
      ])
      for (const o of report.outcomes) assert.isAbove(o.crashes, 0, `${o.policy} had crashes injected`)
      const amo = outcome("atMostOnce")
      assert.strictEqual(amo.duplicated, 0)
      assert.strictEqual(amo.delivered + amo.lost, 3000)
      assert.strictEqual(outcome("commitAfter").lost, 0)
      for (const policy of ["transactional", "kafkaTransactional"]) {
        const eos = outcome(policy)
        assert.deepStrictEqual([eos.delivered, eos.lost, eos.duplicated], [3000, 0, 0], policy)
      }
      // Each partition's lag, as its owner reported it once every record was handled: 0 under every policy.
      for (const o of report.outcomes) {
        assert.deepStrictEqual(
          o.finalLag,
          Array.from({ length: 6 }, (_, partition) => ({ partition, lag: 0 })),
          `${o.policy}: the final lag`
        )
      }
      // The lab's crashes and moves are its own doing: nothing of them is worth a warning.
      assert.notMatch(run.stderr, /WARN|ERROR/, run.stderr)
    })

    it("demo: a bad option value is refused, naming the option", async () => {
      const run = await limited(() => runScript(runtime, "demo/main.ts", ["--partitions", "zero"]))
      assert.notStrictEqual(run.code, 0)
      assert.include(run.stderr + run.stdout, `--partitions must be an integer, got "zero"`)
    })

    for (const example of examples) {
      it(example.file, async () => {
        const run = await limited(() => runScript(runtime, example.file))
        assert.strictEqual(run.code, 0, failed(run))
        assert.isUndefined(example.check(run.stdout), `expected ${example.check(run.stdout)}; got\n${run.stdout}`)
      })
    }
  })
}
