/**
 * The failure route's own memory: what it remembers of a record (its failed attempts, that it is poison, that its
 * dead letter was written) goes once the record is handled, routed, or behind the partition's position.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Chunk from "effect/Chunk"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Schedule from "effect/Schedule"
import type { ConsumerRecord } from "../src/ConsumerRecord.js"
import * as InMemoryKafka from "../src/InMemoryKafka.js"
import { HandlerFailure, makeRouter, type Mode, retryable } from "../src/internal/route/router.js"
import { retryAfterFailure } from "../src/internal/shared/retry.js"

const tp = { topic: "t", partition: 0 }
const record = (offset: number): ConsumerRecord => ({
  topic: "t",
  partition: 0,
  offset: BigInt(offset),
  key: null,
  value: new TextEncoder().encode(String(offset)),
  headers: {},
  timestamp: 0
})
const retry = <E, R>(effect: Effect.Effect<void, E, R>) =>
  retryAfterFailure(effect, { schedule: Schedule.recurs(2), retryable })
/** A unit run again and again, as a policy that rolls a failed unit back does, until it succeeds. */
const rerunUntilDone = <E, R>(effect: Effect.Effect<void, E, R>) =>
  retryAfterFailure(effect, { schedule: Schedule.recurs(10), retryable })
const settings = { topic: "dlq", maxInARow: 1_000_000, delays: [] }

describe("the failure route remembers nothing of records it is done with", () => {
  for (const mode of ["inPlace", "rerun"] as const satisfies ReadonlyArray<Mode>) {
    it.effect(`${mode}: 5,000 records that fail once and then succeed leave nothing behind`, () =>
      Effect.gen(function*() {
        const failed = new Set<bigint>()
        // Each record's first attempt fails, naming it; its second succeeds.
        const work = (records: Chunk.Chunk<ConsumerRecord>) =>
          Effect.forEach(records, (r) => {
            if (failed.has(r.offset)) return Effect.void
            failed.add(r.offset)
            return Effect.fail(new HandlerFailure("boom", r.offset))
          }, { discard: true })
        const router = makeRouter(settings, mode, false, work, retry)
        for (let i = 0; i < 5_000; i += 5) {
          const unit = Chunk.unsafeFromArray(Array.from({ length: 5 }, (_, j) => record(i + j)))
          // A policy that reruns a failed unit runs it again as it is (nothing poison: each record passes later).
          yield* mode === "rerun" ? rerunUntilDone(router.work(unit, tp)) : router.work(unit, tp)
        }
        assert.strictEqual(failed.size, 5_000)
        assert.strictEqual(router.remembered(), 0, "the route kept what it knew of records that were handled")
      }))
  }

  it.live("records routed, and records behind the position, are forgotten; a partition given up leaves nothing", () =>
    Effect.gen(function*() {
      yield* InMemoryKafka.createTopic("dlq", 1)
      const work = (records: Chunk.Chunk<ConsumerRecord>) =>
        Effect.fail(new HandlerFailure("always", Chunk.unsafeHead(records).offset))
      const router = makeRouter(settings, "rerun", false, work, retry)
      const unit = Chunk.of(record(7))
      const failure = yield* Effect.flip(retry(router.work(unit, tp)))
      assert.isTrue(router.poison(tp, unit, failure as HandlerFailure<unknown>))
      assert.isAbove(router.remembered(), 0)
      // The unit runs again with the record routed: its dead letter is written once.
      yield* router.work(unit, tp)
      router.passed(tp, 8n)
      assert.strictEqual(router.remembered(), 0)
      yield* Effect.flip(retry(router.work(Chunk.of(record(9)), tp)))
      assert.isAbove(router.remembered(), 0)
      router.reset(tp)
      assert.strictEqual(router.remembered(), 0)
    }).pipe(Effect.provide(Layer.provideMerge(InMemoryKafka.layerProducer(), InMemoryKafka.layer()))))
})
