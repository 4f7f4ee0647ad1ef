/**
 * A partition's progress when its records finish out of offset order (ordering by key, or none): the position below
 * which every record finished, and the ranges finished above it.
 *
 * Every record covers the offsets from its own up to the next record's (the last record of a fetch, up to where the
 * partition continues after it), so that offsets holding nothing to read (transaction markers, aborted or compacted
 * records) are covered by the record before them, and finished ranges meet without holes.
 *
 * @internal
 */
export type Range = readonly [from: bigint, until: bigint]

/** @internal */
export class Progress {
  private starts: Array<bigint> = []
  private ends: Array<bigint> = []
  private done: Array<boolean> = []
  /** Index of the first range not known to be finished. */
  private head = 0
  /** Where the partition continues after the ranges added so far. */
  private end: bigint
  private skipAt = 0
  /** Indexes handed out stay valid across compactions: they count from the first range ever added. */
  private offsetBase = 0

  /**
   * `position`: where the partition starts; `skip`: ranges above it that an earlier owner finished (sorted, apart).
   */
  constructor(position: bigint, private skip: ReadonlyArray<Range> = []) {
    this.end = position
  }

  /**
   * The partition starts again at `position`, below where it had come: its log was cut back (an unclean leader
   * election) and the offsets from `position` on will hold other records. What was added at or above `position` no
   * longer counts, finished or not: those entries become empty and finished (indexes handed out stay valid, and work
   * still in flight on them moves nothing), a range that reached past `position` ends there, and so do the ranges an
   * earlier owner finished. The next range added starts at `position`.
   */
  rewind(position: bigint): void {
    this.skip = cut(this.skip, position)
    this.skipAt = 0
    if (position >= this.end) return
    for (let i = this.head; i < this.starts.length; i++) {
      if (this.starts[i]! >= position) {
        this.starts[i] = position
        this.ends[i] = position
        this.done[i] = true
      } else if (this.ends[i]! > position) {
        this.ends[i] = position
      }
    }
    this.end = position
    while (this.head < this.done.length && this.done[this.head]) this.head++
  }

  /** Records added and not yet behind the position: what the partition would handle again after a crash, at most. */
  get window(): number {
    return this.starts.length - this.head
  }

  /** Whether an earlier owner finished this offset; such a record is added as finished and not handled again. */
  finishedBefore(offset: bigint): boolean {
    while (this.skipAt < this.skip.length && this.skip[this.skipAt]![1] <= offset) this.skipAt++
    const range = this.skip[this.skipAt]
    return range !== undefined && range[0] <= offset
  }

  /** Whether every range an earlier owner finished lies below `offset`. */
  passed(offset: bigint): boolean {
    const last = this.skip[this.skip.length - 1]
    return last === undefined || last[1] <= offset
  }

  /** Adds the range up to `until` (a record's, or offsets holding nothing to read); returns its index. */
  add(until: bigint, finished: boolean): number {
    const from = this.end
    this.end = until
    if (finished && this.head === this.starts.length) return -1
    if (this.head > 1024 && this.head * 2 > this.starts.length) {
      this.starts = this.starts.slice(this.head)
      this.ends = this.ends.slice(this.head)
      this.done = this.done.slice(this.head)
      this.offsetBase += this.head
      this.head = 0
    }
    this.starts.push(from)
    this.ends.push(until)
    this.done.push(finished)
    return this.starts.length - 1 + this.offsetBase
  }

  /** The offsets the range at `index` covers. */
  rangeOf(index: number): Range {
    const at = index - this.offsetBase
    return [this.starts[at]!, this.ends[at]!]
  }

  /** The range holding `offset` among those not behind the position (a record in flight's), if any. */
  rangeAt(offset: bigint): Range | undefined {
    let low = this.head
    let high = this.starts.length - 1
    while (low <= high) {
      const middle = (low + high) >>> 1
      if (this.starts[middle]! <= offset) low = middle + 1
      else high = middle - 1
    }
    // `high`: the last range starting at or below `offset` (ranges emptied by a rewind cover nothing).
    return high >= this.head && this.ends[high]! > offset ? [this.starts[high]!, this.ends[high]!] : undefined
  }

  /** The range at `index` finished. */
  finish(index: number): void {
    if (index < 0) return
    const at = index - this.offsetBase
    this.done[at] = true
    if (at !== this.head) return
    while (this.head < this.done.length && this.done[this.head]) this.head++
    if (this.head === this.done.length) {
      this.offsetBase += this.head
      this.starts = []
      this.ends = []
      this.done = []
      this.head = 0
    }
  }

  /** The lowest offset not finished, or where the partition continues when every range added finished. */
  position(): bigint {
    return this.head < this.starts.length ? this.starts[this.head]! : this.end
  }

  /** The finished ranges above the position, merged where they meet. */
  finished(): Array<Range> {
    const out: Array<Range> = []
    let i = this.head
    while (i < this.done.length) {
      if (!this.done[i]) {
        i++
        continue
      }
      const from = this.starts[i]!
      while (i < this.done.length && this.done[i]) i++
      // Entries emptied by a rewind cover nothing.
      if (this.ends[i - 1]! > from) out.push([from, this.ends[i - 1]!])
    }
    return out
  }
}

/** Ranges (sorted, apart) below `position`: a range that reaches past it ends there. */
const cut = (ranges: ReadonlyArray<Range>, position: bigint): ReadonlyArray<Range> => {
  const last = ranges[ranges.length - 1]
  if (last === undefined || last[1] <= position) return ranges
  const out: Array<Range> = []
  for (const [from, until] of ranges) {
    if (from >= position) break
    out.push(until > position ? [from, position] : [from, until])
  }
  return out
}

/** What a position's metadata starts with when it carries finished ranges of this library. */
const prefix = "fin1:"

/**
 * Kafka refuses offset metadata longer than the broker's `offset.metadata.max.bytes` (4,096 by default). Finished
 * ranges that do not fit are left out: their records are handled again after a crash, and none is lost.
 *
 * @internal
 */
export const maxMetadata = 4_000

/**
 * Finished ranges above `position` as a compact string: each range as its distance from the end of the one before
 * (from the position for the first) and its length, in base 36. Ranges that would pass `max` characters are left out.
 *
 * @internal
 */
export const encode = (position: bigint, ranges: ReadonlyArray<Range>, max: number = maxMetadata): string => {
  if (ranges.length === 0) return ""
  let out = prefix
  let previous = position
  for (const [from, until] of ranges) {
    const token = `${(from - previous).toString(36)}.${(until - from).toString(36)}`
    const next = out.length === prefix.length ? out + token : `${out},${token}`
    if (next.length > max) break
    out = next
    previous = until
  }
  return out === prefix ? "" : out
}

/**
 * The finished ranges a position's metadata carries; none when the metadata is not this library's or is damaged
 * (then the records are handled again, and none is lost).
 *
 * @internal
 */
export const decode = (position: bigint, metadata: string | null | undefined): ReadonlyArray<Range> => {
  if (metadata === null || metadata === undefined || !metadata.startsWith(prefix)) return []
  const out: Array<Range> = []
  let previous = position
  for (const token of metadata.slice(prefix.length).split(",")) {
    const dot = token.indexOf(".")
    if (dot <= 0 || dot === token.length - 1) return []
    const gap = parse36(token.slice(0, dot))
    const length = parse36(token.slice(dot + 1))
    if (gap === undefined || length === undefined || length <= 0n) return []
    const from = previous + gap
    out.push([from, from + length])
    previous = from + length
  }
  return out
}

const digits = "0123456789abcdefghijklmnopqrstuvwxyz"

const parse36 = (text: string): bigint | undefined => {
  if (text.length === 0 || text.length > 13) return undefined
  let value = 0n
  for (const c of text) {
    const d = digits.indexOf(c)
    if (d < 0) return undefined
    value = value * 36n + BigInt(d)
  }
  return value
}

/**
 * A stored position and the ranges finished above it.
 *
 * @internal
 */
export interface Stored {
  readonly position: bigint | null
  readonly finished: ReadonlyArray<Range>
}

/**
 * What a store keeps after a unit. The position moves to the unit's `next` (never back): every record below it was
 * finished in a unit that committed, or held nothing to read. The ranges a unit of records finished out of order adds
 * are kept with the others; ranges at or below the position are dropped, and the position moves past every range
 * that starts at it.
 *
 * @internal
 */
export const advance = (
  stored: Stored,
  unit: { readonly next: bigint; readonly finished?: ReadonlyArray<Range> | undefined }
): { readonly position: bigint; readonly finished: ReadonlyArray<Range> } => {
  let position = stored.position === null || unit.next > stored.position ? unit.next : stored.position
  const ranges = unit.finished === undefined || unit.finished.length === 0
    ? stored.finished
    : union(stored.finished, unit.finished)
  let at = 0
  while (at < ranges.length && ranges[at]![0] <= position) {
    if (ranges[at]![1] > position) position = ranges[at]![1]
    at++
  }
  return { position, finished: at === 0 ? ranges : ranges.slice(at) }
}

/** Two lists of sorted, apart ranges as one, merged where they meet or overlap. */
const union = (a: ReadonlyArray<Range>, b: ReadonlyArray<Range>): Array<Range> => {
  const all = [...a, ...b].sort((x, y) => (x[0] < y[0] ? -1 : x[0] > y[0] ? 1 : 0))
  const out: Array<Range> = []
  for (const [from, until] of all) {
    const last = out[out.length - 1]
    if (last !== undefined && from <= last[1]) {
      if (until > last[1]) out[out.length - 1] = [last[0], until]
    } else {
      out.push([from, until])
    }
  }
  return out
}
