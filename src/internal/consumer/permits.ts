import * as Effect from "effect/Effect"
import type * as Fiber from "effect/Fiber"

/** A fiber waiting for a permit. */
interface Waiter {
  readonly resume: () => void
  /** The permit was handed to it. */
  handed: boolean
  /** It was interrupted before it got one. */
  cancelled: boolean
}

/**
 * Permits handed out first come, first served. A released permit goes straight to the oldest waiter, so a release
 * wakes one fiber: with hundreds of waiters (a handler call per record, many keys), waking them all to race for it
 * costs more than the handlers.
 *
 * @internal
 */
export interface Permits {
  readonly withPermit: <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>
  /**
   * Waits for a permit, then forks `effect` holding it (released when the fiber ends). `effect` is not started
   * before a permit is there: a fiber is made only for work that can run.
   */
  readonly forkWithPermit: <A, E, R>(
    effect: Effect.Effect<A, E, R>
  ) => Effect.Effect<Fiber.RuntimeFiber<A, E>, never, R>
  /** Permits not taken now. */
  readonly free: () => number
  /** Permits not taken, and fibers waiting (for tests). */
  readonly state: () => { readonly free: number; readonly waiting: number }
}

/** @internal */
export const make = (permits: number): Permits => {
  let free = permits
  let waiting: Array<Waiter> = []
  let head = 0

  const release = () => {
    while (head < waiting.length) {
      const next = waiting[head++]!
      if (next.cancelled) continue
      next.handed = true
      next.resume()
      return
    }
    waiting = []
    head = 0
    free++
  }

  const acquire = Effect.async<void>((resume) => {
    if (free > 0) {
      free--
      resume(Effect.void)
      return
    }
    const waiter: Waiter = { resume: () => resume(Effect.void), handed: false, cancelled: false }
    if (head > 1024 && head * 2 > waiting.length) {
      waiting = waiting.slice(head)
      head = 0
    }
    waiting.push(waiter)
    // Interrupted while waiting: it gives up its place, or, when a permit was handed to it meanwhile, passes it on.
    return Effect.sync(() => {
      if (waiter.handed) release()
      else waiter.cancelled = true
    })
  })

  const releasing = Effect.sync(release)

  return {
    forkWithPermit: (effect) =>
      Effect.uninterruptibleMask((restore) =>
        Effect.zipRight(restore(acquire), Effect.fork(Effect.ensuring(Effect.interruptible(effect), releasing)))
      ),
    withPermit: (effect) =>
      Effect.uninterruptibleMask((restore) =>
        Effect.zipRight(restore(acquire), Effect.ensuring(restore(effect), releasing))
      ),
    free: () => free,
    state: () => ({ free, waiting: waiting.slice(head).filter((w) => !w.cancelled && !w.handed).length })
  }
}
