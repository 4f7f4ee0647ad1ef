/**
 * Runs the examples and the demo as a user would, in a child process on Node (tsx), Deno or Bun, and says what each
 * example must print.
 */
import { execFile } from "node:child_process"
import * as path from "node:path"
import { fileURLToPath } from "node:url"

export const projectDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..")

export type Runtime = "node" | "deno" | "bun"

const command = (runtime: Runtime, file: string): [string, Array<string>] => {
  const bin = (name: string) => path.join(projectDir, "node_modules", ".bin", name)
  switch (runtime) {
    case "node":
      return [bin("tsx"), [file]]
    case "deno":
      // --cached-only: every package comes from node_modules (deno.json: nodeModulesDir "manual"), never the network.
      return [bin("deno"), ["run", "-A", "--cached-only", file]]
    case "bun":
      return [bin("bun"), ["run", file]]
  }
}

export interface Run {
  readonly code: number
  readonly stdout: string
  readonly stderr: string
  readonly millis: number
}

/**
 * Runs a script of the project. `brokers` undefined runs it on the in-memory broker: KAFKA_BROKERS, which the test
 * setup exports for the tests that need Kafka, is removed from its environment.
 */
export const runScript = (
  runtime: Runtime,
  file: string,
  args: ReadonlyArray<string> = [],
  options: {
    readonly brokers?: string
    readonly timeoutMillis?: number
    readonly env?: Readonly<Record<string, string>>
  } = {}
): Promise<Run> =>
  new Promise((resolve) => {
    const [cmd, base] = command(runtime, file)
    const env: NodeJS.ProcessEnv = { ...process.env, NO_COLOR: "1", DENO_NO_UPDATE_CHECK: "1" }
    delete env.KAFKA_BROKERS
    delete env.KAFKA_DRIVER
    if (options.brokers !== undefined) env.KAFKA_BROKERS = options.brokers
    Object.assign(env, options.env)
    const started = Date.now()
    execFile(
      cmd,
      [...base, ...args],
      { cwd: projectDir, env, timeout: options.timeoutMillis ?? 60_000, maxBuffer: 16 * 1024 * 1024 },
      (error, stdout, stderr) => {
        const code = error === null ? 0 : typeof error.code === "number" ? error.code : 1
        resolve({ code, stdout, stderr, millis: Date.now() - started })
      }
    )
  })

const count = (text: string, pattern: RegExp) =>
  text.match(new RegExp(pattern.source, `${pattern.flags}g`))?.length ?? 0

/** What each example must print, checked on its standard output. A failed check returns what went wrong. */
export const examples: ReadonlyArray<{
  readonly file: string
  readonly needs?: "postgres" | "mysql"
  readonly check: (stdout: string) => string | undefined
}> = [
  {
    file: "examples/01-at-most-once.ts",
    check: (out) => count(out, /^send notice \d/m) === 6 && /6 records handled/.test(out) ? undefined : "6 notices"
  },
  {
    file: "examples/02-auto-commit.ts",
    check: (out) => /30 page views counted/.test(out) && /\/page\/0: 5/.test(out) ? undefined : "30 page views"
  },
  {
    file: "examples/03-at-least-once.ts",
    check: (out) => /40 payments, total 7800/.test(out) ? undefined : "40 payments totalling 7800"
  },
  {
    file: "examples/04-commit-every.ts",
    check: (out) => /750 readings archived/.test(out) ? undefined : "750 readings"
  },
  {
    file: "examples/05-exactly-once-postgres.ts",
    needs: "postgres",
    check: (out) =>
      /positions: (15|30), (15|30), (15|30)/.test(out) && /customer-0: 420/.test(out) &&
        /customer-3: 465/.test(out)
        ? undefined
        : "positions summing to 60 and each customer's total once"
  },
  {
    file: "examples/06-static-partitions.ts",
    check: (out) =>
      /first run: began partition 1 at offset 0, partition 3 at offset 0; handled 20/.test(out) &&
        /second run: began partition 1 at offset 10, partition 3 at offset 10; handled 6/.test(out) &&
        /26 results stored/.test(out)
        ? undefined
        : "the second run resuming at the stored positions"
  },
  {
    file: "examples/07-file-store.ts",
    check: (out) => {
      const json = out.slice(out.indexOf("{"))
      try {
        const segment = JSON.parse(json) as { next: string; results: ReadonlyArray<{ offset: string }> }
        return /12 records/.test(out) && segment.results.at(-1)?.offset === String(BigInt(segment.next) - 1n)
          ? undefined
          : "a segment whose last result is the record just below its position"
      } catch {
        return "a segment file printed as JSON"
      }
    }
  },
  {
    file: "examples/08-worker-per-partition.ts",
    check: (out) =>
      /80 images/.test(out) && count(out, /worker started/) === count(out, /worker stopped/) &&
        /member B \S+: worker started/.test(out)
        ? undefined
        : "every worker started is stopped, and member B got partitions"
  },
  {
    file: "examples/09-retry.ts",
    check: (out) =>
      count(out, /crate-4\): shipped/) === 1 && count(out, /crate-4\): carrier unavailable/) === 2 &&
        /Handler failed on shipments-\S+-0 at offset 5 after its retries/.test(out) &&
        /ServiceUnavailable at offset 5: carrier rejected pallet-6/.test(out)
        ? undefined
        : "the crate shipped on its third attempt, and the pallet stopping the consumer at offset 5 with the " +
          "handler's own error"
  },
  {
    file: "examples/11-producer.ts",
    check: (out) =>
      /60 orders acknowledged by every in-sync replica; customer-3's all on partition \d$/m.test(out) &&
        /20 quotes acknowledged by the leader/.test(out) && /80 records read back/.test(out)
        ? undefined
        : "60 orders with each customer on one partition, 20 quotes, 80 records read back"
  },
  {
    file: "examples/12-pipeline.ts",
    check: (out) => /40 invoices, each order once/.test(out) ? undefined : "40 invoices, each order once"
  },
  {
    file: "examples/13-per-key.ts",
    check: (out) => {
      const most = Number(/(\d+) calls in flight at most \(bound 50\)/.exec(out)?.[1] ?? "0")
      return /400 events of 40 accounts, each account's in order/.test(out) && most > 1 && most <= 50
        ? undefined
        : "400 events of 40 accounts, each account's in order, more than one and at most 50 calls in flight"
    }
  },
  {
    file: "examples/14-dead-letter.ts",
    check: (out) =>
      /17 orders handled, 3 dead-lettered/.test(out) &&
        /dead letter: orders-0@13, OutOfCatalog after 3 attempt\(s\): unicorn is not in the catalog/.test(out) &&
        /dead letter: orders-0@4, DecodeFailed after 1 attempt\(s\)/.test(out) &&
        /dead letter: orders-0@9, DecodeFailed after 1 attempt\(s\): Expected an integer, actual 1.5/.test(out)
        ? undefined
        : "17 orders handled and the three poison orders dead-lettered with their errors and attempts"
  },
  {
    file: "examples/15-observability.ts",
    check: (out) => {
      const lags = [...out.matchAll(/^ {2}orders-\d+ {2}position (\d+) {2}lag (\d+)$/gm)]
      const positions = lags.reduce((sum, m) => sum + Number(m[1]), 0)
      const metric = (name: string) =>
        Number(new RegExp(`^ {2}${name.replace(/\./g, "\\.")} +(\\d+)$`, "m").exec(out)?.[1])
      return /10 orders handled on/.test(out) && lags.length === 3 && positions === 10 &&
          lags.every((m) => m[2] === "0") &&
          /└─ send orders \(producer\) +[0-9a-f]{16} {2}traceparent in the record's headers/.test(out) &&
          /process orders \(consumer\) +[0-9a-f]{16} {2}linked to the send/.test(out) &&
          metric("messaging.client.sent.messages") === 10 && metric("messaging.client.consumed.messages") === 10 &&
          metric("kafka.consumer.handled.records") === 10 && metric("kafka.consumer.lag") === 0 &&
          metric("kafka.consumer.rebalance.partitions") === 3
        ? undefined
        : "10 orders handled, lag 0 on three partitions, order-3's trace linked from its chunk, and the metrics"
    }
  },
  {
    file: "examples/16-exactly-once-mysql.ts",
    needs: "mysql",
    check: (out) =>
      /and MySQL; positions: (15|30), (15|30), (15|30)/.test(out) && /customer-0: 420/.test(out) &&
        /customer-3: 465/.test(out)
        ? undefined
        : "positions summing to 60 and each customer's total once, in MySQL"
  },
  {
    file: "examples/17-exactly-once-sqlite.ts",
    check: (out) =>
      /and SQLite; positions: (15|30), (15|30), (15|30)/.test(out) && /customer-0: 420/.test(out) &&
        /customer-3: 465/.test(out)
        ? undefined
        : "positions summing to 60 and each customer's total once, in SQLite"
  }
]
