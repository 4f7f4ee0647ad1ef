/**
 * The semantics lab against a real broker, with real processes: consumer members run as child processes
 * (`member.ts`), are killed with SIGKILL at random moments while records flow and restarted, and every record's
 * handling is counted in Postgres (or, for `transactional` with `mysqlUrl`, in MariaDB beside its positions). At the end
 * the count says, record by record, what each policy lost or duplicated.
 * `CLUSTER_VERBOSE=1` copies the members' output to standard error.
 */
import { type ChildProcess, spawn } from "node:child_process"
import * as os from "node:os"
import * as path from "node:path"
import { createInterface } from "node:readline"
import { fileURLToPath } from "node:url"
import * as Data from "effect/Data"
import * as Deferred from "effect/Deferred"
import type * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import { Kafka, logLevel } from "kafkajs"
import * as KafkaJs from "../../src/KafkaJs.js"
import { type Outcome, random } from "../lab.js"
import { readCommitted } from "../lab.js"
import {
  type DriverName,
  type MemberOptions,
  type Ordering,
  outputTopicOf,
  type PolicyName,
  type RealRebalance,
  toArgs
} from "./options.js"
import { mariadbTables, postgresTables, type ResultsFailed } from "./results.js"
import * as FailureRoute from "../../src/FailureRoute.js"

export interface RealWorkload {
  readonly policy: PolicyName
  readonly records: number
  readonly partitions: number
  readonly consumers: number
  /** SIGKILLs to deliver while records flow; each killed member is restarted at once. */
  readonly kills: number
  /**
   * Members to pause with SIGSTOP while records flow, for longer than their session, then to let go on with SIGCONT:
   * zombies, which the group has evicted meanwhile. Default 0.
   */
  readonly stops?: number
  readonly seed: number
  readonly brokers: string
  readonly databaseUrl: string
  /**
   * Under `transactional`: the positions (`SqlOffsetStore`) and the results in this MariaDB (or MySQL) database,
   * `mysql://user@host:port/database`, instead of Postgres. The other policies keep their results in Postgres.
   */
  readonly mysqlUrl?: string
  /** Two more members join (at a quarter and half of the records) and one leaves again (at three quarters). */
  readonly rebalances?: boolean
  readonly onProgress?: (p: { readonly results: number; readonly kills: number }) => void
  /**
   * Time a member's handler spends on each chunk, for the whole run. Default: paced so that records still flow for
   * every kill and move, then at full speed.
   */
  readonly handlerMillis?: number
  /** Default 20. */
  readonly maxPollRecords?: number
  /** Default 6 seconds, the broker's smallest by default. */
  readonly sessionTimeoutMillis?: number
  /** How long the whole run may take before it fails. Default 10 minutes. */
  readonly deadlineMillis?: number
  /** The members' `ordering`. Default `partition`. */
  readonly ordering?: Ordering
  /** Handler calls in flight per member under `key` and `unordered` ordering. Default 64. */
  readonly concurrency?: number
  /** Records get keys `k0` to `k<keys - 1>` in turn (each on the partition its key hashes to); without it, none. */
  readonly keys?: number
  /**
   * Share of poison records, chosen from the seed: half are not JSON (they do not decode), half are `{"refuse": n}`
   * (the handler refuses them). With any, members dead-letter them to the topic's `-dlq` topic.
   */
  readonly poisonRate?: number
  /** With poison records: the waits (milliseconds) of the retry topics they go through before the dead-letter topic. */
  readonly retryDelays?: ReadonlyArray<number>
  /** The driver the members consume and produce with. Default `kafkajs`. */
  readonly driver?: DriverName
  /** How the members' group rebalances (`cooperative` needs the `platformatic` driver). Default `eager`. */
  readonly rebalance?: RealRebalance
  /**
   * Static membership: each member's instance id is its slot's name, the same after a restart (`platformatic` only).
   * Default `false`.
   */
  readonly staticMembership?: boolean
  /**
   * Each kill waits until every member shares the partitions: the first kill until the group formed, each later one
   * until the restarted member is back in it, so that every kill is a membership change of its own, with members that
   * stayed. Default `false`.
   */
  readonly settleFirst?: boolean
}

export interface RealOutcome extends Outcome {
  /** Members that exited without being killed or stopped (a lost broker, say), and were restarted. */
  readonly unexpectedExits: number
  readonly handlerMillis: number
}

export class ClusterRunError extends Data.TaggedError("ClusterRunError")<{ readonly message: string }> {}

const memberScript = fileURLToPath(new URL("./member.ts", import.meta.url))
const projectDir = path.resolve(path.dirname(memberScript), "../..")

// ---------------------------------------------------------------------------------------------------------------------
// member processes
// ---------------------------------------------------------------------------------------------------------------------

/** Every member process this process started and that still runs; killed when this process exits. */
const everyChild = new Set<ChildProcess>()
let exitHookInstalled = false

const installExitHook = () => {
  if (exitHookInstalled) return
  exitHookInstalled = true
  process.once("exit", () => {
    for (const child of everyChild) child.kill("SIGKILL")
  })
}

interface Member {
  readonly name: string
  readonly child: ChildProcess
  /** Partitions the member announced as assigned and not yet revoked. */
  readonly owned: Set<string>
  killed: boolean
  stopping: boolean
  readonly exited: Deferred.Deferred<{ readonly code: number | null; readonly signal: NodeJS.Signals | null }>
  /** The last lines the process wrote, for the error message when it fails. */
  readonly tail: Array<string>
}

const remember = (tail: Array<string>, line: string) => {
  tail.push(line)
  if (tail.length > 40) tail.shift()
}

/** The partitions the members announce as revoked and assigned, while `counting`. */
interface MoveCount {
  counting: boolean
  revoked: number
  assigned: number
}

const startMember = (
  name: string,
  options: MemberOptions,
  running: Set<Member>,
  moves: MoveCount
): Effect.Effect<Member> =>
  Effect.gen(function*() {
    installExitHook()
    const exited = yield* Deferred.make<{ readonly code: number | null; readonly signal: NodeJS.Signals | null }>()
    const child = spawn(process.execPath, ["--import", "tsx", memberScript, ...toArgs(options)], {
      cwd: projectDir,
      // The member leaves when this pipe closes, so that it cannot outlive this process.
      stdio: ["pipe", "pipe", "pipe"],
      env: { ...process.env, KAFKAJS_NO_PARTITIONER_WARNING: "1" }
    })
    // Members run below the driver's scheduling priority: on a small machine, however busy the members are, the driver
    // (its kills and audits, and a test runner's own messages) keeps up.
    if (child.pid !== undefined) {
      try {
        os.setPriority(child.pid, 10)
      } catch {
        // a platform without priorities: the members run at the driver's
      }
    }
    const member: Member = { name, child, owned: new Set(), killed: false, stopping: false, exited, tail: [] }
    everyChild.add(child)
    running.add(member)
    const verbose = process.env.CLUSTER_VERBOSE === "1"
    createInterface({ input: child.stdout! }).on("line", (line) => {
      if (line.startsWith("assigned ")) {
        member.owned.add(line.slice("assigned ".length))
        if (moves.counting) moves.assigned++
      } else if (line.startsWith("revoked ")) {
        member.owned.delete(line.slice("revoked ".length))
        if (moves.counting) moves.revoked++
      } else if (line !== "ready") remember(member.tail, line)
      if (verbose) process.stderr.write(`[${name} ${child.pid}] ${line}\n`)
    })
    createInterface({ input: child.stderr! }).on("line", (line) => {
      remember(member.tail, line)
      if (verbose) process.stderr.write(`[${name} ${child.pid}] ${line}\n`)
    })
    child.stdin!.on("error", () => {})
    const done = (code: number | null, signal: NodeJS.Signals | null) => {
      everyChild.delete(child)
      running.delete(member)
      member.owned.clear()
      Deferred.unsafeDone(exited, Effect.succeed({ code, signal }))
    }
    child.once("exit", done)
    child.once("error", (error) => {
      remember(member.tail, `spawn failed: ${error.message}`)
      done(-1, null)
    })
    return member
  })

const signal = (member: Member, signal: NodeJS.Signals) =>
  Effect.sync(() => {
    if (member.child.exitCode === null && member.child.signalCode === null) member.child.kill(signal)
  })

/** SIGTERM, then SIGKILL if the member has not left within the deadline. */
const stopMember = (member: Member, deadline: Duration.DurationInput) =>
  Effect.gen(function*() {
    member.stopping = true
    yield* signal(member, "SIGTERM")
    const left = yield* Deferred.await(member.exited).pipe(Effect.timeoutOption(deadline))
    if (Option.isNone(left)) {
      yield* Effect.logWarning(`member ${member.name} did not leave within ${deadline} of SIGTERM; killing it`)
      yield* signal(member, "SIGKILL")
      yield* Deferred.await(member.exited).pipe(Effect.timeoutOption("10 seconds"))
    }
  })

// ---------------------------------------------------------------------------------------------------------------------
// the run
// ---------------------------------------------------------------------------------------------------------------------

const validate = (workload: RealWorkload) =>
  Effect.gen(function*() {
    const positive = (field: string, value: number, min = 1) =>
      Number.isInteger(value) && value >= min
        ? Effect.void
        : Effect.fail(new ClusterRunError({ message: `${field} must be an integer >= ${min}, got ${value}` }))
    yield* positive("records", workload.records)
    yield* positive("partitions", workload.partitions)
    yield* positive("consumers", workload.consumers)
    yield* positive("kills", workload.kills, 0)
    if (workload.handlerMillis !== undefined) yield* positive("handlerMillis", workload.handlerMillis, 0)
    yield* KafkaJs.parseBrokers(workload.brokers)
  })

/**
 * The output of a `kafkaTransactional` run read `read_committed`, as a tally per input partition: each output record
 * names the input record it was made from (`<partition>@<offset>`).
 */
const outputTally = (brokers: string, topic: string, partitions: number) =>
  Effect.gen(function*() {
    const records = yield* readCommitted(outputTopicOf(topic), partitions).pipe(
      Effect.provide(KafkaJs.layer({ brokers: brokers.split(","), clientId: "cluster-lab-audit", logLevel: "error" }))
    )
    const counts = new Map<string, number>()
    const decoder = new TextDecoder()
    for (const r of records) {
      const k = r.value === null ? "" : decoder.decode(r.value)
      counts.set(k, (counts.get(k) ?? 0) + 1)
    }
    const out = new Map<number, { partition: number; handled: number; deliveries: number }>()
    for (const [k, n] of counts) {
      const partition = Number(k.slice(0, k.indexOf("@")))
      const t = out.get(partition) ?? { partition, handled: 0, deliveries: 0 }
      t.handled++
      t.deliveries += n
      out.set(partition, t)
    }
    return Array.from(out.values())
  }).pipe(Effect.mapError((e) => new ClusterRunError({ message: `reading the output failed: ${String(e)}` })))

/** The topic a run with poison records dead-letters them to. */
const deadLetterTopic = (topic: string) => `${topic}-dlq`

const decoder = new TextDecoder()

/**
 * The dead-letter topic read `read_committed`: the records it holds (`<partition>@<offset>` of the source, once
 * each), how many per source partition, the copies beyond the first, and the records there that were not poison.
 */
const deadLetterAudit = (brokers: string, topic: string, partitions: number) =>
  Effect.gen(function*() {
    const records = yield* readCommitted(deadLetterTopic(topic), partitions).pipe(
      Effect.provide(KafkaJs.layer({ brokers: brokers.split(","), clientId: "cluster-lab-audit", logLevel: "error" }))
    )
    const seen = new Set<string>()
    const byPartition = new Map<number, number>()
    let repeats = 0
    let misrouted = 0
    for (const record of records) {
      const letter = FailureRoute.deadLettered(record)
      if (letter === undefined || letter.topic !== topic) {
        misrouted++
        continue
      }
      const value = record.value === null ? "" : decoder.decode(record.value)
      if (/^\d+$/.test(value)) misrouted++
      const k = `${letter.partition}@${letter.offset}`
      if (seen.has(k)) {
        repeats++
        continue
      }
      seen.add(k)
      byPartition.set(letter.partition, (byPartition.get(letter.partition) ?? 0) + 1)
    }
    return { keys: Array.from(seen), byPartition, repeats, misrouted }
  }).pipe(Effect.mapError((e) => new ClusterRunError({ message: `reading the dead letters failed: ${String(e)}` })))

/** How many of these records (`<partition>@<offset>`) a `kafkaTransactional` run wrote output for. */
const outputHolds = (brokers: string, topic: string, partitions: number, keys: ReadonlyArray<string>) =>
  readCommitted(outputTopicOf(topic), partitions).pipe(
    Effect.provide(KafkaJs.layer({ brokers: brokers.split(","), clientId: "cluster-lab-audit", logLevel: "error" })),
    Effect.map((records) => {
      const written = new Set(records.map((r) => r.value === null ? "" : decoder.decode(r.value)))
      return keys.filter((k) => written.has(k)).length
    }),
    Effect.mapError((e) => new ClusterRunError({ message: `reading the output failed: ${String(e)}` }))
  )

const tryPromise = <A>(what: string, f: () => Promise<A>) =>
  Effect.tryPromise({
    try: f,
    catch: (cause) =>
      new ClusterRunError({ message: `${what} failed: ${cause instanceof Error ? cause.message : String(cause)}` })
  })

const inTables = <A, R>(what: string, effect: Effect.Effect<A, ResultsFailed, R>) =>
  Effect.mapError(effect, (error) => new ClusterRunError({ message: `${what} failed: ${error.message}` }))

/** The MariaDB a `transactional` run keeps its positions and results in, if any; the other runs use Postgres. */
const mysqlUrlOf = (workload: RealWorkload) => workload.policy === "transactional" ? workload.mysqlUrl : undefined

/** The run's tables, created for it and dropped at the end of the scope: in MariaDB with `mysqlUrlOf`, else Postgres. */
const runTables = (workload: RealWorkload, resultsTable: string, offsetsTable: string) => {
  const mysqlUrl = mysqlUrlOf(workload)
  const options = { resultsTable, offsetsTable, transactional: workload.policy === "transactional" }
  return mysqlUrl === undefined
    ? inTables(
      `creating the tables in ${workload.databaseUrl}`,
      postgresTables({ ...options, url: workload.databaseUrl })
    )
    : inTables(`creating the tables in ${mysqlUrl}`, mariadbTables({ ...options, url: mysqlUrl }))
}

/**
 * Runs the workload to the end and counts what the handlers did: every partition's position (Kafka's committed
 * offset, or the offsets table under `transactional`) reaches the end of the topic, then the members stop
 * cleanly. The topic, the group and the tables are removed afterwards; no member process outlives the run.
 */
let runs = 0

export const runRealWorkload = (workload: RealWorkload): Effect.Effect<RealOutcome, unknown> =>
  Effect.scoped(Effect.gen(function*() {
    yield* validate(workload)
    const rng = random(workload.seed)
    // Two runs in one process may start in the same millisecond with the same seed: the run counter keeps their
    // topics, groups and tables apart.
    const id = `${Date.now().toString(36)}_${Math.floor(rng() * 2 ** 32).toString(36)}_${process.pid}_${runs++}`
    const topic = `cluster-${workload.policy}-${id}`
    const groupId = `${topic}-group`
    const resultsTable = `cluster_results_${id}`
    const poisonRate = workload.poisonRate ?? 0
    const retryTopics = poisonRate > 0
      ? (workload.retryDelays ?? []).map((_, step) => FailureRoute.retryTopic(topic, step))
      : []
    const offsetsTable = `cluster_offsets_${id}`
    const maxPollRecords = workload.maxPollRecords ?? 20
    const chunksPerPartition = Math.max(1, Math.ceil(workload.records / workload.partitions / maxPollRecords))
    // Records must outlast the kills: each kill needs about a second and a half of flow, besides the rebalance
    // stalls, which are not counted here since nothing flows then.
    const stops = workload.stops ?? 0
    const sessionTimeoutMillis = workload.sessionTimeoutMillis ?? 6_000
    const flowMillis = 5_000 + workload.kills * 1_500 + (workload.rebalances === true ? 20_000 : 0) +
      stops * (sessionTimeoutMillis + 6_000)
    const handlerMillis = workload.handlerMillis ?? Math.min(1_000, Math.round(flowMillis / chunksPerPartition))

    const tables = yield* runTables(workload, resultsTable, offsetsTable)

    const brokers = Array.from(yield* KafkaJs.parseBrokers(workload.brokers))
    const admin = new Kafka({ clientId: "cluster-lab", brokers, logLevel: logLevel.NOTHING }).admin()
    yield* Effect.acquireRelease(
      tryPromise(`connecting to Kafka at ${workload.brokers}`, () => admin.connect()),
      () =>
        Effect.gen(function*() {
          yield* tryPromise("deleting the group", () => admin.deleteGroups([groupId])).pipe(Effect.ignore)
          yield* tryPromise("deleting the topics", () =>
            admin.deleteTopics({
              topics: [
                topic,
                ...(workload.policy === "kafkaTransactional" ? [outputTopicOf(topic)] : []),
                ...(poisonRate > 0 ? [deadLetterTopic(topic)] : []),
                ...retryTopics
              ]
            })).pipe(Effect.ignore)
          yield* tryPromise("disconnecting", () => admin.disconnect()).pipe(Effect.ignore)
        }).pipe(Effect.timeoutOption("20 seconds"))
    )
    yield* KafkaJs.createTopic(workload.brokers, topic, workload.partitions)
    if (workload.policy === "kafkaTransactional") {
      yield* KafkaJs.createTopic(workload.brokers, outputTopicOf(topic), workload.partitions)
    }
    if (poisonRate > 0) yield* KafkaJs.createTopic(workload.brokers, deadLetterTopic(topic), workload.partitions)
    for (const retry of retryTopics) yield* KafkaJs.createTopic(workload.brokers, retry, workload.partitions)
    // Poison records are chosen by a generator of their own, so that the same seed kills at the same moments.
    const poisonRng = random(workload.seed ^ 0x5bd1e995)
    let poison = 0
    const valueOf = (i: number) => {
      if (poisonRate === 0 || poisonRng() >= poisonRate) return String(i)
      poison++
      return i % 2 === 0 ? JSON.stringify({ refuse: i }) : `poison-${i}`
    }
    yield* KafkaJs.produce(
      workload.brokers,
      topic,
      Array.from({ length: workload.records }, (_, i) =>
        workload.keys === undefined
          ? { partition: i % workload.partitions, value: valueOf(i) }
          : { key: `k${i % workload.keys}`, value: valueOf(i) })
    )
    const end = yield* KafkaJs.endOffsets(workload.brokers, topic)

    const positionsOf = (
      of: string
    ): Effect.Effect<ReadonlyMap<number, bigint>, ClusterRunError> =>
      workload.policy === "transactional"
        ? inTables("reading stored positions", tables.storedPositions(groupId, of))
        : tryPromise("reading committed offsets", async () => {
          const response = await admin.fetchOffsets({ groupId, topics: [of] })
          const out = new Map<number, bigint>()
          for (const t of response) for (const p of t.partitions) out.set(p.partition, BigInt(p.offset))
          return out
        })
    const positions = positionsOf(topic)
    // A broker that is starting or restarting answers with errors for a while; the run's deadline bounds the wait.
    // Records on their way through retry topics are not done either.
    const atEnd = Effect.gen(function*() {
      const ps = yield* positions
      if (!Array.from(end).every(([p, e]) => (ps.get(p) ?? -1n) >= e)) return false
      for (const retry of retryTopics) {
        const ends = yield* KafkaJs.endOffsets(workload.brokers, retry)
        const at = yield* positionsOf(retry)
        if (!Array.from(ends).every(([p, e]) => e === 0n || (at.get(p) ?? -1n) >= e)) return false
      }
      return true
    }).pipe(Effect.catchAll((error) => Effect.as(Effect.logDebug(error.message), false)))

    const memberOptions = (name: string): MemberOptions => ({
      brokers: workload.brokers,
      topic,
      groupId,
      policy: workload.policy as PolicyName,
      databaseUrl: workload.databaseUrl,
      resultsTable,
      offsetsTable,
      mysqlUrl: mysqlUrlOf(workload),
      clientId: `${workload.policy}-${name}`,
      maxPollRecords,
      handlerMillis: disturbancesLeft > 0 ? handlerMillis : 0,
      sessionTimeoutMillis,
      ordering: workload.ordering ?? "partition",
      concurrency: workload.concurrency ?? 64,
      deadLetterTopic: poisonRate > 0 ? deadLetterTopic(topic) : undefined,
      retryDelays: poisonRate > 0 ? workload.retryDelays ?? [] : [],
      supervised: true,
      driver: workload.driver ?? "kafkajs",
      rebalance: workload.rebalance ?? "eager",
      staticMembership: workload.staticMembership ?? false
    })
    const moves: MoveCount = { counting: true, revoked: 0, assigned: 0 }
    // Joins (after the first members), restarts, leaves, kills and evictions.
    let changes = 0

    let kills = 0
    let rebalances = 0
    // The handlers are paced while kills or moves remain, then the rest of the records go at full speed.
    // A pace given by the caller holds for the whole run.
    let disturbancesLeft = (workload.kills > 0 ? 1 : 0) + (workload.rebalances === true ? 1 : 0) +
      (stops > 0 ? 1 : 0) + (workload.handlerMillis === undefined ? 0 : 1)
    const disturbed = Effect.sync(() => {
      disturbancesLeft--
      if (disturbancesLeft > 0) return
      for (const member of current.values()) member.child.stdin?.write("pace 0\n")
    })

    // Slots: each keeps one member process running, restarting it when it is killed or dies, until stopped.
    const current = new Map<string, Member>()
    const running = new Set<Member>()
    const stopped = new Set<string>()
    const failure = yield* Deferred.make<never, ClusterRunError>()
    let unexpectedExits = 0
    let fenced = 0
    yield* Effect.addFinalizer(() =>
      Effect.forEach(
        Array.from(running),
        (m) =>
          signal(m, "SIGKILL").pipe(Effect.zipRight(Deferred.await(m.exited).pipe(Effect.timeoutOption("10 seconds")))),
        {
          discard: true,
          concurrency: "unbounded"
        }
      )
    )

    const slot = (name: string) =>
      Effect.gen(function*() {
        let starts = 0
        while (!stopped.has(name)) {
          if (starts++ > 0 || name.startsWith("extra-")) changes++
          const member = yield* startMember(name, memberOptions(name), running, moves)
          current.set(name, member)
          const exit = yield* Deferred.await(member.exited)
          current.delete(name)
          if (member.stopping || member.killed) continue
          // A zombie refused by the offset store ends with `Fenced`; like any member that stops, it is restarted.
          if (member.tail.some((line) => line.includes("Fenced"))) {
            fenced++
            continue
          }
          unexpectedExits++
          const detail = `member ${name} exited on its own (code ${exit.code}, signal ${exit.signal}):\n  ` +
            member.tail.join("\n  ")
          if (unexpectedExits > 10 + workload.kills) {
            return yield* Deferred.fail(
              failure,
              new ClusterRunError({ message: `too many unexpected exits; last: ${detail}` })
            )
          }
          yield* Effect.logWarning(detail)
          // A member that cannot start must not be restarted in a tight loop.
          yield* Effect.sleep("1 second")
        }
      }).pipe(Effect.asVoid)
    const slots = new Map<string, Fiber.RuntimeFiber<void>>()
    const startSlot = (name: string) =>
      Effect.map(Effect.forkScoped(slot(name)), (fiber) => void slots.set(name, fiber))
    const stopSlot = (name: string) =>
      Effect.gen(function*() {
        stopped.add(name)
        const member = current.get(name)
        if (member !== undefined) yield* stopMember(member, "60 seconds")
        const fiber = slots.get(name)
        if (fiber !== undefined) yield* Fiber.interrupt(fiber)
      })

    const startedAt = Date.now()
    for (let i = 1; i <= workload.consumers; i++) yield* startSlot(`member-${i}`)

    let handled = 0
    // Under kafkaTransactional nothing is written to Postgres: how far the group's committed positions have got says
    // how many records went into committed transactions.
    const progress = workload.policy === "kafkaTransactional"
      ? Effect.map(positions, (ps) => {
        let n = 0
        for (const at of ps.values()) if (at > 0n) n += Number(at)
        return n
      })
      : inTables("reading progress", tables.handledCount(topic))
    const reporter = Effect.gen(function*() {
      handled = yield* progress
      workload.onProgress?.({ results: handled, kills })
    }).pipe(Effect.repeat(Schedule.spaced("250 millis")))
    yield* Effect.forkScoped(reporter.pipe(Effect.catchAll((e) => Deferred.fail(failure, e))))

    const waitFor = (what: string, condition: () => boolean, deadline: Duration.DurationInput) =>
      Effect.sync(condition).pipe(
        Effect.repeat({ schedule: Schedule.spaced("100 millis"), until: (ok) => ok }),
        Effect.timeoutFail({
          duration: deadline,
          onTimeout: () => new ClusterRunError({ message: `timed out after ${deadline} waiting for ${what}` })
        })
      )

    // Every member is up and owns partitions, and together they own them all.
    const shared = () => {
      const members = Array.from(current.values())
      return members.length === workload.consumers && members.every((m) => m.owned.size > 0 && !m.killed) &&
        new Set(members.flatMap((m) => Array.from(m.owned))).size === workload.partitions
    }
    // The moves are counted from the moment the first members share every partition: how the group formed is not a
    // membership change's.
    const formed = yield* Deferred.make<void>()
    yield* Effect.forkScoped(
      waitFor(
        "the first members to share the partitions",
        () => changes === 0 && shared(),
        "10 minutes"
      ).pipe(
        Effect.zipRight(Effect.sync(() => {
          moves.revoked = 0
          moves.assigned = 0
        })),
        Effect.zipRight(Deferred.succeed(formed, undefined)),
        Effect.ignore
      )
    )

    // Kills at random moments, only while records flow and only members that own partitions at that moment.
    const killer = Effect.gen(function*() {
      if (workload.settleFirst === true) yield* Deferred.await(formed)
      let handledAtLastKill = 0
      while (kills < workload.kills) {
        yield* Effect.sleep(300 + Math.floor(rng() * 2_200))
        if (workload.settleFirst === true && kills > 0) {
          yield* waitFor("the restarted member to be back in the group", shared, "120 seconds")
        }
        yield* waitFor(
          "records to flow before the next kill",
          () =>
            handled > handledAtLastKill &&
            Array.from(current.values()).some((m) => m.owned.size > 0 && !m.killed && !m.stopping),
          "120 seconds"
        )
        const candidates = Array.from(current.values()).filter((m) => m.owned.size > 0 && !m.killed && !m.stopping)
        const victim = candidates[Math.floor(rng() * candidates.length)]
        if (victim === undefined) continue
        victim.killed = true
        yield* signal(victim, "SIGKILL")
        kills++
        changes++
        handledAtLastKill = handled
      }
      if (workload.kills > 0) yield* disturbed
    })
    const killerFiber = yield* Effect.forkScoped(killer.pipe(Effect.catchAll((e) => Deferred.fail(failure, e))))

    // Zombies: a member that owns partitions stops (SIGSTOP) for longer than its session, so that the group evicts
    // it and moves its partitions, then goes on (SIGCONT) as if nothing had happened. It must find out, give up what
    // it lost and rejoin, without exiting.
    let paused = 0
    const stopper = Effect.gen(function*() {
      while (paused < stops) {
        yield* Effect.sleep(500 + Math.floor(rng() * 1_500))
        yield* waitFor(
          "records to flow before the next stop",
          () => Array.from(current.values()).some((m) => m.owned.size > 0 && !m.killed && !m.stopping),
          "120 seconds"
        )
        const candidates = Array.from(current.values()).filter((m) => m.owned.size > 0 && !m.killed && !m.stopping)
        const victim = candidates[Math.floor(rng() * candidates.length)]
        if (victim === undefined) continue
        yield* signal(victim, "SIGSTOP")
        changes++
        yield* Effect.sleep(sessionTimeoutMillis + 4_000).pipe(Effect.ensuring(signal(victim, "SIGCONT")))
        paused++
      }
      if (stops > 0) yield* disturbed
    })
    const stopperFiber = yield* Effect.forkScoped(stopper.pipe(Effect.catchAll((e) => Deferred.fail(failure, e))))

    let leaving = false
    // Members join at a quarter and at half of the records; the first of them leaves again at three quarters.
    const mover = Effect.gen(function*() {
      const share = (n: number) => Math.floor((workload.records * n) / 4)
      yield* waitFor("a quarter of the records", () => handled >= share(1), "10 minutes")
      rebalances++
      yield* startSlot("extra-1")
      yield* waitFor("half of the records", () => handled >= share(2), "10 minutes")
      rebalances++
      yield* startSlot("extra-2")
      yield* waitFor("three quarters of the records", () => handled >= share(3), "10 minutes")
      rebalances++
      leaving = true
      changes++
      yield* stopSlot("extra-1")
      leaving = false
      yield* disturbed
    })
    const moverFiber = workload.rebalances === true
      ? Option.some(yield* Effect.forkScoped(mover.pipe(Effect.catchAll((e) => Deferred.fail(failure, e)))))
      : Option.none()

    const deadline = workload.deadlineMillis ?? 600_000
    const finished = atEnd.pipe(
      Effect.repeat({ schedule: Schedule.spaced("250 millis"), until: (ok) => ok }),
      Effect.timeoutFail({
        duration: deadline,
        onTimeout: () =>
          new ClusterRunError({
            message: `the group did not reach the end of ${topic} within ${deadline} ms (${handled} of ` +
              `${workload.records} records handled, ${kills} kills)`
          })
      })
    )
    yield* Effect.raceFirst(finished, Deferred.await(failure))
    yield* Fiber.interrupt(killerFiber)
    yield* Fiber.interrupt(stopperFiber)
    if (Option.isSome(moverFiber)) {
      // A leave that has begun is let finish, so that the member leaves cleanly.
      if (leaving) yield* Fiber.await(moverFiber.value).pipe(Effect.timeoutOption("90 seconds"))
      yield* Fiber.interrupt(moverFiber.value)
    }
    // Leaving cleanly: every member finishes its in-flight work and commits or stores its final positions. These
    // revokes are not a membership change's.
    moves.counting = false
    yield* Effect.forEach(Array.from(slots.keys()), stopSlot, { concurrency: "unbounded", discard: true })
    const elapsedMillis = Date.now() - startedAt

    const tally = workload.policy === "kafkaTransactional"
      ? yield* outputTally(workload.brokers, topic, workload.partitions)
      : yield* inTables("reading the results", tables.tallyByPartition(topic))
    const letters = poisonRate > 0 ? yield* deadLetterAudit(workload.brokers, topic, workload.partitions) : undefined
    let lost = 0
    let duplicated = 0
    let delivered = 0
    for (const [partition, e] of end) {
      const t = tally.find((x) => x.partition === partition)
      lost += Number(e) - (t?.handled ?? 0) - (letters?.byPartition.get(partition) ?? 0)
      duplicated += (t?.deliveries ?? 0) - (t?.handled ?? 0)
      delivered += t?.deliveries ?? 0
    }
    // Records both handled and dead-lettered: counted once too few as lost above.
    const both = letters === undefined ? 0 : workload.policy === "kafkaTransactional"
      ? yield* outputHolds(workload.brokers, topic, workload.partitions, letters.keys)
      : yield* inTables("reading the results", tables.handledAmong(topic, letters.keys))
    lost += both
    workload.onProgress?.({ results: handled, kills })
    return {
      policy: workload.policy,
      produced: workload.records,
      delivered,
      lost,
      duplicated,
      crashes: kills,
      rebalances,
      // kafkajs does not expose the group generation (its admin API does not return it).
      generation: 0,
      fenced,
      zombies: paused,
      elapsedMillis,
      moves: { changes, revoked: moves.revoked, assigned: moves.assigned },
      unexpectedExits,
      handlerMillis,
      poison,
      deadLettered: letters?.keys.length ?? 0,
      deadLetterRepeats: letters?.repeats ?? 0,
      handledAndDeadLettered: both,
      misrouted: letters?.misrouted ?? 0
    } satisfies RealOutcome
  }))
