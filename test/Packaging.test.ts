import { execFile } from "node:child_process"
import { promisify } from "node:util"
import { assert, describe, it } from "vitest"

const run = promisify(execFile)

describe("packaging", () => {
  it("deno.json is complete enough to publish to JSR (dry run)", async () => {
    // Effect's tag and error classes are "slow types" to JSR (their super class is an expression): allowed here.
    const { stderr, stdout } = await run(
      "node_modules/.bin/deno",
      ["publish", "--dry-run", "--allow-slow-types", "--allow-dirty"],
      { timeout: 120_000 }
    )
    const output = stdout + stderr
    assert.include(output, "Dry run complete")
    assert.include(output, "src/Consumer.ts")
    assert.notInclude(output, "test/")
  }, 150_000)

  it("npm pack ships the library and nothing of the tests, demo or benchmarks", async () => {
    const { stdout } = await run("npm", ["pack", "--dry-run", "--json", "--ignore-scripts"], { timeout: 120_000 })
    const files = (JSON.parse(stdout) as Array<{ files: Array<{ path: string }> }>)[0]!.files.map((f) => f.path)
    assert.include(files, "src/index.ts")
    assert.include(files, "src/Consumer.ts")
    assert.include(files, "README.md")
    assert.isEmpty(files.filter((f) => /^(test|demo|bench|examples|scripts|\.ci)\//.test(f)))
  }, 150_000)
})
