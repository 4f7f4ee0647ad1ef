/**
 * An in-memory Kafka: topics, partitions, consumer groups with several members, eager rebalances, committed offsets,
 * session timeouts and crash injection. It keeps the `Driver` contract exactly as the kafkajs driver does, runs on the
 * Effect `Clock` (so it is deterministic under `TestClock`), and is the test kit users get for their own consumers.
 *
 * @since 0.1.0
 */
import * as Chunk from "effect/Chunk"
import * as Clock from "effect/Clock"
import * as Context from "effect/Context"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import type * as Scope from "effect/Scope"
import type { ConsumerRecord } from "./ConsumerRecord.js"
import { Driver, type DriverEvent, type DriverSession, type SessionOptions } from "./Driver.js"
import { Faults, type CrashPoint } from "./Faults.js"
import { CommitFailed, ConfigError, DriverError } from "./KafkaError.js"
import * as OffsetBatch from "./OffsetBatch.js"
import * as TopicPartition from "./TopicPartition.js"

/**
 * A record to produce. Without `partition`, records with a key go to the key's partition and the others round robin.
 *
 * @since 0.1.0
 * @category models
 */
export interface ProducerRecord {
  readonly key?: Uint8Array | string | null
  readonly value: Uint8Array | string | null
  readonly partition?: number
  readonly headers?: Readonly<Record<string, Uint8Array | string>>
}

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
export interface GroupMember {
  readonly memberId: string
  readonly partitions: ReadonlyArray<TopicPartition.TopicPartition>
}

/**
 * @since 0.1.0
 * @category tags
 */
export class InMemoryKafka extends Context.Tag("effect-kafka-delivery/InMemoryKafka")<InMemoryKafka, {
  readonly createTopic: (topic: string, partitions: number) => Effect.Effect<void, ConfigError>
  readonly produce: (
    topic: string,
    records: ReadonlyArray<ProducerRecord>
  ) => Effect.Effect<ReadonlyArray<readonly [partition: number, offset: bigint]>, DriverError>
  /** The next offset to be written to each partition of the topic. */
  readonly endOffsets: (topic: string) => Effect.Effect<ReadonlyArray<bigint>, DriverError>
  readonly committed: (groupId: string) => Effect.Effect<ReadonlyMap<string, bigint>>
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
}>() {}

interface Member {
  id: string
  readonly groupId: string
  readonly options: SessionOptions
  /** `options.sessionTimeout` in millis, decoded once: every poll checks it. */
  readonly sessionMillis: number
  readonly static: boolean
  generation: number
  assigned: Array<TopicPartition.TopicPartition>
  positions: Map<string, bigint>
  paused: Set<string>
  pendingEvents: Array<DriverEvent>
  awaitingRelease: boolean
  rebalanceDeadline: number
  lastHeartbeat: number
  inGroup: boolean
  dead: boolean
  frozen: boolean
  fetched: number
}

interface Group {
  readonly id: string
  members: Array<Member>
  generation: number
  rebalancing: boolean
  committed: Map<string, bigint>
}

const encoder = new TextEncoder()
const bytes = (value: Uint8Array | string): Uint8Array => typeof value === "string" ? encoder.encode(value) : value

const hashBytes = (value: Uint8Array): number => {
  let h = 0x811c9dc5
  for (let i = 0; i < value.length; i++) {
    h ^= value[i]!
    h = Math.imul(h, 0x01000193)
  }
  return h >>> 0
}

const sortTopicPartitions = (tps: Array<TopicPartition.TopicPartition>) => tps.sort(TopicPartition.compare)

/**
 * Builds the broker's state and its operations. Exposed through `layer`.
 */
const makeBroker = (options: Options) =>
  Effect.gen(function*() {
    const assignor = options.assignor ?? "range"
    const topics = new Map<string, Array<Array<ConsumerRecord>>>()
    const groups = new Map<string, Group>()
    const members = new Map<string, Member>()
    let memberSeq = 0
    let roundRobin = 0
    let changed = yield* Deferred.make<void>()

    const notify = Effect.suspend(() => {
      const previous = changed
      return Deferred.make<void>().pipe(
        Effect.flatMap((next) => {
          changed = next
          return Deferred.succeed(previous, undefined)
        })
      )
    })

    const groupOf = (id: string): Group => {
      let group = groups.get(id)
      if (group === undefined) {
        group = { id, members: [], generation: 0, rebalancing: false, committed: new Map() }
        groups.set(id, group)
      }
      return group
    }

    const partitionsOf = (topicNames: ReadonlyArray<string>): Array<TopicPartition.TopicPartition> => {
      const out: Array<TopicPartition.TopicPartition> = []
      for (const topic of topicNames) {
        const log = topics.get(topic)
        if (log !== undefined) log.forEach((_, partition) => out.push({ topic, partition }))
      }
      return out
    }

    const assign = (group: Group): void => {
      const active = group.members.filter((m) => !m.static)
      const ids = active.map((m) => m.id).sort()
      const byId = new Map(active.map((m) => [m.id, [] as Array<TopicPartition.TopicPartition>]))
      const allTopics = Array.from(
        new Set(active.flatMap((m) => m.options.subscription._tag === "Topics" ? m.options.subscription.topics : []))
      ).sort()
      if (assignor === "range") {
        for (const topic of allTopics) {
          const subscribers = ids.filter((id) => {
            const s = members.get(id)!.options.subscription
            return s._tag === "Topics" && s.topics.includes(topic)
          })
          const tps = partitionsOf([topic])
          const per = Math.floor(tps.length / Math.max(1, subscribers.length))
          const extra = tps.length % Math.max(1, subscribers.length)
          let at = 0
          subscribers.forEach((id, i) => {
            const n = per + (i < extra ? 1 : 0)
            byId.get(id)!.push(...tps.slice(at, at + n))
            at += n
          })
        }
      } else {
        let i = 0
        for (const tp of partitionsOf(allTopics)) {
          for (let tries = 0; tries < ids.length; tries++) {
            const id = ids[(i + tries) % ids.length]!
            const s = members.get(id)!.options.subscription
            if (s._tag === "Topics" && s.topics.includes(tp.topic)) {
              byId.get(id)!.push(tp)
              i = (i + tries + 1) % ids.length
              break
            }
          }
        }
      }
      group.generation++
      group.rebalancing = false
      for (const m of active) {
        const tps = sortTopicPartitions(byId.get(m.id) ?? [])
        m.generation = group.generation
        m.assigned = tps
        m.positions = new Map()
        m.paused = new Set()
        m.pendingEvents.push({ _tag: "Assigned", partitions: tps })
      }
    }

    const maybeCompleteRebalance = (group: Group): void => {
      if (group.rebalancing && group.members.every((m) => m.static || !m.awaitingRelease)) assign(group)
    }

    const startRebalance = (group: Group, now: number): void => {
      group.rebalancing = true
      for (const m of group.members) {
        if (m.static) continue
        if (m.assigned.length > 0 && !m.awaitingRelease) {
          m.awaitingRelease = true
          m.rebalanceDeadline = now + Duration.toMillis(m.options.rebalanceTimeout)
          const generation = m.generation
          const member = m
          m.pendingEvents.push({
            _tag: "Revoked",
            partitions: [...m.assigned],
            release: Effect.suspend(() => release(member, generation))
          })
        }
      }
      maybeCompleteRebalance(group)
    }

    // Removes a member from its group without a revoke: its partitions move at once.
    const evict = (member: Member, now: number): void => {
      if (!member.inGroup) return
      member.inGroup = false
      member.awaitingRelease = false
      const group = groupOf(member.groupId)
      group.members = group.members.filter((m) => m !== member)
      if (!member.static) startRebalance(group, now)
    }

    const expire = (group: Group, now: number): boolean => {
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

    const release = (member: Member, generation: number) =>
      Effect.gen(function*() {
        if (member.dead || !member.inGroup || member.generation !== generation || !member.awaitingRelease) return
        member.awaitingRelease = false
        member.assigned = []
        member.positions = new Map()
        maybeCompleteRebalance(groupOf(member.groupId))
        yield* notify
      })

    const join = (member: Member, now: number): void => {
      const group = groupOf(member.groupId)
      member.inGroup = true
      member.lastHeartbeat = now
      group.members.push(member)
      if (member.static) {
        const s = member.options.subscription
        member.assigned = s._tag === "Partitions" ? sortTopicPartitions([...s.partitions]) : []
        member.generation = -1
        member.pendingEvents.push({ _tag: "Assigned", partitions: member.assigned })
      } else {
        startRebalance(group, now)
      }
    }

    // Fetched records are views of the log, not copies. A view is a slice of a chunk over the log as long as it was
    // when the view was made: the log only grows, so what a slice covers never changes. The chunk over the whole log
    // is never handed out, since it wraps the array that grows.
    const views = new WeakMap<Array<ConsumerRecord>, Chunk.Chunk<ConsumerRecord>>()
    const slice = (log: Array<ConsumerRecord>, from: number, end: number): Chunk.Chunk<ConsumerRecord> => {
      if (from === 0 && end === log.length) return Chunk.unsafeFromArray(log.slice(from, end))
      let view = views.get(log)
      if (view === undefined || Chunk.size(view) !== log.length) {
        view = Chunk.unsafeFromArray(log)
        views.set(log, view)
      }
      return Chunk.take(Chunk.drop(view, from), end - from)
    }

    const fetch = (member: Member): Array<DriverEvent> => {
      const out: Array<DriverEvent> = []
      const group = groupOf(member.groupId)
      if (member.awaitingRelease || (group.rebalancing && !member.static)) return out
      for (const tp of member.assigned) {
        const k = TopicPartition.key(tp)
        if (member.paused.has(k)) continue
        const log = topics.get(tp.topic)?.[tp.partition]
        if (log === undefined) continue
        // A newly assigned partition is fetched only once the runloop has sought it to its start position.
        const position = member.positions.get(k)
        if (position === undefined || position >= BigInt(log.length)) continue
        const from = Number(position)
        const end = Math.min(from + member.options.maxPollRecords, log.length)
        member.positions.set(k, BigInt(end))
        member.fetched += end - from
        out.push({ _tag: "Records", partition: tp, records: slice(log, from, end) })
      }
      return out
    }

    const pollOnce = (member: Member, now: number): Array<DriverEvent> | "lost" => {
      const group = groupOf(member.groupId)
      if (expire(group, now)) changedPending = true
      if (!member.inGroup) return "lost"
      const events = member.pendingEvents
      member.pendingEvents = []
      return events.concat(fetch(member))
    }
    let changedPending = false

    const flushNotify = Effect.suspend(() => {
      if (!changedPending) return Effect.void
      changedPending = false
      return notify
    })

    const newMember = (options: SessionOptions, now: number): Member => ({
      id: `${options.clientId}-${++memberSeq}`,
      groupId: options.groupId,
      options,
      sessionMillis: Duration.toMillis(options.sessionTimeout),
      static: options.subscription._tag === "Partitions",
      generation: 0,
      assigned: [],
      positions: new Map(),
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

    const whileFrozen = (member: Member): Effect.Effect<void> =>
      Effect.suspend(() => {
        if (member.dead) return Effect.never
        if (!member.frozen) return Effect.void
        return Deferred.await(changed).pipe(Effect.zipRight(whileFrozen(member)))
      })

    const connect = (options: SessionOptions): Effect.Effect<DriverSession, DriverError, Scope.Scope> =>
      Effect.gen(function*() {
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
          if (member.dead || member.frozen) return
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
          if (member.dead || member.frozen) return slowPoll
          const wake = changed
          const t = clock.unsafeCurrentTimeMillis()
          member.lastHeartbeat = t
          const first = pollOnce(member, t)
          if (first === "lost" || first.length === 0 || changedPending) {
            return Effect.zipRight(flushNotify, afterFirst(wake, first))
          }
          return Effect.succeed(first)
        })

        const slowPoll: Effect.Effect<ReadonlyArray<DriverEvent>, DriverError> = Effect.gen(function*() {
          yield* whileFrozen(member)
          const wake = changed
          const t = yield* Clock.currentTimeMillis
          member.lastHeartbeat = t
          const first = pollOnce(member, t)
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
          member.pendingEvents = []
          const t = yield* Clock.currentTimeMillis
          members.delete(member.id)
          member.id = `${options.clientId}-${++memberSeq}`
          members.set(member.id, member)
          join(member, t)
          yield* notify
          return [{ _tag: "Lost", partitions: lost }] as ReadonlyArray<DriverEvent>
        })

        const commitNow = (offsets: OffsetBatch.OffsetBatch): Effect.Effect<void, CommitFailed> => {
          if (!member.inGroup) {
            return Effect.fail(new CommitFailed({ reason: "UnknownMember", retriable: false, detail: member.id }))
          }
          const group = groupOf(member.groupId)
          if (!member.static && member.generation !== group.generation) {
            return Effect.fail(
              new CommitFailed({
                reason: "IllegalGeneration",
                retriable: false,
                detail: `member generation ${member.generation}, group generation ${group.generation}`
              })
            )
          }
          // The broker itself would take a commit for any partition from a member of the current generation;
          // refusing partitions the member does not own keeps a late commit from moving another owner's position.
          const owns = new Set(member.assigned.map(TopicPartition.key))
          const foreign = [...offsets.positions.keys()].filter((k) => !owns.has(k))
          if (foreign.length > 0) {
            return Effect.fail(
              new CommitFailed({
                reason: "IllegalGeneration",
                retriable: false,
                detail: `${foreign.join(", ")} not assigned to ${member.id}`
              })
            )
          }
          for (const [k, position] of offsets.positions) group.committed.set(k, position)
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

        const session: DriverSession = {
          get memberId() {
            return member.id
          },
          poll,
          commit,
          committed: (tps) =>
            Effect.sync(() => {
              const group = groupOf(member.groupId)
              const out = new Map<string, bigint>()
              for (const tp of tps) {
                const position = group.committed.get(TopicPartition.key(tp))
                if (position !== undefined) out.set(TopicPartition.key(tp), position)
              }
              return out
            }),
          beginning: (tps) => Effect.sync(() => new Map(tps.map((tp) => [TopicPartition.key(tp), 0n] as const))),
          seek: (tp, position) =>
            Effect.sync(() => {
              if (member.assigned.some((a) => TopicPartition.equals(a, tp))) {
                member.positions.set(TopicPartition.key(tp), position)
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

    const lookup = (memberId: string) => Option.fromNullable(members.get(memberId))

    const service: Context.Tag.Service<InMemoryKafka> = {
      createTopic: (topic, partitions) =>
        Effect.suspend(() => {
          if (topic.length === 0) {
            return new ConfigError({ field: "topic", reason: "must be a non-empty string" })
          }
          if (!Number.isInteger(partitions) || partitions < 1) {
            return new ConfigError({ field: "partitions", reason: `must be a positive integer, got ${partitions}` })
          }
          if (!topics.has(topic)) topics.set(topic, Array.from({ length: partitions }, () => []))
          return notify
        }),
      produce: (topic, records) =>
        Effect.gen(function*() {
          const log = topics.get(topic)
          if (log === undefined) {
            return yield* new DriverError({ operation: "produce", reason: `unknown topic "${topic}"` })
          }
          const now = yield* Clock.currentTimeMillis
          const out: Array<readonly [number, bigint]> = []
          for (const r of records) {
            const key = r.key === undefined || r.key === null ? null : bytes(r.key)
            const partition = r.partition ?? (key !== null ? hashBytes(key) % log.length : roundRobin++ % log.length)
            const target = log[partition]
            if (target === undefined) {
              return yield* new DriverError({
                operation: "produce",
                reason: `topic "${topic}" has no partition ${partition}`
              })
            }
            const headers: Record<string, Uint8Array> = {}
            if (r.headers !== undefined) for (const [k, v] of Object.entries(r.headers)) headers[k] = bytes(v)
            const offset = BigInt(target.length)
            target.push({
              topic,
              partition,
              offset,
              key,
              value: r.value === null ? null : bytes(r.value),
              headers,
              timestamp: now
            })
            out.push([partition, offset])
          }
          yield* notify
          return out
        }),
      endOffsets: (topic) =>
        Effect.suspend(() => {
          const log = topics.get(topic)
          return log === undefined
            ? new DriverError({ operation: "endOffsets", reason: `unknown topic "${topic}"` })
            : Effect.succeed(log.map((p) => BigInt(p.length)))
        }),
      committed: (groupId) => Effect.sync(() => new Map(groupOf(groupId).committed)),
      members: (groupId) =>
        Effect.sync(() => groupOf(groupId).members.map((m) => ({ memberId: m.id, partitions: [...m.assigned] }))),
      generation: (groupId) => Effect.sync(() => groupOf(groupId).generation),
      fetchedCount: (memberId) => Effect.sync(() => Option.match(lookup(memberId), { onNone: () => 0, onSome: (m) => m.fetched })),
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
        Effect.suspend(() => plan(point, memberId, partitions) ? Effect.as(kafka.kill(memberId), true) : Effect.succeed(false))
    }))
  )

/**
 * Creates a topic with this many partitions.
 *
 * @since 0.1.0
 * @category accessors
 */
export const createTopic = (topic: string, partitions: number): Effect.Effect<void, ConfigError, InMemoryKafka> =>
  Effect.flatMap(InMemoryKafka, (kafka) => kafka.createTopic(topic, partitions))

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
 * The group's committed positions as a batch.
 *
 * @since 0.1.0
 * @category accessors
 */
export const committed = (groupId: string): Effect.Effect<OffsetBatch.OffsetBatch, never, InMemoryKafka> =>
  Effect.map(InMemoryKafka, (kafka) => kafka.committed(groupId)).pipe(
    Effect.flatten,
    Effect.map((positions) => ({ positions }))
  )
