/**
 * What the fetch of a session keeps per partition (`PartitionState`), the batches kafkajs handed over and the runloop
 * has not all polled yet (`RecordsEntry`), and the steps every part of the fetch takes on them: letting a batch call
 * go, finishing a batch, telling kafkajs to fetch a partition or not, and pointing kafkajs back at a position.
 */
import type { Consumer, KafkaMessage } from "kafkajs"
import type { DriverEvent, PartitionOffsets } from "../../Driver.js"
import * as TopicPartition from "../../TopicPartition.js"
import { describe } from "./errors.js"
import { fetchesIn, partitionPhase } from "./states.js"

/**
 * Why an `eachBatch` call stopped waiting for the runloop:
 * - `taken`: `poll` returned all its records
 * - `ahead`: the partition's earlier batches were all returned; the records are kept until `poll` returns them, and
 *   kafkajs advances past the whole batch and fetches the next one meanwhile
 * - `seek`/`stale`: the records are no longer wanted (a seek, or a new generation); kafkajs must not advance
 * - `pause`: the partition was paused; the records not yet returned are kept (handed out first on resume), so
 *   kafkajs advances past the whole batch and fetches nothing of it again
 * - `revoke`: the group is rebalancing; the records go to the next owner
 * - `close`: the session is closing
 *
 * @internal
 */
export type Outcome = "taken" | "ahead" | "seek" | "stale" | "pause" | "revoke" | "close"

/** @internal */
export interface RecordsEntry {
  readonly _tag: "Records"
  readonly state: PartitionState
  /**
   * kafkajs's messages, from the first at or after the runloop's position. Each becomes a record when `poll` returns
   * it, not before: kafkajs fetches the next batch only once every batch call of its last fetch returned.
   */
  readonly messages: ReadonlyArray<KafkaMessage>
  /** The offsets the batch accounts for: `[start, end)` holds nothing readable besides `messages`. */
  readonly start: bigint
  readonly end: bigint
  /** kafkajs's offset of the batch's last readable message: resolving it resolves the whole batch (to `end`). */
  readonly lastMessageOffset: string
  /** Index of the next record to hand out; records before it were returned by `poll` or skipped by a seek. */
  next: number
  /** The `eachBatch` call was told its outcome (and may have returned). A paused entry's records still wait. */
  released: boolean
  /** All records were returned, or they are no longer wanted. */
  done: boolean
  /** The records are no longer wanted: kafkajs must not move past them. */
  dropped: boolean
  /** `PartitionState.moves` when the batch was handed over. */
  readonly moves: number
  readonly release: (outcome: Outcome) => void
  readonly outcome: Promise<Outcome>
}

/** @internal */
export interface OutOfRangeEntry {
  readonly _tag: "OutOfRange"
  readonly state: PartitionState
  readonly position: bigint
  readonly epoch: number
}

/** @internal */
export type Entry =
  | RecordsEntry
  | OutOfRangeEntry
  | { readonly _tag: "Control"; readonly event: DriverEvent }
  | { readonly _tag: "Wake" }

/** @internal */
export interface PartitionState {
  readonly partition: TopicPartition.TopicPartition
  readonly key: string
  /** The runloop's position: where it sought, or the `next` of the last `Records` returned. */
  position: bigint | undefined
  /** Where kafkajs's next fetch of the partition starts, as far as this adapter sent or followed it. */
  fetchPosition: bigint | undefined
  /** Batches handed over and not yet all returned, in fetch order. */
  readonly entries: Set<RecordsEntry>
  /** The runloop paused the partition: `poll` returns none of its records. */
  paused: boolean
  /** Paused for a while (`pause` with `hold`): kafkajs fetches nothing ahead for it. */
  held: boolean
  /** What kafkajs was last told: fetch the partition or not. */
  fetching: boolean
  /** kafkajs reset the partition or fetched it from elsewhere: nothing is fetched until that is looked into. */
  suspended: boolean
  /** An `OutOfRange` was queued: nothing is fetched until the runloop seeks. */
  outOfRange: boolean
  /** kafkajs logged that it resets the partition (and commits its default offset) since the last seek. */
  reset: boolean
  /** Counts seeks, so that what was decided before one is not applied after it. */
  epoch: number
  /**
   * Counts the seeks this adapter made kafkajs do: a batch resolved after one does not move kafkajs's position,
   * which the pending seek sets at its next fetch.
   */
  moves: number
}

/** @internal */
export interface FetchOptions {
  readonly consumer: Pick<Consumer, "pause" | "resume" | "seek">
  readonly enqueue: (entry: Entry) => void
  /** The partition's earliest offset and its high watermark, from the cluster: a position in between is in range. */
  readonly offsets: (
    partition: TopicPartition.TopicPartition
  ) => Promise<Pick<PartitionOffsets, "earliest" | "latest">>
  readonly log: (level: "debug" | "info" | "warning", message: string) => void
  readonly maxPollRecords: number
  readonly isClosed: () => boolean
}

/**
 * What the steps of a session's fetch share: its options, the state of each partition it was assigned, and what
 * `poll` took from the queue and has not handed out yet.
 *
 * @internal
 */
export interface Fetcher {
  readonly options: FetchOptions
  readonly states: Map<string, PartitionState>
  /** Entries taken from the queue by `poll` and not yet done, in fetch order. */
  pending: Array<Entry>
}

/** @internal */
export const offsetAt = (entry: RecordsEntry, index: number): bigint => BigInt(entry.messages[index]!.offset)

/** Where the entry's records not yet returned are accounted from. @internal */
export const cursor = (entry: RecordsEntry): bigint =>
  entry.next === 0 ? entry.start : offsetAt(entry, entry.next - 1) + 1n

/** @internal */
export const stateOf = (f: Fetcher, topic: string, partition: number): PartitionState | undefined =>
  f.states.get(TopicPartition.key(TopicPartition.make(topic, partition)))

/** @internal */
export const release = (entry: RecordsEntry, outcome: Outcome) => {
  if (entry.released) return
  entry.released = true
  entry.release(outcome)
}

/**
 * The partition's oldest batch, once every batch before it was returned, lets its call go: kafkajs fetches the next
 * batch while the runloop reads this one, instead of after. A partition keeps at most two batches: the one read and
 * the next, whose call waits until the one read is all returned (kafkajs fetches nothing meanwhile).
 */
const readAhead = (f: Fetcher, state: PartitionState) => {
  const [first] = state.entries
  if (first !== undefined && f.states.get(state.key) === state) release(first, "ahead")
}

/**
 * The entry's records are all returned, or no longer wanted; its call (if still waiting) learns why.
 *
 * @internal
 */
export const finish = (f: Fetcher, entry: RecordsEntry, outcome: Outcome) => {
  entry.done = true
  if (outcome !== "taken" && outcome !== "pause") entry.dropped = true
  entry.state.entries.delete(entry)
  release(entry, outcome)
  if (outcome === "taken") readAhead(f, entry.state)
}

/** @internal */
export const dropEntries = (f: Fetcher, state: PartitionState, outcome: Outcome) => {
  for (const entry of Array.from(state.entries)) finish(f, entry, outcome)
}

/**
 * Tells kafkajs to fetch the partition or not, once per change. It fetches a partition only once the runloop sought
 * it (so that the group's committed offset, kafkajs's own start, is never fetched behind the runloop's back), and
 * not while it is suspended, out of range, held, or paused with `PARKED_BATCHES` batches kept (the phases of
 * `partitionPhase` other than Fetching and Parking).
 *
 * @internal
 */
export const syncFetching = (f: Fetcher, state: PartitionState, force = false) => {
  const wanted = fetchesIn(partitionPhase(state))
  if (!force && wanted === state.fetching) return
  state.fetching = wanted
  const partitions = [{ topic: state.partition.topic, partitions: [state.partition.partition] }]
  try {
    if (wanted) f.options.consumer.resume(partitions)
    else f.options.consumer.pause(partitions)
  } catch (error) {
    f.options.log("warning", `${wanted ? "resume" : "pause"} of ${state.key} not applied: ${describe(error)}`)
  }
}

/**
 * Points kafkajs's fetch position back at this adapter's: kafkajs moved it on its own.
 *
 * @internal
 */
export const reseek = (f: Fetcher, state: PartitionState) => {
  if (state.fetchPosition === undefined) return
  state.moves++
  try {
    f.options.consumer.seek({ ...state.partition, offset: state.fetchPosition.toString() })
  } catch (error) {
    f.options.log("warning", `seek of ${state.key} to ${state.fetchPosition} not applied: ${describe(error)}`)
  }
}

/** @internal */
export const isCurrent = (f: Fetcher, state: PartitionState, epoch: number) =>
  f.states.get(state.key) === state && state.epoch === epoch && !f.options.isClosed()

/** @internal */
export const makeEntry = (
  state: PartitionState,
  messages: ReadonlyArray<KafkaMessage>,
  start: bigint,
  end: bigint,
  lastMessageOffset: string
): RecordsEntry => {
  let resolve: (outcome: Outcome) => void = () => {}
  const outcome = new Promise<Outcome>((r) => {
    resolve = r
  })
  const entry: RecordsEntry = {
    _tag: "Records",
    state,
    messages,
    start,
    end,
    lastMessageOffset,
    next: 0,
    released: false,
    done: false,
    dropped: false,
    moves: state.moves,
    release: resolve,
    outcome
  }
  state.entries.add(entry)
  return entry
}

/**
 * A paused partition lets its batch calls go (kafkajs would otherwise hold every other partition's next fetch
 * behind them) but keeps their records: they are returned first once the partition resumes. Once it keeps
 * `PARKED_BATCHES` batches, kafkajs stops fetching it.
 *
 * @internal
 */
export const park = (f: Fetcher, state: PartitionState) => {
  for (const entry of state.entries) release(entry, "pause")
  syncFetching(f, state)
}
