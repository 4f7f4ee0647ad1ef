/**
 * `kafkaTransactional`: exactly-once inside Kafka. Each owned input partition has a transactional producer of its
 * own, whose id names the partition: starting it fences every earlier owner and ends its open transaction. A chunk's
 * output records and its position commit in one Kafka transaction; a transaction whose outcome is unknown is settled
 * by reading the committed position once the producer has started anew.
 *
 * @internal
 */
import * as Chunk from "effect/Chunk"
import * as Clock from "effect/Clock"
import * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Scope from "effect/Scope"
import type { CommitPolicy, PolicyContext, PolicyError, PolicyInstance } from "../../CommitPolicy.js"
import type { ConsumerRecord } from "../../ConsumerRecord.js"
import type { GroupMetadata } from "../../Driver.js"
import { type DriverError, ProduceFailed, TransactionFailed } from "../../KafkaError.js"
import { Producer, type TransactionalProducer, TransactionalProducers } from "../../Producer.js"
import * as TopicPartition from "../../TopicPartition.js"
import { giveUp, inRound, makeMember, RoundFailed, start } from "./memberTransactions.js"
import { kafkaStartPositions, whileUnreachable } from "./support.js"

type Retry = <E2, R2>(work: Effect.Effect<void, E2, R2>) => Effect.Effect<void, E2, R2>

const outsideUnit =
  "under CommitPolicy.kafkaTransactional the Producer writes into the transaction of the chunk being handled; " +
  "outside a handler there is none (provide a Producer layer of its own to write elsewhere)"

/** The `Producer` outside a chunk's handler: it has no transaction to write into. */
const producerOutsideUnit: Context.Tag.Service<typeof Producer> = {
  send: (record) => Effect.fail(new ProduceFailed({ reason: "Other", topic: record.topic, detail: outsideUnit })),
  sendAll: (records) =>
    Effect.suspend(() => {
      const first = Array.from(records)[0]
      return first === undefined
        ? Effect.succeed([])
        : Effect.fail(new ProduceFailed({ reason: "Other", topic: first.topic, detail: outsideUnit }))
    }),
  flush: Effect.void
}

/**
 * A transaction whose outcome is unknown (a timeout, a lost connection, a client in a broken state). Not one refused
 * because a newer member took this one's instance id: that ends the consumer, as a commit refused so does.
 */
const unsettled = (error: unknown): error is TransactionFailed =>
  error instanceof TransactionFailed && error.code !== "FENCED_INSTANCE_ID" &&
  (error.reason === "Timeout" || error.reason === "Disconnected" || error.reason === "Other")

interface Owned {
  producer: Context.Tag.Service<typeof TransactionalProducer>
  scope: Scope.CloseableScope
  /**
   * A transaction of this producer failed: before the next, the policy starts the partition's producer anew and reads
   * the committed position (`resume`). A producer never starts anew by itself: that would fence the partition's
   * owner, were this member a zombie, and go on from a position other members may have moved past.
   */
  failed: boolean
}

/** The producers of one consumer session's owned partitions. */
interface Producers {
  readonly context: PolicyContext
  readonly factory: Context.Tag.Service<TransactionalProducers>
  readonly prefix: string
  readonly owned: Map<string, Owned>
}

const close = (producers: Producers, partitions: ReadonlyArray<TopicPartition.TopicPartition>) =>
  Effect.forEach(partitions, (tp) => {
    const k = TopicPartition.key(tp)
    const o = producers.owned.get(k)
    if (o === undefined) return Effect.void
    producers.owned.delete(k)
    return Scope.close(o.scope, Exit.void)
  }, { concurrency: "unbounded", discard: true })

// Starting the partition's producer fences every earlier owner and ends its open transaction. Started anew, it takes
// the place of the partition's earlier one, unless the partition was revoked meanwhile.
const open = (producers: Producers, tp: TopicPartition.TopicPartition) =>
  Effect.gen(function*() {
    const k = TopicPartition.key(tp)
    const earlier = producers.owned.get(k)
    if (earlier !== undefined) yield* Scope.close(earlier.scope, Exit.void)
    const scope = yield* Scope.make()
    const id = `${producers.prefix}${producers.context.groupId}-${tp.topic}-${tp.partition}`
    const producer = yield* producers.factory.make(id).pipe(
      Scope.extend(scope),
      Effect.onError(() => Scope.close(scope, Exit.void))
    )
    if (earlier === undefined) {
      producers.owned.set(k, { producer, scope, failed: false })
    } else if (producers.owned.get(k) === earlier) {
      earlier.producer = producer
      earlier.scope = scope
      earlier.failed = false
    } else {
      yield* Scope.close(scope, Exit.void)
    }
  })

/**
 * Where a chunk stands, read once its partition's producer has started anew (every earlier producer of the partition
 * fenced, their open transactions ended): committed (the position is the chunk's end), to handle (nothing of it is
 * committed), or moved on: the position is inside the chunk or past it, so another member took the partition and went
 * on. The chunk fails then as fenced, and the member joins again rather than go on from where it was.
 */
const standing = (
  transactionalId: string,
  partition: TopicPartition.TopicPartition,
  records: Chunk.Chunk<ConsumerRecord>,
  next: bigint,
  position: bigint | undefined
): Effect.Effect<"committed" | "handle", TransactionFailed> => {
  if (position === next) return Effect.succeed("committed")
  const first = Chunk.head(records)
  if (position === undefined || position < next && (Option.isNone(first) || position <= first.value.offset)) {
    return Effect.succeed("handle")
  }
  return Effect.fail(
    new TransactionFailed({
      transactionalId,
      operation: "init",
      reason: "Fenced",
      detail: `${TopicPartition.key(partition)}'s committed position is ${position} while this member handles the ` +
        `chunk up to ${next}: another member took the partition and went on`
    })
  )
}

/**
 * How the chunks of the owned partitions go into transactions: a producer per partition, or one for the member.
 */
interface Transactor {
  /** The owned partitions, each with whether a transaction of its chunks failed since it last resumed. */
  readonly owned: ReadonlyMap<string, { failed: boolean }>
  readonly transactionalId: (k: string) => string
  /** Ends the transaction of the partition's chunk that failed, if it is still open: its outcome is final then. */
  readonly restart: (partition: TopicPartition.TopicPartition) => Effect.Effect<void, TransactionFailed | DriverError>
  /** The chunk's handler in a transaction that commits its records and the partition's position `next`. */
  readonly transaction: <E, R>(
    partition: TopicPartition.TopicPartition,
    next: bigint,
    body: Effect.Effect<void, E, R>
  ) => Effect.Effect<void, E | TransactionFailed | DriverError, Exclude<R, Producer>>
  readonly assign: (partitions: ReadonlyArray<TopicPartition.TopicPartition>) => Effect.Effect<void, PolicyError>
  readonly revoke: (partitions: ReadonlyArray<TopicPartition.TopicPartition>) => Effect.Effect<void>
  readonly lost: (partitions: ReadonlyArray<TopicPartition.TopicPartition>) => Effect.Effect<void>
}

/** A producer per owned partition, whose transactional id names the partition. */
const perPartition = (producers: Producers): Effect.Effect<Transactor, never, Scope.Scope> =>
  Effect.gen(function*() {
    const { context, owned } = producers
    const closing = (partitions: ReadonlyArray<TopicPartition.TopicPartition>) => close(producers, partitions)
    yield* Effect.addFinalizer(() => closing(Array.from(owned.keys(), TopicPartition.fromKey)))
    return {
      owned,
      transactionalId: (k) => owned.get(k)?.producer.transactionalId ?? k,
      restart: (partition) => open(producers, partition),
      transaction: (partition, next, body) =>
        Effect.suspend(() => {
          const o = owned.get(TopicPartition.key(partition))
          if (o === undefined) return Effect.void
          const offsets = {
            groupId: context.groupId,
            positions: [{ topic: partition.topic, partition: partition.partition, next }]
          }
          return o.producer.transaction(body, { offsets })
        }),
      assign: (partitions) =>
        Effect.forEach(
          partitions,
          (tp) => whileUnreachable(context.guard(open(producers, tp)), context.reconnectTimeout),
          { concurrency: "unbounded", discard: true }
        ),
      revoke: closing,
      lost: closing
    }
  })

/**
 * A member whose positions the group's coordinator refuses because it is not in the group any more (its session
 * expired) is fenced: it gives up its partitions and joins again. A refused generation alone is not: the member may
 * still be in the group at a newer one, and the chunk is settled and tried again with it. A newer member with this
 * one's instance id ends it (`unsettled`).
 */
const outOfGroup = (error: TransactionFailed | DriverError): TransactionFailed | DriverError =>
  error instanceof TransactionFailed && error.code === "UNKNOWN_MEMBER_ID"
    ? new TransactionFailed({ ...error, reason: "Fenced" })
    : error

/** One producer for the member, its transactions fenced by the member's generation (KIP-447). */
const perMember = (
  context: PolicyContext,
  factory: Context.Tag.Service<TransactionalProducers>,
  transactionalId: string,
  groupMetadata: () => GroupMetadata
): Effect.Effect<Transactor, never, Scope.Scope> =>
  Effect.map(makeMember(context, factory, transactionalId, groupMetadata), (member): Transactor => ({
    owned: member.owned,
    transactionalId: () => transactionalId,
    restart: () => start(member),
    transaction: (partition, next, body) =>
      Effect.catchIf(
        inRound(member, partition, next, body),
        (error): error is RoundFailed => error instanceof RoundFailed,
        (failed) => Effect.fail(outOfGroup(failed.error))
      ),
    assign: (partitions) =>
      Effect.zipRight(
        whileUnreachable(context.guard(start(member)), context.reconnectTimeout),
        Effect.sync(() => {
          for (const tp of partitions) member.owned.set(TopicPartition.key(tp), { failed: false })
        })
      ),
    revoke: (partitions) => giveUp(member, partitions, true),
    lost: (partitions) => giveUp(member, partitions, false)
  }))

/** A chunk in a transaction, with its position. */
const processChunk = <E, R>(
  context: PolicyContext,
  transactor: Transactor,
  partition: TopicPartition.TopicPartition,
  records: Chunk.Chunk<ConsumerRecord>,
  next: bigint,
  work: Effect.Effect<void, E, R>,
  retry: Retry
): Effect.Effect<void, E | PolicyError, Exclude<R, Producer>> =>
  Effect.gen(function*() {
    const { owned } = transactor
    const k = TopicPartition.key(partition)
    // Work of a partition this member no longer owns (left running after a revoke) commits nothing.
    if (!owned.has(k)) return
    yield* context.crashAt("beforeHandler", [partition])
    const body = work.pipe(
      Effect.zipLeft(context.crashAt("afterHandler", [partition])),
      Effect.zipLeft(context.crashAt("beforeCommit", [partition]))
    )
    const deadline = (yield* Clock.currentTimeMillis) + Duration.toMillis(context.reconnectTimeout)
    // The transaction that failed ended (the partition's producer started anew), then the committed position read
    // (stable: a transaction still completing makes the read wait) says where the chunk stands. A cluster still
    // away is waited for, up to the chunk's deadline.
    const resume = Effect.flatMap(Clock.currentTimeMillis, (now) =>
      whileUnreachable(
        Effect.suspend(() =>
          // A partition revoked meanwhile is not started again: its next owner handles the chunk.
          owned.has(k)
            ? Effect.zipRight(
              context.guard(transactor.restart(partition)),
              Effect.flatMap(context.guard(context.session.committed([partition])), (committed) => {
                const o = owned.get(k)
                if (o === undefined) return Effect.succeed("revoked" as const)
                o.failed = false
                return standing(transactor.transactionalId(k), partition, records, next, committed.get(k))
              })
            )
            : Effect.succeed("revoked" as const)
        ),
        Duration.millis(Math.max(0, deadline - now))
      ))
    const transaction = Effect.suspend(() => {
      const o = owned.get(k)
      return o === undefined
        ? Effect.void
        : context.observe("transaction", partition, next, transactor.transaction(partition, next, body)).pipe(
          Effect.tapError(() => Effect.sync(() => (o.failed = true)))
        )
    })
    const attempt = Effect.suspend(() =>
      owned.get(k)?.failed === true
        ? Effect.flatMap(resume, (stands) => stands === "handle" ? transaction : Effect.void)
        : transaction
    )
    // An unsettled transaction (its outcome unknown) is settled as a failed one is: the next attempt resumes first.
    const run = (delay: number): Effect.Effect<void, E | PolicyError, Exclude<R, Producer>> =>
      Effect.catchIf(retry(context.guard(attempt)), unsettled, (error) =>
        Effect.flatMap(resume, (stands) =>
          stands !== "handle" ? Effect.void : Effect.flatMap(Clock.currentTimeMillis, (now) =>
            now >= deadline
              ? Effect.fail(error)
              : Effect.zipRight(
                Effect.logWarning(`${k}: ${error.message}; handling the chunk again in a new transaction`),
                Effect.zipRight(Effect.sleep(Duration.millis(delay)), run(Math.min(delay * 2, 5_000)))
              ))))
    yield* run(100)
    yield* context.crashAt("afterCommit", [partition])
  })

/** The policy's instance for one consumer session. */
const instance = (
  context: PolicyContext,
  factory: Context.Tag.Service<TransactionalProducers>,
  options: Options
): Effect.Effect<PolicyInstance, never, Scope.Scope> =>
  Effect.gen(function*() {
    const groupMetadata = context.session.groupMetadata
    const transactor = groupMetadata === undefined || options.producers === "partition"
      ? yield* perPartition({ context, factory, prefix: options.prefix, owned: new Map() })
      : yield* perMember(
        context,
        factory,
        `${options.prefix}${context.groupId}-${options.instanceId ?? crypto.randomUUID()}`,
        groupMetadata
      )
    const policy: PolicyInstance = {
      name: "kafkaTransactional",
      failedRecords: "rerun",
      unitHoldsWrites: true,
      assign: (partitions) =>
        Effect.zipRight(
          transactor.assign(partitions),
          // Read once every earlier owner is fenced: the committed positions are final.
          kafkaStartPositions(context, partitions)
        ),
      delivered: () => Effect.void,
      polled: Effect.void,
      process: (partition, records, next, work, retry) =>
        processChunk(context, transactor, partition, records, next, work, retry),
      revoke: transactor.revoke,
      lost: transactor.lost
    }
    return policy
  })

/** How the policy names and shares its transactional producers. */
export interface Options {
  readonly prefix: string
  /** The member's producer's id, after the prefix and the group id; a random one when absent. */
  readonly instanceId: string | undefined
  /** `partition`: a producer per partition even where the driver sends the group's metadata. */
  readonly producers: "member" | "partition"
}

/** Exactly-once inside Kafka: the handler's records and the position in one Kafka transaction per chunk. */
export const kafkaTransactionalLayer = (
  tag: typeof CommitPolicy,
  options: Options
): Layer.Layer<CommitPolicy | Producer, never, TransactionalProducers> =>
  Layer.effectContext(
    Effect.map(TransactionalProducers, (factory) =>
      Context.make(tag, {
        name: "kafkaTransactional",
        make: (context: PolicyContext) => instance(context, factory, options)
      }).pipe(Context.add(Producer, producerOutsideUnit)))
  )
