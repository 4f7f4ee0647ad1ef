/**
 * The settings of one cluster member, and how they travel on its command line: `runRealWorkload` writes them with
 * `toArgs`, the member reads them back with `parse`.
 */
import * as Data from "effect/Data"
import * as Effect from "effect/Effect"
import { parseArgs } from "node:util"

export type PolicyName = "atMostOnce" | "autoCommit" | "commitAfter" | "transactional" | "kafkaTransactional"

export type Ordering = "partition" | "key" | "unordered"

/** The client a member consumes and produces with. */
export type DriverName = "kafkajs" | "platformatic"

export const driverNames: ReadonlyArray<DriverName> = ["kafkajs", "platformatic"]

/** How the members' group rebalances on a real broker: `cooperative` and `consumer` on @platformatic/kafka only. */
export type RealRebalance = "eager" | "cooperative" | "consumer"

export const realRebalances: ReadonlyArray<RealRebalance> = ["eager", "cooperative", "consumer"]

export const orderings: ReadonlyArray<Ordering> = ["partition", "key", "unordered"]

export const policies: ReadonlyArray<PolicyName> = [
  "atMostOnce",
  "autoCommit",
  "commitAfter",
  "transactional",
  "kafkaTransactional"
]

/** Where a `kafkaTransactional` member writes one record per input record, in the chunk's transaction. */
export const outputTopicOf = (topic: string) => `${topic}-out`

export interface MemberOptions {
  readonly brokers: string
  readonly topic: string
  readonly groupId: string
  readonly policy: PolicyName
  readonly databaseUrl: string
  /** Where the handler counts each record it handled, keyed by (topic, partition, offset). */
  readonly resultsTable: string
  /** The positions of `transactional` (a `PgOffsetStore` table, or a `SqlOffsetStore` one in MariaDB). */
  readonly offsetsTable: string
  /**
   * Under `transactional`: keep the positions (`SqlOffsetStore`) and the results table in this MariaDB (or MySQL)
   * database, written through the member's own `SqlClient`, instead of Postgres.
   */
  readonly mysqlUrl: string | undefined
  readonly clientId: string
  readonly maxPollRecords: number
  /** Time the handler spends on each chunk, half before its write and half after, as real work would. */
  readonly handlerMillis: number
  readonly sessionTimeoutMillis: number
  /** The consumer's `ordering`: `partition` (the default), `key` or `unordered`. */
  readonly ordering: Ordering
  /** Handler calls in flight under `key` and `unordered` ordering. */
  readonly concurrency: number
  /**
   * With it, the member decodes values as JSON numbers, refuses `{"refuse": n}`, and dead-letters both kinds of poison
   * to this topic (`FailureRoute.deadLetter`).
   */
  readonly deadLetterTopic: string | undefined
  /** With a dead-letter topic: retry topics with these waits (milliseconds) before it. */
  readonly retryDelays: ReadonlyArray<number>
  /**
   * Standard input is the supervisor's pipe: a line `pace <millis>` changes the handler's time, and the end of input
   * means the supervisor is gone, so the member leaves.
   */
  readonly supervised: boolean
  /** The driver the member consumes and produces with. Default `kafkajs`. */
  readonly driver: DriverName
  /** How the group rebalances. Default `eager`. */
  readonly rebalance: RealRebalance
  /** Static membership: the client id is the member's instance id, the same on every restart. */
  readonly staticMembership: boolean
}

export class MemberConfigError extends Data.TaggedError("MemberConfigError")<{ readonly message: string }> {}

const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_]{0,62}$/

const usage = "usage: member.ts --brokers host:port --topic T --group G " +
  "--policy atMostOnce|autoCommit|commitAfter|transactional|kafkaTransactional --database-url URL " +
  "--results-table NAME " +
  "[--offsets-table NAME] [--mysql-url URL] [--client-id ID] [--max-poll-records N] [--handler-millis MS] " +
  "[--session-timeout-millis MS] [--ordering partition|key|unordered] [--concurrency N] [--dead-letter-topic T] " +
  "[--retry-delays MS,MS] " +
  "[--supervised] [--driver kafkajs|platformatic] [--rebalance eager|cooperative|consumer] [--static-membership] (or KAFKA_BROKERS, DATABASE_URL in the environment)"

/** Reads the member's settings from its arguments, with `KAFKA_BROKERS` and `DATABASE_URL` as fallbacks. */
export const parse = (
  argv: ReadonlyArray<string>,
  env: Readonly<Record<string, string | undefined>>
): Effect.Effect<MemberOptions, MemberConfigError> =>
  Effect.gen(function*() {
    const parsed = yield* Effect.try({
      try: () =>
        parseArgs({
          args: [...argv],
          strict: true,
          options: {
            brokers: { type: "string" },
            topic: { type: "string" },
            group: { type: "string" },
            policy: { type: "string" },
            "database-url": { type: "string" },
            "results-table": { type: "string" },
            "offsets-table": { type: "string" },
            "mysql-url": { type: "string" },
            "client-id": { type: "string" },
            "max-poll-records": { type: "string" },
            "handler-millis": { type: "string" },
            "session-timeout-millis": { type: "string" },
            ordering: { type: "string" },
            concurrency: { type: "string" },
            "dead-letter-topic": { type: "string" },
            "retry-delays": { type: "string" },
            supervised: { type: "boolean" },
            driver: { type: "string" },
            rebalance: { type: "string" },
            "static-membership": { type: "boolean" }
          }
        }).values,
      catch: (error) => new MemberConfigError({ message: `${String(error)}\n${usage}` })
    })
    const required = (name: string, value: string | undefined) =>
      value === undefined || value.trim() === ""
        ? Effect.fail(new MemberConfigError({ message: `--${name} is required\n${usage}` }))
        : Effect.succeed(value.trim())
    const identifier = (name: string, value: string) =>
      IDENTIFIER.test(value)
        ? Effect.succeed(value)
        : Effect.fail(new MemberConfigError({ message: `--${name} must be a plain SQL identifier, got "${value}"` }))
    const integer = (name: string, value: string | undefined, fallback: number, min: number) => {
      if (value === undefined) return Effect.succeed(fallback)
      const n = Number(value)
      return Number.isInteger(n) && n >= min
        ? Effect.succeed(n)
        : Effect.fail(new MemberConfigError({ message: `--${name} must be an integer >= ${min}, got "${value}"` }))
    }
    const delays = (text: string | undefined) => {
      if (text === undefined || text.trim() === "") return Effect.succeed([] as ReadonlyArray<number>)
      const list = text.split(",").map(Number)
      return list.every((n) => Number.isInteger(n) && n >= 0)
        ? Effect.succeed(list as ReadonlyArray<number>)
        : Effect.fail(new MemberConfigError({ message: `--retry-delays takes milliseconds, MS,MS..., got "${text}"` }))
    }
    const policy = yield* required("policy", parsed.policy)
    if (!policies.includes(policy as PolicyName)) {
      return yield* new MemberConfigError({
        message: `--policy must be one of ${policies.join(", ")}, got "${policy}"`
      })
    }
    if (parsed["mysql-url"] !== undefined && policy !== "transactional") {
      return yield* new MemberConfigError({
        message: `--mysql-url is for --policy transactional (its positions and results), got "${policy}"`
      })
    }
    const groupId = yield* required("group", parsed.group)
    const ordering = parsed.ordering ?? "partition"
    if (!orderings.includes(ordering as Ordering)) {
      return yield* new MemberConfigError({
        message: `--ordering must be one of ${orderings.join(", ")}, got "${ordering}"`
      })
    }
    const driver = parsed.driver ?? env.KAFKA_DRIVER ?? "kafkajs"
    if (!driverNames.includes(driver as DriverName)) {
      return yield* new MemberConfigError({
        message: `--driver must be one of ${driverNames.join(", ")}, got "${driver}"`
      })
    }
    const rebalance = parsed.rebalance ?? "eager"
    if (!realRebalances.includes(rebalance as RealRebalance)) {
      return yield* new MemberConfigError({
        message: `--rebalance must be one of ${realRebalances.join(", ")}, got "${rebalance}"`
      })
    }
    if (rebalance !== "eager" && driver !== "platformatic") {
      return yield* new MemberConfigError({
        message: `--rebalance ${rebalance} needs --driver platformatic: kafkajs rebalances eagerly only`
      })
    }
    return {
      brokers: yield* required("brokers", parsed.brokers ?? env.KAFKA_BROKERS),
      topic: yield* required("topic", parsed.topic),
      groupId,
      policy: policy as PolicyName,
      databaseUrl: yield* required("database-url", parsed["database-url"] ?? env.DATABASE_URL),
      resultsTable: yield* identifier("results-table", yield* required("results-table", parsed["results-table"])),
      offsetsTable: yield* identifier("offsets-table", parsed["offsets-table"] ?? "kafka_offsets"),
      mysqlUrl: parsed["mysql-url"] === undefined ? undefined : yield* required("mysql-url", parsed["mysql-url"]),
      clientId: parsed["client-id"] ?? groupId,
      maxPollRecords: yield* integer("max-poll-records", parsed["max-poll-records"], 50, 1),
      handlerMillis: yield* integer("handler-millis", parsed["handler-millis"], 0, 0),
      sessionTimeoutMillis: yield* integer("session-timeout-millis", parsed["session-timeout-millis"], 6000, 1),
      ordering: ordering as Ordering,
      concurrency: yield* integer("concurrency", parsed.concurrency, 64, 1),
      deadLetterTopic: parsed["dead-letter-topic"],
      retryDelays: yield* delays(parsed["retry-delays"]),
      supervised: parsed.supervised ?? false,
      driver: driver as DriverName,
      rebalance: rebalance as RealRebalance,
      staticMembership: parsed["static-membership"] ?? false
    }
  })

/** The command line that `parse` reads back into the same options. */
export const toArgs = (options: MemberOptions): Array<string> => [
  "--brokers",
  options.brokers,
  "--topic",
  options.topic,
  "--group",
  options.groupId,
  "--policy",
  options.policy,
  "--database-url",
  options.databaseUrl,
  "--results-table",
  options.resultsTable,
  "--offsets-table",
  options.offsetsTable,
  ...(options.mysqlUrl === undefined ? [] : ["--mysql-url", options.mysqlUrl]),
  "--client-id",
  options.clientId,
  "--max-poll-records",
  String(options.maxPollRecords),
  "--handler-millis",
  String(options.handlerMillis),
  "--session-timeout-millis",
  String(options.sessionTimeoutMillis),
  "--ordering",
  options.ordering,
  "--concurrency",
  String(options.concurrency),
  ...(options.deadLetterTopic === undefined ? [] : ["--dead-letter-topic", options.deadLetterTopic]),
  ...(options.retryDelays.length === 0 ? [] : ["--retry-delays", options.retryDelays.join(",")]),
  ...(options.supervised ? ["--supervised"] : []),
  "--driver",
  options.driver,
  "--rebalance",
  options.rebalance,
  ...(options.staticMembership ? ["--static-membership"] : [])
]
