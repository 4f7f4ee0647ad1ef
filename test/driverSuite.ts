/**
 * The `Driver` contract as a behaviour suite, written once and run against every implementation (kafkajs on a real
 * broker, the in-memory broker). Each implementation supplies its `Driver` layer and a `DriverTestKit` layer.
 *
 * The suite runs on real time: waits are on conditions, with deadlines.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import type * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import * as Scope from "effect/Scope"
import { inspect } from "node:util"
import type { ConsumerRecord } from "../src/ConsumerRecord.js"
import { toPlain, valueString } from "../src/ConsumerRecord.js"
import type { DriverEvent, DriverSession, IsolationLevel, Subscription } from "../src/Driver.js"
import { Driver } from "../src/Driver.js"
import { CommitFailed, DriverError } from "../src/KafkaError.js"
import * as OffsetBatch from "../src/OffsetBatch.js"
import * as TopicPartition from "../src/TopicPartition.js"

/**
 * What the suite needs from a cluster besides the driver: topics, records (plain, keyed, in transactions),
 * compaction, deleted records, end offsets.
 */
export class DriverTestKit extends Context.Tag("test/DriverTestKit")<DriverTestKit, {
  /**
   * Creates a topic. A `compacted` topic keeps only the latest record of each key once `compact` has run (on Kafka:
   * `cleanup.policy=compact`, with settings that let the log cleaner run soon).
   */
  readonly createTopic: (
    topic: string,
    partitions: number,
    options?: { readonly compacted?: boolean }
  ) => Effect.Effect<void, unknown>
  /** Appends records with these values to one partition, in order. */
  readonly produce: (topic: string, partition: number, values: ReadonlyArray<string>) => Effect.Effect<void, unknown>
  /** Appends records with these keys and values to one partition, in order. */
  readonly produceKeyed: (
    topic: string,
    partition: number,
    entries: ReadonlyArray<readonly [key: string, value: string]>
  ) => Effect.Effect<void, unknown>
  /** Appends records with these keys (none when `null`), values, headers and timestamps to one partition, in order. */
  readonly produceRecords: (
    topic: string,
    partition: number,
    records: ReadonlyArray<ProducedRecord>
  ) => Effect.Effect<void, unknown>
  /**
   * Appends these values to one partition in one transaction of a transactional producer, which commits or aborts
   * it. The transaction leaves a marker at the offset after its records; the records of an aborted one are never read.
   */
  readonly produceTransaction: (
    topic: string,
    partition: number,
    values: ReadonlyArray<string>,
    outcome: "commit" | "abort"
  ) => Effect.Effect<void, unknown>
  /** Returns once every partition of a compacted topic holds only the latest record of each key. */
  readonly compact: (topic: string) => Effect.Effect<void, unknown>
  /** Deletes the partition's records below `before`: its earliest offset becomes `before`. */
  readonly deleteRecords: (topic: string, partition: number, before: bigint) => Effect.Effect<void, unknown>
  /** Per partition, the offset the next record will get. */
  readonly endOffsets: (topic: string) => Effect.Effect<ReadonlyMap<number, bigint>, unknown>
}>() {}

/** Transactions left open, for the tests of what an open transaction does to reads. */
export class DriverTestTransactions extends Context.Tag("test/DriverTestTransactions")<DriverTestTransactions, {
  /**
   * Begins a transaction of a new transactional producer that writes `values` to one partition and, with `offsets`,
   * sends a position of the topic for a group with it (`sendOffsetsToTransaction`), and leaves it open. `end` commits
   * or aborts it and returns once its marker is in the partition's log (when it wrote records). Closing the scope
   * aborts a transaction still open.
   */
  readonly openTransaction: (
    topic: string,
    partition: number,
    values: ReadonlyArray<string>,
    offsets?: { readonly groupId: string; readonly partition: number; readonly next: bigint }
  ) => Effect.Effect<OpenTransaction, unknown, Scope.Scope>
}>() {}

/** A transaction begun by `DriverTestTransactions.openTransaction`, still open. */
export interface OpenTransaction {
  readonly end: (outcome: "commit" | "abort") => Effect.Effect<void, unknown>
}

/** A record for `DriverTestKit.produceRecords`. */
export interface ProducedRecord {
  readonly key: string | null
  readonly value: string | null
  readonly headers: Readonly<Record<string, string>>
  readonly timestamp: number
}

/**
 * Timing of the sessions the suite opens; defaults suit a real broker.
 */
export interface DriverSuiteOptions {
  readonly sessionTimeout?: Duration.DurationInput
  readonly rebalanceTimeout?: Duration.DurationInput
  readonly pollTimeout?: Duration.DurationInput
  /** How long a wait on a condition may take before the test fails. */
  readonly deadline?: Duration.DurationInput
  /**
   * How long a driver may take, once it handed over a record of one partition, to hand over what the same fetch, or
   * an earlier one, found in another (default 3 seconds). The in-memory broker hands a whole fetch over in one poll:
   * 0, so that what it leaves out fails at once.
   */
  readonly settle?: Duration.DurationInput
  /** vitest timeout of each test, in milliseconds. */
  readonly testTimeout?: number
  /**
   * `false` for a driver whose groups rebalance incrementally: the tests of how members hand partitions over, which
   * expect every rebalance to revoke everything a member owns, are left out (the incremental hand-overs have tests of
   * their own). Default `true`.
   */
  readonly eagerRevokes?: boolean
}

/** One `Records` event as the member saw it. */
interface Chunk {
  readonly from: bigint
  readonly next: bigint
  readonly offsets: ReadonlyArray<bigint>
}

/** One member as a test sees it: what it owns, what it fetched, which revokes wait for `release`. */
interface Member {
  readonly name: string
  readonly session: DriverSession
  readonly owned: Set<string>
  readonly records: Map<string, Array<ConsumerRecord>>
  readonly chunks: Map<string, Array<Chunk>>
  /** Per partition, where the member expects the next `Records` to start: where it sought, or the last `next`. */
  readonly positions: Map<string, bigint>
  readonly outOfRange: Array<{ readonly key: string; readonly position: bigint }>
  readonly log: Array<string>
  readonly pendingRevokes: Array<Extract<DriverEvent, { _tag: "Revoked" }>>
  revocations: number
  readonly autoRelease: boolean
  /** The most records one `poll` returned for one partition. */
  maxPerPoll: number
}

const unique = (prefix: string) => `${prefix}-${crypto.randomUUID().slice(0, 8)}`

const tp = TopicPartition.make
const k = (topic: string, partition: number) => TopicPartition.key(tp(topic, partition))

const values = (partition: number, from: number, count: number) =>
  Array.from({ length: count }, (_, i) => `p${partition}-v${from + i}`)

const recordsOf = (m: Member, topic: string, partition: number): Array<ConsumerRecord> =>
  m.records.get(k(topic, partition)) ?? []

const offsetsOf = (m: Member, topic: string, partition: number): Array<bigint> =>
  recordsOf(m, topic, partition).map((r) => r.offset)

const valuesOf = (m: Member, topic: string, partition: number): Array<string | null> =>
  recordsOf(m, topic, partition).map(valueString)

const chunksOf = (m: Member, topic: string, partition: number): Array<Chunk> => m.chunks.get(k(topic, partition)) ?? []

const total = (m: Member) => Array.from(m.records.values()).reduce((n, rs) => n + rs.length, 0)

const range = (from: number, to: number): Array<bigint> => Array.from({ length: to - from }, (_, i) => BigInt(from + i))

const sortedKeys = (keys: Iterable<string>) =>
  Array.from(keys).map(TopicPartition.fromKey).sort(TopicPartition.compare).map(TopicPartition.key)

const keyString = (r: ConsumerRecord) => r.key === null ? null : new TextDecoder().decode(r.key)

/**
 * Registers the suite under `name`. `env` is provided to each test afresh (a new driver and kit per test); every test
 * uses topics and groups of its own.
 */
export const driverSuite = (
  name: string,
  env: Layer.Layer<Driver | DriverTestKit | DriverTestTransactions, unknown>,
  options: DriverSuiteOptions = {}
): void => {
  const deadline = Duration.decode(options.deadline ?? "30 seconds")
  const testTimeout = options.testTimeout ?? 90_000
  const sessionTimeout = Duration.decode(options.sessionTimeout ?? "10 seconds")
  /** Long enough that a member holding a revoke would have been evicted had nothing kept its session. */
  const holdLonger = Duration.sum(sessionTimeout, Duration.seconds(2))

  const sessionOptions = (
    groupId: string,
    subscription: Subscription,
    member: string,
    maxPollRecords: number,
    isolationLevel: IsolationLevel = "read_committed"
  ) => ({
    isolationLevel,
    groupId,
    clientId: member,
    subscription,
    maxPollRecords,
    pollTimeout: Duration.decode(options.pollTimeout ?? "200 millis"),
    sessionTimeout,
    rebalanceTimeout: Duration.decode(options.rebalanceTimeout ?? "20 seconds")
  })

  /**
   * Connects a member. Like the runloop, it positions every assigned partition at its committed position, or at the
   * earliest offset when nothing was committed, before it looks at records.
   */
  const join = (
    memberName: string,
    groupId: string,
    subscription: Subscription,
    config: {
      readonly autoRelease?: boolean
      readonly maxPollRecords?: number
      readonly isolationLevel?: IsolationLevel
    } = {}
  ) =>
    Effect.gen(function*() {
      const driver = yield* Driver
      const session = yield* driver.connect(
        sessionOptions(groupId, subscription, memberName, config.maxPollRecords ?? 500, config.isolationLevel)
      )
      const member: Member = {
        name: memberName,
        session,
        owned: new Set(),
        records: new Map(),
        chunks: new Map(),
        positions: new Map(),
        outOfRange: [],
        log: [],
        pendingRevokes: [],
        revocations: 0,
        autoRelease: config.autoRelease ?? true,
        maxPerPoll: 0
      }
      return member
    })

  /** Seeks like the runloop: the partition's next `Records` must start exactly there. */
  const seekTo = (m: Member, partition: TopicPartition.TopicPartition, position: bigint) =>
    Effect.gen(function*() {
      m.positions.set(TopicPartition.key(partition), position)
      yield* m.session.seek(partition, position)
    })

  const apply = (m: Member, event: DriverEvent) =>
    Effect.gen(function*() {
      switch (event._tag) {
        case "Assigned": {
          m.log.push(`Assigned ${event.partitions.map(TopicPartition.key).join(",")}`)
          for (const p of event.partitions) m.owned.add(TopicPartition.key(p))
          const committed = yield* m.session.committed(event.partitions)
          const offsets = yield* m.session.offsets(event.partitions)
          for (const p of event.partitions) {
            const key = TopicPartition.key(p)
            const start = committed.get(key) ?? offsets.get(key)?.earliest
            assert.isDefined(start, `no start position for ${key}`)
            yield* seekTo(m, p, start!)
          }
          return
        }
        case "Revoked": {
          m.log.push(`Revoked ${event.partitions.map(TopicPartition.key).join(",")}`)
          m.revocations++
          for (const p of event.partitions) {
            m.owned.delete(TopicPartition.key(p))
            m.positions.delete(TopicPartition.key(p))
          }
          if (m.autoRelease) yield* event.release
          else m.pendingRevokes.push(event)
          return
        }
        case "Lost": {
          m.log.push(`Lost ${event.partitions.map(TopicPartition.key).join(",")}`)
          for (const p of event.partitions) {
            m.owned.delete(TopicPartition.key(p))
            m.positions.delete(TopicPartition.key(p))
          }
          return
        }
        case "OutOfRange": {
          const key = TopicPartition.key(event.partition)
          m.log.push(`OutOfRange ${key}@${event.position}`)
          assert.isTrue(m.owned.has(key), `${m.name} got OutOfRange for ${key}, which it does not own`)
          m.outOfRange.push({ key, position: event.position })
          return
        }
        case "Records": {
          const key = TopicPartition.key(event.partition)
          assert.isTrue(m.owned.has(key), `${m.name} got records of ${key}, which it does not own`)
          // The chain: every Records starts where the member sought or where the one before ended.
          assert.strictEqual(event.from, m.positions.get(key), `${m.name}: Records of ${key} start elsewhere`)
          // Empty only to move the position past offsets with nothing to read.
          assert.isTrue(event.records.length > 0 || event.next > event.from, `${m.name}: empty Records of ${key}`)
          let previous = event.from - 1n
          for (const record of event.records) {
            assert.isAbove(Number(record.offset - previous), 0, `${m.name}: ${key} offsets not increasing`)
            previous = record.offset
          }
          assert.isBelow(Number(previous - event.next), 0, `${m.name}: ${key} record at or past next ${event.next}`)
          m.positions.set(key, event.next)
          let list = m.records.get(key)
          if (list === undefined) {
            list = []
            m.records.set(key, list)
          }
          for (const record of event.records) list.push(record)
          let chunks = m.chunks.get(key)
          if (chunks === undefined) {
            chunks = []
            m.chunks.set(key, chunks)
          }
          chunks.push({ from: event.from, next: event.next, offsets: Array.from(event.records, (r) => r.offset) })
          return
        }
      }
    })

  const describeMember = (m: Member) =>
    `${m.name}: owns [${sortedKeys(m.owned).join(", ")}], records {${
      Array.from(m.records, ([key, rs]) => `${key}: ${rs.length}`).join(", ")
    }}, events [${m.log.join("; ")}]`

  /** Polls each member once and applies what it returned. */
  const pollOnce = (members: ReadonlyArray<Member>) =>
    Effect.gen(function*() {
      for (const m of members) {
        const events = yield* m.session.poll
        const perPartition = new Map<string, number>()
        for (const event of events) {
          if (event._tag === "Records") {
            const key = TopicPartition.key(event.partition)
            const n = (perPartition.get(key) ?? 0) + event.records.length
            perPartition.set(key, n)
            m.maxPerPoll = Math.max(m.maxPerPoll, n)
          }
          yield* apply(m, event)
        }
      }
    })

  /** Polls the members in turn until `condition` holds; fails after the deadline with what each member saw. */
  const pollUntil = (
    members: ReadonlyArray<Member>,
    what: string,
    condition: () => boolean,
    within: Duration.Duration = deadline
  ) =>
    Effect.gen(function*() {
      const start = Date.now()
      while (!condition()) {
        if (Date.now() - start > Duration.toMillis(within)) {
          return yield* Effect.fail(
            new Error(`timed out waiting for: ${what}\n${members.map(describeMember).join("\n")}`)
          )
        }
        yield* pollOnce(members)
      }
    })

  /** Opens a member in a scope of its own, so that the test decides when it leaves. */
  const joinInOwnScope = (
    memberName: string,
    groupId: string,
    subscription: Subscription,
    config: { readonly autoRelease?: boolean; readonly maxPollRecords?: number } = {}
  ) =>
    Effect.gen(function*() {
      const scope = yield* Scope.make()
      yield* Effect.addFinalizer(() => Scope.close(scope, Exit.void))
      const fiber = yield* Effect.fork(Scope.extend(join(memberName, groupId, subscription, config), scope))
      return { scope, fiber }
    })

  /**
   * Keeps polling `holder` (which holds a revoke) for `holdLonger`, and the joining member too once its connect has
   * returned, and checks that the joining member is given no partition meanwhile. Returns the joining member when
   * its connect returned during the hold.
   */
  const holdRevoke = (holder: Member, joining: Fiber.RuntimeFiber<Member, unknown>) =>
    Effect.gen(function*() {
      const until = Date.now() + Duration.toMillis(holdLonger)
      let other: Member | undefined
      while (Date.now() < until) {
        if (other === undefined) {
          const done = yield* Fiber.poll(joining)
          if (Option.isSome(done)) other = yield* done.value
        }
        yield* pollOnce(other === undefined ? [holder] : [holder, other])
        if (other !== undefined) {
          assert.deepStrictEqual(
            other.log.filter((line) => line.startsWith("Assigned")),
            [],
            `${other.name} was given partitions while ${holder.name} had not released its revoked ones`
          )
        }
      }
      assert.deepStrictEqual(
        holder.log.filter((line) => line.startsWith("Lost")),
        [],
        `${holder.name} lost its partitions while it held the revoke: its session was not kept`
      )
      return other
    })

  const topics = (...names: Array<string>): Subscription => ({ _tag: "Topics", topics: names })

  /**
   * Writes a record to partition 1 and polls until the member has it. Partition 0's writes made before it were
   * fetched by then, in the same fetch or an earlier one: what they lead to is handed over at once, or within a
   * moment (`settle`) on a driver that hands the partitions of one fetch over side by side.
   */
  const fetchedPast = (m: Member, topic: string) =>
    Effect.gen(function*() {
      const before = offsetsOf(m, topic, 1).length
      yield* DriverTestKit.pipe(Effect.flatMap((kit) => kit.produce(topic, 1, [`sync-${before}`])))
      yield* pollUntil([m], "partition 1's record, written after partition 0's", () =>
        offsetsOf(m, topic, 1).length > before)
    })
  const settle = Duration.decode(options.settle ?? "3 seconds")

  /** Polls until `condition` holds, for at most `settle`, then asserts it: what `fetchedPast` waited for. */
  const settled = (m: Member, what: string, condition: () => boolean) =>
    Effect.gen(function*() {
      yield* pollUntil([m], what, condition, settle).pipe(Effect.ignore)
      assert.isTrue(condition(), `${what}, once partition 1's later record was handed over\n${describeMember(m)}`)
    })

  /** The partition's `Records` from `from` on: each empty, together spanning `[from, next)`. */
  const emptyFrom = (m: Member, topic: string, partition: number, from: bigint, next: bigint) => {
    const after = chunksOf(m, topic, partition).filter((chunk) => chunk.from >= from)
    const text = after.map((c) => `[${c.from}, ${c.next}): ${c.offsets.join(" ")}`).join("; ")
    assert.isAbove(after.length, 0, `no Records of ${k(topic, partition)} from ${from}`)
    assert.strictEqual(after[0]!.from, from, text)
    assert.strictEqual(after[after.length - 1]!.next, next, text)
    assert.isTrue(after.every((chunk) => chunk.offsets.length === 0), `records past ${from}: ${text}`)
  }

  /** A committed read repeated while it fails with UNSTABLE_OFFSET_COMMIT, as the policies repeat it. */
  const whileUnstable = <A>(read: Effect.Effect<A, DriverError>) =>
    read.pipe(
      Effect.retry({
        while: (error) => error.retriable && error.message.includes("UNSTABLE_OFFSET_COMMIT"),
        schedule: Schedule.spaced("50 millis")
      }),
      Effect.timeoutFail({
        duration: deadline,
        onTimeout: () => new Error("the committed position was still unstable at the deadline")
      })
    )

  describe(name, () => {
    it.scopedLive(
      "a single member is assigned every partition and fetches each in offset order",
      () =>
        Effect.gen(function*() {
          const kit = yield* DriverTestKit
          const topic = unique("single")
          yield* kit.createTopic(topic, 3)
          for (let p = 0; p < 3; p++) yield* kit.produce(topic, p, values(p, 0, 5))
          const m = yield* join("a", unique("group"), topics(topic))
          yield* pollUntil([m], "3 partitions and 15 records", () => m.owned.size === 3 && total(m) >= 15)
          assert.deepStrictEqual(sortedKeys(m.owned), [k(topic, 0), k(topic, 1), k(topic, 2)])
          for (let p = 0; p < 3; p++) {
            assert.deepStrictEqual(offsetsOf(m, topic, p), range(0, 5))
            assert.deepStrictEqual(valuesOf(m, topic, p), values(p, 0, 5))
            assert.strictEqual(chunksOf(m, topic, p)[0]!.from, 0n)
            for (const r of recordsOf(m, topic, p)) {
              assert.strictEqual(r.topic, topic)
              assert.strictEqual(r.partition, p)
            }
          }
          const ends = yield* kit.endOffsets(topic)
          assert.deepStrictEqual([0, 1, 2].map((p) => ends.get(p)), [5n, 5n, 5n])
        }).pipe(Effect.provide(env)),
      testTimeout
    )

    it.scopedLive(
      "offsets of a new topic are 0 and 0, and the latest moves with what is produced",
      () =>
        Effect.gen(function*() {
          const kit = yield* DriverTestKit
          const topic = unique("fresh")
          yield* kit.createTopic(topic, 2)
          const m = yield* join("a", unique("group"), topics(topic))
          yield* pollUntil([m], "2 partitions", () => m.owned.size === 2)
          const partitions = [tp(topic, 0), tp(topic, 1)]
          const fresh = yield* m.session.offsets(partitions)
          assert.deepStrictEqual(fresh.get(k(topic, 0)), { earliest: 0n, latest: 0n, lastStable: 0n })
          assert.deepStrictEqual(fresh.get(k(topic, 1)), { earliest: 0n, latest: 0n, lastStable: 0n })
          const committed = yield* m.session.committed(partitions)
          assert.strictEqual(committed.size, 0)

          yield* kit.produce(topic, 0, values(0, 0, 3))
          const after = yield* m.session.offsets(partitions)
          assert.deepStrictEqual(after.get(k(topic, 0)), { earliest: 0n, latest: 3n, lastStable: 3n })
          assert.deepStrictEqual(after.get(k(topic, 1)), { earliest: 0n, latest: 0n, lastStable: 0n })
        }).pipe(Effect.provide(env)),
      testTimeout
    )

    it.scopedLive(
      "a driver commits nothing by itself: records fetched and handed over leave no committed position",
      () =>
        Effect.gen(function*() {
          const kit = yield* DriverTestKit
          const topic = unique("nocommit")
          const group = unique("group")
          yield* kit.createTopic(topic, 2)
          yield* kit.produce(topic, 0, values(0, 0, 5))
          yield* kit.produce(topic, 1, values(1, 0, 5))
          const member = yield* join("reader", group, topics(topic))
          yield* pollUntil([member], "10 records", () => total(member) >= 10)
          // Polled again after every record was handed over: a driver that commits what it fetched would have by now.
          yield* pollOnce([member])
          const committed = yield* member.session.committed([tp(topic, 0), tp(topic, 1)])
          assert.deepStrictEqual([...committed.entries()], [], "the runloop commits; the driver never does")
        }).pipe(Effect.provide(env)),
      testTimeout
    )

    it.scopedLive(
      "positions committed by one session are the next session's committed positions",
      () =>
        Effect.gen(function*() {
          const kit = yield* DriverTestKit
          const topic = unique("commit")
          const group = unique("group")
          yield* kit.createTopic(topic, 2)
          yield* kit.produce(topic, 0, values(0, 0, 5))
          yield* kit.produce(topic, 1, values(1, 0, 5))
          yield* Effect.scoped(Effect.gen(function*() {
            const first = yield* join("first", group, topics(topic))
            yield* pollUntil([first], "10 records", () => total(first) >= 10)
            yield* first.session.commit(OffsetBatch.fromIterable([[tp(topic, 0), 3n], [tp(topic, 1), 5n]]))
            const seen = yield* first.session.committed([tp(topic, 0), tp(topic, 1)])
            assert.deepStrictEqual(seen.get(k(topic, 0)), 3n)
            assert.deepStrictEqual(seen.get(k(topic, 1)), 5n)
          }))
          const second = yield* join("second", group, topics(topic))
          yield* pollUntil([second], "2 partitions", () => second.owned.size === 2)
          const committed = yield* second.session.committed([tp(topic, 0), tp(topic, 1)])
          assert.deepStrictEqual(committed.get(k(topic, 0)), 3n)
          assert.deepStrictEqual(committed.get(k(topic, 1)), 5n)
          // Positioned at the committed offsets, the new session reads on from there.
          yield* pollUntil([second], "records 3 and 4 of partition 0", () => offsetsOf(second, topic, 0).length >= 2)
          assert.deepStrictEqual(offsetsOf(second, topic, 0), [3n, 4n])
          yield* kit.produce(topic, 1, values(1, 5, 1))
          yield* pollUntil([second], "record 5 of partition 1", () => offsetsOf(second, topic, 1).length >= 1)
          assert.deepStrictEqual(offsetsOf(second, topic, 1), [5n])
        }).pipe(Effect.provide(env)),
      testTimeout
    )

    it.scopedLive(
      "a position's metadata is committed with it and read back by the next session; a commit without one clears it",
      () =>
        Effect.gen(function*() {
          const kit = yield* DriverTestKit
          const topic = unique("metadata")
          const group = unique("group")
          yield* kit.createTopic(topic, 2)
          yield* kit.produce(topic, 0, values(0, 0, 5))
          const finished = "fin1:2.3," + "z".repeat(3000)
          yield* Effect.scoped(Effect.gen(function*() {
            const first = yield* join("first", group, topics(topic))
            yield* pollUntil([first], "5 records", () => total(first) >= 5)
            yield* first.session.commit({
              positions: new Map([[k(topic, 0), 1n], [k(topic, 1), 0n]]),
              metadata: new Map([[k(topic, 0), finished]])
            })
            const seen = yield* first.session.committedWithMetadata([tp(topic, 0), tp(topic, 1)])
            assert.deepStrictEqual(seen.get(k(topic, 0)), { position: 1n, metadata: finished })
            assert.deepStrictEqual(seen.get(k(topic, 1)), { position: 0n, metadata: "" })
          }))
          const second = yield* join("second", group, topics(topic))
          yield* pollUntil([second], "2 partitions", () => second.owned.size === 2)
          const read = yield* second.session.committedWithMetadata([tp(topic, 0), tp(topic, 1)])
          assert.deepStrictEqual(read.get(k(topic, 0)), { position: 1n, metadata: finished })
          yield* second.session.commit(OffsetBatch.of(tp(topic, 0), 2n))
          const cleared = yield* second.session.committedWithMetadata([tp(topic, 0)])
          assert.deepStrictEqual(cleared.get(k(topic, 0)), { position: 2n, metadata: "" })
          assert.deepStrictEqual((yield* second.session.committed([tp(topic, 0)])).get(k(topic, 0)), 2n)
        }).pipe(Effect.provide(env)),
      testTimeout
    )

    it.scopedLive(
      "one poll returns at most maxPollRecords records of a partition, in order",
      () =>
        Effect.gen(function*() {
          const kit = yield* DriverTestKit
          const topic = unique("maxpoll")
          yield* kit.createTopic(topic, 2)
          yield* kit.produce(topic, 0, values(0, 0, 25))
          yield* kit.produce(topic, 1, values(1, 0, 25))
          const m = yield* join("a", unique("group"), topics(topic), { maxPollRecords: 10 })
          yield* pollUntil([m], "50 records", () => total(m) >= 50)
          assert.isAtMost(m.maxPerPoll, 10)
          assert.deepStrictEqual(offsetsOf(m, topic, 0), range(0, 25))
          assert.deepStrictEqual(offsetsOf(m, topic, 1), range(0, 25))
        }).pipe(Effect.provide(env)),
      testTimeout
    )

    it.scopedLive("seek moves the fetch position backwards and forwards", () =>
      Effect.gen(function*() {
        const kit = yield* DriverTestKit
        const topic = unique("seek")
        yield* kit.createTopic(topic, 1)
        yield* kit.produce(topic, 0, values(0, 0, 10))
        const m = yield* join("a", unique("group"), topics(topic))
        yield* pollUntil([m], "10 records", () => offsetsOf(m, topic, 0).length >= 10)
        assert.deepStrictEqual(offsetsOf(m, topic, 0), range(0, 10))

        yield* seekTo(m, tp(topic, 0), 3n)
        m.records.clear()
        yield* pollUntil([m], "records from 3 after seeking back", () => offsetsOf(m, topic, 0).length >= 7)
        assert.deepStrictEqual(offsetsOf(m, topic, 0), range(3, 10))

        yield* seekTo(m, tp(topic, 0), 8n)
        m.records.clear()
        yield* kit.produce(topic, 0, values(0, 10, 2))
        yield* pollUntil([m], "records from 8 after seeking forward", () => offsetsOf(m, topic, 0).includes(11n))
        assert.deepStrictEqual(offsetsOf(m, topic, 0), range(8, 12))
      }).pipe(Effect.provide(env)), testTimeout)

    it.scopedLive("pause stops the records of a partition and resume restarts them", () =>
      Effect.gen(function*() {
        const kit = yield* DriverTestKit
        const topic = unique("pause")
        yield* kit.createTopic(topic, 2)
        const m = yield* join("a", unique("group"), topics(topic))
        yield* pollUntil([m], "2 partitions", () => m.owned.size === 2)
        yield* m.session.pause([tp(topic, 0)])
        // Partition 0's records are written first: once partition 1's arrive, partition 0 had its chance.
        yield* kit.produce(topic, 0, values(0, 0, 5))
        yield* kit.produce(topic, 1, values(1, 0, 5))
        yield* pollUntil([m], "partition 1's records", () => offsetsOf(m, topic, 1).length >= 5)
        yield* kit.produce(topic, 1, values(1, 5, 5))
        yield* pollUntil([m], "more of partition 1's records", () => offsetsOf(m, topic, 1).length >= 10)
        assert.deepStrictEqual(offsetsOf(m, topic, 0), [], "records of a paused partition were returned")

        yield* m.session.resume([tp(topic, 0)])
        yield* pollUntil([m], "partition 0's records after resume", () => offsetsOf(m, topic, 0).length >= 5)
        assert.deepStrictEqual(offsetsOf(m, topic, 0), range(0, 5))
        assert.deepStrictEqual(offsetsOf(m, topic, 1), range(0, 10))
      }).pipe(Effect.provide(env)), testTimeout)

    it.scopedLive(
      "a pause in the middle of a fetched batch: the rest comes after resume, once and in order",
      () =>
        Effect.gen(function*() {
          const kit = yield* DriverTestKit
          const topic = unique("pause-mid")
          yield* kit.createTopic(topic, 2)
          yield* kit.produce(topic, 0, values(0, 0, 20))
          const m = yield* join("a", unique("group"), topics(topic), { maxPollRecords: 3 })
          yield* pollUntil([m], "partition 0's first records", () => offsetsOf(m, topic, 0).length > 0)
          yield* m.session.pause([tp(topic, 0)])
          const beforePause = offsetsOf(m, topic, 0)
          assert.isBelow(beforePause.length, 20, "one poll returned more than maxPollRecords")

          yield* kit.produce(topic, 1, values(1, 0, 5))
          yield* pollUntil([m], "partition 1's records", () => offsetsOf(m, topic, 1).length >= 5)
          assert.deepStrictEqual(offsetsOf(m, topic, 0), beforePause, "records of a paused partition were returned")

          yield* m.session.resume([tp(topic, 0)])
          yield* pollUntil([m], "the rest of partition 0 after resume", () => offsetsOf(m, topic, 0).length >= 20)
          assert.deepStrictEqual(offsetsOf(m, topic, 0), range(0, 20))
        }).pipe(Effect.provide(env)),
      testTimeout
    )

    it.scopedLive(
      "a pause that holds (a retry topic waiting): nothing of the partition meanwhile, then all of it once and in order",
      () =>
        Effect.gen(function*() {
          const kit = yield* DriverTestKit
          const topic = unique("pause-hold")
          yield* kit.createTopic(topic, 2)
          yield* kit.produce(topic, 0, values(0, 0, 10))
          const m = yield* join("a", unique("group"), topics(topic), { maxPollRecords: 3 })
          yield* pollUntil([m], "partition 0's first records", () => offsetsOf(m, topic, 0).length > 0)
          yield* m.session.pause([tp(topic, 0)], { hold: true })
          const beforePause = offsetsOf(m, topic, 0)
          // Records keep coming to the held partition, one write at a time, while another partition is read.
          for (let i = 10; i < 15; i++) yield* kit.produce(topic, 0, values(0, i, 1))
          yield* kit.produce(topic, 1, values(1, 0, 5))
          yield* pollUntil([m], "partition 1's records", () => offsetsOf(m, topic, 1).length >= 5)
          assert.deepStrictEqual(offsetsOf(m, topic, 0), beforePause, "records of a held partition were returned")

          yield* m.session.resume([tp(topic, 0)])
          yield* pollUntil([m], "the rest of partition 0 after resume", () => offsetsOf(m, topic, 0).length >= 15)
          yield* kit.produce(topic, 0, values(0, 15, 2))
          yield* pollUntil([m], "records written after resume", () => offsetsOf(m, topic, 0).length >= 17)
          assert.deepStrictEqual(offsetsOf(m, topic, 0), range(0, 17))
        }).pipe(Effect.provide(env)),
      testTimeout
    )

    it.scopedLive(
      "transaction markers and aborted records leave gaps; the chain of Records spans them exactly",
      () =>
        Effect.gen(function*() {
          const kit = yield* DriverTestKit
          const topic = unique("txn")
          const group = unique("group")
          const p0 = tp(topic, 0)
          yield* kit.createTopic(topic, 1)
          // Offsets: c0 c1 c2 @0-2, commit marker @3; x0 x1 @4-5, abort marker @6; plain @7; c3 @8, commit marker @9.
          yield* kit.produceTransaction(topic, 0, ["c0", "c1", "c2"], "commit")
          yield* kit.produceTransaction(topic, 0, ["x0", "x1"], "abort")
          yield* kit.produce(topic, 0, ["plain-0"])
          yield* kit.produceTransaction(topic, 0, ["c3"], "commit")
          const end = (yield* kit.endOffsets(topic)).get(0)!
          assert.strictEqual(end, 10n)

          yield* Effect.scoped(Effect.gen(function*() {
            const m = yield* join("a", group, topics(topic), { maxPollRecords: 3 })
            yield* pollUntil([m], "the 5 records to read", () => offsetsOf(m, topic, 0).length >= 5)
            assert.deepStrictEqual(valuesOf(m, topic, 0), ["c0", "c1", "c2", "plain-0", "c3"])
            // The Records carrying the last record end after the marker that follows it.
            assert.strictEqual(m.positions.get(k(topic, 0)), end, "the Records chain stops before the last marker")
            assert.deepStrictEqual(offsetsOf(m, topic, 0), [0n, 1n, 2n, 7n, 8n])
            const chunks = chunksOf(m, topic, 0)
            assert.strictEqual(chunks[0]!.from, 0n)
            assert.isTrue(
              chunks.some((chunk) => chunk.offsets[0]! > chunk.from),
              `no Records started at a gap: ${chunks.map((c) => `[${c.from}, ${c.next}): ${c.offsets.join(" ")}`)}`
            )

            // Read live: an aborted transaction, a committed one, a plain record.
            yield* kit.produceTransaction(topic, 0, ["x2"], "abort")
            yield* kit.produceTransaction(topic, 0, ["c4"], "commit")
            yield* kit.produce(topic, 0, ["plain-1"])
            const liveEnd = (yield* kit.endOffsets(topic)).get(0)!
            assert.strictEqual(liveEnd, 15n)
            yield* pollUntil([m], "the records written live", () => valuesOf(m, topic, 0).includes("plain-1"))
            assert.strictEqual(m.positions.get(k(topic, 0)), liveEnd)
            assert.deepStrictEqual(valuesOf(m, topic, 0).slice(5), ["c4", "plain-1"])
            assert.deepStrictEqual(offsetsOf(m, topic, 0).slice(5), [12n, 14n])

            // Then only an aborted transaction: nothing to read, and the position passes it all the same (an empty
            // Records), so that a commit of it leaves no lag behind.
            yield* kit.produceTransaction(topic, 0, ["x3"], "abort")
            const abortedEnd = (yield* kit.endOffsets(topic)).get(0)!
            assert.strictEqual(abortedEnd, 17n)
            yield* pollUntil(
              [m],
              "the position past the aborted transaction",
              () => m.positions.get(k(topic, 0)) === abortedEnd
            )
            assert.deepStrictEqual(valuesOf(m, topic, 0).slice(5), ["c4", "plain-1"])

            // The last `next` committed: a new session starts past every marker.
            yield* m.session.commit(OffsetBatch.of(p0, abortedEnd))
          }))

          yield* kit.produce(topic, 0, ["after"])
          const next = yield* join("b", group, topics(topic))
          yield* pollUntil([next], "the record after the commit", () => offsetsOf(next, topic, 0).length >= 1)
          assert.strictEqual(chunksOf(next, topic, 0)[0]!.from, 17n)
          assert.deepStrictEqual(valuesOf(next, topic, 0), ["after"])
          assert.deepStrictEqual(offsetsOf(next, topic, 0), [17n])
        }).pipe(Effect.provide(env)),
      testTimeout
    )

    it.scopedLive(
      "a fetch that finds only an aborted transaction gives a Records with no record, whose next passes it",
      () =>
        Effect.gen(function*() {
          const kit = yield* DriverTestKit
          const topic = unique("empty-abort")
          yield* kit.createTopic(topic, 2)
          yield* kit.produce(topic, 0, values(0, 0, 3))
          const m = yield* join("a", unique("group"), topics(topic))
          yield* pollUntil([m], "records 0 to 2", () => offsetsOf(m, topic, 0).length >= 3)
          assert.strictEqual(m.positions.get(k(topic, 0)), 3n)

          // x0 x1 @3-4, abort marker @5: nothing more to read in partition 0, ever.
          yield* kit.produceTransaction(topic, 0, ["x0", "x1"], "abort")
          assert.strictEqual((yield* kit.endOffsets(topic)).get(0), 6n)
          yield* fetchedPast(m, topic)
          yield* settled(
            m,
            "partition 0's position passes the aborted transaction",
            () => m.positions.get(k(topic, 0)) === 6n
          )
          emptyFrom(m, topic, 0, 3n, 6n)
          assert.deepStrictEqual(offsetsOf(m, topic, 0), range(0, 3))
        }).pipe(Effect.provide(env)),
      testTimeout
    )

    it.scopedLive(
      "a fetch that finds only a commit marker gives a Records with no record, whose next passes it",
      () =>
        Effect.gen(function*() {
          const kit = yield* DriverTestKit
          const topic = unique("empty-marker")
          yield* kit.createTopic(topic, 2)
          yield* kit.produce(topic, 0, ["plain"])
          // t0 t1 @1-2, read at once by a read_uncommitted member; the commit marker @3 comes after.
          const txn = yield* (yield* DriverTestTransactions).openTransaction(topic, 0, ["t0", "t1"])
          const m = yield* join("dirty", unique("group"), topics(topic), { isolationLevel: "read_uncommitted" })
          yield* pollUntil([m], "the open transaction's records", () => valuesOf(m, topic, 0).includes("t1"))
          assert.deepStrictEqual(valuesOf(m, topic, 0), ["plain", "t0", "t1"])
          yield* pollUntil([m], "partition 0's position after t1", () => m.positions.get(k(topic, 0)) === 3n)

          yield* txn.end("commit")
          assert.strictEqual((yield* kit.endOffsets(topic)).get(0), 4n)
          yield* fetchedPast(m, topic)
          yield* settled(
            m,
            "partition 0's position passes the commit marker",
            () => m.positions.get(k(topic, 0)) === 4n
          )
          emptyFrom(m, topic, 0, 3n, 4n)
          assert.deepStrictEqual(offsetsOf(m, topic, 0), range(0, 3))
        }).pipe(Effect.provide(env)),
      testTimeout
    )

    it.scopedLive(
      "latest is the high watermark, lastStable the open transaction's start; a read_committed fetch between them waits for it, with no OutOfRange",
      () =>
        Effect.gen(function*() {
          const kit = yield* DriverTestKit
          const topic = unique("lso")
          const group = unique("group")
          const p0 = tp(topic, 0)
          yield* kit.createTopic(topic, 2)
          // p0-v0..2 @0-2, the open transaction's t0 t1 @3-4, a plain record @5.
          yield* kit.produce(topic, 0, values(0, 0, 3))
          const txn = yield* (yield* DriverTestTransactions).openTransaction(topic, 0, ["t0", "t1"])
          yield* kit.produce(topic, 0, ["after"])

          // A read_uncommitted member handles the open transaction's records and commits past them.
          yield* Effect.scoped(Effect.gen(function*() {
            const dirty = yield* join("dirty", group, topics(topic), { isolationLevel: "read_uncommitted" })
            yield* pollUntil([dirty], "every record", () => valuesOf(dirty, topic, 0).includes("after"))
            assert.deepStrictEqual(valuesOf(dirty, topic, 0), [...values(0, 0, 3), "t0", "t1", "after"])
            const offsets = yield* dirty.session.offsets([p0])
            assert.deepStrictEqual(offsets.get(k(topic, 0)), { earliest: 0n, latest: 6n, lastStable: 3n })
            yield* dirty.session.commit(OffsetBatch.of(p0, 5n))
          }))

          // The next member reads committed, from 5: above the last stable offset, at most the high watermark.
          const clean = yield* join("clean", group, topics(topic))
          yield* pollUntil([clean], "partition 0 sought", () => clean.positions.has(k(topic, 0)))
          assert.strictEqual(clean.positions.get(k(topic, 0)), 5n)
          yield* fetchedPast(clean, topic)
          assert.deepStrictEqual(offsetsOf(clean, topic, 0), [], "records above the last stable offset were returned")
          assert.deepStrictEqual(clean.outOfRange, [], "a position below the high watermark was out of range")
          const open = yield* clean.session.offsets([p0, tp(topic, 1)])
          assert.deepStrictEqual(open.get(k(topic, 0)), { earliest: 0n, latest: 6n, lastStable: 3n })
          assert.deepStrictEqual(open.get(k(topic, 1)), { earliest: 0n, latest: 1n, lastStable: 1n })

          // The transaction commits (marker @6): the records from 5 on come, the position passes the marker.
          yield* txn.end("commit")
          yield* fetchedPast(clean, topic)
          yield* settled(clean, "the record above the position comes, and the position passes the marker", () =>
            offsetsOf(clean, topic, 0).length >= 1 && clean.positions.get(k(topic, 0)) === 7n)
          assert.deepStrictEqual(valuesOf(clean, topic, 0), ["after"])
          assert.deepStrictEqual(offsetsOf(clean, topic, 0), [5n])
          assert.strictEqual(chunksOf(clean, topic, 0)[0]!.from, 5n)
          assert.deepStrictEqual(clean.outOfRange, [])
          const ended = yield* clean.session.offsets([p0])
          assert.deepStrictEqual(ended.get(k(topic, 0)), { earliest: 0n, latest: 7n, lastStable: 7n })
        }).pipe(Effect.provide(env)),
      testTimeout
    )

    it.scopedLive(
      "a committed read of a partition whose transactional commit is pending fails retriable, naming UNSTABLE_OFFSET_COMMIT, until the transaction ends",
      () =>
        Effect.gen(function*() {
          const kit = yield* DriverTestKit
          const topic = unique("unstable")
          const group = unique("group")
          const p0 = tp(topic, 0)
          const p1 = tp(topic, 1)
          yield* kit.createTopic(topic, 2)
          yield* kit.produce(topic, 0, values(0, 0, 10))
          const m = yield* join("a", group, topics(topic))
          yield* pollUntil([m], "2 partitions", () => m.owned.size === 2)
          yield* m.session.commit(OffsetBatch.fromIterable([[p0, 2n], [p1, 0n]]))

          const transactions = yield* DriverTestTransactions
          const txn = yield* transactions.openTransaction(topic, 0, [], { groupId: group, partition: 0, next: 5n })
          const unstable = (read: Effect.Effect<unknown, DriverError>) =>
            Effect.gen(function*() {
              const result = yield* Effect.either(read)
              if (Either.isRight(result)) {
                return assert.fail(
                  `read while the transaction is open, the position before it: ${inspect(result.right)}`
                )
              }
              const error = result.left
              assert.instanceOf(error, DriverError)
              assert.isTrue(error.retriable, error.message)
              assert.include(error.message, "UNSTABLE_OFFSET_COMMIT")
            })
          yield* unstable(m.session.committed([p0]))
          yield* unstable(m.session.committedWithMetadata([p0, p1]))
          // The other partition of the topic has nothing pending: it reads as ever.
          const other = yield* Effect.either(m.session.committed([p1]))
          if (Either.isLeft(other)) return assert.fail(`the read of partition 1 failed: ${other.left.message}`)
          assert.deepStrictEqual(other.right.get(k(topic, 1)), 0n)

          yield* txn.end("commit")
          const committed = yield* whileUnstable(m.session.committed([p0, p1]))
          assert.deepStrictEqual(committed.get(k(topic, 0)), 5n)
          assert.deepStrictEqual(committed.get(k(topic, 1)), 0n)

          // An aborted transaction's position never lands.
          const aborted = yield* transactions.openTransaction(topic, 0, [], { groupId: group, partition: 0, next: 9n })
          yield* unstable(m.session.committed([p0]))
          yield* aborted.end("abort")
          const after = yield* whileUnstable(m.session.committed([p0]))
          assert.deepStrictEqual(after.get(k(topic, 0)), 5n)
        }).pipe(Effect.provide(env)),
      testTimeout
    )

    it.scopedLive(
      "read_uncommitted reads the records of aborted transactions too; read_committed never",
      () =>
        Effect.gen(function*() {
          const kit = yield* DriverTestKit
          const topic = unique("isolation")
          yield* kit.createTopic(topic, 1)
          yield* kit.produceTransaction(topic, 0, ["x0", "x1"], "abort")
          yield* kit.produceTransaction(topic, 0, ["c0"], "commit")
          yield* kit.produce(topic, 0, ["p0"])
          const dirty = yield* join("dirty", unique("group"), topics(topic), { isolationLevel: "read_uncommitted" })
          const clean = yield* join("clean", unique("group"), topics(topic))
          yield* pollUntil(
            [dirty, clean],
            "every record",
            () => valuesOf(dirty, topic, 0).includes("p0") && valuesOf(clean, topic, 0).includes("p0")
          )
          assert.deepStrictEqual(valuesOf(dirty, topic, 0), ["x0", "x1", "c0", "p0"])
          assert.deepStrictEqual(valuesOf(clean, topic, 0), ["c0", "p0"])
        }).pipe(Effect.provide(env)),
      testTimeout
    )

    it.scopedLive(
      "a compacted topic returns the latest record of each key, with gaps between their offsets",
      () =>
        Effect.gen(function*() {
          const kit = yield* DriverTestKit
          const topic = unique("compact")
          yield* kit.createTopic(topic, 1, { compacted: true })
          yield* kit.produceKeyed(topic, 0, [
            ["k1", "a1"], // 0
            ["k2", "a1"], // 1
            ["k1", "a2"], // 2
            ["k3", "a1"], // 3
            ["k2", "a2"], // 4
            ["k1", "a3"] // 5
          ])
          yield* kit.compact(topic)
          const m = yield* join("a", unique("group"), topics(topic), { maxPollRecords: 2 })
          yield* pollUntil([m], "the latest record of each key", () => offsetsOf(m, topic, 0).length >= 3)
          const records = recordsOf(m, topic, 0)
          assert.deepStrictEqual(records.map((r) => `${keyString(r)}=${valueString(r)}@${r.offset}`), [
            "k3=a1@3",
            "k2=a2@4",
            "k1=a3@5"
          ])
          const chunks = chunksOf(m, topic, 0)
          assert.strictEqual(chunks[0]!.from, 0n)
          assert.deepStrictEqual(chunks[0]!.offsets[0], 3n)
        }).pipe(Effect.provide(env)),
      testTimeout
    )

    it.scopedLive(
      "a record reads as it was produced, and toPlain gives it as a plain object of its seven fields",
      () =>
        Effect.gen(function*() {
          const kit = yield* DriverTestKit
          const topic = unique("fields")
          yield* kit.createTopic(topic, 2)
          const produced: ReadonlyArray<ProducedRecord> = [
            {
              key: "k-0",
              value: "v-0",
              headers: { trace: "t-0", "content-type": "text/plain" },
              timestamp: 1_700_000_000_001
            },
            { key: null, value: "no key", headers: {}, timestamp: 1_700_000_000_002 },
            { key: "k-2", value: null, headers: { only: "" }, timestamp: 1_700_000_000_003 }
          ]
          yield* kit.produceRecords(topic, 1, produced)
          const m = yield* join("a", unique("group"), topics(topic))
          yield* pollUntil([m], "the 3 records", () => offsetsOf(m, topic, 1).length >= 3)
          const text = (bytes: Uint8Array | null) => bytes === null ? null : new TextDecoder().decode(bytes)
          const records = recordsOf(m, topic, 1)
          records.forEach((record, i) => {
            const expected = produced[i]!
            // What a handler reads, field by field.
            assert.strictEqual(record.topic, topic)
            assert.strictEqual(record.partition, 1)
            assert.strictEqual(record.offset, BigInt(i))
            assert.strictEqual(typeof record.offset, "bigint")
            assert.strictEqual(record.timestamp, expected.timestamp)
            assert.strictEqual(text(record.key), expected.key)
            assert.strictEqual(text(record.value), expected.value)
            if (record.key !== null) assert.instanceOf(record.key, Uint8Array)
            if (record.value !== null) assert.instanceOf(record.value, Uint8Array)
            const headers = Object.fromEntries(Object.entries(record.headers).map(([name, v]) => [name, text(v)]))
            assert.deepStrictEqual(headers, expected.headers)
            for (const value of Object.values(record.headers)) assert.instanceOf(value, Uint8Array)
            // Read twice, the same.
            assert.strictEqual(record.offset, record.offset)
            assert.strictEqual(record.timestamp, record.timestamp)
            // The record itself has no fields of its own on either driver: spread, it is empty, so code that spreads
            // records fails in tests on the in-memory broker as it would on Kafka.
            assert.deepStrictEqual({ ...record }, {})
            // toPlain: a plain object of the seven fields, which spreads, clones and compares as data.
            const plain = toPlain(record)
            assert.strictEqual(Object.getPrototypeOf(plain), Object.prototype)
            assert.deepStrictEqual(
              Object.keys(plain).sort(),
              ["headers", "key", "offset", "partition", "timestamp", "topic", "value"]
            )
            const spread = { ...plain }
            assert.deepStrictEqual(
              { ...spread, key: text(spread.key), value: text(spread.value), headers },
              {
                topic,
                partition: 1,
                offset: BigInt(i),
                key: expected.key,
                value: expected.value,
                headers,
                timestamp: expected.timestamp
              }
            )
            assert.strictEqual(structuredClone(plain).offset, BigInt(i))
            assert.deepStrictEqual(toPlain(plain), plain)
            // Printed, a record shows its fields; JSON fails on the bigint offset as it does for any plain record.
            assert.include(inspect(record), `offset: ${i}n`)
            assert.throws(() => JSON.stringify(record), TypeError)
          })
        }).pipe(Effect.provide(env)),
      testTimeout
    )

    it.scopedLive(
      "records deleted past the committed position: OutOfRange at it, and reading on from earliest",
      () =>
        Effect.gen(function*() {
          const kit = yield* DriverTestKit
          const topic = unique("deleted")
          const group = unique("group")
          const p0 = tp(topic, 0)
          yield* kit.createTopic(topic, 1)
          yield* kit.produce(topic, 0, values(0, 0, 10))
          yield* Effect.scoped(Effect.gen(function*() {
            const first = yield* join("first", group, topics(topic))
            yield* pollUntil([first], "10 records", () => offsetsOf(first, topic, 0).length >= 10)
            yield* first.session.commit(OffsetBatch.of(p0, 3n))
          }))
          yield* kit.deleteRecords(topic, 0, 6n)

          const m = yield* join("second", group, topics(topic))
          yield* pollUntil(
            [m],
            "OutOfRange or records of partition 0",
            () => m.outOfRange.length > 0 || offsetsOf(m, topic, 0).length > 0
          )
          assert.deepStrictEqual(offsetsOf(m, topic, 0), [], "records read past a position that is out of range")
          assert.deepStrictEqual(m.outOfRange, [{ key: k(topic, 0), position: 3n }])
          const offsets = yield* m.session.offsets([p0])
          assert.deepStrictEqual(offsets.get(k(topic, 0)), { earliest: 6n, latest: 10n, lastStable: 10n })
          // Nothing moved the group's committed position but this group's own commits.
          const committed = yield* m.session.committed([p0])
          assert.strictEqual(committed.get(k(topic, 0)), 3n)

          yield* seekTo(m, p0, 6n)
          yield* pollUntil([m], "records 6 to 9", () => offsetsOf(m, topic, 0).length >= 4)
          assert.deepStrictEqual(offsetsOf(m, topic, 0), range(6, 10))
          assert.strictEqual(chunksOf(m, topic, 0)[0]!.from, 6n)
          assert.strictEqual(m.outOfRange.length, 1)
        }).pipe(Effect.provide(env)),
      testTimeout
    )

    it.scopedLive(
      "a commit naming a partition the member does not own is refused as a whole, naming just it",
      () =>
        Effect.gen(function*() {
          const kit = yield* DriverTestKit
          const topic = unique("owned")
          const other = unique("other")
          yield* kit.createTopic(topic, 1)
          yield* kit.createTopic(other, 1)
          const m = yield* join("a", unique("group"), topics(topic))
          yield* pollUntil([m], "its partition", () => m.owned.size === 1)
          const refused = yield* Effect.either(
            m.session.commit(OffsetBatch.fromIterable([[tp(topic, 0), 1n], [tp(other, 0), 1n]]))
          )
          assert.isTrue(Either.isLeft(refused), "a commit for a partition the member does not own was accepted")
          if (Either.isLeft(refused)) {
            assert.instanceOf(refused.left, CommitFailed)
            assert.strictEqual(refused.left.reason, "NotOwned")
            assert.deepStrictEqual(refused.left.partitions, [{ topic: other, partition: 0 }])
            assert.isTrue(refused.left.notOwned)
          }
          const committed = yield* m.session.committed([tp(topic, 0), tp(other, 0)])
          assert.strictEqual(committed.size, 0, "part of a refused commit landed")
        }).pipe(Effect.provide(env)),
      testTimeout
    )

    // Each member revokes everything on every rebalance: what these tests expect of eager groups.
    if (options.eagerRevokes !== false) {
      it.scopedLive(
        "two members split the partitions; when one leaves, the other takes them over",
        () =>
          Effect.gen(function*() {
            const kit = yield* DriverTestKit
            const topic = unique("split")
            const group = unique("group")
            yield* kit.createTopic(topic, 4)
            for (let p = 0; p < 4; p++) yield* kit.produce(topic, p, values(p, 0, 2))
            const a = yield* join("a", group, topics(topic))
            yield* pollUntil([a], "a owns all 4 partitions", () => a.owned.size === 4)

            // b's join completes only when a has released what it gave up, so a keeps polling meanwhile.
            const b = yield* joinInOwnScope("b", group, topics(topic))
            yield* pollUntil(
              [a],
              "a revoked and reassigned",
              () => a.revocations >= 1 && a.owned.size > 0 && a.owned.size < 4
            )
            const memberB = yield* Fiber.join(b.fiber)
            const all = [0, 1, 2, 3].map((p) => k(topic, p))
            yield* pollUntil(
              [a, memberB],
              "a and b own 2 partitions each, and b fetched its records",
              () =>
                a.owned.size === 2 && memberB.owned.size === 2 &&
                Array.from(memberB.owned).every((key) => (memberB.records.get(key)?.length ?? 0) >= 2)
            )
            assert.deepStrictEqual(sortedKeys([...a.owned, ...memberB.owned]), all)
            for (const key of memberB.owned) {
              assert.deepStrictEqual(memberB.records.get(key)!.map((r) => r.offset), [0n, 1n])
            }

            // b leaves: a gets b's partitions, after revoking and releasing its own.
            const revocationsBefore = a.revocations
            yield* Scope.close(b.scope, Exit.void)
            yield* pollUntil([a], "a owns all 4 partitions again", () => a.owned.size === 4)
            assert.isAbove(a.revocations, revocationsBefore)
            assert.deepStrictEqual(sortedKeys(a.owned), all)
          }).pipe(Effect.provide(env)),
        testTimeout
      )

      it.scopedLive(
        "commits made between Revoked and release are what the next owner starts from",
        () =>
          Effect.gen(function*() {
            const kit = yield* DriverTestKit
            const topic = unique("handover")
            const group = unique("group")
            yield* kit.createTopic(topic, 2)
            yield* kit.produce(topic, 0, values(0, 0, 3))
            yield* kit.produce(topic, 1, values(1, 0, 3))
            const a = yield* join("a", group, topics(topic), { autoRelease: false })
            yield* pollUntil([a], "a fetched 6 records", () => a.owned.size === 2 && total(a) >= 6)
            yield* a.session.commit(OffsetBatch.fromIterable([[tp(topic, 0), 1n], [tp(topic, 1), 1n]]))

            // More records arrive while a is busy with what it has: they wait in the driver, unpolled, while b joins.
            yield* kit.produce(topic, 0, values(0, 3, 3))
            yield* kit.produce(topic, 1, values(1, 3, 3))
            const b = yield* joinInOwnScope("b", group, topics(topic))
            yield* Effect.sleep("3 seconds")

            yield* pollUntil([a], "a's partitions revoked", () => a.pendingRevokes.length > 0)
            const revoked = a.pendingRevokes.shift()!
            assert.deepStrictEqual(sortedKeys(revoked.partitions.map(TopicPartition.key)), [k(topic, 0), k(topic, 1)])
            // The final positions of the revoked partitions, committed before they are released.
            yield* a.session.commit(OffsetBatch.fromIterable(revoked.partitions.map((p) => [p, 5n] as const)))
            yield* revoked.release

            const memberB = yield* Fiber.join(b.fiber)
            yield* pollUntil(
              [a, memberB],
              "a and b own one partition each",
              () => a.owned.size === 1 && memberB.owned.size === 1
            )
            const [bKey] = Array.from(memberB.owned)
            const bPartition = TopicPartition.fromKey(bKey!)
            const committed = yield* memberB.session.committed([bPartition])
            assert.deepStrictEqual(committed.get(bKey!), 5n)
            yield* pollUntil(
              [a, memberB],
              "b reads from the handed-over position",
              () => (memberB.records.get(bKey!)?.length ?? 0) >= 1
            )
            assert.deepStrictEqual(memberB.records.get(bKey!)!.map((r) => r.offset), [5n])

            // a no longer owns b's partition: its commit there is refused, for good.
            const refused = yield* Effect.either(a.session.commit(OffsetBatch.of(bPartition, 6n)))
            assert.isTrue(Either.isLeft(refused), "a committed to a partition it no longer owns")
            if (Either.isLeft(refused)) {
              assert.instanceOf(refused.left, CommitFailed)
              assert.isFalse(refused.left.retriable)
              assert.strictEqual(refused.left.reason, "NotOwned")
              assert.deepStrictEqual(refused.left.partitions, [bPartition])
            }
            const after = yield* memberB.session.committed([bPartition])
            assert.deepStrictEqual(after.get(bKey!), 5n)
          }).pipe(Effect.provide(env)),
        testTimeout
      )

      it.scopedLive(
        "an idle member holding a revoke holds the new assignment, past its session timeout",
        () =>
          Effect.gen(function*() {
            const kit = yield* DriverTestKit
            const topic = unique("hold-idle")
            const group = unique("group")
            yield* kit.createTopic(topic, 2)
            yield* kit.produce(topic, 0, values(0, 0, 3))
            yield* kit.produce(topic, 1, values(1, 0, 3))
            const a = yield* join("a", group, topics(topic), { autoRelease: false })
            // a has read everything: it is idle, nothing is being fetched or handed over.
            yield* pollUntil([a], "a read all 6 records", () => total(a) >= 6)

            const b = yield* joinInOwnScope("b", group, topics(topic))
            yield* pollUntil([a], "a's partitions revoked", () => a.pendingRevokes.length > 0)
            const revoked = a.pendingRevokes.shift()!
            const early = yield* holdRevoke(a, b.fiber)
            // Still a member of the group after its session timeout: the commit with its generation is accepted.
            yield* a.session.commit(OffsetBatch.fromIterable([[tp(topic, 0), 2n], [tp(topic, 1), 3n]]))
            yield* revoked.release

            const memberB = early ?? (yield* Fiber.join(b.fiber))
            yield* pollUntil(
              [a, memberB],
              "a and b own one partition each",
              () => a.owned.size === 1 && memberB.owned.size === 1
            )
            const [bKey] = Array.from(memberB.owned)
            const bPartition = TopicPartition.fromKey(bKey!)
            const start = bPartition.partition === 0 ? 2n : 3n
            assert.strictEqual(memberB.positions.get(bKey!), start, "b did not start from what a committed")
            yield* kit.produce(topic, bPartition.partition, values(bPartition.partition, 3, 1))
            yield* pollUntil(
              [a, memberB],
              "b reads from a's last commit",
              () => (memberB.records.get(bKey!)?.length ?? 0) >= 4n - start
            )
            assert.deepStrictEqual(memberB.records.get(bKey!)!.map((r) => r.offset), range(Number(start), 4))
          }).pipe(Effect.provide(env)),
        testTimeout
      )

      it.scopedLive(
        "a member with every partition paused under a backlog holds the new assignment the same way",
        () =>
          Effect.gen(function*() {
            const kit = yield* DriverTestKit
            const topic = unique("hold-paused")
            const group = unique("group")
            const partitions = [tp(topic, 0), tp(topic, 1)]
            yield* kit.createTopic(topic, 2)
            yield* kit.produce(topic, 0, values(0, 0, 200))
            yield* kit.produce(topic, 1, values(1, 0, 200))
            const a = yield* join("a", group, topics(topic), { autoRelease: false, maxPollRecords: 5 })
            yield* pollUntil(
              [a],
              "a's first records of both partitions",
              () => offsetsOf(a, topic, 0).length > 0 && offsetsOf(a, topic, 1).length > 0
            )
            // A slow consumer: its buffers are full, every partition is paused, the backlog waits in the broker.
            yield* a.session.pause(partitions)
            const until = Date.now() + 1000
            yield* pollUntil([a], "a second of polling while paused", () => Date.now() >= until)
            const reached = new Map(
              partitions.map((p) => [TopicPartition.key(p), a.positions.get(TopicPartition.key(p))!])
            )

            const b = yield* joinInOwnScope("b", group, topics(topic))
            yield* pollUntil([a], "a's partitions revoked", () => a.pendingRevokes.length > 0)
            const revoked = a.pendingRevokes.shift()!
            const early = yield* holdRevoke(a, b.fiber)
            yield* a.session.commit(
              OffsetBatch.fromIterable(partitions.map((p) => [p, reached.get(TopicPartition.key(p))!] as const))
            )
            yield* revoked.release

            const memberB = early ?? (yield* Fiber.join(b.fiber))
            yield* pollUntil(
              [a, memberB],
              "a and b own one partition each",
              () => a.owned.size === 1 && memberB.owned.size === 1
            )
            const [bKey] = Array.from(memberB.owned)
            const start = reached.get(bKey!)!
            assert.strictEqual(memberB.positions.get(bKey!), start, "b did not start from what a committed")
            yield* pollUntil(
              [a, memberB],
              "b reads the rest of its partition",
              () => (memberB.records.get(bKey!)?.length ?? 0) >= 200 - Number(start)
            )
            assert.deepStrictEqual(memberB.records.get(bKey!)!.map((r) => r.offset), range(Number(start), 200))
          }).pipe(Effect.provide(env)),
        testTimeout
      )

      it.scopedLive(
        "a member that leaves while it holds a revoke hands its partitions over, with its commits",
        () =>
          Effect.gen(function*() {
            const kit = yield* DriverTestKit
            const topic = unique("hold-leave")
            const group = unique("group")
            yield* kit.createTopic(topic, 2)
            yield* kit.produce(topic, 0, values(0, 0, 3))
            yield* kit.produce(topic, 1, values(1, 0, 3))
            const first = yield* joinInOwnScope("a", group, topics(topic), { autoRelease: false })
            const a = yield* Fiber.join(first.fiber)
            yield* pollUntil([a], "a read all 6 records", () => total(a) >= 6)

            const b = yield* joinInOwnScope("b", group, topics(topic))
            yield* pollUntil([a], "a's partitions revoked", () => a.pendingRevokes.length > 0)
            yield* a.session.commit(OffsetBatch.fromIterable([[tp(topic, 0), 1n], [tp(topic, 1), 2n]]))
            // a stops without releasing: closing the session ends the hold.
            yield* Scope.close(first.scope, Exit.void)

            const memberB = yield* Fiber.join(b.fiber)
            yield* pollUntil([memberB], "b owns both partitions", () => memberB.owned.size === 2)
            assert.strictEqual(memberB.positions.get(k(topic, 0)), 1n)
            assert.strictEqual(memberB.positions.get(k(topic, 1)), 2n)
            // a's JoinGroup went out when it closed: b may have owned one partition for a generation with a before a
            // left, and read it from a's commit then. What counts is what it reads from the assignment of both on.
            memberB.records.clear()
            yield* pollUntil([memberB], "b reads on from a's commits", () => total(memberB) >= 3)
            assert.deepStrictEqual(offsetsOf(memberB, topic, 0), [1n, 2n])
            assert.deepStrictEqual(offsetsOf(memberB, topic, 1), [2n])
          }).pipe(Effect.provide(env)),
        testTimeout
      )
    }

    it.scopedLive("a partition subscription gets exactly the partitions it names", () =>
      Effect.gen(function*() {
        const kit = yield* DriverTestKit
        const topic = unique("static")
        yield* kit.createTopic(topic, 3)
        for (let p = 0; p < 3; p++) yield* kit.produce(topic, p, values(p, 0, 2))
        const m = yield* join("a", unique("group"), { _tag: "Partitions", partitions: [tp(topic, 0), tp(topic, 2)] })
        yield* pollUntil([m], "records of partitions 0 and 2", () =>
          offsetsOf(m, topic, 0).length >= 2 && offsetsOf(m, topic, 2).length >= 2)
        assert.deepStrictEqual(sortedKeys(m.owned), [k(topic, 0), k(topic, 2)])
        assert.deepStrictEqual(offsetsOf(m, topic, 1), [])
        yield* m.session.commit(OffsetBatch.of(tp(topic, 2), 2n))
        const committed = yield* m.session.committed([tp(topic, 0), tp(topic, 2)])
        assert.deepStrictEqual(committed.get(k(topic, 2)), 2n)
        assert.isFalse(committed.has(k(topic, 0)))
      }).pipe(Effect.provide(env)), testTimeout)
  })
}
