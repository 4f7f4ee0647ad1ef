import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import type { PartitionOffsets } from "../../Driver.js"
import { type CommitFailureReason, DriverError, InvalidConfig } from "../../KafkaError.js"
import type * as TopicPartition from "../../TopicPartition.js"
import type { Broker } from "./broker.js"
import * as groups from "./groups.js"
import * as memoryLog from "./log.js"
import type { ProducerRecord } from "./record.js"
import * as transactions from "./transactions.js"

type Offsets = ReadonlyArray<readonly [partition: number, offset: bigint]>

/** Topics and their logs: creating, writing, cleaning, reading their offsets. */
const topicOperations = (broker: Broker) => {
  const { logs, notify } = broker
  const produceWith =
    (operation: string, transaction: "commit" | "abort" | undefined) =>
    (topicName: string, records: ReadonlyArray<ProducerRecord>): Effect.Effect<Offsets, DriverError> =>
      Effect.gen(function*() {
        const topic = yield* memoryLog.topicOf(logs, operation, topicName)
        const planned = yield* memoryLog.plan(logs, operation, topic, records, yield* Clock.currentTimeMillis)
        const out = memoryLog.write(topic, planned, transaction)
        yield* notify
        return out
      })
  return {
    createTopic: (
      topic: string,
      partitions: number,
      topicOptions?: { readonly compacted?: boolean }
    ): Effect.Effect<void, InvalidConfig> =>
      Effect.suspend(() => {
        if (topic.length === 0) {
          return new InvalidConfig({ field: "topic", reason: "must be a non-empty string" })
        }
        if (!Number.isInteger(partitions) || partitions < 1) {
          return new InvalidConfig({ field: "partitions", reason: `must be a positive integer, got ${partitions}` })
        }
        if (!logs.topics.has(topic)) {
          logs.topics.set(topic, memoryLog.makeTopic(topic, partitions, topicOptions?.compacted === true))
        }
        return notify
      }),
    produce: produceWith("produce", undefined),
    produceTransaction: (
      topic: string,
      records: ReadonlyArray<ProducerRecord>,
      outcome: "commit" | "abort"
    ): Effect.Effect<Offsets, DriverError> => produceWith("produceTransaction", outcome)(topic, records),
    compact: (topicName: string): Effect.Effect<void, DriverError> =>
      Effect.flatMap(memoryLog.topicOf(logs, "compact", topicName), (topic) => {
        if (!topic.compacted) {
          return new DriverError({
            operation: "compact",
            reason: `topic "${topicName}" is not compacted (create it with { compacted: true })`
          })
        }
        for (const log of topic.partitions) memoryLog.compact(log)
        return notify
      }),
    deleteRecords: (topicName: string, partition: number, before: bigint): Effect.Effect<void, DriverError> =>
      Effect.flatMap(memoryLog.topicOf(logs, "deleteRecords", topicName), (topic) => {
        const log = topic.partitions[partition]
        if (log === undefined) {
          return new DriverError({
            operation: "deleteRecords",
            reason: `topic "${topicName}" has no partition ${partition}`
          })
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
    endOffsets: (topic: string): Effect.Effect<ReadonlyArray<bigint>, DriverError> =>
      Effect.map(memoryLog.topicOf(logs, "endOffsets", topic), (t) => t.partitions.map((p) => p.end)),
    offsets: (topic: string): Effect.Effect<ReadonlyArray<PartitionOffsets>, DriverError> =>
      Effect.map(memoryLog.topicOf(logs, "offsets", topic), (t) => t.partitions.map(memoryLog.offsets))
  }
}

/** Groups and their members: what tests look at, and the faults they inject. */
const groupOperations = (broker: Broker) => {
  const { coordinator, notify } = broker
  const { groupOf, members } = coordinator
  const lookup = (memberId: string) => Option.fromNullable(members.get(memberId))
  return {
    committed: (groupId: string): Effect.Effect<ReadonlyMap<string, bigint>> =>
      Effect.sync(() => new Map(groupOf(groupId).committed)),
    committedMetadata: (groupId: string): Effect.Effect<ReadonlyMap<string, string>> =>
      Effect.sync(() => new Map(groupOf(groupId).metadata)),
    members: (
      groupId: string
    ): Effect.Effect<
      ReadonlyArray<{ readonly memberId: string; readonly partitions: ReadonlyArray<TopicPartition.TopicPartition> }>
    > => Effect.sync(() => groupOf(groupId).members.map((m) => ({ memberId: m.id, partitions: [...m.assigned] }))),
    generation: (groupId: string): Effect.Effect<number> => Effect.sync(() => groupOf(groupId).generation),
    fetchedCount: (memberId: string): Effect.Effect<number> =>
      Effect.sync(() => Option.match(lookup(memberId), { onNone: () => 0, onSome: (m) => m.fetched })),
    kill: (memberId: string): Effect.Effect<void> =>
      Effect.gen(function*() {
        const member = members.get(memberId)
        if (member === undefined || member.dead) return
        member.dead = true
        if (member.instanceId !== undefined) {
          // A member with an instance id stays in its group until its session expires.
          member.frozen = true
          return yield* notify
        }
        groups.evict(coordinator, member, yield* Clock.currentTimeMillis)
        members.delete(memberId)
        yield* notify
      }),
    freeze: (memberId: string): Effect.Effect<void> =>
      Effect.sync(() => {
        const member = members.get(memberId)
        if (member !== undefined) member.frozen = true
      }),
    thaw: (memberId: string): Effect.Effect<void> =>
      Effect.suspend(() => {
        const member = members.get(memberId)
        if (member !== undefined) member.frozen = false
        return notify
      }),
    refuseCommits: (groupId: string, reason: CommitFailureReason, times = 1): Effect.Effect<void> =>
      Effect.sync(() => {
        const refusals = groupOf(groupId).refusals
        for (let i = 0; i < times; i++) refusals.push(reason)
      }),
    unreachable: Effect.suspend(() => {
      broker.down = true
      return notify
    }),
    reachable: Effect.suspend(() => {
      broker.down = false
      return notify
    })
  }
}

/**
 * The operations of `InMemoryKafka` on a broker.
 *
 * @internal
 */
export const make = (broker: Broker) => ({
  ...topicOperations(broker),
  ...groupOperations(broker),
  ...transactions.operations({
    producers: broker.producers,
    logs: broker.logs,
    groupOf: broker.coordinator.groupOf,
    notify: broker.notify
  })
})
