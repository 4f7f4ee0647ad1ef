/**
 * The failure route: the handler with retries, retry topics and a dead-letter topic around it. Its parts:
 * - `failures.ts`: the failures it tells apart, and the handler as the runloop calls it;
 * - `targets.ts`: where a failed record goes;
 * - `attempts.ts`: the failed attempts it counts;
 * - `circuit.ts`: the records routed in a row, which open its circuit;
 * - `deadLetters.ts` and `sideWrites.ts`: the letters it writes, by a unit or apart from it;
 * - `handling.ts`: the handler run with all of these around it.
 *
 * @internal
 */
import type * as Chunk from "effect/Chunk"
import type * as Effect from "effect/Effect"
import type { ConsumerRecord } from "../../ConsumerRecord.js"
import * as TopicPartition from "../../TopicPartition.js"
import * as Attempts from "./attempts.js"
import * as Circuit from "./circuit.js"
import { type Mode, type PartitionRoute, type RouteContext, stateOf } from "./context.js"
import { failedOffset, type HandlerFailure, type Work } from "./failures.js"
import { inPlace, rerun } from "./handling.js"
import type { SideWrites } from "./sideWrites.js"
import type { RouteSettings } from "./targets.js"

export type { Locate } from "./circuit.js"
export type { Mode } from "./context.js"
export { Fatal, HandlerFailure, indexOf, retryable, type Work } from "./failures.js"
export { makeSideWrites, type SideWrites } from "./sideWrites.js"
export { retryStepOf, type RouteSettings } from "./targets.js"

export interface Router<E, R> {
  readonly work: Work<E, R>
  /**
   * Under `rerun`, after a unit's retries: marks the record it failed on to be routed when the unit runs again, and
   * returns `true`; `false` when the record is not known (a chunk handler failed on a chunk of several records): then
   * the unit is to be taken apart, a record per unit.
   */
  readonly poison: (
    partition: TopicPartition.TopicPartition,
    records: Chunk.Chunk<ConsumerRecord>,
    failure: HandlerFailure<unknown>
  ) => boolean
  /** The partition's position passed `position`: what was kept of the records below it is dropped. */
  readonly passed: (partition: TopicPartition.TopicPartition, position: bigint) => void
  /** The partition is assigned anew, or given up: what was known of its failures is dropped. */
  readonly reset: (partition: TopicPartition.TopicPartition) => void
  /**
   * The partition's records finish out of order: `locate` gives the range of a record in flight, with which records
   * in a row are counted in offset order (see `Circuit.Row`).
   */
  readonly outOfOrder: (partition: TopicPartition.TopicPartition, locate: Circuit.Locate) => void
  /**
   * How many records the router remembers something of (failed attempts, poison, dead letters written): what its memory
   * grows with. The streak of failures in a row is not counted: it never holds more than `maxInARow` records.
   */
  readonly remembered: () => number
}

/**
 * The handler with the dead-letter route around it. `retry` runs an effect with the consumer's retry schedule.
 */
export const makeRouter = <E, R>(
  settings: RouteSettings,
  mode: Mode,
  unitHoldsWrites: boolean,
  work: Work<E, R>,
  retry: <E2, R2>(effect: Effect.Effect<void, E2, R2>) => Effect.Effect<void, E2, R2>,
  /** Under `inPlace`, when the policy's commits wait for the writes: units do not. */
  side?: SideWrites,
  /** Told of each record written to a retry or dead-letter topic. */
  onRouted?: (partition: TopicPartition.TopicPartition, topic: string) => void
): Router<E, R> => {
  const context: RouteContext<E, R> = {
    settings,
    mode,
    unitHoldsWrites,
    work,
    retry,
    apart: mode === "inPlace" ? side : undefined,
    onRouted,
    partitions: new Map(),
    locators: new Map(),
    attempts: new Map()
  }
  return {
    work: mode === "rerun" ? rerun(context) : inPlace(context),
    poison: (tp, records, failure) => {
      const offset = failedOffset(failure, records)
      if (offset === undefined) return false
      stateOf(context, TopicPartition.key(tp)).poisoned.set(offset, failure.error)
      return true
    },
    outOfOrder: (tp, locate) => {
      context.locators.set(TopicPartition.key(tp), locate)
    },
    passed: (tp, position) => passed(context, tp, position),
    reset: (tp) => {
      context.partitions.delete(TopicPartition.key(tp))
      context.attempts.delete(TopicPartition.key(tp))
      context.locators.delete(TopicPartition.key(tp))
    },
    remembered: () => {
      let n = Attempts.size(context.attempts)
      for (const state of context.partitions.values()) n += remembered(state)
      return n
    }
  }
}

/** The partition's position passed `position`: what was kept of the records below it is dropped. */
const passed = <E, R>(context: RouteContext<E, R>, tp: TopicPartition.TopicPartition, position: bigint) => {
  const k = TopicPartition.key(tp)
  const state = context.partitions.get(k)
  if (state !== undefined) Circuit.passed(state, position)
  Attempts.passed(context.attempts, k, position)
  if (state === undefined || (state.poisoned.size === 0 && state.written.size === 0)) return
  for (const offset of state.poisoned.keys()) if (offset < position) state.poisoned.delete(offset)
  for (const offset of state.written) if (offset < position) state.written.delete(offset)
}

/** How many records a partition's route remembers something of: poison, dead letters written, ranges routed. */
const remembered = (state: PartitionRoute) => state.poisoned.size + state.written.size + state.routedFrom.size
