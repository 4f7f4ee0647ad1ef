/**
 * The telemetry's parts on their own: label sets made once, trace context written into records, and what a consumer's
 * telemetry keeps of its partitions' positions and its member ids, with metrics and spans off.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as MetricLabel from "effect/MetricLabel"
import * as Stream from "effect/Stream"
import * as Tracer from "effect/Tracer"
import type { DriverSession } from "../src/Driver.js"
import { CommitFailed } from "../src/KafkaError.js"
import * as OffsetBatch from "../src/OffsetBatch.js"
import type { LagSnapshot } from "../src/Observability.js"
import { makeConsumer } from "../src/internal/telemetry/consumer.js"
import { errorType, LabelSet, type Settings } from "../src/internal/telemetry/labels.js"
import { parseTraceparent, traceparent, withTraceparent } from "../src/internal/telemetry/traceContext.js"

const traceId = "4bf92f3577b34da6a3ce929d0e0e4736"
const spanId = "00f067aa0ba902b7"

describe("label sets", () => {
  it("the labels with an error type are made once per type", () => {
    const set = new LabelSet([MetricLabel.make("a", "1")])
    const refused = set.failed("Refused")
    assert.strictEqual(set.failed("Refused"), refused)
    assert.notStrictEqual(set.failed("Timeout"), refused)
    assert.deepStrictEqual(refused.map((l) => [l.key, l.value]), [["a", "1"], ["error.type", "Refused"]])
  })

  it("a failure's type: its tag, else its class, else what it is", () => {
    class Mine {}
    assert.strictEqual(errorType({ _tag: "Tagged" }), "Tagged")
    assert.strictEqual(errorType(new Mine()), "Mine")
    assert.strictEqual(errorType(new RangeError("x")), "RangeError")
    assert.strictEqual(errorType({ plain: true }), "object")
    assert.strictEqual(errorType("text"), "string")
    assert.strictEqual(errorType(null), "object")
  })
})

describe("trace context in records", () => {
  const span = Tracer.externalSpan({ traceId, spanId, sampled: true })

  it("a span's traceparent names it again", () => {
    assert.strictEqual(traceparent(span), `00-${traceId}-${spanId}-01`)
    const parsed = parseTraceparent(traceparent(span))
    assert.deepStrictEqual([parsed?.traceId, parsed?.spanId, parsed?.sampled], [traceId, spanId, true])
    assert.strictEqual(traceparent(Tracer.externalSpan({ traceId, spanId, sampled: false })).slice(-2), "00")
  })

  it("records get the span's traceparent unless they name one of their own", () => {
    const own = `00-${traceId}-${"1".repeat(16)}-00`
    const [plain, kept, withHeaders] = withTraceparent([
      { topic: "t", value: "a" },
      { topic: "t", value: "b", headers: { traceparent: own } },
      { topic: "t", value: "c", headers: { other: "x" } }
    ], span)
    assert.strictEqual(plain!.headers!["traceparent"], traceparent(span))
    assert.strictEqual(kept!.headers!["traceparent"], own)
    assert.deepStrictEqual(withHeaders!.headers, { other: "x", traceparent: traceparent(span) })
  })
})

/** Settings with nothing recorded; `reports` gets what the consumer's telemetry reports. */
const quiet = (reports: Array<LagSnapshot>): Settings => ({
  metrics: false,
  spans: false,
  traceContext: false,
  lagInterval: Duration.seconds(5),
  lag: Stream.empty,
  report: (snapshot) =>
    Effect.sync(() => {
      reports.push(snapshot)
    })
})

/** A session whose commits succeed or fail as `refuse` says. */
const sessionOf = (refuse: () => boolean): DriverSession => ({
  memberId: "m",
  poll: Effect.succeed([]),
  commit: () => refuse() ? Effect.fail(new CommitFailed({ reason: "NotOwned", partitions: [] })) : Effect.void,
  committed: () => Effect.succeed(new Map()),
  committedWithMetadata: () => Effect.succeed(new Map()),
  offsets: () => Effect.succeed(new Map()),
  seek: () => Effect.void,
  pause: () => Effect.void,
  resume: () => Effect.void
})

describe("a consumer's telemetry", () => {
  const tp = { topic: "t", partition: 0 }

  it.effect("a partition's position starts where it is told, and moves only forward, by units and commits", () =>
    Effect.gen(function*() {
      const clock = yield* Effect.clock
      const telemetry = makeConsumer(quiet([]), "g", clock)
      telemetry.started(tp, 10n)
      assert.strictEqual(telemetry.positions.get("t-0"), 10n)
      yield* telemetry.unit("store", tp, 15n, Effect.void)
      assert.strictEqual(telemetry.positions.get("t-0"), 15n)
      yield* telemetry.unit("store", tp, 12n, Effect.void)
      assert.strictEqual(telemetry.positions.get("t-0"), 15n)
      yield* Effect.flip(telemetry.unit("store", tp, 30n, Effect.fail("refused")))
      assert.strictEqual(telemetry.positions.get("t-0"), 15n)
      let refuse = true
      const session = telemetry.session(sessionOf(() => refuse))
      yield* Effect.flip(session.commit(OffsetBatch.of(tp, 20n)))
      assert.strictEqual(telemetry.positions.get("t-0"), 15n)
      refuse = false
      yield* session.commit(OffsetBatch.of(tp, 20n))
      assert.strictEqual(telemetry.positions.get("t-0"), 20n)
      assert.strictEqual(session.memberId, "m")
      telemetry.forget(tp)
      assert.isFalse(telemetry.positions.has("t-0"))
    }))

  it.effect("a partition's labels and attributes are made once", () =>
    Effect.gen(function*() {
      const telemetry = makeConsumer(quiet([]), "g", yield* Effect.clock)
      const first = telemetry.partition(tp)
      assert.strictEqual(telemetry.partition({ topic: "t", partition: 0 }), first)
      assert.strictEqual(first.attributes["messaging.consumer.group.name"], "g")
      assert.strictEqual(first.attributes["messaging.destination.partition.id"], "0")
    }))

  it.effect("a member id the session left behind is reported as owning nothing, before the new one", () =>
    Effect.gen(function*() {
      const reports: Array<LagSnapshot> = []
      const telemetry = makeConsumer(quiet(reports), "g", yield* Effect.clock)
      const lag = { topic: "t", partition: 0, position: 1n, latest: 2n, lag: 1n }
      yield* telemetry.settings.report({ groupId: "g", memberId: "a", at: 1, partitions: [lag] })
      yield* telemetry.settings.report({ groupId: "g", memberId: "a", at: 2, partitions: [lag] })
      yield* telemetry.settings.report({ groupId: "g", memberId: "b", at: 3, partitions: [lag] })
      assert.deepStrictEqual(
        reports.map((r) => [r.memberId, r.at, r.partitions.length]),
        [["a", 1, 1], ["a", 2, 1], ["a", 3, 0], ["b", 3, 1]]
      )
    }))
})
