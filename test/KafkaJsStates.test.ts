/**
 * The kafkajs adapter's states (`src/internal/kafkajs/states.ts`), without a broker: the member's state read from the
 * session's flags, the phases of a partition's fetch, and the member's transitions driven by hand on a session whose
 * kafkajs clients are stand-ins.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Queue from "effect/Queue"
import type { Admin, Consumer } from "kafkajs"
import type { DriverEvent } from "../src/Driver.js"
import { DriverError } from "../src/KafkaError.js"
import * as TopicPartition from "../src/TopicPartition.js"
import { poll } from "../src/internal/kafkajs/batches.js"
import type { Fetch } from "../src/internal/kafkajs/fetch.js"
import {
  freshMemberState,
  onCrash,
  onGroupJoin,
  onHeartbeatAnswer,
  onJoinGroup,
  type Session
} from "../src/internal/kafkajs/member.js"
import type { Entry } from "../src/internal/kafkajs/partitions.js"
import type { ReadWire } from "../src/internal/kafkajs/readWire.js"
import {
  fetchesIn,
  memberState,
  PARKED_BATCHES,
  partitionPhase,
  type PartitionFlags,
  type Revoke
} from "../src/internal/kafkajs/states.js"
import type { Wire } from "../src/internal/kafkajs/wire.js"

const tp = TopicPartition.make

describe("the member's state", () => {
  const revoke = (released: boolean): Revoke => ({ partitions: [], released, timers: [] })
  const failure = new DriverError({ operation: "poll", reason: "crashed" })
  const flags = { joined: true, closed: false, revoke: undefined, failure: undefined }

  it("is read from the session's flags as the table says", () => {
    assert.strictEqual(memberState({ ...flags, joined: false }), "Joining")
    assert.strictEqual(memberState(flags), "Member")
    assert.strictEqual(memberState({ ...flags, revoke: revoke(false) }), "Holding")
    assert.strictEqual(memberState({ ...flags, revoke: revoke(true) }), "Released")
    assert.strictEqual(memberState({ ...flags, failure }), "Failed")
    assert.strictEqual(memberState({ ...flags, closed: true }), "Closed")
  })

  it("is Closed whatever else holds, and a revoke counts before a failure or the join", () => {
    assert.strictEqual(memberState({ ...flags, closed: true, revoke: revoke(false), failure }), "Closed")
    assert.strictEqual(memberState({ ...flags, revoke: revoke(false), failure }), "Holding")
    assert.strictEqual(memberState({ ...flags, joined: false, failure }), "Joining")
  })
})

describe("a partition's fetch phase", () => {
  const combinations = function*(): Generator<PartitionFlags> {
    for (const position of [undefined, 5n]) {
      for (const suspended of [false, true]) {
        for (const outOfRange of [false, true]) {
          for (const paused of [false, true]) {
            for (const held of [false, true]) {
              for (let size = 0; size <= PARKED_BATCHES + 1; size++) {
                yield { position, suspended, outOfRange, paused, held, entries: { size } }
              }
            }
          }
        }
      }
    }
  }

  it("has kafkajs fetch a partition once sought, unless suspended, out of range, held, or parked", () => {
    for (const state of combinations()) {
      const wanted = state.position !== undefined && !state.suspended && !state.outOfRange &&
        !(state.paused && (state.held || state.entries.size >= PARKED_BATCHES))
      assert.strictEqual(fetchesIn(partitionPhase(state)), wanted, JSON.stringify({ ...state, position: undefined }))
    }
  })

  it("names each phase as the table says", () => {
    const base: PartitionFlags = {
      position: 0n,
      suspended: false,
      outOfRange: false,
      paused: false,
      held: false,
      entries: { size: 0 }
    }
    assert.strictEqual(partitionPhase({ ...base, position: undefined }), "AwaitingSeek")
    assert.strictEqual(partitionPhase({ ...base, suspended: true }), "Verifying")
    assert.strictEqual(partitionPhase({ ...base, outOfRange: true }), "OutOfRange")
    assert.strictEqual(partitionPhase({ ...base, paused: true, held: true }), "Parked")
    assert.strictEqual(partitionPhase({ ...base, paused: true, entries: { size: PARKED_BATCHES } }), "Parked")
    assert.strictEqual(partitionPhase({ ...base, paused: true, entries: { size: PARKED_BATCHES - 1 } }), "Parking")
    assert.strictEqual(partitionPhase(base), "Fetching")
  })
})

/** A session whose kafkajs clients are stand-ins: it records what the member asked of its socket layer and fetch. */
const makeSession = (options: { readonly isStatic?: boolean } = {}) => {
  const calls: Array<string> = []
  const wire: Wire = {
    socketFactory: () => {
      throw new Error("no sockets here")
    },
    release: () => {
      calls.push("wire.release")
    },
    heartbeat: () => {
      calls.push("wire.heartbeat")
      return true
    }
  }
  const fetcher = {
    dropAll: (outcome: string) => calls.push(`fetcher.dropAll ${outcome}`),
    clear: (outcome: string) => calls.push(`fetcher.clear ${outcome}`),
    assign: (partitions: ReadonlyArray<TopicPartition.TopicPartition>) =>
      calls.push(`fetcher.assign ${partitions.map(TopicPartition.key).join(",")}`),
    restore: () => calls.push("fetcher.restore"),
    drain: (taken: Iterable<Entry>): Array<DriverEvent> =>
      Array.from(taken).flatMap((entry) => entry._tag === "Control" ? [entry.event] : [])
  } as unknown as Fetch
  const requested = [tp("t", 0), tp("t", 1)]
  const s: Session = {
    groupId: "g",
    log: () => {},
    isStatic: options.isStatic ?? false,
    requested: options.isStatic === true ? requested : [],
    sessionTimeout: 6000,
    rebalanceTimeout: 60_000,
    heartbeatInterval: 60_000,
    pollTimeout: 0,
    tick: 500,
    holdLimit: 60_000,
    queue: Effect.runSync(Queue.unbounded<Entry>()),
    ...freshMemberState(),
    wire,
    consumer: {} as Consumer,
    admin: {} as Admin,
    reader: {} as Admin,
    readWire: {} as ReadWire,
    reads: Effect.runSync(Effect.makeSemaphore(1)),
    fetcher
  }
  const events = (): Array<DriverEvent> =>
    Effect.runSync(Queue.takeAll(s.queue)).pipe((chunk) =>
      Array.from(chunk).flatMap((entry) => entry._tag === "Control" ? [entry.event] : [])
    )
  return { s, calls, events }
}

describe("the member's transitions", () => {
  it("Joining, Member, Holding (the JoinGroup held), Released, Member: a rebalance as the table says", () => {
    const { calls, events, s } = makeSession()
    assert.strictEqual(memberState(s), "Joining")
    onGroupJoin(s, { t: [1, 0] }, "m-1")
    assert.strictEqual(memberState(s), "Member")
    assert.strictEqual(s.memberId, "m-1")
    assert.deepStrictEqual(events(), [{ _tag: "Assigned", partitions: [tp("t", 0), tp("t", 1)] }])

    // kafkajs writes its JoinGroup with its member id: held, and the partitions are revoked.
    assert.isTrue(onJoinGroup(s, "m-1"))
    assert.strictEqual(memberState(s), "Holding")
    const [revoked] = events()
    assert.strictEqual(revoked?._tag, "Revoked")
    assert.isTrue(calls.includes("fetcher.dropAll revoke"))
    // A JoinGroup kafkajs writes again meanwhile is held too.
    assert.isTrue(onJoinGroup(s, "m-1"))
    assert.notInclude(calls, "wire.release")

    if (revoked?._tag !== "Revoked") return
    Effect.runSync(revoked.release)
    assert.strictEqual(memberState(s), "Released")
    assert.strictEqual(s.owned.size, 0)
    assert.deepStrictEqual(calls.filter((c) => c === "wire.release"), ["wire.release"])
    // Released: a JoinGroup goes out at once.
    assert.isFalse(onJoinGroup(s, "m-1"))

    onGroupJoin(s, { t: [1] }, "m-1")
    assert.strictEqual(memberState(s), "Member")
    assert.deepStrictEqual(Array.from(s.owned.keys()), [TopicPartition.key(tp("t", 1))])
    assert.deepStrictEqual(events(), [{ _tag: "Assigned", partitions: [tp("t", 1)] }])
  })

  it("a hold's heartbeat answered UNKNOWN_MEMBER_ID sends the held JoinGroup; REBALANCE_IN_PROGRESS does not", () => {
    const { calls, events, s } = makeSession()
    onGroupJoin(s, { t: [0] }, "m-1")
    assert.isTrue(onJoinGroup(s, "m-1"))
    onHeartbeatAnswer(s, 27)
    assert.notInclude(calls, "wire.release")
    onHeartbeatAnswer(s, 25)
    assert.include(calls, "wire.release")
    assert.strictEqual(memberState(s), "Holding")
    const revoked = events().find((event) => event._tag === "Revoked")
    if (revoked?._tag === "Revoked") Effect.runSync(revoked.release)
  })

  it("a JoinGroup without member id loses what the member owned; a crash without restart fails poll", () => {
    const { events, s } = makeSession()
    onGroupJoin(s, { t: [0] }, "m-1")
    events()
    assert.isFalse(onJoinGroup(s, ""))
    assert.deepStrictEqual(events(), [{ _tag: "Lost", partitions: [tp("t", 0)] }])
    assert.strictEqual(memberState(s), "Member")

    onCrash(s, new Error("boom"), false)
    assert.strictEqual(memberState(s), "Failed")
    const exit = Effect.runSyncExit(poll(s))
    assert.isTrue(Exit.isFailure(exit))
    assert.isTrue(Effect.runSync(Deferred.isDone(s.settled)))
  })

  it("a Partitions subscription never holds: a rejoin restores its partitions", () => {
    const { calls, events, s } = makeSession({ isStatic: true })
    onGroupJoin(s, {}, "m-1")
    assert.deepStrictEqual(events(), [{ _tag: "Assigned", partitions: [tp("t", 0), tp("t", 1)] }])
    assert.isFalse(onJoinGroup(s, "m-1"))
    assert.strictEqual(memberState(s), "Member")
    onGroupJoin(s, {}, "m-1")
    assert.include(calls, "fetcher.restore")
    assert.deepStrictEqual(events(), [])
  })
})
