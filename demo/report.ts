/**
 * What the semantics lab prints: a progress line per policy while it runs, then a table of outcomes and, for each
 * policy, two lines on why it came out the way it did.
 */
import * as process from "node:process"
import type { Outcome, PolicyName } from "./lab.js"

const count = (n: number): string => Math.round(n).toLocaleString("en-US")

/** Handled records (repeats included) per second of the run. */
export const recordsPerSecond = (outcome: Outcome): number =>
  outcome.elapsedMillis <= 0 ? 0 : Math.round((outcome.delivered * 1000) / outcome.elapsedMillis)

const columns = [
  ["policy", 20],
  ["produced", 10],
  ["delivered", 11],
  ["lost", 8],
  ["duplicated", 12],
  ["crashes", 9],
  ["records/s", 11]
] as const

const row = (cells: ReadonlyArray<string>): string =>
  cells.map((cell, i) => i === 0 ? cell.padEnd(columns[i]![1]) : cell.padStart(columns[i]![1])).join("")

/** The outcomes as a table, one row per policy; with poison records, where they went as well. */
export const table = (outcomes: ReadonlyArray<Outcome>): string => {
  const main = [
    row(columns.map(([name]) => name)),
    ...outcomes.map((o) =>
      row([
        o.policy,
        count(o.produced),
        count(o.delivered),
        count(o.lost),
        count(o.duplicated),
        count(o.crashes),
        count(recordsPerSecond(o))
      ])
    )
  ]
  if (!outcomes.some((o) => o.poison > 0)) return main.join("\n")
  const poisonRow = (cells: ReadonlyArray<string>) =>
    cells.map((cell, i) => i === 0 ? cell.padEnd(20) : cell.padStart(i === 3 ? 22 : 16)).join("")
  return [
    ...main,
    "",
    poisonRow(["policy", "poison", "dead-lettered", "dead-lettered twice", "handled too", "misrouted"]),
    ...outcomes.map((o) =>
      poisonRow([
        o.policy,
        count(o.poison),
        count(o.deadLettered),
        count(o.deadLetterRepeats),
        count(o.handledAndDeadLettered),
        count(o.misrouted)
      ])
    )
  ].join("\n")
}

/** Two lines per policy, in plain words, on why it lost or repeated what it did. */
export const explain = (outcome: Outcome, store: string): readonly [string, string] => {
  const { duplicated, lost } = outcome
  switch (outcome.policy) {
    case "atMostOnce":
      return [
        `commits each chunk's position before the handler sees it, so no record is handled twice (${
          count(duplicated)
        } duplicated).`,
        lost > 0
          ? `A crash between that commit and the end of the handler took the chunk's rest with it: ${count(lost)} lost.`
          : "No crash fell between a commit and the end of its handler this time; one that does loses records."
      ]
    case "autoCommit":
      return [
        "commits on a timer whatever was fetched, handled or not, as kafka-clients' enable.auto.commit does.",
        lost > 0 && duplicated > 0
          ? `A crash lost records committed ahead (${count(lost)}) and repeated those handled after the last tick (${
            count(duplicated)
          }).`
          : lost > 0
          ? `A crash lost records committed before they were handled (${count(lost)}); none was repeated this time.`
          : duplicated > 0
          ? `A crash repeated records handled after the last tick (${count(duplicated)}); none was lost this time.`
          : "No crash fell where it loses or repeats records this time; with other timing, one does."
      ]
    case "commitAfter":
      return [
        `commits a position only once its record and all before it in the partition were handled: ${count(lost)} lost.`,
        duplicated > 0
          ? `Records handled after the last commit went to the next owner again on a crash: ${
            count(duplicated)
          } duplicated.`
          : "No crash fell between a handler's end and the next commit this time; one that does repeats records."
      ]
    case "kafkaTransactional":
      return [
        "produces each chunk's results and commits its partition's new position in one Kafka transaction.",
        lost === 0 && duplicated === 0
          ? "A crash aborted both (the member, restarted, ended its transaction); the next owner went on from the position."
          : `${count(lost)} lost and ${
            count(duplicated)
          } duplicated, which this policy must never do: please report it with the seed.`
      ]
    case "transactional":
      return [
        `writes each chunk's results and its partition's new position in one transaction of the ${store}.`,
        lost === 0 && duplicated === 0
          ? "A crash rolled both back; the next owner began at the stored position: nothing lost, nothing repeated."
          : `${count(lost)} lost and ${
            count(duplicated)
          } duplicated, which this policy must never do: please report it with the seed.`
      ]
  }
}

/** The explanations of all outcomes, the policy's name in front of the first of its two lines. */
export const explanations = (outcomes: ReadonlyArray<Outcome>, store: string): string =>
  outcomes.map((o) => {
    const [first, second] = explain(o, store)
    return `${o.policy.padEnd(20)}${first}\n${" ".repeat(20)}${second}`
  }).join("\n")

/**
 * A progress line per policy. On a terminal the line is rewritten in place; otherwise a plain line is printed at
 * each quarter of the way, so that logs stay readable.
 */
export interface ProgressLine {
  /** `done` of `total` records have got as far as `what` says, with `crashes` so far. */
  readonly update: (what: string, done: number, total: number, crashes: number, lag?: number) => void
  readonly finish: (text: string) => void
}

export const progressLine = (policy: PolicyName, enabled: boolean, crash: "crash" | "kill"): ProgressLine => {
  const tty = process.stdout.isTTY === true
  const label = policy.padEnd(20)
  let lastDraw = 0
  let quarter = 0
  const write = (text: string) => {
    if (enabled) process.stdout.write(text)
  }
  return {
    update: (what, done, total, crashes, lag) => {
      const line = `${label}${what} ${count(done)} / ${count(total)}, ${count(crashes)} ${crash}${
        crashes === 1 ? "" : crash === "crash" ? "es" : "s"
      }${lag === undefined ? "" : `, lag ${count(lag)}`}`
      if (tty) {
        const now = Date.now()
        if (now - lastDraw < 100) return
        lastDraw = now
        write(`\r${line}\x1b[K`)
      } else {
        const q = Math.floor((4 * done) / Math.max(1, total))
        if (q <= quarter || q >= 4) return
        quarter = q
        write(`${line}\n`)
      }
    },
    finish: (text) => write(tty ? `\r${label}${text}\x1b[K\n` : `${label}${text}\n`)
  }
}
