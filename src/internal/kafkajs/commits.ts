/**
 * What the runloop asks of a session's group and partitions: commits, committed positions, and the partitions' offsets.
 */
import * as Effect from "effect/Effect"
import type { CommittedPosition, PartitionOffsets } from "../../Driver.js"
import { CommitFailed, DriverError } from "../../KafkaError.js"
import * as OffsetBatch from "../../OffsetBatch.js"
import * as TopicPartition from "../../TopicPartition.js"
import { commitFailed, driverError } from "./errors.js"
import { positionsOnly } from "../shared/topics.js"
import { byTopic, k, type Session } from "./member.js"

/**
 * The log start and the high watermark of each partition of the topic.
 *
 * @internal
 */
export const watermarks = (s: Pick<Session, "reader">, topic: string) => s.reader.fetchTopicOffsets(topic)

/**
 * Commits all of `offsets` or none: nothing is sent once the session closed or kafkajs crashed for good, nor when a
 * partition is not the member's.
 *
 * @internal
 */
export const commit = (s: Session, offsets: OffsetBatch.OffsetBatch): Effect.Effect<void, CommitFailed> =>
  Effect.suspend(() => {
    const entries = OffsetBatch.entries(offsets)
    const partitions = entries.map(([tp]) => tp)
    if (s.closed) {
      return Effect.fail(new CommitFailed({ reason: "UnknownMember", partitions, detail: "the session is closed" }))
    }
    if (s.failure !== undefined) {
      return Effect.fail(new CommitFailed({ reason: "Other", partitions, detail: s.failure.reason }))
    }
    if (entries.length === 0) return Effect.void
    // kafkajs commits with its current generation, which the broker accepts for any partition of the group: a
    // partition this member does not own (any more) must be refused here. All or nothing: none is committed.
    const notOwned = partitions.filter((tp) => !s.owned.has(TopicPartition.key(tp)))
    if (notOwned.length > 0) {
      return Effect.fail(
        new CommitFailed({ reason: "NotOwned", partitions: notOwned, detail: "not assigned to this member" })
      )
    }
    return Effect.tryPromise({
      try: () =>
        s.consumer.commitOffsets(
          entries.map(([tp, position]) => ({
            topic: tp.topic,
            partition: tp.partition,
            offset: position.toString(),
            metadata: offsets.metadata?.get(TopicPartition.key(tp)) ?? null
          }))
        ),
      catch: (cause) => commitFailed(cause, partitions)
    }).pipe(
      Effect.tap(() =>
        Effect.sync(() => {
          for (const [tp, position] of entries) {
            const key = TopicPartition.key(tp)
            if (s.owned.has(key)) s.committedPositions.set(key, position)
          }
        })
      )
    )
  })

/** The group's committed positions (stable reads), with their metadata. @internal */
export const committedWithMetadata = (
  s: Session,
  partitions: ReadonlyArray<TopicPartition.TopicPartition>
): Effect.Effect<ReadonlyMap<string, CommittedPosition>, DriverError> =>
  Effect.gen(function*() {
    const out = new Map<string, CommittedPosition>()
    const wanted = byTopic(partitions)
    if (wanted.size === 0) return out
    const only = new Map(Array.from(wanted, ([topic, list]) => [topic, new Set(list)] as const))
    const response = yield* Effect.tryPromise({
      try: () => {
        s.readWire.only(only)
        return s.reader.fetchOffsets({ groupId: s.groupId, topics: Array.from(wanted.keys()) })
      },
      catch: driverError("committed")
    }).pipe(
      Effect.ensuring(Effect.sync(() => s.readWire.only(undefined))),
      s.reads.withPermits(1)
    )
    if (s.readWire.stableReads() === false && !s.unstableWarned) {
      s.unstableWarned = true
      s.log(
        "warning",
        "the cluster does not take stable offset reads (OffsetFetch v7, Kafka 2.5 and later): a committed " +
          "position read while a transaction that commits it completes can be the one before"
      )
    }
    for (const { topic, partitions: list } of response) {
      const want = wanted.get(topic)
      for (const { partition, offset, metadata } of list) {
        if (want === undefined || !want.includes(partition)) continue
        const key = k(topic, partition)
        const position = BigInt(offset)
        if (position >= 0n) out.set(key, { position, metadata: metadata ?? "" })
        if (!s.owned.has(key)) continue
        if (position >= 0n) s.committedPositions.set(key, position)
        else s.committedPositions.delete(key)
      }
    }
    return out
  })

/** @internal */
export const committed = (
  s: Session,
  partitions: ReadonlyArray<TopicPartition.TopicPartition>
): Effect.Effect<ReadonlyMap<string, bigint>, DriverError> =>
  Effect.map(committedWithMetadata(s, partitions), positionsOnly)

/** Each partition's log start, high watermark and last stable offset. @internal */
export const offsets = (
  s: Session,
  partitions: ReadonlyArray<TopicPartition.TopicPartition>
): Effect.Effect<ReadonlyMap<string, PartitionOffsets>, DriverError> =>
  Effect.gen(function*() {
    const out = new Map<string, PartitionOffsets>()
    for (const [topic, want] of byTopic(partitions)) {
      const [ends, stable] = yield* Effect.all([
        Effect.tryPromise({ try: () => watermarks(s, topic), catch: driverError("offsets") }),
        Effect.tryPromise({ try: () => s.admin.fetchTopicOffsets(topic), catch: driverError("offsets") })
      ], { concurrency: 2 })
      for (const partition of want) {
        const end = ends.find((entry) => entry.partition === partition)
        const lso = stable.find((entry) => entry.partition === partition)
        if (end === undefined || lso === undefined) {
          return yield* new DriverError({ operation: "offsets", reason: `no partition ${k(topic, partition)}` })
        }
        const latest = BigInt(end.high)
        // Read side by side, the last stable offset can come from a moment after the high watermark: it is kept
        // at or below it, as it always is at any one moment.
        const lastStable = BigInt(lso.high) < latest ? BigInt(lso.high) : latest
        out.set(k(topic, partition), { earliest: BigInt(end.low), latest, lastStable })
      }
    }
    return out
  })
