/**
 * The README cannot drift from the code: its quick start is `examples/00-quick-start.ts` (the file's text below its
 * opening comment), which `npm run typecheck` compiles and this file runs on the in-memory broker; its two commands
 * are there, naming scripts package.json has; and every relative link of the README and of `docs/` leads somewhere.
 */
import { assert, describe, it } from "@effect/vitest"
import * as fs from "node:fs"
import * as path from "node:path"
import { projectDir, type Runtime, runScript } from "./support/examples.js"

const read = (file: string) => fs.readFileSync(path.join(projectDir, file), "utf8")

const readme = read("README.md")
const quickStartFile = "examples/00-quick-start.ts"

/** The text of a section: from its `## ` heading to the next one. */
const section = (markdown: string, heading: string): string => {
  const start = markdown.indexOf(`\n## ${heading}\n`)
  assert.isAtLeast(start, 0, `no "## ${heading}" section`)
  const end = markdown.indexOf("\n## ", start + 1)
  return markdown.slice(start, end < 0 ? undefined : end)
}

/** The fenced code blocks of a piece of Markdown, with their language. */
const codeBlocks = (markdown: string): Array<{ readonly lang: string; readonly code: string }> =>
  [...markdown.matchAll(/^```(\w*)\n([\s\S]*?)^```$/gm)].map((m) => ({ lang: m[1]!, code: m[2]! }))

/** The quick start's program: the example's text after its opening comment. */
const quickStartProgram = (): string => {
  const text = read(quickStartFile)
  const end = text.indexOf("*/\n")
  assert.isTrue(text.startsWith("/**") && end > 0, `${quickStartFile} opens with a comment`)
  return text.slice(end + 3).replace(/^\n+/, "")
}

describe("README", () => {
  it("its quick start is examples/00-quick-start.ts, word for word", () => {
    const blocks = codeBlocks(section(readme, "Quick start")).filter((b) => b.lang === "ts")
    assert.lengthOf(blocks, 1, "the quick start has one TypeScript block")
    assert.strictEqual(blocks[0]!.code, quickStartProgram())
  })

  it("the quick start comes first, and its install line names what package.json asks of a user", () => {
    const headings = [...readme.matchAll(/^## (.*)$/gm)].map((m) => m[1])
    assert.strictEqual(headings[0], "Quick start")
    const pkg = JSON.parse(read("package.json")) as {
      readonly name: string
      readonly peerDependencies: Record<string, string>
      readonly peerDependenciesMeta?: Record<string, { readonly optional?: boolean }>
    }
    const install = codeBlocks(section(readme, "Quick start")).find((b) => b.code.startsWith("npm install "))
    assert.isDefined(install, "an npm install line")
    const names = install!.code.trim().split(/\s+/).slice(2)
    // Every peer a user must install, and the optional ones (a client) that the quick start imports.
    const imported = new Set(
      [...quickStartProgram().matchAll(/from "([^"]+)"/g)].map((m) =>
        m[1]!.split("/").slice(0, m[1]!.startsWith("@") ? 2 : 1).join("/")
      )
    )
    const peers = Object.keys(pkg.peerDependencies).filter((name) =>
      pkg.peerDependenciesMeta?.[name]?.optional !== true || imported.has(name)
    )
    for (const name of [pkg.name, ...peers]) assert.include(names, name)
    const clients = Object.keys(pkg.peerDependencies).filter((name) => pkg.peerDependenciesMeta?.[name]?.optional)
    assert.isTrue(
      clients.some((name) => names.includes(name)),
      "the install line names the client the quick start uses"
    )
  })

  it("has the two commands, and package.json the scripts they run", () => {
    const commands = section(readme, "The two commands")
    assert.include(commands, "npm ci && npm run demo")
    assert.include(commands, "npm ci && npm test")
    const scripts = (JSON.parse(read("package.json")) as { scripts: Record<string, string> }).scripts
    assert.isDefined(scripts.demo)
    assert.isDefined(scripts.test)
  })
})

/** GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens, repeats numbered. */
const anchors = (markdown: string): Set<string> => {
  const seen = new Map<string, number>()
  const out = new Set<string>()
  const withoutCode = markdown.replace(/^```[\s\S]*?^```$/gm, "")
  for (const [, heading] of withoutCode.matchAll(/^#{1,6} (.*)$/gm)) {
    const base = heading!.toLowerCase().replace(/[^\p{L}\p{N}\s_-]/gu, "").trim().replace(/\s/g, "-")
    const n = seen.get(base) ?? 0
    seen.set(base, n + 1)
    out.add(n === 0 ? base : `${base}-${n}`)
  }
  return out
}

/** The links of a Markdown file, outside code blocks and code spans. */
const links = (markdown: string): Array<string> => {
  const prose = markdown.replace(/^```[\s\S]*?^```$/gm, "").replace(/`[^`\n]*`/g, "")
  return [...prose.matchAll(/\]\(([^)\s]+)\)/g)].map((m) => m[1]!)
}

const docs = fs.readdirSync(path.join(projectDir, "docs")).filter((f) => f.endsWith(".md"))
const documents = ["README.md", ...docs.map((f) => `docs/${f}`)]

describe("links of the README and docs/", () => {
  for (const document of documents) {
    it(`${document}: every relative link leads to a file, and to a heading when it names one`, () => {
      const broken: Array<string> = []
      for (const link of links(read(document))) {
        if (/^[a-z]+:/i.test(link)) continue
        const [target, anchor] = link.split("#") as [string, string | undefined]
        const file = target === "" ? document : path.posix.join(path.posix.dirname(document), target)
        if (!fs.existsSync(path.join(projectDir, file))) {
          broken.push(`${link}: no ${file}`)
        } else if (anchor !== undefined && file.endsWith(".md") && !anchors(read(file)).has(anchor)) {
          broken.push(`${link}: no heading #${anchor} in ${file}`)
        }
      }
      assert.deepStrictEqual(broken, [])
    })
  }

  it("the docs are all reachable from the README", () => {
    const linked = new Set(links(readme).map((link) => link.split("#")[0]))
    const reachable = new Set(linked)
    for (const file of linked) {
      if (!file?.startsWith("docs/")) continue
      for (const link of links(read(file))) reachable.add(path.posix.join("docs", link.split("#")[0]!))
    }
    assert.deepStrictEqual(documents.filter((d) => d !== "README.md" && !reachable.has(d)), [])
  })
})

describe("docs/layout.md", () => {
  it("names files that exist: the modules of each folder of src/internal, and the tests", () => {
    const layout = read("docs/layout.md")
    const missing: Array<string> = []
    for (const part of layout.split(/^### /m).slice(1)) {
      const folder = /^\[`([\w-]+)\/`\]/.exec(part)?.[1]
      assert.isDefined(folder, `a section that names no folder: ${part.slice(0, 60)}`)
      for (const [, name] of part.matchAll(/`([\w./-]+\.ts)`/g)) {
        const file = name!.startsWith("src/")
          ? name!
          : /(\.test|Suite)\.ts$/.test(name!)
          ? `test/${name}`
          : `src/internal/${folder}/${name}`
        if (!fs.existsSync(path.join(projectDir, file))) missing.push(file)
      }
    }
    assert.deepStrictEqual(missing, [])
  })

  it("has a section for each folder of src/internal", () => {
    const folders = fs.readdirSync(path.join(projectDir, "src/internal"), { withFileTypes: true })
      .filter((entry) => entry.isDirectory()).map((entry) => entry.name)
    const described = [...read("docs/layout.md").matchAll(/^### \[`([\w-]+)\/`\]/gm)].map((m) => m[1])
    assert.sameMembers(described, folders)
  })
})

describe.concurrent("the quick start on the in-memory broker", () => {
  for (const runtime of ["node", "deno", "bun"] satisfies ReadonlyArray<Runtime>) {
    it(`on ${runtime}: ships the three orders and stops`, async () => {
      const run = await runScript(runtime, quickStartFile)
      const failed = `exit ${run.code} after ${run.millis} ms\n${run.stdout}\n${run.stderr}`
      assert.strictEqual(run.code, 0, failed)
      for (const line of ["shipping order-1: 2 books", "shipping order-2: a lamp", "shipping order-3: a kettle"]) {
        assert.include(run.stdout, line, failed)
      }
      assert.match(run.stdout, /^3 orders shipped$/m, failed)
    }, 90_000)
  }
})
