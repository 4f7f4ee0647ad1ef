import * as Effect from "effect/Effect"
import { type CommitUnit, Fenced, Transaction } from "../OffsetStore.js"

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
 * Runs `work` with a fresh `UnitBuffer` as its `Transaction` and returns its value with the appended entries. The
 * buffer closes when the work ends, so that a fiber forked by the work cannot append after the unit was decided.
 *
 * @internal
 */
export const runUnit = <A, E, R>(
  store: string,
  work: Effect.Effect<A, E, R>
): Effect.Effect<readonly [A, ReadonlyArray<string>], E, Exclude<R, Transaction>> =>
  Effect.suspend(() => {
    const buffer = new UnitBuffer()
    return work.pipe(
      Effect.provideService(Transaction, { store, handle: buffer }),
      Effect.ensuring(Effect.sync(() => {
        buffer.open = false
      })),
      Effect.map((value) => [value, buffer.entries] as const)
    )
  })

/**
 * The refusal of a unit whose stored position was `actual`, not the one it started from.
 *
 * @internal
 */
export const fencedUnit = (unit: CommitUnit, actual: bigint | null): Fenced =>
  new Fenced({
    groupId: unit.groupId,
    topic: unit.partition.topic,
    partition: unit.partition.partition,
    expected: unit.expected,
    actual
  })
