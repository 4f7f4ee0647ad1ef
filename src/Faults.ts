/**
 * Crash injection. The consumer asks this service at four points of each unit of work whether the process dies
 * there; when it does, nothing after that point happens for the member: no handler starts, no commit or store write
 * lands, no finalizer acts on its behalf. `InMemoryKafka.layerFaults` provides it for the in-memory broker.
 *
 * @since 0.1.0
 */
import * as Context from "effect/Context"
import type * as Effect from "effect/Effect"
import * as Schema from "effect/Schema"
import type { TopicPartition } from "./TopicPartition.js"

/**
 * Where a crash can be injected, in the order a unit of work meets them under `commitAfter`.
 *
 * @since 0.1.0
 * @category models
 */
export type CrashPoint = "beforeHandler" | "afterHandler" | "beforeCommit" | "afterCommit"

/**
 * @since 0.1.0
 * @category models
 */
export const crashPoints: ReadonlyArray<CrashPoint> = ["beforeHandler", "afterHandler", "beforeCommit", "afterCommit"]

/**
 * The defect a consumer dies with when a crash was injected.
 *
 * @since 0.1.0
 * @category errors
 */
export class Crashed extends Schema.TaggedError<Crashed>()("Crashed", {
  memberId: Schema.String,
  point: Schema.Literal("beforeHandler", "afterHandler", "beforeCommit", "afterCommit")
}) {
  override get message(): string {
    return `Member ${this.memberId} crashed (injected) at ${this.point}`
  }
}

/**
 * @since 0.1.0
 * @category tags
 */
export class Faults extends Context.Tag("effect-kafka-delivery/Faults")<Faults, {
  /** Whether the member dies at this point, with these partitions' work in hand. */
  readonly crashAt: (
    point: CrashPoint,
    memberId: string,
    partitions: ReadonlyArray<TopicPartition>
  ) => Effect.Effect<boolean>
}>() {}
