/**
 * Workers that did not stop when their partition was revoked are remembered only while they run: a partition that
 * never comes back holds nothing once its worker ends.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as StuckWorkers from "../src/internal/consumer/stuckWorkers.js"

describe("stuck workers", () => {
  it.effect("are remembered while they run and forgotten when they end", () =>
    Effect.gen(function*() {
      const workers = StuckWorkers.make()
      const gates = yield* Effect.forEach(Array.from({ length: 100 }), () => Deferred.make<void>())
      const fibers = yield* Effect.forEach(gates, (gate) => Effect.fork(Effect.uninterruptible(Deferred.await(gate))))
      fibers.forEach((fiber, i) => workers.add(`t-${i}`, fiber))
      yield* Effect.forEach(fibers, Fiber.interruptFork)
      yield* Effect.yieldNow()
      assert.strictEqual(workers.size(), 100)
      assert.strictEqual(workers.get("t-7"), fibers[7])
      yield* Effect.forEach(gates, (gate) => Deferred.succeed(gate, undefined))
      yield* Effect.forEach(fibers, Fiber.await)
      assert.strictEqual(workers.size(), 0, "workers that ended are still held")
      assert.isUndefined(workers.get("t-7"))
    }))

  it.effect("a worker replaced by a later one for the same partition does not remove the later one when it ends", () =>
    Effect.gen(function*() {
      const workers = StuckWorkers.make()
      const first = yield* Deferred.make<void>()
      const second = yield* Deferred.make<void>()
      const a = yield* Effect.fork(Deferred.await(first))
      const b = yield* Effect.fork(Deferred.await(second))
      workers.add("t-0", a)
      workers.add("t-0", b)
      yield* Deferred.succeed(first, undefined)
      yield* Fiber.await(a)
      assert.strictEqual(workers.get("t-0"), b)
      yield* Deferred.succeed(second, undefined)
      yield* Fiber.await(b)
      assert.strictEqual(workers.size(), 0)
    }))
})
