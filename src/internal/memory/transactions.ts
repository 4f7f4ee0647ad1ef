import * as Clock from "effect/Clock"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import type { GroupMetadata } from "../../Driver.js"
import { ProduceFailed, TransactionFailed } from "../../KafkaError.js"
import * as TopicPartition from "../../TopicPartition.js"
import * as producer from "../producer/producer.js"
import type * as groups from "./groups.js"
import * as memoryLog from "./log.js"
import type { ProducerRecord } from "./record.js"

/**
 * Why the group's coordinator refuses positions sent with this group metadata (TxnOffsetCommit, KIP-447): the member
 * is not in the group, a newer member took its instance id, or it is not at that generation (member epoch) any more.
 */
const refuseMetadata = (
  group: groups.Group,
  metadata: GroupMetadata
): readonly [code: string, detail: string] | undefined => {
  const member = group.members.find((m) => m.id === metadata.memberId)
  if (member === undefined || !member.inGroup) {
    return ["UNKNOWN_MEMBER_ID", `${metadata.memberId} is not in group ${group.id}`]
  }
  if (member.fenced) {
    return ["FENCED_INSTANCE_ID", `a newer member joined group ${group.id} with instance id "${member.instanceId}"`]
  }
  if (member.generation !== metadata.generationId) {
    return [
      "ILLEGAL_GENERATION",
      `sent with generation ${metadata.generationId}, the member's is ${member.generation} in group ${group.id}`
    ]
  }
  return undefined
}

/** A position to commit for a group, as a transaction carries it. */
type Position = { readonly topic: string; readonly partition: number; readonly next: bigint }

/**
 * Positions to commit for one group, as a transaction carries them.
 *
 * @internal
 */
export interface GroupOffsets {
  readonly groupId: string
  readonly positions: ReadonlyArray<Position>
}

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

/**
 * The transactional producers, by transactional id: each one's epoch, transaction timeout and open transaction.
 *
 * @internal
 */
export type Producers = Map<string, TransactionalProducerState>

/** @internal */
export const makeProducers = (): Producers => new Map()

const openTransaction = (state: TransactionalProducerState, now: number): OpenTransaction => {
  if (state.open === undefined) state.open = { txn: { state: "open" }, logs: new Set(), at: now, offsets: [] }
  return state.open
}

/**
 * The producer of an open transaction that carries a position of `key` for `groupId`, if one does.
 *
 * @internal
 */
export const pendingOffsetCommit = (producers: Producers, groupId: string, key: string): string | undefined => {
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

/**
 * The broker aborts transactions open longer than their timeout, and fences their producer.
 *
 * @internal
 */
export const expireTransactions = (producers: Producers, now: number): boolean => {
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

const fencedBy = (
  producers: Producers,
  transactionalId: string,
  epoch: number
): TransactionalProducerState | string => {
  const state = producers.get(transactionalId)
  if (state === undefined) return `producer "${transactionalId}" was never initialized`
  if (state.epoch !== epoch) {
    return `producer "${transactionalId}" with epoch ${epoch} was fenced by epoch ${state.epoch} (a newer ` +
      "producer with the same transactional id started, or the broker aborted a transaction that timed out)"
  }
  return state
}

/**
 * What the transactions reach of the rest of the broker: the logs they write to, the groups whose positions they
 * commit, and the change that wakes waiting polls.
 *
 * @internal
 */
export interface Context {
  readonly producers: Producers
  readonly logs: memoryLog.Logs
  readonly groupOf: (groupId: string) => groups.Group
  readonly notify: Effect.Effect<void>
}

/**
 * The broker's transaction operations, `InMemoryKafka`'s `initProducer`, `transactionalProduce`, `endTransaction` and
 * `sendOffsets`.
 *
 * @internal
 */
export const operations = ({ groupOf, logs, notify, producers }: Context) => {
  /** The producer of `transactionalId` at `epoch`, once expired transactions are aborted; or why it is fenced. */
  const current = (transactionalId: string, epoch: number) =>
    Effect.gen(function*() {
      const now = yield* Clock.currentTimeMillis
      if (expireTransactions(producers, now)) yield* notify
      return { now, state: fencedBy(producers, transactionalId, epoch) }
    })
  return {
    initProducer: (transactionalId: string, transactionTimeout: Duration.DurationInput): Effect.Effect<number> =>
      Effect.gen(function*() {
        const now = yield* Clock.currentTimeMillis
        expireTransactions(producers, now)
        const state = producers.get(transactionalId) ?? { epoch: -1, timeoutMillis: 0, open: undefined }
        finish(state, "aborted")
        state.epoch++
        state.timeoutMillis = Duration.toMillis(Duration.decode(transactionTimeout))
        producers.set(transactionalId, state)
        yield* notify
        return state.epoch
      }),
    transactionalProduce: (
      transactionalId: string,
      epoch: number,
      topicName: string,
      records: ReadonlyArray<ProducerRecord>
    ): Effect.Effect<ReadonlyArray<readonly [partition: number, offset: bigint]>, ProduceFailed> =>
      Effect.gen(function*() {
        const { now, state } = yield* current(transactionalId, epoch)
        if (typeof state === "string") {
          return yield* new ProduceFailed({
            reason: "Fenced",
            topic: topicName,
            code: "PRODUCER_FENCED",
            detail: state
          })
        }
        const topic = logs.topics.get(topicName)
        if (topic === undefined) return yield* producer.unknownTopic(topicName)
        const planned = yield* memoryLog.plan(logs, "transactionalProduce", topic, records, now).pipe(
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
        return memoryLog.inOrder(planned, offsets)
      }),
    endTransaction: (
      transactionalId: string,
      epoch: number,
      outcome: "commit" | "abort",
      offsets: ReadonlyArray<GroupOffsets> = []
    ): Effect.Effect<void, TransactionFailed> =>
      Effect.gen(function*() {
        const { state } = yield* current(transactionalId, epoch)
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
    sendOffsets: (
      transactionalId: string,
      epoch: number,
      groupId: string,
      positions: ReadonlyArray<Position>,
      member?: GroupMetadata
    ): Effect.Effect<void, TransactionFailed> =>
      Effect.gen(function*() {
        const { now, state } = yield* current(transactionalId, epoch)
        if (typeof state === "string") {
          return yield* producer.transactionFailed(transactionalId, "sendOffsets", "Fenced", state)
        }
        const refused = member === undefined ? undefined : refuseMetadata(groupOf(groupId), member)
        if (refused !== undefined) {
          return yield* producer.transactionFailed(transactionalId, "sendOffsets", "Other", refused[1], refused[0])
        }
        openTransaction(state, now).offsets.push({ groupId, positions: [...positions] })
      })
  }
}
