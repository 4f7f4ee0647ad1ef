/**
 * Summarizes a V8 CPU profile (`.cpuprofile`): self time by file and by function, and inclusive time of the library's
 * own functions.
 *
 *   node --import tsx bench/profileSummary.ts .cache/prof/chunk.cpuprofile [top]
 */
import * as fs from "node:fs"

interface CallFrame {
  readonly functionName: string
  readonly url: string
  readonly lineNumber: number
}
interface ProfileNode {
  readonly id: number
  readonly callFrame: CallFrame
  readonly children?: ReadonlyArray<number>
}
interface Profile {
  readonly nodes: ReadonlyArray<ProfileNode>
  readonly samples: ReadonlyArray<number>
  readonly timeDeltas: ReadonlyArray<number>
}

const [file, topArg] = process.argv.slice(2)
if (file === undefined) throw new Error("usage: profileSummary.ts <file.cpuprofile> [top]")
const top = Number(topArg ?? 30)
const profile = JSON.parse(fs.readFileSync(file, "utf8")) as Profile
const nodes = new Map(profile.nodes.map((n) => [n.id, n]))
const parent = new Map<number, number>()
for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id)

const selfTime = new Map<number, number>()
profile.samples.forEach((id, i) => selfTime.set(id, (selfTime.get(id) ?? 0) + (profile.timeDeltas[i] ?? 0)))
const total = Array.from(selfTime.values()).reduce((a, b) => a + b, 0)

const where = (frame: CallFrame) =>
  frame.url.replace(/^.*node_modules\//, "").replace(/^file:\/\/.*?\/(src|bench)\//, "$1/")
const fileOf = (frame: CallFrame) => {
  const url = where(frame)
  if (url === "") return frame.functionName
  const parts = url.split("/")
  return url.startsWith("src/") || url.startsWith("bench/") ? url : parts.slice(0, 2).join("/")
}
const label = (frame: CallFrame) => `${frame.functionName || "(anonymous)"} ${where(frame)}:${frame.lineNumber + 1}`

const add = (map: Map<string, number>, key: string, t: number) => map.set(key, (map.get(key) ?? 0) + t)
const byFile = new Map<string, number>()
const byFunction = new Map<string, number>()
const inclusive = new Map<string, number>()
for (const [id, t] of selfTime) {
  const node = nodes.get(id)!
  add(byFile, fileOf(node.callFrame), t)
  add(byFunction, label(node.callFrame), t)
  // Inclusive time of library frames: every distinct src/ frame on the stack gets the sample.
  const seen = new Set<string>()
  for (let at: number | undefined = id; at !== undefined; at = parent.get(at)) {
    const frame = nodes.get(at)!.callFrame
    if (!where(frame).startsWith("src/")) continue
    const key = label(frame)
    if (!seen.has(key)) {
      seen.add(key)
      add(inclusive, key, t)
    }
  }
}
const pct = (t: number) => `${((100 * t) / total).toFixed(1).padStart(5)}%`
const print = (title: string, map: Map<string, number>, n: number) => {
  process.stdout.write(`--- ${title}\n`)
  for (const [key, t] of Array.from(map).sort((a, b) => b[1] - a[1]).slice(0, n)) {
    process.stdout.write(`${pct(t)}  ${key}\n`)
  }
}
process.stdout.write(`${file}: ${(total / 1e6).toFixed(2)} s sampled\n`)
print("self time by file", byFile, 15)
print("self time by function", byFunction, top)
print("inclusive time of library (src/) functions", inclusive, top)
