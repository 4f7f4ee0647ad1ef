/**
 * The route's circuit: it opens when `maxInARow` records in a row, in offset order, were routed. A partition read in
 * order counts them as a streak above the highest record handled; a partition whose records finish out of order, by
 * the ranges of the records it routed.
 *
 * @internal
 */

/** Where a record's range lies, for a partition whose records finish out of order (see `Progress`). */
export type Locate = (offset: bigint) => readonly [from: bigint, until: bigint] | undefined

/** What the circuit knows of one partition's failures in a row. */
export interface Row {
  /**
   * A partition read in order: the highest offset handled, and the records routed above it: the failures in a row,
   * in offset order.
   */
  handledUpTo: bigint
  streak: Array<bigint>
  /**
   * A partition whose records finish out of order: the ranges of the records it routed, by where they start and by
   * where they end. Records in a row are those whose ranges meet: consecutive records of the partition, whatever the
   * order they failed in. A record not finished, or handled, between two routed ones breaks the row.
   */
  readonly routedFrom: Map<bigint, bigint>
  readonly routedUntil: Map<bigint, bigint>
}

/** A partition with no failure yet. */
export const emptyRow = (): Row => ({ handledUpTo: -1n, streak: [], routedFrom: new Map(), routedUntil: new Map() })

/**
 * How many records in a row, in offset order, a record of range `range` would make with the routed records whose
 * ranges meet it on either side; counted up to `most`.
 */
export const inARow = (state: Row, range: readonly [bigint, bigint], most: number): number => {
  let row = 1
  for (let at = state.routedUntil.get(range[0]); at !== undefined && row < most; at = state.routedUntil.get(at)) row++
  for (let at = state.routedFrom.get(range[1]); at !== undefined && row < most; at = state.routedFrom.get(at)) row++
  return row
}

/**
 * How many records in a row the record at `offset` makes, itself included, should it be routed (counted up to
 * `most`); 0 when it does not count (`counts` false, or it is in the row already). `range` is where it lies in a
 * partition whose records finish out of order.
 */
export const rowOf = (
  state: Row,
  offset: bigint,
  range: readonly [bigint, bigint] | undefined,
  counts: boolean,
  most: number
): number => {
  if (range !== undefined) {
    // Out of order: the routed records whose ranges meet this one's, on both sides.
    return counts && !state.routedFrom.has(range[0]) ? inARow(state, range, most) : 0
  }
  // In order, with no record handled after it.
  return counts && offset > state.handledUpTo && !state.streak.includes(offset) ? state.streak.length + 1 : 0
}

/** The record at `offset` (of range `range`, out of order) was routed, making a row of `row` records. */
export const routed = (state: Row, offset: bigint, range: readonly [bigint, bigint] | undefined, row: number) => {
  if (row > 0 && range !== undefined) {
    state.routedFrom.set(range[0], range[1])
    state.routedUntil.set(range[1], range[0])
  } else if (row > 0) {
    state.streak.push(offset)
  }
}

/** Records up to `upTo` were handled: failures below them are no longer in a row. */
export const handled = (state: Row, upTo: bigint) => {
  if (upTo <= state.handledUpTo) return
  state.handledUpTo = upTo
  if (state.streak.length > 0) state.streak = state.streak.filter((offset) => offset > upTo)
}

/** The partition's position passed `position`: the ranges of the records routed below it go. */
export const passed = (state: Row, position: bigint) => {
  if (state.routedFrom.size === 0) return
  for (const [from, until] of state.routedFrom) {
    if (until > position) continue
    state.routedFrom.delete(from)
    state.routedUntil.delete(until)
  }
}
