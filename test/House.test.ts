/**
 * The shape of `src/`, as `scripts/house.ts` measures it: no module loads itself through another at run time, no file
 * grows far past 500 lines, no function past 150. The measure is tried first on a few files written for it, so that a
 * check that could not fail does not pass for one that holds.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import { measure } from "../scripts/house.js"

const MAX_FILE_LINES = 550
const MAX_FUNCTION_LINES = 150

describe("the house", () => {
  it("the measure finds a circle at run time, a circle through types only, and a long function", () => {
    const dir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "house-"))
    try {
      Fs.writeFileSync(Path.join(dir, "a.ts"), `import { b } from "./b.js"\nexport const a = () => b()\n`)
      Fs.writeFileSync(Path.join(dir, "b.ts"), `import { a } from "./a.js"\nexport const b = (): unknown => a\n`)
      Fs.writeFileSync(Path.join(dir, "c.ts"), `import type { D } from "./d.js"\nexport interface C { d?: D }\n`)
      Fs.writeFileSync(Path.join(dir, "d.ts"), `import type { C } from "./c.js"\nexport interface D { c?: C }\n`)
      const body = Array.from({ length: 200 }, (_, i) => `  const x${i} = ${i}`).join("\n")
      Fs.writeFileSync(Path.join(dir, "e.ts"), `export function long() {\n${body}\n}\n`)
      const house = measure(dir)
      assert.deepStrictEqual(house.circles.map((c) => c.map((f) => Path.basename(f))), [["a.ts", "b.ts"]])
      assert.deepStrictEqual(house.typeCircles.map((c) => c.map((f) => Path.basename(f))), [["c.ts", "d.ts"]])
      assert.strictEqual(house.functions[0]?.name, "long")
      assert.strictEqual(house.functions[0]?.lines, 202)
      assert.strictEqual(house.files[0]?.lines, 203)
    } finally {
      Fs.rmSync(dir, { recursive: true, force: true })
    }
  })

  const house = measure()

  it("no module of src/ imports itself through others at run time", () => {
    assert.deepStrictEqual(house.circles, [])
  })

  it(`no file of src/ is over ${MAX_FILE_LINES} lines`, () => {
    assert.isAbove(house.files.length, 100)
    assert.deepStrictEqual(house.files.filter((f) => f.lines > MAX_FILE_LINES), [])
  })

  it(`no function of src/ is over ${MAX_FUNCTION_LINES} lines`, () => {
    assert.isAbove(house.functions.length, 1000)
    assert.deepStrictEqual(house.functions.filter((f) => f.lines > MAX_FUNCTION_LINES), [])
  })
})
