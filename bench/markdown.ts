/**
 * Renders a `--json` report as Markdown tables, for docs/BENCHMARKS.md:
 *
 *   node --import tsx bench/markdown.ts bench-results.json
 */
import * as fs from "node:fs"
import { formatNumber } from "./harness.js"
import type { Report } from "./main.js"

const file = process.argv[2]
if (file === undefined) throw new Error("usage: bench/markdown.ts <report.json>")
const report = JSON.parse(fs.readFileSync(file, "utf8")) as Report

const lines: Array<string> = []
const m = report.machine
lines.push(
  `Run ${report.startedAt} (${report.mode}): \`${report.command}\` on ${m.nproc} CPUs (${m.cpu}), ${m.memoryGiB} GiB, ` +
    `Node ${m.node}, ${m.platform}; load average at start ${m.loadAverage.slice(0, 3).join(" / ")} (1/5/15 min), ` +
    `at the end ${m.loadAverage[3] ?? "?"}.`
)
lines.push("")
for (const result of report.results) {
  lines.push(`#### ${result.title}`)
  lines.push("")
  lines.push(
    `${result.rounds} rounds after ${result.warmup} warm-up, interleaved; load ${result.load[0].toFixed(2)} -> ${
      result.load[1].toFixed(2)
    }.`
  )
  lines.push("")
  const keys = Array.from(new Set(result.variants.flatMap((v) => Object.keys(v.details))))
  lines.push(`| variant | median ${result.unit} | min | max | ${keys.join(" | ")} |`)
  lines.push(`|---|---:|---:|---:|${keys.map(() => "---:").join("|")}|`)
  for (const v of result.variants) {
    lines.push(
      `| ${v.id}: ${v.label} | ${formatNumber(v.median)} | ${formatNumber(v.min)} | ${formatNumber(v.max)} | ${
        keys.map((k) => v.details[k] === undefined ? "-" : formatNumber(v.details[k])).join(" | ")
      } |`
    )
  }
  lines.push("")
  for (const check of result.checks) {
    const verdict = check.target === "(reported)" ? "" : check.hit ? " **hit**" : " **MISS**"
    lines.push(`- ${check.name} = ${formatNumber(check.value)} (target ${check.target})${verdict}`)
  }
  lines.push("")
}
for (const failure of report.failures) lines.push(`- FAILED ${failure.benchmark}: ${failure.error.split("\n")[0]}`)
process.stdout.write(`${lines.join("\n")}\n`)
