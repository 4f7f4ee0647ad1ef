/**
 * `npm run bench -- --smoke` end to end: every benchmark runs at tiny sizes and reports a figure. Speed targets are not
 * asserted here (a loaded CI machine says nothing about them); that every benchmark still runs and measures is.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Effect from "effect/Effect"
import { execFile } from "node:child_process"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { fileURLToPath } from "node:url"

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..")

interface Report {
  readonly mode: string
  readonly machine: { readonly nproc: number; readonly node: string }
  readonly results: ReadonlyArray<{
    readonly id: string
    readonly variants: ReadonlyArray<
      { readonly id: string; readonly median: number; readonly samples: ReadonlyArray<number> }
    >
    readonly checks: ReadonlyArray<{ readonly name: string; readonly value: number; readonly hit: boolean }>
  }>
  readonly failures: ReadonlyArray<{ readonly benchmark: string; readonly error: string }>
}

const expected = [
  "in-memory",
  "pg-batch-1",
  "pg-batch-100",
  "pg-batch-1000",
  "sql-mysql-batch-100",
  "sql-mysql-batch-1000",
  "sql-sqlite-batch-100",
  "sql-sqlite-batch-1000",
  "overhead-256b",
  "overhead-16b",
  "realistic",
  "backlog",
  "producer-256b",
  "producer-16b",
  "producer-fibers",
  "pipeline",
  "ordering-inmemory",
  "ordering-postgres",
  "ordering-kafka",
  "retries-inmemory",
  "retries-kafka",
  "observability-inmemory",
  "observability-kafka",
  "drivers-consumer",
  "drivers-producer",
  "rebalance-inmemory",
  "rebalance-kafka",
  "transactions-kafka"
]

const runSmoke = (json: string) =>
  Effect.async<{ readonly code: number; readonly stdout: string; readonly stderr: string }>((resume) => {
    const child = execFile(
      process.execPath,
      ["--import", "tsx", path.join(root, "bench", "main.ts"), "--smoke", "--json", json],
      { cwd: root, env: process.env, timeout: 170_000, maxBuffer: 16 * 1024 * 1024 },
      (error, stdout, stderr) => {
        const code = error === null ? 0 : typeof error.code === "number" ? error.code : 1
        resume(Effect.succeed({ code, stdout, stderr }))
      }
    )
    return Effect.sync(() => {
      child.kill("SIGTERM")
    })
  })

describe("bench --smoke", () => {
  it.live("runs every benchmark and reports a figure for each", () =>
    Effect.gen(function*() {
      const dir = fs.mkdtempSync(path.join(os.tmpdir(), "bench-smoke-"))
      const json = path.join(dir, "bench.json")
      const run = yield* runSmoke(json)
      assert.strictEqual(run.code, 0, `bench --smoke failed:\n${run.stderr.slice(-4000)}`)
      const report = JSON.parse(fs.readFileSync(json, "utf8")) as Report
      fs.rmSync(dir, { recursive: true, force: true })

      assert.strictEqual(report.mode, "smoke")
      assert.deepStrictEqual(report.failures, [])
      assert.isAbove(report.machine.nproc, 0)
      assert.deepStrictEqual(report.results.map((r) => r.id).sort(), [...expected].sort())
      for (const result of report.results) {
        assert.isAbove(result.variants.length, 1, `${result.id} compares at least two variants`)
        for (const variant of result.variants) {
          assert.isTrue(
            Number.isFinite(variant.median) && variant.median > 0,
            `${result.id} ${variant.id} measured ${variant.median}`
          )
          assert.isAbove(variant.samples.length, 0)
        }
        assert.isAbove(result.checks.length, 0, `${result.id} is judged by at least one figure`)
        for (const check of result.checks) {
          assert.isTrue(Number.isFinite(check.value), `${result.id} ${check.name} is ${check.value}`)
        }
      }
      // The printed table carries the same results.
      for (
        const id of ["1. Consumer overhead", "2. Realistic handlers", "3. Exactly-once", "4. In-memory", "5. Memory"]
      ) {
        assert.include(run.stdout, id)
      }
    }), 180_000)
})
