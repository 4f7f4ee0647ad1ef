/**
 * What the parts of one failure route share: its settings, the handler it wraps, and what it remembers per partition.
 *
 * @internal
 */
import type * as Effect from "effect/Effect"
import type * as TopicPartition from "../../TopicPartition.js"
import type { Attempts } from "./attempts.js"
import * as Circuit from "./circuit.js"
import type { Work } from "./failures.js"
import type { SideWrites } from "./sideWrites.js"
import type { RouteSettings } from "./targets.js"

/**
 * How a policy lets a failed record be set aside:
 * - `inPlace`: the record is retried alone and, failing still, routed where it is, inside the unit;
 * - `once`: the handler runs once per record (at-most-once): a failed record is routed at once, inside the unit;
 * - `rerun`: a failed unit is rolled back; it runs again with the record routed in it rather than handled. When the
 *   unit holds the route's write (a Kafka transaction), each run writes it; else a record written once is not again.
 */
export type Mode = "inPlace" | "once" | "rerun"

/** What the route knows of one partition: its records set aside, and the circuit's row of failures. */
export interface PartitionRoute extends Circuit.Row {
  /** Records to route rather than handle when their unit runs again, with the error they failed with. */
  readonly poisoned: Map<bigint, unknown>
  /** Records dead-lettered by a write that a rolled-back unit does not take back: not written again. */
  readonly written: Set<bigint>
}

export interface RouteContext<E, R> {
  readonly settings: RouteSettings
  readonly mode: Mode
  readonly unitHoldsWrites: boolean
  /** The user's handler. */
  readonly work: Work<E, R>
  /** Runs an effect with the consumer's retry schedule. */
  readonly retry: <E2, R2>(effect: Effect.Effect<void, E2, R2>) => Effect.Effect<void, E2, R2>
  /** Under `inPlace`, when the policy's commits wait for the writes: units do not. */
  readonly apart: SideWrites | undefined
  /** Told of each record written to a retry or dead-letter topic. */
  readonly onRouted: ((partition: TopicPartition.TopicPartition, topic: string) => void) | undefined
  readonly partitions: Map<string, PartitionRoute>
  /** Partitions whose records finish out of order. */
  readonly locators: Map<string, Circuit.Locate>
  readonly attempts: Attempts
}

/** What the route knows of partition `k`, made when it knows nothing yet. */
export const stateOf = <E, R>(context: RouteContext<E, R>, k: string): PartitionRoute => {
  let state = context.partitions.get(k)
  if (state === undefined) {
    state = { poisoned: new Map(), written: new Set(), ...Circuit.emptyRow() }
    context.partitions.set(k, state)
  }
  return state
}
