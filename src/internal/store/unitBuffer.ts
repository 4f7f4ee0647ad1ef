import type * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import { Fenced } from "../../KafkaError.js"
import type { CommitUnit, OffsetStore, Results, Transaction } from "../../OffsetStore.js"

/**
 * The open transaction of the memory and file stores: results appended by the work, kept as JSON text so that what
 * is read back is what a file store would read back.
 *
 * @internal
 */
export class UnitBuffer {
  readonly entries: Array<string> = []
  open = true
}

/**
 * The handle of the `Transaction` service outside any unit of work: the `transactional` policy provides the service
 * for the consumer's lifetime (so that a handler that needs it type-checks only under that policy), and each unit of
 * work provides its own transaction over it. Using this one fails.
 *
 * @internal
 */
export class OutsideUnit {
  constructor(readonly store: string) {}
}

/**
 * The reason given when the `Transaction` service is used outside a unit of work.
 *
 * @internal
 */
export const outsideUnitReason =
  "no unit of work is open: the store's transaction exists only while the handler runs on a chunk under the " +
  "transactional policy (not in hooks, nor in fibers that outlive the handler)"

/**
 * Runs a unit's work with a fresh `UnitBuffer` as its `Transaction`, returning its value and the entries it appended.
 *
 * @internal
 */
export type UnitRunner = <A, E, R>(
  store: string,
  work: Effect.Effect<A, E, R>
) => Effect.Effect<readonly [A, ReadonlyArray<string>], E, Exclude<R, Transaction>>

/**
 * The runner of units over the `Transaction` tag. The tag is declared in the public `OffsetStore` module, which builds
 * the memory and file stores from this module's parts: taking the tag as an argument keeps that import one-way.
 * The buffer closes when the work ends, so that a fiber forked by the work cannot append after the unit was decided.
 *
 * @internal
 */
export const unitRunner = (transaction: typeof Transaction): UnitRunner => (store, work) =>
  Effect.suspend(() => {
    const buffer = new UnitBuffer()
    return work.pipe(
      Effect.provideService(transaction, { store, handle: buffer }),
      Effect.ensuring(Effect.sync(() => {
        buffer.open = false
      })),
      Effect.map((value) => [value, buffer.entries] as const)
    )
  })

/**
 * A store's services before they are put under their tags (by the public `OffsetStore` module).
 *
 * @internal
 */
export interface StoreParts {
  readonly store: Context.Tag.Service<typeof OffsetStore>
  readonly results: Context.Tag.Service<typeof Results>
}

/**
 * The refusal of a unit whose owner epoch is no longer the partition's (`current`).
 *
 * @internal
 */
export const fencedUnit = (unit: CommitUnit, current: bigint | null): Fenced =>
  new Fenced({
    groupId: unit.groupId,
    topic: unit.partition.topic,
    partition: unit.partition.partition,
    epoch: unit.epoch,
    currentEpoch: current
  })
