/**
 * An in-memory tracer that keeps every span it makes, and a reader of Effect's metric registry, for tests that check
 * what `Observability.layer` records.
 */
import type * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import type * as Exit from "effect/Exit"
import * as Layer from "effect/Layer"
import * as Metric from "effect/Metric"
import * as MetricState from "effect/MetricState"
import * as Option from "effect/Option"
import * as Tracer from "effect/Tracer"

const hexOf = (length: number) => {
  let out = ""
  for (let i = 0; i < length; i++) out += Math.floor(Math.random() * 16).toString(16)
  return out
}

export class RecordedSpan implements Tracer.Span {
  readonly _tag = "Span"
  readonly spanId = hexOf(16)
  readonly traceId: string
  readonly sampled = true
  status: Tracer.SpanStatus
  readonly attributes = new Map<string, unknown>()
  links: ReadonlyArray<Tracer.SpanLink>
  exit: Exit.Exit<unknown, unknown> | undefined
  constructor(
    readonly name: string,
    readonly parent: Option.Option<Tracer.AnySpan>,
    readonly context: Context.Context<never>,
    links: ReadonlyArray<Tracer.SpanLink>,
    startTime: bigint,
    readonly kind: Tracer.SpanKind
  ) {
    this.traceId = Option.isSome(parent) ? parent.value.traceId : hexOf(32)
    this.status = { _tag: "Started", startTime }
    this.links = links
  }
  end(endTime: bigint, exit: Exit.Exit<unknown, unknown>): void {
    this.status = { _tag: "Ended", startTime: this.status.startTime, endTime, exit }
    this.exit = exit
  }
  attribute(key: string, value: unknown): void {
    this.attributes.set(key, value)
  }
  event(): void {}
  addLinks(links: ReadonlyArray<Tracer.SpanLink>): void {
    this.links = [...this.links, ...links]
  }
  get parentSpanId(): string | undefined {
    return Option.isSome(this.parent) ? this.parent.value.spanId : undefined
  }
}

/** A tracer keeping its spans in `spans`, and the layer that makes it the program's tracer. */
export const recordingTracer = () => {
  const spans: Array<RecordedSpan> = []
  const tracer = Tracer.make({
    span: (name, parent, context, links, startTime, kind) => {
      const span = new RecordedSpan(name, parent, context, links, startTime, kind)
      spans.push(span)
      return span
    },
    context: (f) => f()
  })
  return { spans, layer: Layer.setTracer(tracer) }
}

/**
 * A metric's value summed over its series whose labels include `labels`: a counter's count, a gauge's value, a
 * histogram's count of observations. 0 when no series matches.
 */
export const metricValue = (name: string, labels: Readonly<Record<string, string>> = {}) =>
  Effect.map(Metric.snapshot, (pairs) => {
    let total = 0
    for (const pair of pairs) {
      if (pair.metricKey.name !== name) continue
      const tags = new Map(pair.metricKey.tags.map((tag) => [tag.key, tag.value]))
      if (!Object.entries(labels).every(([key, value]) => tags.get(key) === value)) continue
      const state = pair.metricState
      if (MetricState.isCounterState(state)) total += Number(state.count)
      else if (MetricState.isGaugeState(state)) total += Number(state.value)
      else if (MetricState.isHistogramState(state)) total += state.count
    }
    return total
  })

/** The sum of a histogram's observations over its series whose labels include `labels`. */
export const histogramSum = (name: string, labels: Readonly<Record<string, string>> = {}) =>
  Effect.map(Metric.snapshot, (pairs) => {
    let total = 0
    for (const pair of pairs) {
      if (pair.metricKey.name !== name || !MetricState.isHistogramState(pair.metricState)) continue
      const tags = new Map(pair.metricKey.tags.map((tag) => [tag.key, tag.value]))
      if (Object.entries(labels).every(([key, value]) => tags.get(key) === value)) total += pair.metricState.sum
    }
    return total
  })
