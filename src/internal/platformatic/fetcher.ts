/**
 * What a session fetches: each owned partition's position, the records fetched and not handed over yet, paused and
 * out-of-range partitions, and one fetch in flight per leader at a time, on a connection pool of its own so that a
 * fetch the broker holds never delays a heartbeat or a commit.
 */
import type { Consumer, ConnectionPool } from "@platformatic/kafka"
import * as Chunk from "effect/Chunk"
import type { ConsumerRecord } from "../../ConsumerRecord.js"
import type { DriverEvent } from "../../Driver.js"
import * as TopicPartition from "../../TopicPartition.js"
import { apiIds, describe, isRetriable } from "./errors.js"
import { type RawBatch, toRecords } from "./records.js"

/** A partition this member owns, as the fetcher sees it. @internal */
export interface PartitionState {
  readonly tp: TopicPartition.TopicPartition
  /** Where the next `Records` starts; `undefined` until the runloop sought the partition. */
  position: bigint | undefined
  /** Records fetched from `position` on and not handed over yet, and where the fetch that got them ended. */
  buffered: { records: Array<ConsumerRecord>; next: bigint } | undefined
  paused: boolean
  /** Out of range at `position`: nothing is fetched until a seek. */
  suspended: boolean
  /** Bumped by every seek, so that a fetch sent before it is not taken. */
  epoch: number
  /** Revoked: owned until released, never fetched again. */
  stopped: boolean
}

/** @internal */
export interface FetchSettings {
  readonly maxWaitTime: number
  readonly minBytes: number
  readonly maxBytes: number
  readonly maxBytesPerPartition: number
  readonly readCommitted: boolean
  readonly maxPollRecords: number
}

/** @internal */
export interface Fetcher {
  readonly partitions: Map<string, PartitionState>
  readonly add: (tps: ReadonlyArray<TopicPartition.TopicPartition>) => void
  readonly remove: (tps: ReadonlyArray<TopicPartition.TopicPartition>) => void
  readonly seek: (tp: TopicPartition.TopicPartition, position: bigint) => boolean
  /** Fetches and hands over nothing more of a partition that is being revoked. */
  readonly stop: (tp: TopicPartition.TopicPartition) => void
  /** Starts a fetch on each leader with fetchable partitions and none in flight. */
  readonly start: () => void
  /** Hands over what was fetched: at most `maxPollRecords` records per partition, and the partitions out of range. */
  readonly take: () => Array<DriverEvent>
  /** The last fetch failure that has not passed since `since` (ms), if any. */
  readonly failing: () => { readonly since: number; readonly error: unknown } | undefined
  readonly close: () => void
}

interface FetchRequestPartition {
  readonly partition: number
  readonly currentLeaderEpoch: number
  readonly fetchOffset: bigint
  readonly lastFetchedEpoch: number
  readonly partitionMaxBytes: number
}

interface Sent {
  readonly key: string
  readonly epoch: number
  readonly from: bigint
}

interface ResponsePartition {
  readonly partitionIndex: number
  readonly errorCode: number
  readonly abortedTransactions: ReadonlyArray<{ readonly producerId: bigint; readonly firstOffset: bigint }> | null
  readonly records?: ReadonlyArray<RawBatch> | null
}

interface Response {
  readonly responses: ReadonlyArray<{ readonly topicId: string; readonly partitions: ReadonlyArray<ResponsePartition> }>
}

const OFFSET_OUT_OF_RANGE = 1

const responseOf = (error: unknown): Response | undefined => {
  if (typeof error !== "object" || error === null) return undefined
  const response = (error as { readonly response?: unknown }).response
  return typeof response === "object" && response !== null && Array.isArray((response as Response).responses)
    ? response as Response
    : undefined
}

/** What the fetcher keeps: the options it was made with, and its partitions and fetches. */
interface State {
  readonly consumer: Consumer
  readonly pool: ConnectionPool
  readonly settings: FetchSettings
  readonly wake: () => void
  readonly log: (message: string) => void
  readonly partitions: Map<string, PartitionState>
  /** The leaders with a fetch in flight: one at a time each. */
  readonly inFlight: Set<number>
  readonly outOfRange: Array<{ readonly tp: TopicPartition.TopicPartition; readonly position: bigint }>
  failure: { since: number; error: unknown } | undefined
  closed: boolean
}

const fetchable = (p: PartitionState) =>
  p.position !== undefined && p.buffered === undefined && !p.paused && !p.suspended && !p.stopped

/** Takes a fetch's answer for the partitions it was sent for, at the positions it was sent from. */
const apply = (st: State, sent: ReadonlyArray<Sent>, topicNames: ReadonlyMap<string, string>, response: Response) => {
  const byKey = new Map(sent.map((s) => [s.key, s]))
  for (const topic of response.responses) {
    const name = topicNames.get(topic.topicId) ?? topic.topicId
    for (const answer of topic.partitions) {
      const key = TopicPartition.key(TopicPartition.make(name, answer.partitionIndex))
      const request = byKey.get(key)
      const state = st.partitions.get(key)
      // Taken only for the position it was sent for: a seek, a revoke or a pause since then drops it.
      if (request === undefined || state === undefined || state.epoch !== request.epoch) continue
      if (state.position !== request.from || state.buffered !== undefined || state.suspended) continue
      if (answer.errorCode === OFFSET_OUT_OF_RANGE) {
        state.suspended = true
        st.outOfRange.push({ tp: state.tp, position: request.from })
        continue
      }
      if (answer.errorCode !== 0) continue
      const fetched = toRecords(
        name,
        answer.partitionIndex,
        request.from,
        answer.records ?? [],
        answer.abortedTransactions,
        st.settings.readCommitted
      )
      if (fetched.next !== undefined && fetched.next > request.from) {
        state.buffered = { records: fetched.records, next: fetched.next }
      }
    }
  }
}

/** Sends one leader's fetch; its answer is taken when it comes, and the session woken. */
const fetchNode = (
  st: State,
  node: number,
  topics: Map<string, Array<FetchRequestPartition>>,
  sent: Array<Sent>,
  names: Map<string, string>
) => {
  const { settings } = st
  st.inFlight.add(node)
  st.consumer.fetch({
    node,
    connectionPool: st.pool,
    maxWaitTime: settings.maxWaitTime,
    minBytes: settings.minBytes,
    maxBytes: settings.maxBytes,
    isolationLevel: settings.readCommitted ? 1 : 0,
    topics: Array.from(topics, ([topicId, list]) => ({ topicId, partitions: list }))
  }).then(
    (response) => {
      st.failure = undefined
      if (!st.closed) apply(st, sent, names, response as unknown as Response)
    },
    (error: unknown) => {
      // A response with a partition's error (out of range) still carries the other partitions' records.
      const response = responseOf(error)
      if (response !== undefined && !st.closed) apply(st, sent, names, response)
      const ids = apiIds(error)
      if (response === undefined || ids.some((id) => id !== "OFFSET_OUT_OF_RANGE")) {
        if (st.failure === undefined) st.failure = { since: Date.now(), error }
        if (!st.closed) st.log(`fetch failed${isRetriable(error) ? ", trying again" : ""}: ${describe(error)}`)
      } else {
        st.failure = undefined
      }
    }
  ).finally(() => {
    st.inFlight.delete(node)
    st.wake()
  })
}

/** Starts a fetch on each leader with fetchable partitions and none in flight. */
const start = (st: State) => {
  if (st.closed) return
  const wanted = Array.from(st.partitions.values()).filter(fetchable)
  if (wanted.length === 0) return
  const metadata = st.consumer.currentMetadata
  if (metadata === undefined) {
    void st.consumer.metadata({ topics: Array.from(new Set(wanted.map((p) => p.tp.topic))) }).then(st.wake, st.wake)
    return
  }
  const byNode = new Map<number, { topics: Map<string, Array<FetchRequestPartition>>; sent: Array<Sent> }>()
  const names = new Map<string, string>()
  const missing = new Set<string>()
  for (const p of wanted) {
    const topic = metadata.topics.get(p.tp.topic)
    const leader = topic?.partitions[p.tp.partition]
    if (topic === undefined || leader === undefined || leader.leader < 0) {
      missing.add(p.tp.topic)
      continue
    }
    if (st.inFlight.has(leader.leader)) continue
    names.set(topic.id, p.tp.topic)
    let entry = byNode.get(leader.leader)
    if (entry === undefined) byNode.set(leader.leader, entry = { topics: new Map(), sent: [] })
    let list = entry.topics.get(topic.id)
    if (list === undefined) entry.topics.set(topic.id, list = [])
    list.push({
      partition: p.tp.partition,
      currentLeaderEpoch: -1,
      fetchOffset: p.position!,
      lastFetchedEpoch: -1,
      partitionMaxBytes: st.settings.maxBytesPerPartition
    })
    entry.sent.push({ key: TopicPartition.key(p.tp), epoch: p.epoch, from: p.position! })
  }
  if (missing.size > 0) {
    void st.consumer.metadata({ topics: Array.from(missing), forceUpdate: true }).then(st.wake, st.wake)
  }
  for (const [node, { sent, topics }] of byNode) fetchNode(st, node, topics, sent, names)
}

/** Hands over what was fetched: at most `maxPollRecords` records per partition, and the partitions out of range. */
const take = (st: State): Array<DriverEvent> => {
  const events: Array<DriverEvent> = []
  for (const { position, tp } of st.outOfRange.splice(0)) {
    const state = st.partitions.get(TopicPartition.key(tp))
    if (state !== undefined && state.suspended && !state.stopped && state.position === position) {
      events.push({ _tag: "OutOfRange", partition: tp, position })
    }
  }
  for (const state of st.partitions.values()) {
    const buffered = state.buffered
    if (buffered === undefined || state.paused || state.stopped || state.position === undefined) continue
    const from = state.position
    if (buffered.records.length <= st.settings.maxPollRecords) {
      state.buffered = undefined
      state.position = buffered.next
      events.push({
        _tag: "Records",
        partition: state.tp,
        records: Chunk.unsafeFromArray(buffered.records),
        from,
        next: buffered.next
      })
    } else {
      const part = buffered.records.splice(0, st.settings.maxPollRecords)
      const next = part[part.length - 1]!.offset + 1n
      state.position = next
      events.push({ _tag: "Records", partition: state.tp, records: Chunk.unsafeFromArray(part), from, next })
    }
  }
  return events
}

/** @internal */
export const makeFetcher = (options: {
  readonly consumer: Consumer
  readonly pool: ConnectionPool
  readonly settings: FetchSettings
  /** Called when a fetch ended, whatever it gave. */
  readonly wake: () => void
  readonly log: (message: string) => void
}): Fetcher => {
  const st: State = {
    ...options,
    partitions: new Map(),
    inFlight: new Set(),
    outOfRange: [],
    failure: undefined,
    closed: false
  }
  const { partitions } = st
  return {
    partitions,
    add: (tps) => {
      for (const tp of tps) {
        const key = TopicPartition.key(tp)
        if (partitions.has(key)) continue
        partitions.set(key, {
          tp,
          position: undefined,
          buffered: undefined,
          paused: false,
          suspended: false,
          epoch: 0,
          stopped: false
        })
      }
    },
    remove: (tps) => {
      for (const tp of tps) partitions.delete(TopicPartition.key(tp))
    },
    stop: (tp) => {
      const state = partitions.get(TopicPartition.key(tp))
      if (state === undefined) return
      state.stopped = true
      state.buffered = undefined
      state.epoch++
    },
    seek: (tp, position) => {
      const state = partitions.get(TopicPartition.key(tp))
      if (state === undefined) return false
      state.position = position
      state.buffered = undefined
      state.suspended = false
      state.epoch++
      return true
    },
    start: () => start(st),
    take: () => take(st),
    failing: () => st.failure,
    close: () => {
      st.closed = true
      partitions.clear()
    }
  }
}
