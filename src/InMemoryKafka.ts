/**
 * An in-memory Kafka: topics, partitions, consumer groups with several members, eager rebalances, committed offsets,
 * session timeouts and crash injection, and the gaps of a real log (transaction markers, aborted transactions,
 * compaction, retention). It keeps the `Driver` contract exactly as the kafkajs driver does, runs on the Effect
 * `Clock` (so it is deterministic under `TestClock`), and is the test kit users get for their own consumers.
 *
 * @since 0.1.0
 */
import * as Chunk from "effect/Chunk"
import * as Clock from "effect/Clock"
import * as Context from "effect/Context"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import type * as Scope from "effect/Scope"
import type { ConsumerRecord } from "./ConsumerRecord.js"
import {
  type CommittedPosition,
  Driver,
  type DriverEvent,
  type DriverSession,
  type PartitionOffsets,
  type SessionOptions
} from "./Driver.js"
import { type CrashPoint, Faults } from "./Faults.js"
import * as groups from "./internal/memory/groups.js"
import * as memoryLog from "./internal/memory/log.js"
import { partitionOfKey } from "./internal/shared/murmur2.js"
import { utf8EncodeInto, utf8Length } from "./internal/shared/utf8.js"
import * as producer from "./internal/producer/producer.js"
import { MemoryRecord } from "./internal/memory/record.js"
import {
  CommitFailed,
  type CommitFailureReason,
  InvalidConfig,
  DriverError,
  ProduceFailed,
  TransactionFailed
} from "./KafkaError.js"
import * as OffsetBatch from "./OffsetBatch.js"
import {
  Producer,
  type ProducerRecord as TopicRecord,
  type Settings as ProducerSettings,
  TransactionalProducer,
  TransactionalProducers,
  type TransactionalSettings
} from "./Producer.js"
import * as TopicPartition from "./TopicPartition.js"

/**
 * A record to produce to a topic given apart: the `Producer`'s record without its topic. Without `partition`, records
 * with a key go to the key's partition (murmur2, as the Java client) and the others round robin; without `timestamp`,
 * the broker's clock when it is written.
 *
 * @since 0.1.0
 * @category models
 */
export type ProducerRecord = Omit<TopicRecord, "topic">

/**
 * How partitions are spread over the members of a group.
 *
 * @since 0.1.0
 * @category models
 */
export type Assignor = "range" | "roundRobin"

/**
 * @since 0.1.0
 * @category models
 */
export interface Options {
  readonly assignor?: Assignor
}

/**
 * @since 0.1.0
 * @category models
 */
export interface TopicOptions {
  /** `cleanup.policy=compact`: `compact` keeps only the latest record of each key. */
  readonly compacted?: boolean
}

/**
 * @since 0.1.0
 * @category models
 */
export interface GroupMember {
  readonly memberId: string
  readonly partitions: ReadonlyArray<TopicPartition.TopicPartition>
}

/**
 * @since 0.1.0
 * @category tags
 */
export class InMemoryKafka extends Context.Tag("effect-kafka-delivery/InMemoryKafka")<InMemoryKafka, {
  readonly createTopic: (
    topic: string,
    partitions: number,
    options?: TopicOptions
  ) => Effect.Effect<void, InvalidConfig>
  readonly produce: (
    topic: string,
    records: ReadonlyArray<ProducerRecord>
  ) => Effect.Effect<ReadonlyArray<readonly [partition: number, offset: bigint]>, DriverError>
  /**
   * Writes records as one transaction of a transactional producer, committed or aborted. Each partition it touched
   * gets a marker after its records, an offset that holds nothing to read; an aborted transaction's records take
   * offsets too and are never read (consumers read committed). Returns the offsets the records took.
   */
  readonly produceTransaction: (
    topic: string,
    records: ReadonlyArray<ProducerRecord>,
    outcome: "commit" | "abort"
  ) => Effect.Effect<ReadonlyArray<readonly [partition: number, offset: bigint]>, DriverError>
  /** Runs the log cleaner on a compacted topic: only the latest record of each key stays. */
  readonly compact: (topic: string) => Effect.Effect<void, DriverError>
  /** Removes a partition's records below `before`, as retention or `kafka-delete-records` do. */
  readonly deleteRecords: (topic: string, partition: number, before: bigint) => Effect.Effect<void, DriverError>
  /** The next offset to be written to each partition of the topic. */
  readonly endOffsets: (topic: string) => Effect.Effect<ReadonlyArray<bigint>, DriverError>
  /** The earliest, latest (high watermark) and last stable offsets of each partition of the topic. */
  readonly offsets: (topic: string) => Effect.Effect<ReadonlyArray<PartitionOffsets>, DriverError>
  readonly committed: (groupId: string) => Effect.Effect<ReadonlyMap<string, bigint>>
  /** The metadata committed with the group's positions, where there is any. */
  readonly committedMetadata: (groupId: string) => Effect.Effect<ReadonlyMap<string, string>>
  readonly members: (groupId: string) => Effect.Effect<ReadonlyArray<GroupMember>>
  /** The generation of the group's current assignment; it grows by one with every completed rebalance. */
  readonly generation: (groupId: string) => Effect.Effect<number>
  /** Records fetched by a member and not yet known to be handled are the runloop's business; this counts fetches. */
  readonly fetchedCount: (memberId: string) => Effect.Effect<number>
  /** The member's process dies: it leaves the group at once without revoking, and nothing it does lands any more. */
  readonly kill: (memberId: string) => Effect.Effect<void>
  /** The member stops heartbeating and polling, as in a long GC pause; the group evicts it after its session timeout. */
  readonly freeze: (memberId: string) => Effect.Effect<void>
  /** A frozen member goes on; if it was evicted meanwhile, it learns on its next poll that its partitions are lost. */
  readonly thaw: (memberId: string) => Effect.Effect<void>
  /** The group's next `times` commits are refused with `reason`, as the broker or the client would refuse them. */
  readonly refuseCommits: (groupId: string, reason: CommitFailureReason, times?: number) => Effect.Effect<void>
  /**
   * The broker cannot be reached: connecting, polling, reading offsets fail with a retriable `DriverError`, commits
   * with `CommitFailed` (`Disconnected`), and no heartbeat arrives, so members whose session expires meanwhile are
   * evicted when it is back.
   */
  readonly unreachable: Effect.Effect<void>
  /** The broker can be reached again. */
  readonly reachable: Effect.Effect<void>
  /**
   * Registers a transactional producer (Kafka's InitProducerId): the id's epoch goes up by one and is returned, and
   * the open transaction of the earlier epoch is aborted. Every later call with an earlier epoch is fenced. A
   * transaction open for longer than `transactionTimeout` is aborted by the broker, which bumps the epoch too. What
   * `layerTransactionalProducer` uses.
   */
  readonly initProducer: (
    transactionalId: string,
    transactionTimeout: Duration.DurationInput
  ) => Effect.Effect<number>
  /**
   * Writes records in the open transaction of the producer (opening one if none is): read-committed consumers see
   * them once it commits, and a partition is read-committed only up to the oldest transaction still open on it.
   */
  readonly transactionalProduce: (
    transactionalId: string,
    epoch: number,
    topic: string,
    records: ReadonlyArray<ProducerRecord>
  ) => Effect.Effect<ReadonlyArray<readonly [partition: number, offset: bigint]>, ProduceFailed>
  /**
   * Adds positions to commit for `groupId` to the producer's open transaction, opening one if none is (Kafka's
   * AddOffsetsToTxn and TxnOffsetCommit, what `sendOffsetsToTransaction` sends): they are committed when it commits,
   * dropped when it aborts. Until it ends, a session's read of the group's committed position of these partitions
   * (`DriverSession.committed`) fails with a retriable `DriverError` naming `UNSTABLE_OFFSET_COMMIT`, as a stable
   * read does on Kafka.
   *
   * @since 0.2.0
   */
  readonly sendOffsets: (
    transactionalId: string,
    epoch: number,
    groupId: string,
    positions: ReadonlyArray<{ readonly topic: string; readonly partition: number; readonly next: bigint }>
  ) => Effect.Effect<void, TransactionFailed>
  /**
   * Ends the producer's open transaction. `commit` also commits the positions added with `sendOffsets`, and
   * `offsets`, for their groups, atomically with the records (`sendOffsetsToTransaction`); `abort` drops them.
   */
  readonly endTransaction: (
    transactionalId: string,
    epoch: number,
    outcome: "commit" | "abort",
    offsets?: ReadonlyArray<{
      readonly groupId: string
      readonly positions: ReadonlyArray<{ readonly topic: string; readonly partition: number; readonly next: bigint }>
    }>
  ) => Effect.Effect<void, TransactionFailed>
}>() {}

/** Positions to commit for one group, as a transaction carries them. */
interface GroupOffsets {
  readonly groupId: string
  readonly positions: ReadonlyArray<{ readonly topic: string; readonly partition: number; readonly next: bigint }>
}

const encoder = new TextEncoder()
const bytes = (value: Uint8Array | string): Uint8Array => typeof value === "string" ? encoder.encode(value) : value

/**
 * A record's headers as bytes: string values are encoded into one array, each header a view of its part of it (a
 * dead letter's eight headers are one allocation, not eight).
 */
const headerBytes = (given: Readonly<Record<string, Uint8Array | string>>): Record<string, Uint8Array> => {
  const entries = Object.entries(given)
  let size = 0
  for (const [, value] of entries) if (typeof value === "string") size += utf8Length(value)
  const all = new Uint8Array(size)
  const headers: Record<string, Uint8Array> = {}
  let at = 0
  for (const [name, value] of entries) {
    if (typeof value !== "string") {
      headers[name] = value
      continue
    }
    const end = utf8EncodeInto(value, all, at)
    headers[name] = all.subarray(at, end)
    at = end
  }
  return headers
}

/**
 * Builds the broker's state and its operations. Exposed through `layer`.
 */
const makeBroker = (options: Options) =>
  Effect.gen(function*() {
    const topics = new Map<string, memoryLog.Topic>()
    let roundRobin = 0
    let down = false
    let changed = yield* Deferred.make<void>()
    const read = memoryLog.makeReader()

    const notify = Effect.suspend(() => {
      const previous = changed
      return Deferred.make<void>().pipe(
        Effect.flatMap((next) => {
          changed = next
          return Deferred.succeed(previous, undefined)
        })
      )
    })

    const partitionsOf = (topicNames: ReadonlyArray<string>): Array<TopicPartition.TopicPartition> => {
      const out: Array<TopicPartition.TopicPartition> = []
      for (const topic of topicNames) {
        const found = topics.get(topic)
        if (found !== undefined) found.partitions.forEach((_, partition) => out.push({ topic, partition }))
      }
      return out
    }
    const logOf = (tp: TopicPartition.TopicPartition) => topics.get(tp.topic)?.partitions[tp.partition]

    const coordinator = groups.makeCoordinator(options.assignor ?? "range", partitionsOf)
    const { groupOf, members } = coordinator

    const release = (member: groups.Member, generation: number) =>
      coordinator.release(member, generation) ? notify : Effect.void

    // Removes a member from its group without a revoke: its partitions move at once.
    const evict = (member: groups.Member, now: number): void => {
      if (!member.inGroup) return
      member.inGroup = false
      member.awaitingRelease = false
      const group = groupOf(member.groupId)
      group.members = group.members.filter((m) => m !== member)
      if (!member.static) coordinator.startRebalance(group, now, release)
    }

    const expire = (group: groups.Group, now: number): boolean => {
      let any = false
      for (const m of [...group.members]) {
        const sessionExpired = now - m.lastHeartbeat > m.sessionMillis
        const releaseExpired = m.awaitingRelease && now > m.rebalanceDeadline
        if (sessionExpired || releaseExpired) {
          evict(m, now)
          any = true
        }
      }
      return any
    }

    const join = (member: groups.Member, now: number): void => {
      const group = groupOf(member.groupId)
      member.inGroup = true
      member.lastHeartbeat = now
      group.members.push(member)
      if (member.static) {
        const s = member.options.subscription
        member.assigned = s._tag === "Partitions" ? [...s.partitions].sort(TopicPartition.compare) : []
        member.generation = -1
        member.pendingEvents.push({ _tag: "Assigned", partitions: member.assigned })
      } else {
        coordinator.startRebalance(group, now, release)
      }
    }

    const fetch = (member: groups.Member): Array<DriverEvent> => {
      const out: Array<DriverEvent> = []
      const group = groupOf(member.groupId)
      if (member.awaitingRelease || (group.rebalancing && !member.static)) return out
      for (const tp of member.assigned) {
        const k = TopicPartition.key(tp)
        // A newly assigned partition is fetched only once the runloop has sought it to its start position.
        const position = member.positions.get(k)
        if (position === undefined || member.paused.has(k) || member.outOfRange.has(k)) continue
        const log = logOf(tp)
        if (log === undefined) continue
        const fetched = read(
          log,
          position,
          member.options.maxPollRecords,
          member.options.isolationLevel === "read_uncommitted"
        )
        if (fetched._tag === "Empty") continue
        if (fetched._tag === "OutOfRange") {
          member.outOfRange.add(k)
          out.push({ _tag: "OutOfRange", partition: tp, position })
          continue
        }
        member.positions.set(k, fetched.next)
        member.fetched += Chunk.size(fetched.records)
        out.push({ _tag: "Records", partition: tp, records: fetched.records, from: position, next: fetched.next })
      }
      return out
    }

    let changedPending = false
    // The group looks at sessions before this poll counts as the member's heartbeat: a member that was paused past its
    // session learns here that it was evicted.
    const pollOnce = (member: groups.Member, now: number): Array<DriverEvent> | "lost" => {
      const group = groupOf(member.groupId)
      if (expire(group, now)) changedPending = true
      if (!member.inGroup) return "lost"
      member.lastHeartbeat = now
      if (expireTransactions(now)) changedPending = true
      const events = member.pendingEvents
      member.pendingEvents = []
      return events.concat(fetch(member))
    }

    const flushNotify = Effect.suspend(() => {
      if (!changedPending) return Effect.void
      changedPending = false
      return notify
    })

    const newMember = (options: SessionOptions, now: number): groups.Member => ({
      id: `${options.clientId}-${coordinator.nextMemberId()}`,
      groupId: options.groupId,
      options,
      sessionMillis: Duration.toMillis(options.sessionTimeout),
      static: options.subscription._tag === "Partitions",
      generation: 0,
      assigned: [],
      positions: new Map(),
      outOfRange: new Set(),
      paused: new Set(),
      pendingEvents: [],
      awaitingRelease: false,
      rebalanceDeadline: 0,
      lastHeartbeat: now,
      inGroup: false,
      dead: false,
      frozen: false,
      fetched: 0
    })

    const whileFrozen = (member: groups.Member): Effect.Effect<void> =>
      Effect.suspend(() => {
        if (member.dead) return Effect.never
        if (!member.frozen) return Effect.void
        return Deferred.await(changed).pipe(Effect.zipRight(whileFrozen(member)))
      })

    const unreachableError = (operation: string) =>
      new DriverError({ operation, reason: "the broker cannot be reached", retriable: true })

    const connect = (options: SessionOptions): Effect.Effect<DriverSession, DriverError, Scope.Scope> =>
      Effect.gen(function*() {
        if (down) return yield* unreachableError("connect")
        const subscribed = options.subscription._tag === "Topics"
          ? options.subscription.topics
          : options.subscription.partitions.map((tp) => tp.topic)
        for (const topic of subscribed) {
          if (!topics.has(topic)) {
            return yield* new DriverError({ operation: "subscribe", reason: `unknown topic "${topic}"` })
          }
        }
        const now = yield* Clock.currentTimeMillis
        const member = newMember(options, now)
        members.set(member.id, member)
        join(member, now)
        yield* notify

        const heartbeat = Effect.gen(function*() {
          if (member.dead || member.frozen || down) return
          const t = yield* Clock.currentTimeMillis
          member.lastHeartbeat = t
          if (expire(groupOf(member.groupId), t)) yield* notify
        })
        yield* heartbeat.pipe(
          Effect.repeat(Schedule.spaced(Duration.millis(Math.max(1, Duration.toMillis(options.sessionTimeout) / 3)))),
          Effect.forkScoped
        )

        yield* Effect.addFinalizer(() =>
          Effect.gen(function*() {
            if (member.dead) return
            const t = yield* Clock.currentTimeMillis
            evict(member, t)
            members.delete(member.id)
            yield* notify
          })
        )

        const poll: Effect.Effect<ReadonlyArray<DriverEvent>, DriverError> = Effect.clockWith((clock) => {
          // The common case, a member that is neither dead nor frozen and has something to return, takes no
          // generator and no extra steps: it runs once per poll loop turn.
          if (member.dead || member.frozen || down) return slowPoll
          const wake = changed
          const first = pollOnce(member, clock.unsafeCurrentTimeMillis())
          if (first === "lost" || first.length === 0 || changedPending) {
            return Effect.zipRight(flushNotify, afterFirst(wake, first))
          }
          return Effect.succeed(first)
        })

        const slowPoll: Effect.Effect<ReadonlyArray<DriverEvent>, DriverError> = Effect.gen(function*() {
          yield* whileFrozen(member)
          if (down) return yield* unreachableError("poll")
          const wake = changed
          const first = pollOnce(member, yield* Clock.currentTimeMillis)
          yield* flushNotify
          return yield* afterFirst(wake, first)
        })

        // What follows the first look: a lost member rejoins; an empty poll waits for a change, up to the poll timeout.
        const afterFirst = (
          wake: Deferred.Deferred<void>,
          first: Array<DriverEvent> | "lost"
        ): Effect.Effect<ReadonlyArray<DriverEvent>, DriverError> =>
          Effect.gen(function*() {
            if (first === "lost") return yield* lostAndRejoin
            if (first.length > 0) return first
            const woke = yield* Deferred.await(wake).pipe(Effect.timeoutOption(options.pollTimeout))
            if (Option.isNone(woke)) return []
            yield* whileFrozen(member)
            if (down) return yield* unreachableError("poll")
            const t2 = yield* Clock.currentTimeMillis
            const second = pollOnce(member, t2)
            yield* flushNotify
            if (second === "lost") return yield* lostAndRejoin
            return second
          })

        // An evicted member learns that its partitions are gone, then joins again as a new member, as a Kafka
        // consumer does when its next request is answered with UNKNOWN_MEMBER_ID.
        const lostAndRejoin = Effect.gen(function*() {
          const lost = member.assigned
          member.assigned = []
          member.positions = new Map()
          member.outOfRange = new Set()
          member.pendingEvents = []
          const t = yield* Clock.currentTimeMillis
          members.delete(member.id)
          member.id = `${options.clientId}-${coordinator.nextMemberId()}`
          members.set(member.id, member)
          join(member, t)
          yield* notify
          return [{ _tag: "Lost", partitions: lost }] as ReadonlyArray<DriverEvent>
        })

        const commitNow = (offsets: OffsetBatch.OffsetBatch): Effect.Effect<void, CommitFailed> => {
          if (down) {
            const partitions = Array.from(offsets.positions.keys(), TopicPartition.fromKey)
            return Effect.fail(new CommitFailed({ reason: "Disconnected", partitions, detail: "the broker cannot be reached" }))
          }
          const group = groupOf(member.groupId)
          const refused = groups.refuseCommit(member, group, offsets)
          if (refused !== undefined) return Effect.fail(refused)
          for (const [k, position] of offsets.positions) {
            group.committed.set(k, position)
            const metadata = offsets.metadata?.get(k)
            if (metadata === undefined || metadata === "") group.metadata.delete(k)
            else group.metadata.set(k, metadata)
          }
          return Effect.void
        }

        // A commit runs once per batch of handled records: without a generator, and in one step when the member is
        // neither frozen nor dead.
        const commit = (offsets: OffsetBatch.OffsetBatch): Effect.Effect<void, CommitFailed> =>
          Effect.suspend(() =>
            member.dead || member.frozen
              ? Effect.zipRight(whileFrozen(member), Effect.suspend(() => commitNow(offsets)))
              : commitNow(offsets)
          )

        const reachableOr = <A>(operation: string, f: () => A): Effect.Effect<A, DriverError> =>
          Effect.suspend(() => down ? Effect.fail(unreachableError(operation)) : Effect.succeed(f()))

        // A stable read, as with `require_stable` on Kafka: a position that an open transaction is about to commit
        // is not answered with the one before it.
        const committedWithMetadata = (
          tps: ReadonlyArray<TopicPartition.TopicPartition>
        ): Effect.Effect<ReadonlyMap<string, CommittedPosition>, DriverError> =>
          Effect.clockWith((clock) => {
            if (down) return Effect.fail(unreachableError("committed"))
            // A transaction past its timeout is aborted first, as the broker would have by now.
            const expired = expireTransactions(clock.unsafeCurrentTimeMillis())
            const read = (): Effect.Effect<ReadonlyMap<string, CommittedPosition>, DriverError> => {
              const group = groupOf(member.groupId)
              const out = new Map<string, CommittedPosition>()
              for (const tp of tps) {
                const k = TopicPartition.key(tp)
                const pending = pendingOffsetCommit(member.groupId, k)
                if (pending !== undefined) {
                  return Effect.fail(
                    new DriverError({
                      operation: "committed",
                      reason: `UNSTABLE_OFFSET_COMMIT: the open transaction of producer "${pending}" commits a ` +
                        `position of ${k} for group "${member.groupId}"; read again once it has ended`,
                      retriable: true
                    })
                  )
                }
                const position = group.committed.get(k)
                if (position !== undefined) out.set(k, { position, metadata: group.metadata.get(k) ?? "" })
              }
              return Effect.succeed(out)
            }
            return expired ? Effect.zipRight(notify, Effect.suspend(read)) : read()
          })

        const session: DriverSession = {
          get memberId() {
            return member.id
          },
          poll,
          commit,
          committed: (tps) =>
            Effect.map(committedWithMetadata(tps), (found) => {
              const out = new Map<string, bigint>()
              for (const [k, { position }] of found) out.set(k, position)
              return out
            }),
          committedWithMetadata,
          offsets: (tps) =>
            reachableOr("offsets", () => {
              const out = new Map<string, PartitionOffsets>()
              for (const tp of tps) {
                const log = logOf(tp)
                if (log !== undefined) out.set(TopicPartition.key(tp), memoryLog.offsets(log))
              }
              return out
            }),
          seek: (tp, position) =>
            Effect.sync(() => {
              if (member.assigned.some((a) => TopicPartition.equals(a, tp))) {
                const k = TopicPartition.key(tp)
                member.positions.set(k, position)
                member.outOfRange.delete(k)
              }
            }),
          pause: (tps) =>
            Effect.sync(() => {
              for (const tp of tps) member.paused.add(TopicPartition.key(tp))
            }),
          resume: (tps) =>
            Effect.suspend(() => {
              for (const tp of tps) member.paused.delete(TopicPartition.key(tp))
              return notify
            })
        }
        return session
      })

    const topicOf = (operation: string, topic: string): Effect.Effect<memoryLog.Topic, DriverError> =>
      Effect.suspend(() => {
        const found = topics.get(topic)
        return found === undefined
          ? Effect.fail(new DriverError({ operation, reason: `unknown topic "${topic}"` }))
          : Effect.succeed(found)
      })

    /** The records of one write, by partition, as builders that take the offset the log gives them. */
    const plan = (operation: string, topic: memoryLog.Topic, records: ReadonlyArray<ProducerRecord>, now: number) =>
      Effect.suspend(() => {
        const byPartition = new Map<number, Array<(offset: bigint) => ConsumerRecord>>()
        const order: Array<number> = []
        const count = topic.partitions.length
        for (const r of records) {
          const key = r.key === undefined || r.key === null ? null : bytes(r.key)
          const partition = r.partition ?? (key !== null ? partitionOfKey(key, count) : roundRobin++ % count)
          if (!Number.isInteger(partition) || partition < 0 || partition >= count) {
            return Effect.fail(
              new DriverError({ operation, reason: `topic "${topic.name}" has no partition ${partition}` })
            )
          }
          const headers = r.headers === undefined ? {} : headerBytes(r.headers)
          const value = r.value === null ? null : bytes(r.value)
          let list = byPartition.get(partition)
          if (list === undefined) {
            list = []
            byPartition.set(partition, list)
          }
          const timestamp = r.timestamp ?? now
          list.push((offset) => new MemoryRecord(topic.name, partition, offset, key, value, headers, timestamp))
          order.push(partition)
        }
        return Effect.succeed({ byPartition, order })
      })

    /** Writes a plan; the offsets come back in the order of the records given. */
    const write = (
      topic: memoryLog.Topic,
      planned: Effect.Effect.Success<ReturnType<typeof plan>>,
      transaction: "commit" | "abort" | undefined
    ) => {
      const offsets = new Map<number, Array<bigint>>()
      for (const [partition, builders] of planned.byPartition) {
        const log = topic.partitions[partition]!
        if (transaction === undefined) {
          offsets.set(partition, memoryLog.append(log, builders))
        } else {
          const txn: memoryLog.Txn = { state: "open" }
          offsets.set(partition, memoryLog.appendTransactional(log, builders, txn))
          txn.state = transaction === "commit" ? "committed" : "aborted"
          memoryLog.appendMarker(log)
        }
      }
      const taken = new Map<number, number>()
      return planned.order.map((partition) => {
        const at = taken.get(partition) ?? 0
        taken.set(partition, at + 1)
        return [partition, offsets.get(partition)![at]!] as const
      })
    }

    const produceWith = (operation: string, transaction: "commit" | "abort" | undefined) =>
    (topicName: string, records: ReadonlyArray<ProducerRecord>) =>
      Effect.gen(function*() {
        const topic = yield* topicOf(operation, topicName)
        const planned = yield* plan(operation, topic, records, yield* Clock.currentTimeMillis)
        const out = write(topic, planned, transaction)
        yield* notify
        return out
      })

    const lookup = (memberId: string) => Option.fromNullable(members.get(memberId))

    interface OpenTransaction {
      readonly txn: memoryLog.Txn
      readonly logs: Set<memoryLog.PartitionLog>
      readonly at: number
      /** Positions sent with the transaction, by group: committed with it, or dropped. */
      readonly offsets: Array<GroupOffsets>
    }
    interface TransactionalProducerState {
      epoch: number
      timeoutMillis: number
      open: OpenTransaction | undefined
    }
    const producers = new Map<string, TransactionalProducerState>()

    const openTransaction = (state: TransactionalProducerState, now: number): OpenTransaction => {
      if (state.open === undefined) state.open = { txn: { state: "open" }, logs: new Set(), at: now, offsets: [] }
      return state.open
    }

    /** The producer of an open transaction that carries a position of `key` for `groupId`, if one does. */
    const pendingOffsetCommit = (groupId: string, key: string): string | undefined => {
      for (const [transactionalId, state] of producers) {
        const open = state.open
        if (open === undefined) continue
        for (const sent of open.offsets) {
          if (sent.groupId !== groupId) continue
          if (sent.positions.some((p) => TopicPartition.key({ topic: p.topic, partition: p.partition }) === key)) {
            return transactionalId
          }
        }
      }
      return undefined
    }

    /** Ends an open transaction on every partition it wrote to. */
    const finish = (state: TransactionalProducerState, outcome: "committed" | "aborted") => {
      const open = state.open
      if (open === undefined) return
      state.open = undefined
      open.txn.state = outcome
      for (const log of open.logs) memoryLog.appendMarker(log)
    }

    /** The broker aborts transactions open longer than their timeout, and fences their producer. */
    const expireTransactions = (now: number): boolean => {
      let any = false
      for (const state of producers.values()) {
        if (state.open !== undefined && now - state.open.at > state.timeoutMillis) {
          finish(state, "aborted")
          state.epoch++
          any = true
        }
      }
      return any
    }

    const fencedBy = (transactionalId: string, epoch: number): TransactionalProducerState | string => {
      const state = producers.get(transactionalId)
      if (state === undefined) return `producer "${transactionalId}" was never initialized`
      if (state.epoch !== epoch) {
        return `producer "${transactionalId}" with epoch ${epoch} was fenced by epoch ${state.epoch} (a newer ` +
          "producer with the same transactional id started, or the broker aborted a transaction that timed out)"
      }
      return state
    }

    const service: Context.Tag.Service<InMemoryKafka> = {
      createTopic: (topic, partitions, topicOptions) =>
        Effect.suspend(() => {
          if (topic.length === 0) {
            return new InvalidConfig({ field: "topic", reason: "must be a non-empty string" })
          }
          if (!Number.isInteger(partitions) || partitions < 1) {
            return new InvalidConfig({ field: "partitions", reason: `must be a positive integer, got ${partitions}` })
          }
          if (!topics.has(topic)) {
            topics.set(topic, memoryLog.makeTopic(topic, partitions, topicOptions?.compacted === true))
          }
          return notify
        }),
      produce: produceWith("produce", undefined),
      produceTransaction: (topic, records, outcome) => produceWith("produceTransaction", outcome)(topic, records),
      compact: (topicName) =>
        Effect.flatMap(topicOf("compact", topicName), (topic) => {
          if (!topic.compacted) {
            return new DriverError({
              operation: "compact",
              reason: `topic "${topicName}" is not compacted (create it with { compacted: true })`
            })
          }
          for (const log of topic.partitions) memoryLog.compact(log)
          return notify
        }),
      deleteRecords: (topicName, partition, before) =>
        Effect.flatMap(topicOf("deleteRecords", topicName), (topic) => {
          const log = topic.partitions[partition]
          if (log === undefined) {
            return new DriverError({ operation: "deleteRecords", reason: `topic "${topicName}" has no partition ${partition}` })
          }
          if (before < 0n || before > log.end) {
            return new DriverError({
              operation: "deleteRecords",
              reason: `offset ${before} is outside ${topicName}-${partition}'s log (0 to ${log.end})`
            })
          }
          memoryLog.deleteBefore(log, before)
          return notify
        }),
      endOffsets: (topic) => Effect.map(topicOf("endOffsets", topic), (t) => t.partitions.map((p) => p.end)),
      offsets: (topic) => Effect.map(topicOf("offsets", topic), (t) => t.partitions.map(memoryLog.offsets)),
      committed: (groupId) => Effect.sync(() => new Map(groupOf(groupId).committed)),
      committedMetadata: (groupId) => Effect.sync(() => new Map(groupOf(groupId).metadata)),
      members: (groupId) =>
        Effect.sync(() => groupOf(groupId).members.map((m) => ({ memberId: m.id, partitions: [...m.assigned] }))),
      generation: (groupId) => Effect.sync(() => groupOf(groupId).generation),
      fetchedCount: (memberId) =>
        Effect.sync(() => Option.match(lookup(memberId), { onNone: () => 0, onSome: (m) => m.fetched })),
      kill: (memberId) =>
        Effect.gen(function*() {
          const member = members.get(memberId)
          if (member === undefined || member.dead) return
          member.dead = true
          evict(member, yield* Clock.currentTimeMillis)
          members.delete(memberId)
          yield* notify
        }),
      freeze: (memberId) =>
        Effect.sync(() => {
          const member = members.get(memberId)
          if (member !== undefined) member.frozen = true
        }),
      thaw: (memberId) =>
        Effect.suspend(() => {
          const member = members.get(memberId)
          if (member !== undefined) member.frozen = false
          return notify
        }),
      initProducer: (transactionalId, transactionTimeout) =>
        Effect.gen(function*() {
          const now = yield* Clock.currentTimeMillis
          expireTransactions(now)
          const state = producers.get(transactionalId) ?? { epoch: -1, timeoutMillis: 0, open: undefined }
          finish(state, "aborted")
          state.epoch++
          state.timeoutMillis = Duration.toMillis(Duration.decode(transactionTimeout))
          producers.set(transactionalId, state)
          yield* notify
          return state.epoch
        }),
      transactionalProduce: (transactionalId, epoch, topicName, records) =>
        Effect.gen(function*() {
          const now = yield* Clock.currentTimeMillis
          if (expireTransactions(now)) yield* notify
          const state = fencedBy(transactionalId, epoch)
          if (typeof state === "string") {
            return yield* new ProduceFailed({ reason: "Fenced", topic: topicName, code: "PRODUCER_FENCED", detail: state })
          }
          const topic = topics.get(topicName)
          if (topic === undefined) return yield* producer.unknownTopic(topicName)
          const planned = yield* plan("transactionalProduce", topic, records, now).pipe(
            Effect.mapError((e) => new ProduceFailed({ reason: "UnknownPartition", topic: topicName, detail: e.reason }))
          )
          const open = openTransaction(state, now)
          const offsets = new Map<number, Array<bigint>>()
          for (const [partition, builders] of planned.byPartition) {
            const log = topic.partitions[partition]!
            open.logs.add(log)
            offsets.set(partition, memoryLog.appendTransactional(log, builders, open.txn))
          }
          yield* notify
          const taken = new Map<number, number>()
          return planned.order.map((partition) => {
            const at = taken.get(partition) ?? 0
            taken.set(partition, at + 1)
            return [partition, offsets.get(partition)![at]!] as const
          })
        }),
      endTransaction: (transactionalId, epoch, outcome, offsets = []) =>
        Effect.gen(function*() {
          const now = yield* Clock.currentTimeMillis
          if (expireTransactions(now)) yield* notify
          const state = fencedBy(transactionalId, epoch)
          if (typeof state === "string") {
            return yield* producer.transactionFailed(transactionalId, outcome, "Fenced", state)
          }
          if (outcome === "commit") {
            for (const { groupId, positions } of [...(state.open?.offsets ?? []), ...offsets]) {
              const group = groupOf(groupId)
              for (const { next, partition, topic } of positions) {
                group.committed.set(TopicPartition.key({ topic, partition }), next)
                group.metadata.delete(TopicPartition.key({ topic, partition }))
              }
            }
          }
          finish(state, outcome === "commit" ? "committed" : "aborted")
          yield* notify
        }),
      sendOffsets: (transactionalId, epoch, groupId, positions) =>
        Effect.gen(function*() {
          const now = yield* Clock.currentTimeMillis
          if (expireTransactions(now)) yield* notify
          const state = fencedBy(transactionalId, epoch)
          if (typeof state === "string") {
            return yield* producer.transactionFailed(transactionalId, "sendOffsets", "Fenced", state)
          }
          openTransaction(state, now).offsets.push({ groupId, positions: [...positions] })
        }),
      refuseCommits: (groupId, reason, times = 1) =>
        Effect.sync(() => {
          const refusals = groupOf(groupId).refusals
          for (let i = 0; i < times; i++) refusals.push(reason)
        }),
      unreachable: Effect.suspend(() => {
        down = true
        return notify
      }),
      reachable: Effect.suspend(() => {
        down = false
        return notify
      })
    }

    const driver: Context.Tag.Service<Driver> = { connect }
    return { service, driver } as const
  })

/**
 * The broker and a `Driver` on it, in one layer.
 *
 * @since 0.1.0
 * @category layers
 */
export const layer = (options: Options = {}): Layer.Layer<InMemoryKafka | Driver> =>
  Layer.effectContext(
    makeBroker(options).pipe(
      Effect.map(({ driver, service }) => Context.make(InMemoryKafka, service).pipe(Context.add(Driver, driver)))
    )
  )

/**
 * Crash injection on the in-memory broker: when `plan` says so, the member is killed (it leaves its group at once,
 * and nothing it does afterwards lands) and its consumer dies with `Crashed`.
 *
 * @since 0.1.0
 * @category layers
 */
export const layerFaults = (
  plan: (point: CrashPoint, memberId: string, partitions: ReadonlyArray<TopicPartition.TopicPartition>) => boolean
): Layer.Layer<Faults, never, InMemoryKafka> =>
  Layer.effect(
    Faults,
    Effect.map(InMemoryKafka, (kafka) => ({
      crashAt: (point, memberId, partitions) =>
        Effect.suspend(() =>
          plan(point, memberId, partitions) ? Effect.as(kafka.kill(memberId), true) : Effect.succeed(false)
        )
    }))
  )

/**
 * Creates a topic with this many partitions.
 *
 * @since 0.1.0
 * @category accessors
 */
export const createTopic = (
  topic: string,
  partitions: number,
  options?: TopicOptions
): Effect.Effect<void, InvalidConfig, InMemoryKafka> =>
  Effect.flatMap(InMemoryKafka, (kafka) => kafka.createTopic(topic, partitions, options))

/**
 * @since 0.1.0
 * @category accessors
 */
export const produce = (
  topic: string,
  records: ReadonlyArray<ProducerRecord>
): Effect.Effect<ReadonlyArray<readonly [partition: number, offset: bigint]>, DriverError, InMemoryKafka> =>
  Effect.flatMap(InMemoryKafka, (kafka) => kafka.produce(topic, records))

/**
 * Writes records as one committed or aborted transaction (see {@link InMemoryKafka}).
 *
 * @since 0.1.0
 * @category accessors
 */
export const produceTransaction = (
  topic: string,
  records: ReadonlyArray<ProducerRecord>,
  outcome: "commit" | "abort"
): Effect.Effect<ReadonlyArray<readonly [partition: number, offset: bigint]>, DriverError, InMemoryKafka> =>
  Effect.flatMap(InMemoryKafka, (kafka) => kafka.produceTransaction(topic, records, outcome))

/**
 * The group's committed positions as a batch, with the metadata committed with them.
 *
 * @since 0.1.0
 * @category accessors
 */
export const committed = (groupId: string): Effect.Effect<OffsetBatch.OffsetBatch, never, InMemoryKafka> =>
  Effect.flatMap(InMemoryKafka, (kafka) =>
    Effect.zipWith(
      kafka.committed(groupId),
      kafka.committedMetadata(groupId),
      (positions, metadata): OffsetBatch.OffsetBatch => metadata.size === 0 ? { positions } : { positions, metadata }
    ))

/**
 * A batch written through `produce`: partitions chosen as the Java client does, unknown topics and partitions refused
 * per record.
 */
const makeWrite = (
  kafka: Context.Tag.Service<InMemoryKafka>,
  resolved: producer.Resolved,
  produce: (
    topic: string,
    records: ReadonlyArray<ProducerRecord>
  ) => Effect.Effect<ReadonlyArray<readonly [partition: number, offset: bigint]>, ProduceFailed>
) => {
  const partitioner = producer.makePartitioner()
  return (batch: ReadonlyArray<TopicRecord>) =>
    Effect.gen(function*() {
      const counts = new Map<string, number | ProduceFailed>()
      for (const record of batch) {
        if (counts.has(record.topic)) continue
        const ends = yield* Effect.either(kafka.endOffsets(record.topic))
        counts.set(record.topic, Either.isRight(ends) ? ends.right.length : producer.unknownTopic(record.topic))
      }
      const { out, partitionOf, topics } = partitioner(batch, counts)
      for (const { indexes, topic } of topics) {
        const records: Array<ProducerRecord> = indexes.map((i) => {
          const record = batch[i]!
          return {
            key: record.key ?? null,
            value: record.value,
            partition: partitionOf[i]!,
            ...(record.headers === undefined ? {} : { headers: record.headers }),
            ...(record.timestamp === undefined ? {} : { timestamp: record.timestamp })
          }
        })
        const written = yield* Effect.either(produce(topic, records))
        indexes.forEach((index, k) => {
          out[index] = Either.isRight(written)
            ? { topic, partition: written.right[k]![0], offset: resolved.acks === 0 ? -1n : written.right[k]![1] }
            : written.left
        })
      }
      return out
    })
}

/**
 * The `Producer` on the in-memory broker, with the same settings, batching, partitioning and errors as
 * `KafkaJs.layerProducer`: a key goes to its murmur2 partition, as with the Java client; a topic that does not exist
 * fails with `UnknownTopic`, a partition it does not have with `UnknownPartition`, a record larger than
 * `maxRequestSize` with `RecordTooLarge`. The broker has one replica, so `acks` changes nothing about what is kept.
 *
 * @since 0.1.0
 * @category layers
 */
export const layerProducer = (settings: ProducerSettings = {}): Layer.Layer<Producer, InvalidConfig, InMemoryKafka> =>
  Layer.scoped(
    Producer,
    Effect.gen(function*() {
      const resolved = yield* producer.resolve(settings)
      const kafka = yield* InMemoryKafka
      const write = makeWrite(kafka, resolved, (topic, records) =>
        Effect.mapError(
          kafka.produce(topic, records),
          (error) => new ProduceFailed({ reason: "Other", topic, detail: error.message })
        ))
      return yield* producer.make(resolved, { write })
    })
  )

/**
 * Transactional producers on the in-memory broker, made on demand (see `layerTransactionalProducer`); what
 * `CommitPolicy.kafkaTransactional` needs.
 *
 * @since 0.1.0
 * @category layers
 */
export const layerTransactionalProducers = (
  settings: Omit<TransactionalSettings, "transactionalId"> = {}
): Layer.Layer<TransactionalProducers, InvalidConfig, InMemoryKafka> =>
  Layer.effect(
    TransactionalProducers,
    Effect.gen(function*() {
      const { resolved, transactionTimeout } = yield* producer.resolveTransactional(settings)
      const kafka = yield* InMemoryKafka
      return {
        make: (transactionalId) =>
          producer.makeTransactional(resolved, transactionClient(kafka, resolved, transactionalId, transactionTimeout))
      }
    })
  )

/**
 * A `TransactionalProducer` on the in-memory broker. Starting it fences earlier producers with the same
 * `transactionalId` (their open transaction is aborted); its transactions are invisible to read-committed consumers
 * until they commit, and a partition is read-committed only up to the oldest transaction still open on it.
 *
 * @since 0.1.0
 * @category layers
 */
export const layerTransactionalProducer = (
  settings: TransactionalSettings
): Layer.Layer<TransactionalProducer, InvalidConfig | TransactionFailed, InMemoryKafka> =>
  Layer.scoped(
    TransactionalProducer,
    Effect.gen(function*() {
      const transactionalId = yield* producer.checkTransactionalId(settings.transactionalId)
      const { transactionalId: _, ...rest } = settings
      const producers = yield* Layer.build(layerTransactionalProducers(rest))
      // The in-memory broker is always reachable for a producer: `make` fails with TransactionFailed only.
      return yield* Context.get(producers, TransactionalProducers).make(transactionalId).pipe(
        Effect.catchTag("DriverError", Effect.die)
      )
    })
  )

const transactionClient = (
  kafka: Context.Tag.Service<InMemoryKafka>,
  resolved: producer.Resolved,
  transactionalId: string,
  transactionTimeout: Duration.Duration
): producer.TxnClient => {
  let epoch = -1
  const write = makeWrite(kafka, resolved, (topic, records) =>
    kafka.transactionalProduce(transactionalId, epoch, topic, records))
  return {
    transactionalId,
    init: Effect.map(kafka.initProducer(transactionalId, transactionTimeout), (e) => {
      epoch = e
    }),
    begin: Effect.sync(() => ({
      write,
      // The positions go to the broker at once, as TxnOffsetCommit does: the group's stable reads see them pending.
      sendOffsets: (groupId, positions) => kafka.sendOffsets(transactionalId, epoch, groupId, positions),
      commit: kafka.endTransaction(transactionalId, epoch, "commit"),
      abort: kafka.endTransaction(transactionalId, epoch, "abort")
    }))
  }
}
