/**
 * The measuring core shared by every benchmark: variants run interleaved (A B, B A, ...) after warm-up rounds, each
 * round's figure is kept, and a benchmark reports medians and the ratios it is judged by.
 */
import * as os from "node:os"

/** One measured run of a variant. `value` is what the benchmark compares (records per second, megabytes, ...). */
export interface Sample {
  readonly value: number
  /** Extra figures of the run, reported as medians next to the value (elapsed millis, records, ...). */
  readonly details?: Readonly<Record<string, number>>
}

export interface Variant {
  readonly id: string
  readonly label: string
  readonly run: (round: number) => Promise<Sample>
}

export interface VariantResult {
  readonly id: string
  readonly label: string
  readonly median: number
  readonly min: number
  readonly max: number
  /** Measured rounds only; warm-up rounds are not kept. */
  readonly samples: ReadonlyArray<number>
  readonly details: Readonly<Record<string, number>>
}

/** A figure a benchmark is judged by, with its target. */
export interface Check {
  readonly name: string
  readonly value: number
  readonly target: string
  readonly hit: boolean
}

export interface BenchResult {
  readonly id: string
  readonly title: string
  readonly unit: string
  readonly warmup: number
  readonly rounds: number
  readonly variants: ReadonlyArray<VariantResult>
  readonly checks: ReadonlyArray<Check>
  readonly notes: ReadonlyArray<string>
  readonly elapsedSeconds: number
  /** The 1-minute load average before and after, to judge how quiet the machine was. */
  readonly load: readonly [before: number, after: number]
}

export const median = (values: ReadonlyArray<number>): number => {
  if (values.length === 0) return Number.NaN
  const sorted = [...values].sort((a, b) => a - b)
  const mid = Math.floor(sorted.length / 2)
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2
}

export interface Plan {
  readonly warmup: number
  readonly rounds: number
  /** A run that takes longer than this fails the benchmark instead of hanging it. */
  readonly runTimeoutMillis: number
  readonly log: (line: string) => void
}

const withTimeout = <A>(promise: Promise<A>, millis: number, what: string): Promise<A> =>
  new Promise<A>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${what} did not finish within ${millis} ms`)), millis)
    promise.then(
      (value) => {
        clearTimeout(timer)
        resolve(value)
      },
      (error: unknown) => {
        clearTimeout(timer)
        reject(error)
      }
    )
  })

const gc = (): void => {
  const collect = (globalThis as { gc?: () => void }).gc
  if (collect !== undefined) collect()
}

/**
 * Runs the variants interleaved, `warmup` rounds first (not kept), then `rounds` measured rounds, in the given order
 * in even rounds and in the reverse order in odd ones (A B C D, D C B A, ...), so that no variant always runs right
 * after the same other one.
 */
export const compare = async (
  plan: Plan,
  variants: ReadonlyArray<Variant>
): Promise<ReadonlyArray<VariantResult>> => {
  const samples = new Map<string, Array<Sample>>(variants.map((v) => [v.id, []]))
  const total = plan.warmup + plan.rounds
  for (let round = 0; round < total; round++) {
    const warm = round < plan.warmup
    const order = round % 2 === 0 ? variants : [...variants].reverse()
    for (const variant of order) {
      gc()
      const sample = await withTimeout(variant.run(round), plan.runTimeoutMillis, `${variant.label} (round ${round})`)
      plan.log(
        `  ${warm ? "warm-up" : `round ${round - plan.warmup + 1}/${plan.rounds}`}  ${variant.label.padEnd(44)} ${
          formatNumber(sample.value)
        }`
      )
      if (!warm) samples.get(variant.id)!.push(sample)
    }
  }
  return variants.map((variant) => {
    const list = samples.get(variant.id)!
    const values = list.map((s) => s.value)
    const keys = new Set(list.flatMap((s) => Object.keys(s.details ?? {})))
    const details: Record<string, number> = {}
    for (const key of keys) {
      details[key] = median(list.flatMap((s) => s.details?.[key] === undefined ? [] : [s.details[key]!]))
    }
    return {
      id: variant.id,
      label: variant.label,
      median: median(values),
      min: Math.min(...values),
      max: Math.max(...values),
      samples: values,
      details
    }
  })
}

export const find = (variants: ReadonlyArray<VariantResult>, id: string): VariantResult => {
  const found = variants.find((v) => v.id === id)
  if (found === undefined) throw new Error(`no variant ${id}`)
  return found
}

/** The ratio of two variants' medians, checked against a lower bound. */
export const ratioAtLeast = (
  variants: ReadonlyArray<VariantResult>,
  numerator: string,
  denominator: string,
  min: number
): Check => {
  const value = find(variants, numerator).median / find(variants, denominator).median
  return { name: `${numerator}/${denominator}`, value, target: `>= ${min}`, hit: value >= min }
}

/** A ratio reported with no target. */
export const ratioInfo = (variants: ReadonlyArray<VariantResult>, numerator: string, denominator: string): Check => {
  const value = find(variants, numerator).median / find(variants, denominator).median
  return { name: `${numerator}/${denominator}`, value, target: "(reported)", hit: true }
}

/**
 * The median of the round-by-round ratios of two variants (each round runs both, one right after the other): reported
 * next to the ratio of medians, it shows how much of a gap between them drift between rounds explains.
 */
export const pairedRatioInfo = (
  variants: ReadonlyArray<VariantResult>,
  numerator: string,
  denominator: string
): Check => {
  const top = find(variants, numerator).samples
  const bottom = find(variants, denominator).samples
  const value = median(top.map((value, i) => value / bottom[i]!))
  return { name: `${numerator}/${denominator} per round`, value, target: "(reported)", hit: true }
}

/**
 * A target on the median of the round-by-round ratios of two variants. Where a machine's speed drifts from round to
 * round by more than the gap a target asks about, the ratio of two runs made one right after the other (in alternating
 * order) is the steadier figure: the drift is common to both runs of a round.
 */
export const pairedRatioAtLeast = (
  variants: ReadonlyArray<VariantResult>,
  numerator: string,
  denominator: string,
  min: number
): Check => {
  const { value } = pairedRatioInfo(variants, numerator, denominator)
  return { name: `${numerator}/${denominator} per round`, value, target: `>= ${min}`, hit: value >= min }
}

export const formatNumber = (value: number): string => {
  if (!Number.isFinite(value)) return String(value)
  if (Math.abs(value) >= 1000) return Math.round(value).toLocaleString("en-US")
  if (Math.abs(value) >= 10) return value.toFixed(1)
  return value.toFixed(3)
}

export const loadAverage = (): number => os.loadavg()[0]!

/** Runs one benchmark and stamps it with its duration and the load around it. */
export const timed = async (
  body: () => Promise<Omit<BenchResult, "elapsedSeconds" | "load">>
): Promise<BenchResult> => {
  const before = loadAverage()
  const started = performance.now()
  const result = await body()
  return {
    ...result,
    elapsedSeconds: (performance.now() - started) / 1000,
    load: [before, loadAverage()]
  }
}

/** The result as a text table: one line per variant, then the checks. */
export const renderResult = (result: BenchResult): string => {
  const lines: Array<string> = []
  lines.push(`${result.title}`)
  lines.push(
    `  (${result.rounds} measured rounds after ${result.warmup} warm-up, variants interleaved; ${
      result.elapsedSeconds.toFixed(0)
    } s; load ${result.load[0].toFixed(2)} -> ${result.load[1].toFixed(2)})`
  )
  const detailKeys = Array.from(new Set(result.variants.flatMap((v) => Object.keys(v.details))))
  const header = [
    "variant".padEnd(46),
    `median ${result.unit}`.padStart(20),
    "min".padStart(12),
    "max".padStart(12),
    ...detailKeys.map((k) => k.padStart(14))
  ]
  lines.push(`  ${header.join(" ")}`)
  for (const v of result.variants) {
    const row = [
      `${v.id} ${v.label}`.padEnd(46),
      formatNumber(v.median).padStart(20),
      formatNumber(v.min).padStart(12),
      formatNumber(v.max).padStart(12),
      ...detailKeys.map((k) => formatNumber(v.details[k] ?? Number.NaN).padStart(14))
    ]
    lines.push(`  ${row.join(" ")}`)
  }
  for (const check of result.checks) {
    const verdict = check.target === "(reported)" ? "" : check.hit ? "  HIT" : "  MISS"
    lines.push(
      `  ${check.name.padEnd(24)} ${formatNumber(check.value).padStart(12)}   target ${check.target}${verdict}`
    )
  }
  for (const note of result.notes) lines.push(`  note: ${note}`)
  return lines.join("\n")
}
