/**
 * `transactional`: exactly-once through an offset store. The handler's writes and the position (or the ranges
 * finished) land in one transaction of the store, fenced by the owner epoch of the claim made on assign.
 *
 * @internal
 */
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import type { CommitPolicy, PolicyContext, PolicyError, PolicyInstance } from "../../CommitPolicy.js"
import * as OffsetBatch from "../../OffsetBatch.js"
import { OffsetStore, Transaction } from "../../OffsetStore.js"
import * as TopicPartition from "../../TopicPartition.js"
import { OutsideUnit } from "../store/unitBuffer.js"
import { finishedRanges } from "./support.js"

type Retry = <E2, R2>(work: Effect.Effect<void, E2, R2>) => Effect.Effect<void, E2, R2>

/** What one consumer session's instance of the policy keeps. */
interface Units {
  readonly context: PolicyContext
  readonly store: Context.Tag.Service<OffsetStore>
  readonly commitToKafka: boolean
  /** The owner epoch of each owned partition, from the claim made on assign. */
  readonly epochs: Map<string, bigint>
}

/** One unit of the store: the handler's writes, and the position (or the ranges finished) with them. */
const unitOf = <E, R>(
  units: Units,
  partition: TopicPartition.TopicPartition,
  next: bigint,
  finished: ReadonlyArray<readonly [bigint, bigint]> | undefined,
  work: Effect.Effect<void, E, R>,
  retry: Retry
): Effect.Effect<void, E | PolicyError, R> =>
  Effect.gen(function*() {
    const { context, store } = units
    const epoch = units.epochs.get(TopicPartition.key(partition))
    // Work of a partition this member no longer owns (left running after a revoke) commits nothing.
    if (epoch === undefined) return
    yield* context.crashAt("beforeHandler", [partition])
    const unit = { groupId: context.groupId, partition, epoch, next, finished }
    yield* retry(context.guard(context.observe(
      "store",
      partition,
      next,
      store.commit(
        unit,
        work.pipe(
          Effect.zipLeft(context.crashAt("afterHandler", [partition])),
          Effect.zipLeft(context.crashAt("beforeCommit", [partition]))
        )
      )
    )))
    yield* context.crashAt("afterCommit", [partition])
    if (units.commitToKafka && finished === undefined) {
      yield* context.guard(context.session.commit(OffsetBatch.of(partition, next))).pipe(
        Effect.catchAll((error) => Effect.logDebug("position hint not committed to Kafka", error))
      )
    }
  })

/** The policy's instance for one consumer session. */
const instance = (
  context: PolicyContext,
  store: Context.Tag.Service<OffsetStore>,
  commitToKafka: boolean
): PolicyInstance => {
  const units: Units = { context, store, commitToKafka, epochs: new Map() }
  const { epochs } = units
  // Ranges the earlier owners finished above the stored position, from the claim, taken by the runloop.
  const finishedBefore = finishedRanges()
  const forget = (partitions: ReadonlyArray<TopicPartition.TopicPartition>) =>
    Effect.sync(() => {
      for (const tp of partitions) {
        epochs.delete(TopicPartition.key(tp))
        finishedBefore.forget(TopicPartition.key(tp))
      }
    })
  return {
    name: "transactional",
    failedRecords: "rerun",
    assign: (partitions) =>
      Effect.map(store.claim(context.groupId, partitions), (claims) => {
        const positions = new Map<string, bigint>()
        for (const [k, claim] of claims) {
          epochs.set(k, claim.epoch)
          if (claim.position !== null) positions.set(k, claim.position)
          finishedBefore.set(k, claim.finished)
        }
        return positions
      }),
    finishedOnAssign: finishedBefore.take,
    delivered: () => Effect.void,
    polled: Effect.void,
    process: (partition, _records, next, work, retry) => unitOf(units, partition, next, undefined, work, retry),
    // Records finishing out of order: a unit per few records of a key, naming the ranges it finished.
    outOfOrder: {
      handle: (partition, next, finished, work, retry) => unitOf(units, partition, next, finished, work, retry),
      unitRecords: 32,
      progressed: () => {}
    },
    revoke: forget,
    lost: forget
  }
}

/** Exactly-once: the handler's writes and the position in one transaction of the offset store. */
export const transactionalLayer = (
  tag: typeof CommitPolicy,
  commitToKafka: boolean
): Layer.Layer<CommitPolicy | Transaction, never, OffsetStore> =>
  Layer.effectContext(
    Effect.map(OffsetStore, (store) =>
      Context.make(tag, {
        name: "transactional",
        make: (context: PolicyContext) => Effect.sync(() => instance(context, store, commitToKafka))
      }).pipe(
        // Outside a unit of work the service holds no transaction; each unit provides its own over it.
        Context.add(Transaction, { store: store.name, handle: new OutsideUnit(store.name) })
      ))
  )
