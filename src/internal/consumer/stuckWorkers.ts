import type * as Fiber from "effect/Fiber"

/**
 * Workers of revoked partitions that did not stop when they were interrupted (they sit in an uninterruptible region),
 * by partition key. A partition assigned again waits for its stuck worker first, so that two workers never run on one
 * partition. A worker is forgotten as soon as it ends, so that partitions that never come back hold nothing.
 *
 * @internal
 */
export interface StuckWorkers {
  /** Remembers the worker of `key` until it ends. */
  readonly add: (key: string, fiber: Fiber.RuntimeFiber<void>) => void
  /** The stuck worker of `key`, while it runs. */
  readonly get: (key: string) => Fiber.RuntimeFiber<void> | undefined
  readonly delete: (key: string) => void
  /** How many are remembered. */
  readonly size: () => number
}

/** @internal */
export const make = (): StuckWorkers => {
  const stuck = new Map<string, Fiber.RuntimeFiber<void>>()
  return {
    add: (key, fiber) => {
      stuck.set(key, fiber)
      fiber.addObserver(() => {
        if (stuck.get(key) === fiber) stuck.delete(key)
      })
    },
    get: (key) => stuck.get(key),
    delete: (key) => {
      stuck.delete(key)
    },
    size: () => stuck.size
  }
}
