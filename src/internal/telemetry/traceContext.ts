/**
 * W3C trace context in record headers: the `traceparent` a producer writes, and the links a consumer makes to the
 * spans its records name.
 *
 * @internal
 */
import * as Tracer from "effect/Tracer"
import type { ConsumerRecord } from "../../ConsumerRecord.js"
import type { ProducerRecord } from "../../Producer.js"

/** The W3C `traceparent` of a span: version 00, its trace id, its span id, sampled or not. */
export const traceparent = (span: Tracer.AnySpan): string =>
  `00-${span.traceId}-${span.spanId}-${span.sampled ? "01" : "00"}`

/** Whether the bytes `from` to `to` are lower-case hex digits, and not all zeros. */
const hexDigits = (bytes: Uint8Array, from: number, to: number, zerosAllowed: boolean): boolean => {
  let zeros = true
  for (let i = from; i < to; i++) {
    const b = bytes[i]!
    if (!((b >= 48 && b <= 57) || (b >= 97 && b <= 102))) return false
    if (b !== 48) zeros = false
  }
  return zerosAllowed || !zeros
}

const ascii = (bytes: Uint8Array, from: number, to: number) => String.fromCharCode(...bytes.subarray(from, to))

/** The span a `traceparent` names, if it is well formed (version 00 and up, ids not all zeros). */
export const parseTraceparent = (header: Uint8Array | string): Tracer.ExternalSpan | undefined => {
  const bytes = typeof header === "string" ? new TextEncoder().encode(header) : header
  // 00-<32 hex trace id>-<16 hex span id>-<2 hex flags>
  if (bytes.length < 55 || bytes[2] !== 45 || bytes[35] !== 45 || bytes[52] !== 45) return undefined
  if (!hexDigits(bytes, 0, 2, true) || (bytes[0] === 102 && bytes[1] === 102)) return undefined
  if (!hexDigits(bytes, 3, 35, false) || !hexDigits(bytes, 36, 52, false) || !hexDigits(bytes, 53, 55, true)) {
    return undefined
  }
  // A version 00 header is exactly 55 bytes; a later version may append fields after a dash.
  if (bytes.length > 55 && ((bytes[0] === 48 && bytes[1] === 48) || bytes[55] !== 45)) return undefined
  const flags = Number.parseInt(ascii(bytes, 53, 55), 16)
  return Tracer.externalSpan({ traceId: ascii(bytes, 3, 35), spanId: ascii(bytes, 36, 52), sampled: (flags & 1) === 1 })
}

/** Whether two headers name the same span: the same bytes (span ids first: they differ first). */
const sameBytes = (a: Uint8Array, b: Uint8Array) => {
  if (a === b) return true
  const length = a.length
  if (length !== b.length) return false
  for (let i = length - 1; i >= 0; i--) if (a[i] !== b[i]) return false
  return true
}

/**
 * Links to the spans the records' `traceparent` headers name, one per span, at most `max`. Records sent together
 * name the same span: a header equal to the one before it is not parsed again.
 */
export const linksOf = (records: Iterable<ConsumerRecord>, max = 128): Array<Tracer.SpanLink> => {
  const links: Array<Tracer.SpanLink> = []
  const seen = new Set<string>()
  let previous: Uint8Array | undefined
  for (const record of records) {
    const header = record.headers["traceparent"]
    if (header === undefined || (previous !== undefined && sameBytes(header, previous))) continue
    previous = header
    const span = parseTraceparent(header)
    if (span === undefined || seen.has(span.spanId)) continue
    seen.add(span.spanId)
    links.push({ _tag: "SpanLink", span, attributes: { "messaging.kafka.offset": String(record.offset) } })
    if (links.length >= max) break
  }
  return links
}

/** The records with the span's `traceparent` in their headers, where they do not name one of their own. */
export const withTraceparent = (
  records: ReadonlyArray<ProducerRecord>,
  span: Tracer.AnySpan
): Array<ProducerRecord> => {
  const value = traceparent(span)
  return records.map((record) =>
    record.headers !== undefined && record.headers["traceparent"] !== undefined
      ? record
      : { ...record, headers: { ...record.headers, traceparent: value } }
  )
}
