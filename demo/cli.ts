/**
 * The semantics lab's command line: which workload, which policies, which store, and where (the in-memory broker, or
 * a real one with `--brokers`).
 */
import * as CliConfig from "@effect/cli/CliConfig"
import * as Command from "@effect/cli/Command"
import * as HelpDoc from "@effect/cli/HelpDoc"
import * as Options from "@effect/cli/Options"
import * as ValidationError from "@effect/cli/ValidationError"
import type * as FileSystem from "@effect/platform/FileSystem"
import * as Clock from "effect/Clock"
import * as Console from "effect/Console"
import * as Data from "effect/Data"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import * as Observability from "../src/Observability.js"
import type { Outcome, PolicyName, Workload } from "./lab.js"
import { explanations, progressLine, recordsPerSecond, table } from "./report.js"
import { describeStore, runInMemory, type Store } from "./stores.js"

const allPolicies: ReadonlyArray<PolicyName> = [
  "atMostOnce",
  "autoCommit",
  "commitAfter",
  "transactional",
  "kafkaTransactional"
]

/** A combination of options that cannot run; the message names the options. */
export class UsageError extends Data.TaggedError("UsageError")<{ readonly message: string }> {}

/** A run whose stored positions stopped moving. */
export class Stalled extends Data.TaggedError("Stalled")<{ readonly message: string }> {}

const stallLimit = Duration.minutes(2)

/** Fails the run when `progressAt` (when the run last moved on) is older than the limit, rather than hang. */
const watched = <A, E, R>(policy: PolicyName, run: Effect.Effect<A, E, R>, progressAt: () => number) =>
  Effect.raceFirst(
    run,
    Effect.gen(function*() {
      while (true) {
        yield* Effect.sleep("1 second")
        if ((yield* Clock.currentTimeMillis) - progressAt() > Duration.toMillis(stallLimit)) {
          return yield* new Stalled({
            message: `${policy} made no progress for ${Duration.format(stallLimit)}: the run is stuck; ` +
              "please report it with the options used"
          })
        }
      }
    })
  )

const count = (n: number) => n.toLocaleString("en-US")

const invalid = (message: string) => Effect.fail(ValidationError.invalidValue(HelpDoc.p(message)))

// The kind of every numeric option: @effect/cli reads it with its integer or float parser.
const numeric = {
  records: "integer",
  partitions: "integer",
  consumers: "integer",
  "crash-rate": "float",
  "poison-rate": "float",
  "max-crashes": "integer",
  seed: "integer",
  "handler-millis": "integer",
  concurrency: "integer",
  keys: "integer"
} as const

type NumericName = keyof typeof numeric

const number = (name: NumericName) => numeric[name] === "integer" ? Options.integer(name) : Options.float(name)

const between = (name: NumericName, min: number, max: number, show: (n: number) => string = count) => (n: number) =>
  n >= min && n <= max
    ? Effect.succeed(n)
    : invalid(`--${name} must be between ${show(min)} and ${show(max)}, got ${show(n)}`)

const integer = (name: NumericName, fallback: number, min: number, max: number, description: string) =>
  number(name).pipe(
    Options.withDefault(fallback),
    Options.mapEffect(between(name, min, max)),
    Options.withDescription(`${description} Default ${count(fallback)}.`)
  )

const records = integer("records", 20_000, 1, 10_000_000, "Records produced, then consumed under each policy.")
const partitions = integer("partitions", 6, 1, 1_000, "Partitions of the topic.")
const consumers = integer(
  "consumers",
  3,
  1,
  100,
  "Members of the group at the start; two more join at a quarter and a half of the records, one leaves at three " +
    "quarters."
)
const handlerMillis = integer(
  "handler-millis",
  1,
  0,
  10_000,
  "Time the handler spends on each chunk, as I/O would. With 0, handling keeps pace with fetching and autoCommit " +
    "loses little."
)
const seed = integer(
  "seed",
  1,
  -2_147_483_648,
  2_147_483_647,
  "Seed of the crash decisions. The same seed gives the same decisions; which unit of work meets each one depends on " +
    "scheduling, so counts can differ a little between runtimes, and for autoCommit (a timer) between runs."
)

const crashRate = number("crash-rate").pipe(
  Options.withDefault(0.02),
  Options.mapEffect(between("crash-rate", 0, 1, String)),
  Options.withDescription(
    "Chance that a member dies at each point of a unit of work where a crash can fall (before and after the " +
      "handler, before and after the commit). A crashed member is started again at once. Default 0.02."
  )
)

const poisonRate = number("poison-rate").pipe(
  Options.withDefault(0),
  Options.mapEffect(between("poison-rate", 0, 0.5, String)),
  Options.withDescription(
    "Share of poison records: half are not UTF-8 and do not decode, half are refused by the handler. With any, the " +
      "consumer dead-letters them to the topic's -dlq topic, and the report says where each record went. In-memory " +
      "broker only. Default 0."
  )
)

const maxCrashes = number("max-crashes").pipe(
  Options.mapEffect((n) => n >= 0 ? Effect.succeed(n) : invalid(`--max-crashes must be 0 or more, got ${n}`)),
  Options.optional,
  Options.withDescription("Most crashes per policy. Default 60 in memory, 3 (members killed) with --brokers.")
)

const policies = Options.text("policies").pipe(
  Options.withPseudoName("name,name"),
  Options.withDefault(allPolicies.join(",")),
  Options.mapEffect((text) => {
    const names = [...new Set(text.split(",").map((s) => s.trim()).filter((s) => s.length > 0))]
    const unknown = names.filter((n) => !allPolicies.includes(n as PolicyName))
    if (names.length === 0 || unknown.length > 0) {
      return invalid(
        `--policies takes a comma-separated list of ${allPolicies.join(", ")}; ${
          names.length === 0 ? "got none" : `unknown: ${unknown.join(", ")}`
        }`
      )
    }
    return Effect.succeed(names as ReadonlyArray<PolicyName>)
  }),
  Options.withDescription("Which policies to run, comma-separated, in that order. Default: all five.")
)

const ordering = Options.choice("ordering", ["partition", "key", "unordered"] as const).pipe(
  Options.withDefault("partition" as const),
  Options.withDescription(
    "Which records of a partition are handled one after another: all (partition), those with the same key (key), " +
      "or none (unordered). Default partition."
  )
)
const concurrency = integer(
  "concurrency",
  64,
  1,
  10_000,
  "Handler calls in flight per member under --ordering key or unordered."
)
const keys = number("keys").pipe(
  Options.mapEffect(between("keys", 1, 10_000_000)),
  Options.optional,
  Options.withDescription(
    "Records get keys k0 to k<keys - 1> in turn. Default: none under --ordering partition, 2,000 otherwise."
  )
)

const json = Options.boolean("json").pipe(
  Options.withDescription("Print only the results, as JSON, with no progress and no explanations.")
)

const store = Options.text("store").pipe(
  Options.withPseudoName("memory|file:<dir>|mysql://...|sqlite:<file>"),
  Options.withDefault("memory"),
  Options.mapEffect((text): Effect.Effect<Store, ValidationError.ValidationError> => {
    if (text === "memory") return Effect.succeed({ _tag: "Memory" })
    if (text.startsWith("file:") && text.length > "file:".length) {
      return Effect.succeed({ _tag: "File", directory: text.slice("file:".length) })
    }
    if (/^mysql:\/\/\S+$/.test(text)) return Effect.succeed({ _tag: "Mysql", url: text })
    if (text.startsWith("sqlite:") && text.length > "sqlite:".length) {
      return Effect.succeed({ _tag: "Sqlite", file: text.slice("sqlite:".length) })
    }
    return invalid(
      `--store takes memory, file:<directory>, mysql://user@host:port/database or sqlite:<file>, got ${
        JSON.stringify(text)
      }`
    )
  }),
  Options.withDescription(
    "Offset store of transactional: memory, file:<directory> (one file per committed unit, results inside), " +
      "mysql://user@host:port/database (MySQL or MariaDB) or sqlite:<file>, these two through SqlOffsetStore with " +
      "the results written in the application's own tables. With --brokers, mysql://... keeps transactional's " +
      "positions and results in MySQL. Default memory."
  )
)

const databaseUrl = Options.text("database-url").pipe(
  Options.withPseudoName("postgres://..."),
  Options.mapEffect((url) =>
    /^postgres(ql)?:\/\/\S+$/.test(url)
      ? Effect.succeed(url)
      : invalid(`--database-url must be a URL such as postgres://postgres@127.0.0.1:5432/test, got ${url}`)
  ),
  Options.optional,
  Options.withDescription(
    "Postgres for transactional: positions in lab_offsets, results written in the same transaction into lab_results. " +
      "With --brokers, where every policy's handled records are counted (default: DATABASE_URL, else " +
      "postgres://postgres@127.0.0.1:5432/test)."
  )
)

const brokers = Options.text("brokers").pipe(
  Options.withPseudoName("host:port,..."),
  Options.mapEffect((text) => {
    const list = text.split(",").map((s) => s.trim())
    const bad = list.find((b) => {
      const match = /^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):(\d{1,5})$/.exec(b)
      return match === null || Number(match[2]) < 1 || Number(match[2]) > 65_535
    })
    return bad === undefined
      ? Effect.succeed(list.join(","))
      : invalid(`--brokers takes host:port[,host:port...], got ${JSON.stringify(bad)}`)
  }),
  Options.optional,
  Options.withDescription(
    "Run against a real Kafka cluster instead of the in-memory broker: members are processes, killed and restarted."
  )
)

const driver = Options.choice("driver", ["kafkajs", "platformatic"] as const).pipe(
  Options.withDefault("platformatic" as const),
  Options.withDescription(
    "With --brokers, the client the members consume and produce with: @platformatic/kafka (platformatic) or kafkajs. " +
      "Default platformatic."
  )
)

const rebalance = Options.choice("rebalance", ["eager", "cooperative", "consumer"] as const).pipe(
  Options.withDefault("eager" as const),
  Options.withDescription(
    "How the group moves partitions when members join and leave: eager (everything is revoked), cooperative " +
      "(KIP-429) or consumer (KIP-848), both moving only what moves. With --brokers, cooperative and consumer " +
      "need --driver platformatic. Default eager."
  )
)

const options = {
  records,
  partitions,
  consumers,
  crashRate,
  poisonRate,
  maxCrashes,
  seed,
  handlerMillis,
  ordering,
  concurrency,
  keys,
  policies,
  json,
  store,
  databaseUrl,
  brokers,
  driver,
  rebalance
}

type Args = Command.Command.ParseConfig<typeof options>

const defaultDatabaseUrl = "postgres://postgres@127.0.0.1:5432/test"

/** Runs one policy on a real broker; the module (and the clients) load only when `--brokers` is given. */
const runReal = (
  args: Args,
  store: Store,
  policy: PolicyName,
  brokerList: string,
  onProgress: (results: number, kills: number) => void
) =>
  Effect.gen(function*() {
    const { runRealWorkload } = yield* Effect.tryPromise(() => import("./cluster/run.js"))
    const databaseUrl = Option.getOrElse(args.databaseUrl, () => process.env.DATABASE_URL ?? defaultDatabaseUrl)
    return yield* runRealWorkload({
      policy,
      records: args.records,
      partitions: args.partitions,
      consumers: args.consumers,
      kills: Option.getOrElse(args.maxCrashes, () => 3),
      seed: args.seed,
      brokers: brokerList,
      databaseUrl,
      ...(store._tag === "Mysql" ? { mysqlUrl: store.url } : {}),
      driver: args.driver,
      rebalance: args.rebalance,
      rebalances: true,
      ...orderingOf(args),
      onProgress: (p) => onProgress(p.results, p.kills)
    })
  })

/** The ordering settings of a run; records are keyed when the ordering is not by partition, or when asked. */
const orderingOf = (args: Args) => {
  const keyCount = Option.getOrElse(args.keys, () => args.ordering === "partition" ? undefined : 2_000)
  return {
    ...(args.ordering === "partition" ? {} : { ordering: args.ordering, concurrency: args.concurrency }),
    ...(keyCount === undefined ? {} : { keys: keyCount })
  }
}

const chooseStore = (args: Args): Effect.Effect<Store, UsageError> => {
  if (Option.isSome(args.databaseUrl)) {
    return args.store._tag === "Memory"
      ? Effect.succeed({ _tag: "Postgres", url: args.databaseUrl.value })
      : new UsageError({
        message: "give either --store or --database-url for transactional, not both"
      })
  }
  return Effect.succeed(args.store)
}

/** What the membership changes of a run moved. */
const describeMoves = (moves: NonNullable<Outcome["moves"]>) => {
  const per = (n: number) => moves.changes === 0 ? "" : ` (${(n / moves.changes).toFixed(1)} per change)`
  return `${moves.changes} membership changes: ${moves.revoked} partitions revoked${per(moves.revoked)}, ` +
    `${moves.assigned} assigned again${per(moves.assigned)}`
}

/** Runs the lab and prints its report. */
export const runLab = (args: Args): Effect.Effect<ReadonlyArray<Outcome>, unknown, FileSystem.FileSystem> =>
  Effect.gen(function*() {
    const store = yield* chooseStore(args)
    if (Option.isSome(args.brokers) && (store._tag === "File" || store._tag === "Sqlite")) {
      return yield* new UsageError({
        message: `--store ${store._tag === "File" ? "file:" : "sqlite:"} runs on the in-memory broker only; with ` +
          "--brokers, results go to Postgres (--database-url), or for transactional to MySQL (--store mysql://...)"
      })
    }
    const real = Option.isSome(args.brokers)
    if (real && args.rebalance !== "eager" && args.driver !== "platformatic") {
      return yield* new UsageError({
        message: `--rebalance ${args.rebalance} with --brokers needs --driver platformatic: kafkajs rebalances ` +
          "eagerly only"
      })
    }
    if (real && args.poisonRate > 0) {
      return yield* new UsageError({ message: "--poison-rate runs on the in-memory broker only" })
    }
    const storeName = real && store._tag !== "Mysql" ? "Postgres store" : describeStore(store)
    const maxCrashes = Option.getOrElse(args.maxCrashes, () => real ? 3 : 60)
    if (!args.json) {
      yield* Console.log(
        `Semantics lab: ${count(args.records)} records on ${args.partitions} partitions, ${args.consumers} consumers ` +
          `(two join, one leaves), ${
            args.ordering === "partition" ? "" : `ordering by ${args.ordering}, concurrency ${args.concurrency}, `
          }${
            real ? `${maxCrashes} members killed` : `crash rate ${args.crashRate}, at most ` +
              `${maxCrashes} crashes`
          }, ${args.poisonRate > 0 ? `poison rate ${args.poisonRate}, ` : ""}seed ${args.seed}`
      )
      yield* Console.log(
        `${
          real
            ? `Kafka at ${Option.getOrElse(args.brokers, () => "")}, ${args.rebalance} rebalances`
            : `in-memory broker, ${args.rebalance} rebalances`
        }; ` +
          `transactional stores positions in ${storeName}\n`
      )
    }
    // Runs from earlier invocations may share a lasting store: a run of its own keeps their positions apart.
    const runId = Date.now().toString(36)
    const outcomes: Array<Outcome> = []
    for (const policy of args.policies) {
      const line = progressLine(policy, !args.json, real ? "kill" : "crash")
      let progressAt = yield* Clock.currentTimeMillis
      let last = -1
      const moved = (done: number) => {
        if (done !== last) [last, progressAt] = [done, Date.now()]
      }
      const run = Option.isSome(args.brokers)
        ? runReal(
          args,
          store,
          policy,
          args.brokers.value,
          (results, kills) => line.update("handled", results, args.records, kills)
        )
        : runInMemory(
          {
            policy,
            records: args.records,
            partitions: args.partitions,
            consumers: args.consumers,
            crashes: maxCrashes,
            crashRate: args.crashRate,
            seed: args.seed,
            rebalances: true,
            rebalance: args.rebalance,
            maxPollRecords: 50,
            commitEvery: 100,
            ...(args.handlerMillis > 0 ? { handlerMillis: args.handlerMillis } : {}),
            ...(args.poisonRate > 0 ? { poisonRate: args.poisonRate } : {}),
            ...orderingOf(args),
            runId,
            onProgress: (p) => {
              moved(p.stored)
              line.update("committed", p.stored, p.records, p.crashes, p.lag)
            }
          } satisfies Workload,
          store
        ).pipe(
          // The members report their lag; the progress line shows the group's.
          Effect.provide(Observability.layer({ spans: false, lagInterval: "100 millis" }))
        )
      // A real run has its own deadline; a stuck in-memory run would otherwise wait forever.
      const outcome = yield* (real ? run : watched(policy, run, () => progressAt))
      line.finish(
        `${count(outcome.delivered)} delivered, ${
          outcome.poison > 0 ? `${count(outcome.deadLettered)} dead-lettered, ` : ""
        }${count(outcome.lost)} lost, ${count(outcome.duplicated)} duplicated in ${
          (outcome.elapsedMillis / 1000).toFixed(1)
        } s${
          outcome.finalLag === undefined
            ? ""
            : outcome.finalLag.every((p) => p.lag === 0)
            ? ", lag 0 at the end"
            : `, lag at the end ${outcome.finalLag.map((p) => `${p.partition}: ${p.lag}`).join(", ")}`
        }${outcome.moves === undefined ? "" : `\n    ${describeMoves(outcome.moves)}`}`
      )
      outcomes.push(outcome)
    }
    if (args.json) {
      yield* Console.log(JSON.stringify(
        {
          workload: {
            broker: real ? Option.getOrElse(args.brokers, () => "") : "memory",
            store: storeName,
            records: args.records,
            partitions: args.partitions,
            consumers: args.consumers,
            crashRate: args.crashRate,
            poisonRate: args.poisonRate,
            maxCrashes,
            seed: args.seed,
            handlerMillis: args.handlerMillis,
            ordering: args.ordering,
            ...(args.ordering === "partition" ? {} : { concurrency: args.concurrency }),
            ...(orderingOf(args).keys === undefined ? {} : { keys: orderingOf(args).keys })
          },
          outcomes: outcomes.map((o) => ({ ...o, recordsPerSecond: recordsPerSecond(o) }))
        },
        null,
        2
      ))
    } else {
      yield* Console.log(`\n${table(outcomes)}\n\n${explanations(outcomes, storeName)}`)
    }
    return outcomes
  })

/** The `demo` command. */
export const command = Command.make("demo", options, runLab).pipe(
  Command.withDescription(
    "Runs one workload under each commit policy, with crashes injected and members joining and leaving, and " +
      "counts what each delivered, lost and duplicated."
  )
)

const run = Command.run(command, { name: "Semantics lab", version: "0.1.0" })

// What was given for `--name`, as @effect/cli reads it: `--name value` or `--name=value`.
const given = (args: ReadonlyArray<string>, name: string): Option.Option<string> => {
  for (const [i, arg] of args.entries()) {
    if (arg === `--${name}`) return Option.fromNullable(args[i + 1])
    if (arg.startsWith(`--${name}=`)) return Option.some(arg.slice(name.length + 3))
  }
  return Option.none()
}

// @effect/cli refuses a malformed number before the option's own checks run, in words that do not say which option
// it was ("'zero' is not a integer"). This finds the numeric option whose value its parser refuses, to name it.
const malformedNumber = (args: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    for (const [name, kind] of Object.entries(numeric)) {
      const text = given(args, name)
      if (Option.isNone(text)) continue
      const parsed = yield* Effect.either(
        Options.processCommandLine(number(name as NumericName), [`--${name}`, text.value], CliConfig.defaultConfig)
      )
      if (Either.isLeft(parsed)) {
        const expected = kind === "integer" ? "an integer" : "a number"
        return Option.some(`--${name} must be ${expected}, got ${JSON.stringify(text.value)}`)
      }
    }
    return Option.none<string>()
  })

/** Parses the arguments (`process.argv` style) and runs the lab, or prints help. */
export const cli = (argv: ReadonlyArray<string>) =>
  run(argv).pipe(
    Effect.catchIf(ValidationError.isValidationError, (error) =>
      Effect.flatMap(malformedNumber(argv.slice(2)), (message) =>
        Effect.fail(Option.isSome(message) ? new UsageError({ message: message.value }) : error)))
  )
