/**
 * Metric labels made once each (Effect caches a metric's series by the identity of its label array), and what the
 * consumer's and the producer's instruments share.
 *
 * @internal
 */
import type * as Clock from "effect/Clock"
import type * as Context from "effect/Context"
import * as MetricLabel from "effect/MetricLabel"
import type { Observability } from "../../Observability.js"

export type Settings = Context.Tag.Service<typeof Observability>
export type Labels = ReadonlyArray<MetricLabel.MetricLabel>

export const system = MetricLabel.make("messaging.system", "kafka")
export const label = MetricLabel.make

/** A label set, and the same with `error.type` for each failure seen, made once each. */
export class LabelSet {
  private readonly failures = new Map<string, Labels>()
  constructor(readonly labels: Labels) {}
  failed(type: string): Labels {
    let found = this.failures.get(type)
    if (found === undefined) {
      found = [...this.labels, label("error.type", type)]
      this.failures.set(type, found)
    }
    return found
  }
}

/** The tag of a failure, for `error.type`: its `_tag`, its class, or what it is. */
export const errorType = (error: unknown): string => {
  if (typeof error === "object" && error !== null) {
    const tag = (error as { readonly _tag?: unknown })._tag
    if (typeof tag === "string") return tag
    const name = error.constructor?.name
    if (typeof name === "string" && name !== "Object") return name
  }
  return typeof error
}

/** The seconds since `start`, a time in nanoseconds of `clock`. */
export const seconds = (clock: Clock.Clock, start: bigint) => Number(clock.unsafeCurrentTimeNanos() - start) / 1e9
