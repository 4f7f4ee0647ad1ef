/**
 * What the runloop asks of a session's group and partitions: commits with their metadata, stable reads of the
 * committed positions, and the partitions' offsets. Commits and reads go to the group's coordinator through the
 * client's exported protocol APIs (OffsetCommit v9, OffsetFetch v9 with `requireStable`), on the consumer's own
 * connection, with the consumer's own generation and member id: its `commit` and `listCommittedOffsets` neither
 * send nor return a position's metadata, which the key and unordered modes commit their finished ranges in.
 */
import { type Connection, type Consumer, offsetCommitV9, offsetFetchV9 } from "@platformatic/kafka"
import * as Effect from "effect/Effect"
import type { CommittedPosition, PartitionOffsets } from "../../Driver.js"
import { CommitFailed, DriverError } from "../../KafkaError.js"
import * as OffsetBatch from "../../OffsetBatch.js"
import * as TopicPartition from "../../TopicPartition.js"
import { byTopic, positionsOnly } from "../shared/topics.js"
import { apiIds, commitFailed, driverError } from "./errors.js"

/** What commits and reads need of a session. @internal */
export interface Group {
  readonly consumer: Consumer
  readonly groupId: string
  /** A `Partitions` subscription: no membership, commits as a consumer outside the group's generations. */
  readonly isStatic: boolean
  readonly owns: (key: string) => boolean
  readonly isClosed: () => boolean
  /**
   * Who commits: the generation (classic) or member epoch (KIP-848), the member id and the instance id, as they are
   * now.
   */
  readonly identity: () => Identity
  coordinator: number | undefined
}

/** @internal */
export interface Identity {
  readonly generation: number
  readonly memberId: string
  readonly instanceId: string | null
}

/** A classic member's identity, as its client keeps it. @internal */
export const classicIdentity = (consumer: Consumer) => (): Identity => ({
  generation: consumer.generationId,
  memberId: consumer.memberId ?? "",
  instanceId: consumer.groupInstanceId
})

/** The connection to the group's coordinator, found again after it moved. */
/**
 * The connection to the group's coordinator, on the consumer's own connections; `holder` keeps which broker it is,
 * forgotten when it is not known any more.
 *
 * @internal
 */
export const connectCoordinator = async (
  holder: { coordinator: number | undefined },
  consumer: Consumer,
  operation: string
): Promise<Connection> => {
  const id = holder.coordinator ?? consumer.coordinatorId ?? await consumer.findGroupCoordinator()
  holder.coordinator = id
  const connection = (await consumer.connectToBrokers([id])).get(id)
  if (connection === undefined) {
    holder.coordinator = undefined
    throw new DriverError({ operation, reason: `the coordinator (broker ${id}) is not known`, retriable: true })
  }
  return connection
}

const coordinatorConnection = (g: Group): Promise<Connection> => connectCoordinator(g, g.consumer, "coordinator")

const forgetMovedCoordinator = (g: Group, error: unknown) => {
  const ids = apiIds(error)
  if (ids.includes("NOT_COORDINATOR") || ids.includes("COORDINATOR_NOT_AVAILABLE") || ids.length === 0) {
    g.coordinator = undefined
  }
}

/**
 * Commits all of `offsets` or none: nothing is sent once the session closed, nor when a partition is not the
 * member's (the broker accepts a commit of the current generation for any partition of the group).
 *
 * @internal
 */
export const commit = (g: Group, offsets: OffsetBatch.OffsetBatch): Effect.Effect<void, CommitFailed> =>
  Effect.suspend(() => {
    const entries = OffsetBatch.entries(offsets)
    const partitions = entries.map(([tp]) => tp)
    if (g.isClosed()) {
      return Effect.fail(new CommitFailed({ reason: "UnknownMember", partitions, detail: "the session is closed" }))
    }
    if (entries.length === 0) return Effect.void
    const notOwned = partitions.filter((tp) => !g.owns(TopicPartition.key(tp)))
    if (notOwned.length > 0) {
      return Effect.fail(
        new CommitFailed({ reason: "NotOwned", partitions: notOwned, detail: "not assigned to this member" })
      )
    }
    const topics = new Map<string, Array<offsetCommitV9.OffsetCommitRequestPartition>>()
    for (const [tp, position] of entries) {
      let list = topics.get(tp.topic)
      if (list === undefined) topics.set(tp.topic, list = [])
      list.push({
        partitionIndex: tp.partition,
        committedOffset: position,
        committedLeaderEpoch: -1,
        committedMetadata: offsets.metadata?.get(TopicPartition.key(tp)) ?? null
      })
    }
    const identity = g.isStatic ? { generation: -1, memberId: "", instanceId: null } : g.identity()
    const { generation, memberId } = identity
    return Effect.tryPromise({
      try: async () => {
        const connection = await coordinatorConnection(g)
        await offsetCommitV9.api.async(
          connection,
          g.groupId,
          generation,
          memberId,
          // A static member's commits name it: a member its restart replaced is fenced (FENCED_INSTANCE_ID).
          identity.instanceId,
          Array.from(topics, ([name, list]) => ({ name, partitions: list }))
        )
      },
      catch: (cause) => {
        forgetMovedCoordinator(g, cause)
        const failed = commitFailed(cause, partitions)
        // Sent with the generation the member had, which a rebalance the member took part in has replaced since
        // (a cooperative rebalance's partitions that stay commit throughout it): the member is still in the group
        // and its partitions still its own, so the commit is tried again with the new generation.
        const now = g.isStatic ? identity : g.identity()
        return failed.reason === "IllegalGeneration" && !g.isStatic && now.memberId === memberId &&
            now.generation !== generation
          ? new CommitFailed({
            reason: "RebalanceInProgress",
            partitions: failed.partitions,
            detail: `sent with generation ${generation}, now ${now.generation}: ${failed.detail ?? ""}`
          })
          : failed
      }
    })
  })

/** The group's committed positions (stable reads), with their metadata. @internal */
export const committedWithMetadata = (
  g: Group,
  partitions: ReadonlyArray<TopicPartition.TopicPartition>
): Effect.Effect<ReadonlyMap<string, CommittedPosition>, DriverError> =>
  Effect.gen(function*() {
    const out = new Map<string, CommittedPosition>()
    const wanted = byTopic(partitions)
    if (wanted.size === 0) return out
    const response = yield* Effect.tryPromise({
      try: async () => {
        const connection = await coordinatorConnection(g)
        return offsetFetchV9.api.async(connection, [{
          groupId: g.groupId,
          memberId: null,
          memberEpoch: -1,
          topics: Array.from(wanted, ([name, partitionIndexes]) => ({ name, partitionIndexes }))
        }], true)
      },
      catch: (cause) => {
        forgetMovedCoordinator(g, cause)
        return driverError("committed")(cause)
      }
    })
    for (const group of response.groups) {
      for (const topic of group.topics) {
        const want = wanted.get(topic.name)
        for (const p of topic.partitions) {
          if (want === undefined || !want.includes(p.partitionIndex) || p.committedOffset < 0n) continue
          out.set(TopicPartition.key(TopicPartition.make(topic.name, p.partitionIndex)), {
            position: p.committedOffset,
            metadata: p.metadata ?? ""
          })
        }
      }
    }
    return out
  })

/** @internal */
export const committed = (
  g: Group,
  partitions: ReadonlyArray<TopicPartition.TopicPartition>
): Effect.Effect<ReadonlyMap<string, bigint>, DriverError> =>
  Effect.map(committedWithMetadata(g, partitions), positionsOnly)

const EARLIEST = -2n
const LATEST = -1n

/** Each partition's log start, high watermark and last stable offset. @internal */
export const offsets = (
  consumer: Consumer,
  partitions: ReadonlyArray<TopicPartition.TopicPartition>
): Effect.Effect<ReadonlyMap<string, PartitionOffsets>, DriverError> =>
  Effect.gen(function*() {
    const out = new Map<string, PartitionOffsets>()
    const wanted = byTopic(partitions)
    if (wanted.size === 0) return out
    const topics = Array.from(wanted.keys())
    const list = (timestamp: bigint, isolationLevel: number) =>
      Effect.tryPromise({
        try: () => consumer.listOffsets({ topics, partitions: Object.fromEntries(wanted), timestamp, isolationLevel }),
        catch: driverError("offsets")
      })
    const [earliest, latest, stable] = yield* Effect.all([
      list(EARLIEST, 0),
      list(LATEST, 0),
      list(LATEST, 1)
    ], { concurrency: 3 })
    for (const [topic, indexes] of wanted) {
      for (const partition of indexes) {
        const low = earliest.get(topic)?.[partition]
        const high = latest.get(topic)?.[partition]
        const lso = stable.get(topic)?.[partition]
        const key = TopicPartition.key(TopicPartition.make(topic, partition))
        if (low === undefined || high === undefined || lso === undefined) {
          return yield* new DriverError({ operation: "offsets", reason: `no partition ${key}` })
        }
        // Read side by side, the last stable offset can come from a moment after the high watermark: it is kept
        // at or below it, as it always is at any one moment.
        out.set(key, { earliest: low, latest: high, lastStable: lso < high ? lso : high })
      }
    }
    return out
  })
