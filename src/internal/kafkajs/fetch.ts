/**
 * What kafkajs fetched and the runloop has not polled yet, per partition, and where kafkajs fetches next.
 *
 * kafkajs decides its fetch positions itself: it resolves a batch when its `eachBatch` call lets it, moves past
 * batches that filtering emptied (transaction markers, aborted records) without calling `eachBatch`, and resets a
 * partition whose position is out of range to its default offset without telling anyone. This module follows that
 * position (`fetchPosition`) so that every `Records` event says exactly which offsets it accounts for, and so that a
 * jump kafkajs made on its own is either a gap (nothing to read in between) or an `OutOfRange`, never a silent skip.
 */
import * as Effect from "effect/Effect"
import type { Batch, EachBatchPayload } from "kafkajs"
import { DriverError } from "../../KafkaError.js"
import * as TopicPartition from "../../TopicPartition.js"
import { drain } from "./drain.js"
import { describe } from "./errors.js"
import {
  cursor,
  dropEntries,
  type Entry,
  type FetchOptions,
  type Fetcher,
  finish,
  isCurrent,
  makeEntry,
  type Outcome,
  offsetAt,
  park,
  type PartitionState,
  type RecordsEntry,
  release,
  reseek,
  stateOf,
  syncFetching
} from "./partitions.js"

/** How long to wait before asking for a partition's offsets again when the admin request failed. */
const RECHECK_MILLIS = 1000

/**
 * Where kafkajs's fetch of the batch started (consumerGroup.js passes it to `new Batch`); its types leave it out.
 */
const fetchedOffsetOf = (batch: Batch): bigint | undefined => {
  const value: unknown = Reflect.get(batch, "fetchedOffset")
  return typeof value === "string" ? BigInt(value) : undefined
}

const sleep = (millis: number) => new Promise<void>((resolve) => setTimeout(resolve, millis))

/**
 * Asks the cluster whether the fetch position is in the partition's log. kafkajs fetches nothing of the partition
 * meanwhile. `out` queues an `OutOfRange`; `in` leaves the partition suspended for the caller to decide;
 * `superseded` means a seek or a new assignment came first.
 */
const verify = async (f: Fetcher, state: PartitionState): Promise<"in" | "out" | "superseded"> => {
  const epoch = state.epoch
  const position = state.fetchPosition
  if (position === undefined) return "superseded"
  state.suspended = true
  syncFetching(f, state)
  let warned = false
  while (isCurrent(f, state, epoch)) {
    try {
      const { earliest, latest } = await f.options.offsets(state.partition)
      if (!isCurrent(f, state, epoch)) return "superseded"
      if (position >= earliest && position <= latest) return "in"
      if (state.outOfRange) return "out"
      f.options.log("debug", `${state.key}: position ${position} is outside its log (${earliest} to ${latest})`)
      state.suspended = false
      state.outOfRange = true
      syncFetching(f, state)
      f.options.enqueue({ _tag: "OutOfRange", state, position, epoch })
      return "out"
    } catch (error) {
      if (!warned) f.options.log("warning", `could not read the offsets of ${state.key}: ${describe(error)}; retrying`)
      warned = true
      await sleep(RECHECK_MILLIS)
    }
  }
  return "superseded"
}

const resumeAfter = (f: Fetcher, state: PartitionState, reseeking: boolean) => {
  if (reseeking) reseek(f, state)
  state.suspended = false
  syncFetching(f, state)
}

/**
 * Takes a batch kafkajs hands to `eachBatch`, and queues its records for `poll`; `undefined` when there is nothing
 * to hand over (the batch is stale, below the runloop's position, or kafkajs fetched it from where it should not
 * have), in which case the call returns without resolving anything.
 */
const accept = async (f: Fetcher, payload: EachBatchPayload): Promise<RecordsEntry | undefined> => {
  const { batch } = payload
  const state = stateOf(f, batch.topic, batch.partition)
  // A seek is pending in kafkajs, or the partition is not this member's, suspended, or waiting for a seek.
  if (state === undefined || payload.isStale() || state.suspended || state.outOfRange) return undefined
  const expected = state.fetchPosition
  if (expected === undefined || batch.messages.length === 0) return undefined
  const fetched = fetchedOffsetOf(batch) ?? expected
  if (fetched !== expected) {
    // kafkajs fetched from elsewhere than where this adapter left it: further on after batches emptied by filtering
    // that it did not see, or anywhere after a reset it did not notice. The partition's log bounds tell which.
    const epoch = state.epoch
    const verdict = await verify(f, state)
    // Out of range, or a seek or a new assignment decided meanwhile: nothing of this batch is wanted.
    if (verdict !== "in" || !isCurrent(f, state, epoch)) return undefined
    if (fetched < expected) {
      f.options.log(
        "debug",
        `${state.key}: kafkajs fetched from ${fetched}, behind ${expected}; fetching from ${expected}`
      )
      resumeAfter(f, state, true)
      return undefined
    }
    f.options.log("debug", `${state.key}: offsets ${expected} to ${fetched - 1n} hold nothing to read`)
    resumeAfter(f, state, false)
  }
  const messages = batch.messages
  const end = BigInt(batch.lastOffset()) + 1n
  const lastMessageOffset = messages[messages.length - 1]!.offset
  // Offsets only grow within a batch: records below the runloop's position can only be a prefix.
  const position = state.position
  let first = 0
  if (position !== undefined) {
    while (first < messages.length && BigInt(messages[first]!.offset) < position) first++
  }
  if (first === messages.length) {
    payload.resolveOffset(lastMessageOffset)
    state.fetchPosition = end
    return undefined
  }
  const entry = makeEntry(state, first === 0 ? messages : messages.slice(first), expected, end, lastMessageOffset)
  f.options.enqueue(entry)
  if (state.entries.size === 1) release(entry, "ahead")
  return entry
}

/** kafkajs moves past the entry's batch: its next fetch starts at the batch's end. */
const resolved = (f: Fetcher, entry: RecordsEntry, payload: EachBatchPayload) => {
  payload.resolveOffset(entry.lastMessageOffset)
  const state = entry.state
  if (!entry.dropped && f.states.get(state.key) === state && state.moves === entry.moves) {
    state.fetchPosition = entry.end
  }
}

/**
 * kafkajs resolved a batch that filtering emptied (only transaction markers or aborted records) without calling
 * `eachBatch`. It is followed when it starts where kafkajs's position is known to be, and handed to the runloop as
 * an empty `Records` in its place, so that the partition's position passes it (a commit marker that came after its
 * records were fetched would otherwise hold the position back until the next record); otherwise the next batch
 * looks into it.
 */
const emptied = (f: Fetcher, topic: string, partition: number, firstOffset: string | null, lastOffset: string) => {
  const state = stateOf(f, topic, partition)
  if (state === undefined || state.suspended || state.outOfRange || state.fetchPosition === undefined) return
  // With no message at or after the fetch position kafkajs resolves the fetch position itself.
  const first = BigInt(firstOffset ?? lastOffset)
  if (first !== state.fetchPosition) return
  const end = BigInt(lastOffset) + 1n
  state.fetchPosition = end
  const entry = makeEntry(state, [], first, end, lastOffset)
  // No `eachBatch` call waits for it.
  entry.released = true
  f.options.enqueue(entry)
}

/**
 * kafkajs logged that a fetch of the partition answered OFFSET_OUT_OF_RANGE and that it resets the partition to its
 * default offset. The partition stops at once (before kafkajs fetches from there), then the cluster says whether
 * the position this adapter knows is out of range (an `OutOfRange`) or not (kafkajs is put back there).
 */
const resetLogged = (f: Fetcher, topic: string, partition: number) => {
  const state = stateOf(f, topic, partition)
  if (state === undefined) return
  state.reset = true
  // Already waiting for a seek, or being looked into.
  if (state.outOfRange || state.suspended) return
  state.suspended = true
  syncFetching(f, state)
  const epoch = state.epoch
  void verify(f, state).then((verdict) => {
    if (verdict === "in" && isCurrent(f, state, epoch)) resumeAfter(f, state, true)
  })
}

/** Replaces the assignment: every partition waits for the runloop's seek before kafkajs fetches it. */
const assign = (f: Fetcher, partitions: ReadonlyArray<TopicPartition.TopicPartition>) => {
  dropAll(f, "stale")
  f.states.clear()
  for (const partition of partitions) {
    const state: PartitionState = {
      partition,
      key: TopicPartition.key(partition),
      position: undefined,
      fetchPosition: undefined,
      entries: new Set(),
      paused: false,
      held: false,
      fetching: true,
      suspended: false,
      outOfRange: false,
      reset: false,
      epoch: 0,
      moves: 0
    }
    f.states.set(state.key, state)
    syncFetching(f, state, true)
  }
}

/**
 * A rejoin without a new assignment (static membership): kafkajs starts each partition at the group's committed
 * offset again; put it back at the runloop's position.
 */
const restore = (f: Fetcher) => {
  for (const state of f.states.values()) {
    // Its `OutOfRange` stands, after the records kept before it; kafkajs waits for the runloop's seek.
    if (state.outOfRange) {
      syncFetching(f, state, true)
      continue
    }
    dropEntries(f, state, "stale")
    // A look into the previous fetch position no longer applies.
    state.epoch++
    state.suspended = false
    if (state.position !== undefined) {
      state.fetchPosition = state.position
      reseek(f, state)
    }
    syncFetching(f, state, true)
  }
}

/** Whether kafkajs reset the partition since it was last sought: its commit of a default offset follows. */
const wasReset = (f: Fetcher, topic: string, partition: number): boolean => stateOf(f, topic, partition)?.reset === true

const dropAll = (f: Fetcher, outcome: Outcome) => {
  for (const state of f.states.values()) dropEntries(f, state, outcome)
}

const clear = (f: Fetcher, outcome: Outcome) => {
  dropAll(f, outcome)
  f.states.clear()
}

const seek = (f: Fetcher, tp: TopicPartition.TopicPartition, position: bigint): Effect.Effect<void, DriverError> =>
  Effect.suspend(() => {
    const key = TopicPartition.key(tp)
    const state = f.states.get(key)
    // A partition that moved has a Revoked or Lost event queued; there is nothing to position.
    if (state === undefined) return Effect.void
    if (position < 0n) {
      return Effect.fail(new DriverError({ operation: "seek", reason: `negative position ${position} for ${key}` }))
    }
    state.epoch++
    state.position = position
    state.suspended = false
    state.outOfRange = false
    state.reset = false
    // A seek onto the batch in hand keeps it (and kafkajs's position): only the records before the position go.
    const [first] = state.entries
    if (first !== undefined && cursor(first) <= position && position < first.end) {
      while (first.next < first.messages.length && offsetAt(first, first.next) < position) first.next++
      if (first.next >= first.messages.length) finish(f, first, "taken")
      syncFetching(f, state)
      return Effect.void
    }
    dropEntries(f, state, "seek")
    state.fetchPosition = position
    state.moves++
    return Effect.try({
      try: () => f.options.consumer.seek({ topic: tp.topic, partition: tp.partition, offset: position.toString() }),
      catch: (cause) => new DriverError({ operation: "seek", reason: describe(cause), cause })
    }).pipe(Effect.ensuring(Effect.sync(() => syncFetching(f, state))))
  })

/**
 * `hold`: the partition stays paused for a while (a retry topic waiting until its next record is due): kafkajs stops
 * fetching it at once rather than after `PARKED_BATCHES` batches, whose records would only wait longer still, each
 * fetched with a request of its own as they trickle in.
 */
const pause = (f: Fetcher, partitions: ReadonlyArray<TopicPartition.TopicPartition>, hold = false) => {
  for (const tp of partitions) {
    const state = f.states.get(TopicPartition.key(tp))
    if (state === undefined) continue
    state.paused = true
    if (hold) state.held = true
    park(f, state)
  }
}

/** Returns whether records kept while paused are ready now. */
const resume = (f: Fetcher, partitions: ReadonlyArray<TopicPartition.TopicPartition>): boolean => {
  let parked = false
  for (const tp of partitions) {
    const state = f.states.get(TopicPartition.key(tp))
    if (state === undefined || !state.paused) continue
    state.paused = false
    state.held = false
    if (state.entries.size > 0) parked = true
    syncFetching(f, state)
  }
  return parked
}

/**
 * The fetch of one session: what kafkajs fetched and the runloop has not polled yet, per partition, and where kafkajs
 * fetches next.
 *
 * @internal
 */
export const makeFetch = (options: FetchOptions) => {
  const f: Fetcher = { options, states: new Map(), pending: [] }
  return {
    states: f.states,
    finish: (entry: RecordsEntry, outcome: Outcome) => finish(f, entry, outcome),
    accept: (payload: EachBatchPayload) => accept(f, payload),
    resolved: (entry: RecordsEntry, payload: EachBatchPayload) => resolved(f, entry, payload),
    emptied: (topic: string, partition: number, firstOffset: string | null, lastOffset: string) =>
      emptied(f, topic, partition, firstOffset, lastOffset),
    resetLogged: (topic: string, partition: number) => resetLogged(f, topic, partition),
    wasReset: (topic: string, partition: number) => wasReset(f, topic, partition),
    assign: (partitions: ReadonlyArray<TopicPartition.TopicPartition>) => assign(f, partitions),
    restore: () => restore(f),
    dropAll: (outcome: Outcome) => dropAll(f, outcome),
    clear: (outcome: Outcome) => clear(f, outcome),
    seek: (tp: TopicPartition.TopicPartition, position: bigint) => seek(f, tp, position),
    pause: (partitions: ReadonlyArray<TopicPartition.TopicPartition>, hold = false) => pause(f, partitions, hold),
    resume: (partitions: ReadonlyArray<TopicPartition.TopicPartition>) => resume(f, partitions),
    drain: (taken: Iterable<Entry>) => drain(f, taken)
  }
}

/** @internal */
export type Fetch = ReturnType<typeof makeFetch>
