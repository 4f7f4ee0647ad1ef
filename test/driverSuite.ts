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
import * as Scope from "effect/Scope"
import type { ConsumerRecord } from "../src/ConsumerRecord.js"
import { valueString } from "../src/ConsumerRecord.js"
import type { DriverEvent, DriverSession, Subscription } from "../src/Driver.js"
import { Driver } from "../src/Driver.js"
import { CommitFailed } from "../src/KafkaError.js"
import * as OffsetBatch from "../src/OffsetBatch.js"
import * as TopicPartition from "../src/TopicPartition.js"

/**
 * What the suite needs from a cluster besides the driver: topics, records, end offsets.
 */
export class DriverTestKit extends Context.Tag("test/DriverTestKit")<DriverTestKit, {
  readonly createTopic: (topic: string, partitions: number) => Effect.Effect<void, unknown>
  /** Appends records with these values to one partition, in order. */
  readonly produce: (topic: string, partition: number, values: ReadonlyArray<string>) => Effect.Effect<void, unknown>
  /** Per partition, the offset the next record will get. */
  readonly endOffsets: (topic: string) => Effect.Effect<ReadonlyMap<number, bigint>, unknown>
}>() {}

/**
 * Timing of the sessions the suite opens; defaults suit a real broker.
 */
export interface DriverSuiteOptions {
  readonly sessionTimeout?: Duration.DurationInput
  readonly rebalanceTimeout?: Duration.DurationInput
  readonly pollTimeout?: Duration.DurationInput
  /** How long a wait on a condition may take before the test fails. */
  readonly deadline?: Duration.DurationInput
  /** vitest timeout of each test, in milliseconds. */
  readonly testTimeout?: number
}

/** One member as a test sees it: what it owns, what it fetched, which revokes wait for `release`. */
interface Member {
  readonly name: string
  readonly session: DriverSession
  readonly owned: Set<string>
  readonly records: Map<string, Array<ConsumerRecord>>
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

const total = (m: Member) => Array.from(m.records.values()).reduce((n, rs) => n + rs.length, 0)

const range = (from: number, to: number): Array<bigint> =>
  Array.from({ length: to - from }, (_, i) => BigInt(from + i))

const sortedKeys = (keys: Iterable<string>) =>
  Array.from(keys).map(TopicPartition.fromKey).sort(TopicPartition.compare).map(TopicPartition.key)

/**
 * Registers the suite under `name`. `env` is provided to each test afresh (a new driver and kit per test); every test
 * uses topics and groups of its own.
 */
export const driverSuite = (
  name: string,
  env: Layer.Layer<Driver | DriverTestKit, unknown>,
  options: DriverSuiteOptions = {}
): void => {
  const deadline = Duration.decode(options.deadline ?? "30 seconds")
  const testTimeout = options.testTimeout ?? 90_000

  const sessionOptions = (groupId: string, subscription: Subscription, member: string, maxPollRecords: number) => ({
    groupId,
    clientId: member,
    subscription,
    maxPollRecords,
    pollTimeout: Duration.decode(options.pollTimeout ?? "200 millis"),
    sessionTimeout: Duration.decode(options.sessionTimeout ?? "10 seconds"),
    rebalanceTimeout: Duration.decode(options.rebalanceTimeout ?? "20 seconds")
  })

  /**
   * Connects a member. Like the runloop, it positions every assigned partition at its committed position, or at the
   * beginning when nothing was committed, before it looks at records.
   */
  const join = (
    memberName: string,
    groupId: string,
    subscription: Subscription,
    config: { readonly autoRelease?: boolean; readonly maxPollRecords?: number } = {}
  ) =>
    Effect.gen(function*() {
      const driver = yield* Driver
      const session = yield* driver.connect(
        sessionOptions(groupId, subscription, memberName, config.maxPollRecords ?? 500)
      )
      const member: Member = {
        name: memberName,
        session,
        owned: new Set(),
        records: new Map(),
        log: [],
        pendingRevokes: [],
        revocations: 0,
        autoRelease: config.autoRelease ?? true,
        maxPerPoll: 0
      }
      return member
    })

  const apply = (m: Member, event: DriverEvent) =>
    Effect.gen(function*() {
      switch (event._tag) {
        case "Assigned": {
          m.log.push(`Assigned ${event.partitions.map(TopicPartition.key).join(",")}`)
          for (const p of event.partitions) m.owned.add(TopicPartition.key(p))
          const committed = yield* m.session.committed(event.partitions)
          const beginning = yield* m.session.beginning(event.partitions)
          for (const p of event.partitions) {
            const key = TopicPartition.key(p)
            const start = committed.get(key) ?? beginning.get(key)
            assert.isDefined(start, `no start position for ${key}`)
            yield* m.session.seek(p, start!)
          }
          return
        }
        case "Revoked": {
          m.log.push(`Revoked ${event.partitions.map(TopicPartition.key).join(",")}`)
          m.revocations++
          for (const p of event.partitions) m.owned.delete(TopicPartition.key(p))
          if (m.autoRelease) yield* event.release
          else m.pendingRevokes.push(event)
          return
        }
        case "Lost": {
          m.log.push(`Lost ${event.partitions.map(TopicPartition.key).join(",")}`)
          for (const p of event.partitions) m.owned.delete(TopicPartition.key(p))
          return
        }
        case "Records": {
          const key = TopicPartition.key(event.partition)
          assert.isTrue(m.owned.has(key), `${m.name} got records of ${key}, which it does not own`)
          let list = m.records.get(key)
          if (list === undefined) {
            list = []
            m.records.set(key, list)
          }
          for (const record of event.records) list.push(record)
          return
        }
      }
    })

  const describeMember = (m: Member) =>
    `${m.name}: owns [${sortedKeys(m.owned).join(", ")}], records {${
      Array.from(m.records, ([key, rs]) => `${key}: ${rs.length}`).join(", ")
    }}, events [${m.log.join("; ")}]`

  /** Polls the members in turn until `condition` holds; fails after the deadline with what each member saw. */
  const pollUntil = (members: ReadonlyArray<Member>, what: string, condition: () => boolean) =>
    Effect.gen(function*() {
      const start = Date.now()
      while (!condition()) {
        if (Date.now() - start > Duration.toMillis(deadline)) {
          return yield* Effect.fail(
            new Error(`timed out waiting for: ${what}\n${members.map(describeMember).join("\n")}`)
          )
        }
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

  const topics = (...names: Array<string>): Subscription => ({ _tag: "Topics", topics: names })

  describe(name, () => {
    it.scopedLive("a single member is assigned every partition and fetches each in offset order", () =>
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
          assert.deepStrictEqual(recordsOf(m, topic, p).map(valueString), values(p, 0, 5))
          for (const r of recordsOf(m, topic, p)) {
            assert.strictEqual(r.topic, topic)
            assert.strictEqual(r.partition, p)
          }
        }
        const ends = yield* kit.endOffsets(topic)
        assert.deepStrictEqual([0, 1, 2].map((p) => ends.get(p)), [5n, 5n, 5n])
      }).pipe(Effect.provide(env)), testTimeout)

    it.scopedLive("beginning is 0 and nothing is committed for a new topic", () =>
      Effect.gen(function*() {
        const kit = yield* DriverTestKit
        const topic = unique("fresh")
        yield* kit.createTopic(topic, 2)
        const m = yield* join("a", unique("group"), topics(topic))
        yield* pollUntil([m], "2 partitions", () => m.owned.size === 2)
        const partitions = [tp(topic, 0), tp(topic, 1)]
        const beginning = yield* m.session.beginning(partitions)
        assert.deepStrictEqual(beginning.get(k(topic, 0)), 0n)
        assert.deepStrictEqual(beginning.get(k(topic, 1)), 0n)
        const committed = yield* m.session.committed(partitions)
        assert.strictEqual(committed.size, 0)
      }).pipe(Effect.provide(env)), testTimeout)

    it.scopedLive("positions committed by one session are the next session's committed positions", () =>
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
      }).pipe(Effect.provide(env)), testTimeout)

    it.scopedLive("one poll returns at most maxPollRecords records of a partition, in order", () =>
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
      }).pipe(Effect.provide(env)), testTimeout)

    it.scopedLive("seek moves the fetch position backwards and forwards", () =>
      Effect.gen(function*() {
        const kit = yield* DriverTestKit
        const topic = unique("seek")
        yield* kit.createTopic(topic, 1)
        yield* kit.produce(topic, 0, values(0, 0, 10))
        const m = yield* join("a", unique("group"), topics(topic))
        yield* pollUntil([m], "10 records", () => offsetsOf(m, topic, 0).length >= 10)
        assert.deepStrictEqual(offsetsOf(m, topic, 0), range(0, 10))

        yield* m.session.seek(tp(topic, 0), 3n)
        m.records.clear()
        yield* pollUntil([m], "records from 3 after seeking back", () => offsetsOf(m, topic, 0).length >= 7)
        assert.deepStrictEqual(offsetsOf(m, topic, 0), range(3, 10))

        yield* m.session.seek(tp(topic, 0), 8n)
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

    it.scopedLive("a pause in the middle of a fetched batch: the rest comes after resume, once and in order", () =>
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
      }).pipe(Effect.provide(env)), testTimeout)

    it.scopedLive("two members split the partitions; when one leaves, the other takes them over", () =>
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
      }).pipe(Effect.provide(env)), testTimeout)

    it.scopedLive("commits made between Revoked and release are what the next owner starts from", () =>
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
        yield* pollUntil([a, memberB], "a and b own one partition each", () =>
          a.owned.size === 1 && memberB.owned.size === 1)
        const [bKey] = Array.from(memberB.owned)
        const bPartition = TopicPartition.fromKey(bKey!)
        const committed = yield* memberB.session.committed([bPartition])
        assert.deepStrictEqual(committed.get(bKey!), 5n)
        yield* pollUntil([a, memberB], "b reads from the handed-over position", () =>
          (memberB.records.get(bKey!)?.length ?? 0) >= 1)
        assert.deepStrictEqual(memberB.records.get(bKey!)!.map((r) => r.offset), [5n])

        // a no longer owns b's partition: its commit there is refused, for good.
        const refused = yield* Effect.either(a.session.commit(OffsetBatch.of(bPartition, 6n)))
        assert.isTrue(Either.isLeft(refused), "a committed to a partition it no longer owns")
        if (Either.isLeft(refused)) {
          assert.instanceOf(refused.left, CommitFailed)
          assert.isFalse(refused.left.retriable)
        }
        const after = yield* memberB.session.committed([bPartition])
        assert.deepStrictEqual(after.get(bKey!), 5n)
      }).pipe(Effect.provide(env)), testTimeout)

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
