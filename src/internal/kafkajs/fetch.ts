/**
 * What kafkajs fetched and the runloop has not polled yet, per partition, and where kafkajs fetches next.
 *
 * kafkajs decides its fetch positions itself: it resolves a batch when its `eachBatch` call lets it, moves past
 * batches that filtering emptied (transaction markers, aborted records) without calling `eachBatch`, and resets a
 * partition whose position is out of range to its default offset without telling anyone. This module follows that
 * position (`fetchPosition`) so that every `Records` event says exactly which offsets it accounts for, and so that a
 * jump kafkajs made on its own is either a gap (nothing to read in between) or an `OutOfRange`, never a silent skip.
 */
import * as Chunk from "effect/Chunk"
import * as Effect from "effect/Effect"
import type { Batch, Consumer, EachBatchPayload, KafkaMessage } from "kafkajs"
import type { ConsumerRecord } from "../../ConsumerRecord.js"
import type { DriverEvent, PartitionOffsets } from "../../Driver.js"
import { DriverError } from "../../KafkaError.js"
import * as TopicPartition from "../../TopicPartition.js"
import { describe, toConsumerRecord } from "./driver.js"

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

/**
 * A paused partition keeps up to this many fetched batches before kafkajs is told to stop fetching it. Pausing
 * kafkajs at once would be costly: once every partition is paused, its fetch loop sleeps `maxWaitTime` before it
 * looks again, even if a partition resumes a millisecond later.
 */
const PARKED_BATCHES = 2

/** How long to wait before asking for a partition's offsets again when the admin request failed. */
const RECHECK_MILLIS = 1000

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
 * Where kafkajs's fetch of the batch started (consumerGroup.js passes it to `new Batch`); its types leave it out.
 */
const fetchedOffsetOf = (batch: Batch): bigint | undefined => {
  const value: unknown = Reflect.get(batch, "fetchedOffset")
  return typeof value === "string" ? BigInt(value) : undefined
}

const sleep = (millis: number) => new Promise<void>((resolve) => setTimeout(resolve, millis))

const offsetAt = (entry: RecordsEntry, index: number): bigint => BigInt(entry.messages[index]!.offset)

/** Where the entry's records not yet returned are accounted from. */
const cursor = (entry: RecordsEntry): bigint => entry.next === 0 ? entry.start : offsetAt(entry, entry.next - 1) + 1n

/** @internal */
export const makeFetch = (options: FetchOptions) => {
  const { consumer, enqueue, log } = options
  const states = new Map<string, PartitionState>()
  /** Entries taken from the queue by `poll` and not yet done, in fetch order. */
  let pending: Array<Entry> = []

  const stateOf = (topic: string, partition: number) =>
    states.get(TopicPartition.key(TopicPartition.make(topic, partition)))

  const release = (entry: RecordsEntry, outcome: Outcome) => {
    if (entry.released) return
    entry.released = true
    entry.release(outcome)
  }

  /**
   * The partition's oldest batch, once every batch before it was returned, lets its call go: kafkajs fetches the next
   * batch while the runloop reads this one, instead of after. A partition keeps at most two batches: the one read and
   * the next, whose call waits until the one read is all returned (kafkajs fetches nothing meanwhile).
   */
  const readAhead = (state: PartitionState) => {
    const [first] = state.entries
    if (first !== undefined && states.get(state.key) === state) release(first, "ahead")
  }

  /** The entry's records are all returned, or no longer wanted; its call (if still waiting) learns why. */
  const finish = (entry: RecordsEntry, outcome: Outcome) => {
    entry.done = true
    if (outcome !== "taken" && outcome !== "pause") entry.dropped = true
    entry.state.entries.delete(entry)
    release(entry, outcome)
    if (outcome === "taken") readAhead(entry.state)
  }

  const dropEntries = (state: PartitionState, outcome: Outcome) => {
    for (const entry of Array.from(state.entries)) finish(entry, outcome)
  }

  /**
   * Tells kafkajs to fetch the partition or not, once per change. It fetches a partition only once the runloop sought
   * it (so that the group's committed offset, kafkajs's own start, is never fetched behind the runloop's back), and
   * not while it is suspended, out of range, held, or paused with `PARKED_BATCHES` batches kept.
   */
  const syncFetching = (state: PartitionState, force = false) => {
    const wanted = state.position !== undefined && !state.suspended && !state.outOfRange &&
      !(state.paused && (state.held || state.entries.size >= PARKED_BATCHES))
    if (!force && wanted === state.fetching) return
    state.fetching = wanted
    const partitions = [{ topic: state.partition.topic, partitions: [state.partition.partition] }]
    try {
      if (wanted) consumer.resume(partitions)
      else consumer.pause(partitions)
    } catch (error) {
      log("warning", `${wanted ? "resume" : "pause"} of ${state.key} not applied: ${describe(error)}`)
    }
  }

  /** Points kafkajs's fetch position back at this adapter's: kafkajs moved it on its own. */
  const reseek = (state: PartitionState) => {
    if (state.fetchPosition === undefined) return
    state.moves++
    try {
      consumer.seek({ ...state.partition, offset: state.fetchPosition.toString() })
    } catch (error) {
      log("warning", `seek of ${state.key} to ${state.fetchPosition} not applied: ${describe(error)}`)
    }
  }

  const isCurrent = (state: PartitionState, epoch: number) =>
    states.get(state.key) === state && state.epoch === epoch && !options.isClosed()

  /**
   * Asks the cluster whether the fetch position is in the partition's log. kafkajs fetches nothing of the partition
   * meanwhile. `out` queues an `OutOfRange`; `in` leaves the partition suspended for the caller to decide;
   * `superseded` means a seek or a new assignment came first.
   */
  const verify = async (state: PartitionState): Promise<"in" | "out" | "superseded"> => {
    const epoch = state.epoch
    const position = state.fetchPosition
    if (position === undefined) return "superseded"
    state.suspended = true
    syncFetching(state)
    let warned = false
    while (isCurrent(state, epoch)) {
      try {
        const { earliest, latest } = await options.offsets(state.partition)
        if (!isCurrent(state, epoch)) return "superseded"
        if (position >= earliest && position <= latest) return "in"
        if (state.outOfRange) return "out"
        log("debug", `${state.key}: position ${position} is outside its log (${earliest} to ${latest})`)
        state.suspended = false
        state.outOfRange = true
        syncFetching(state)
        enqueue({ _tag: "OutOfRange", state, position, epoch })
        return "out"
      } catch (error) {
        if (!warned) log("warning", `could not read the offsets of ${state.key}: ${describe(error)}; retrying`)
        warned = true
        await sleep(RECHECK_MILLIS)
      }
    }
    return "superseded"
  }

  const resumeAfter = (state: PartitionState, reseeking: boolean) => {
    if (reseeking) reseek(state)
    state.suspended = false
    syncFetching(state)
  }

  const makeEntry = (
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
   * Takes a batch kafkajs hands to `eachBatch`, and queues its records for `poll`; `undefined` when there is nothing
   * to hand over (the batch is stale, below the runloop's position, or kafkajs fetched it from where it should not
   * have), in which case the call returns without resolving anything.
   */
  const accept = async (payload: EachBatchPayload): Promise<RecordsEntry | undefined> => {
    const { batch } = payload
    const state = stateOf(batch.topic, batch.partition)
    // A seek is pending in kafkajs, or the partition is not this member's, suspended, or waiting for a seek.
    if (state === undefined || payload.isStale() || state.suspended || state.outOfRange) return undefined
    const expected = state.fetchPosition
    if (expected === undefined || batch.messages.length === 0) return undefined
    const fetched = fetchedOffsetOf(batch) ?? expected
    if (fetched !== expected) {
      // kafkajs fetched from elsewhere than where this adapter left it: further on after batches emptied by filtering
      // that it did not see, or anywhere after a reset it did not notice. The partition's log bounds tell which.
      const epoch = state.epoch
      const verdict = await verify(state)
      // Out of range, or a seek or a new assignment decided meanwhile: nothing of this batch is wanted.
      if (verdict !== "in" || !isCurrent(state, epoch)) return undefined
      if (fetched < expected) {
        log("debug", `${state.key}: kafkajs fetched from ${fetched}, behind ${expected}; fetching from ${expected}`)
        resumeAfter(state, true)
        return undefined
      }
      log("debug", `${state.key}: offsets ${expected} to ${fetched - 1n} hold nothing to read`)
      resumeAfter(state, false)
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
    enqueue(entry)
    if (state.entries.size === 1) release(entry, "ahead")
    return entry
  }

  /** kafkajs moves past the entry's batch: its next fetch starts at the batch's end. */
  const resolved = (entry: RecordsEntry, payload: EachBatchPayload) => {
    payload.resolveOffset(entry.lastMessageOffset)
    const state = entry.state
    if (!entry.dropped && states.get(state.key) === state && state.moves === entry.moves) {
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
  const emptied = (topic: string, partition: number, firstOffset: string | null, lastOffset: string) => {
    const state = stateOf(topic, partition)
    if (state === undefined || state.suspended || state.outOfRange || state.fetchPosition === undefined) return
    // With no message at or after the fetch position kafkajs resolves the fetch position itself.
    const first = BigInt(firstOffset ?? lastOffset)
    if (first !== state.fetchPosition) return
    const end = BigInt(lastOffset) + 1n
    state.fetchPosition = end
    const entry = makeEntry(state, [], first, end, lastOffset)
    // No `eachBatch` call waits for it.
    entry.released = true
    enqueue(entry)
  }

  /**
   * kafkajs logged that a fetch of the partition answered OFFSET_OUT_OF_RANGE and that it resets the partition to its
   * default offset. The partition stops at once (before kafkajs fetches from there), then the cluster says whether
   * the position this adapter knows is out of range (an `OutOfRange`) or not (kafkajs is put back there).
   */
  const resetLogged = (topic: string, partition: number) => {
    const state = stateOf(topic, partition)
    if (state === undefined) return
    state.reset = true
    // Already waiting for a seek, or being looked into.
    if (state.outOfRange || state.suspended) return
    state.suspended = true
    syncFetching(state)
    const epoch = state.epoch
    void verify(state).then((verdict) => {
      if (verdict === "in" && isCurrent(state, epoch)) resumeAfter(state, true)
    })
  }

  /** Replaces the assignment: every partition waits for the runloop's seek before kafkajs fetches it. */
  const assign = (partitions: ReadonlyArray<TopicPartition.TopicPartition>) => {
    dropAll("stale")
    states.clear()
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
      states.set(state.key, state)
      syncFetching(state, true)
    }
  }

  /**
   * A rejoin without a new assignment (static membership): kafkajs starts each partition at the group's committed
   * offset again; put it back at the runloop's position.
   */
  const restore = () => {
    for (const state of states.values()) {
      // Its `OutOfRange` stands, after the records kept before it; kafkajs waits for the runloop's seek.
      if (state.outOfRange) {
        syncFetching(state, true)
        continue
      }
      dropEntries(state, "stale")
      // A look into the previous fetch position no longer applies.
      state.epoch++
      state.suspended = false
      if (state.position !== undefined) {
        state.fetchPosition = state.position
        reseek(state)
      }
      syncFetching(state, true)
    }
  }

  /** Whether kafkajs reset the partition since it was last sought: its commit of a default offset follows. */
  const wasReset = (topic: string, partition: number): boolean => stateOf(topic, partition)?.reset === true

  const dropAll = (outcome: Outcome) => {
    for (const state of states.values()) dropEntries(state, outcome)
  }

  const clear = (outcome: Outcome) => {
    dropAll(outcome)
    states.clear()
  }

  const seek = (tp: TopicPartition.TopicPartition, position: bigint): Effect.Effect<void, DriverError> =>
    Effect.suspend(() => {
      const key = TopicPartition.key(tp)
      const state = states.get(key)
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
        if (first.next >= first.messages.length) finish(first, "taken")
        syncFetching(state)
        return Effect.void
      }
      dropEntries(state, "seek")
      state.fetchPosition = position
      state.moves++
      return Effect.try({
        try: () => consumer.seek({ topic: tp.topic, partition: tp.partition, offset: position.toString() }),
        catch: (cause) =>
          new DriverError({ operation: "seek", reason: describe(cause), cause })
      }).pipe(Effect.ensuring(Effect.sync(() => syncFetching(state))))
    })

  /**
   * A paused partition lets its batch calls go (kafkajs would otherwise hold every other partition's next fetch
   * behind them) but keeps their records: they are returned first once the partition resumes. Once it keeps
   * `PARKED_BATCHES` batches, kafkajs stops fetching it.
   */
  const park = (state: PartitionState) => {
    for (const entry of state.entries) release(entry, "pause")
    syncFetching(state)
  }

  /**
   * `hold`: the partition stays paused for a while (a retry topic waiting until its next record is due): kafkajs stops
   * fetching it at once rather than after `PARKED_BATCHES` batches, whose records would only wait longer still, each
   * fetched with a request of its own as they trickle in.
   */
  const pause = (partitions: ReadonlyArray<TopicPartition.TopicPartition>, hold = false) => {
    for (const tp of partitions) {
      const state = states.get(TopicPartition.key(tp))
      if (state === undefined) continue
      state.paused = true
      if (hold) state.held = true
      park(state)
    }
  }

  /** Returns whether records kept while paused are ready now. */
  const resume = (partitions: ReadonlyArray<TopicPartition.TopicPartition>): boolean => {
    let parked = false
    for (const tp of partitions) {
      const state = states.get(TopicPartition.key(tp))
      if (state === undefined || !state.paused) continue
      state.paused = false
      state.held = false
      if (state.entries.size > 0) parked = true
      syncFetching(state)
    }
    return parked
  }

  /**
   * Builds the events of one `poll` from `taken` (what the queue held) and what earlier polls left, at most
   * `maxPollRecords` records per partition. A partition's `OutOfRange` comes after all of its records.
   */
  const drain = (taken: Iterable<Entry>): Array<DriverEvent> => {
    for (const entry of taken) pending.push(entry)
    const out: Array<DriverEvent> = []
    const counts = new Map<string, number>()
    /** Partitions with records still waiting: their `OutOfRange` waits too. */
    const waiting = new Set<string>()
    const rest: Array<Entry> = []
    let stop = false
    for (const entry of pending) {
      if (stop) {
        rest.push(entry)
        continue
      }
      switch (entry._tag) {
        case "Wake":
          continue
        case "Control":
          out.push(entry.event)
          // The runloop reacts (seeks after Assigned, commits after Revoked) before it sees further records.
          stop = true
          continue
        case "OutOfRange": {
          const state = entry.state
          if (states.get(state.key) !== state || state.epoch !== entry.epoch || !state.outOfRange) continue
          if (waiting.has(state.key)) {
            rest.push(entry)
            continue
          }
          out.push({ _tag: "OutOfRange", partition: state.partition, position: entry.position })
          continue
        }
        case "Records": {
          if (entry.done) continue
          const state = entry.state
          if (states.get(state.key) !== state) {
            finish(entry, "stale")
            continue
          }
          if (state.paused) {
            park(state)
            rest.push(entry)
            waiting.add(state.key)
            continue
          }
          const room = options.maxPollRecords - (counts.get(state.key) ?? 0)
          if (room <= 0) {
            rest.push(entry)
            waiting.add(state.key)
            continue
          }
          const from = state.position ?? cursor(entry)
          const messages = entry.messages
          while (entry.next < messages.length && offsetAt(entry, entry.next) < from) entry.next++
          const until = Math.min(messages.length, entry.next + room)
          const records: Array<ConsumerRecord> = []
          for (let i = entry.next; i < until; i++) records.push(toConsumerRecord(state.partition, messages[i]!))
          entry.next = until
          const all = until >= messages.length
          if (records.length > 0) {
            const next = all ? entry.end : records[records.length - 1]!.offset + 1n
            counts.set(state.key, (counts.get(state.key) ?? 0) + records.length)
            state.position = next
            out.push({
              _tag: "Records",
              partition: state.partition,
              records: Chunk.unsafeFromArray(records),
              from,
              next
            })
          } else if (messages.length === 0 && entry.end > from) {
            // A batch filtering emptied: nothing to read, and the position moves past it.
            state.position = entry.end
            out.push({ _tag: "Records", partition: state.partition, records: Chunk.empty(), from, next: entry.end })
          }
          if (all) {
            finish(entry, "taken")
          } else {
            rest.push(entry)
            waiting.add(state.key)
          }
          continue
        }
      }
    }
    pending = rest
    return out
  }

  return {
    states,
    finish,
    accept,
    resolved,
    emptied,
    resetLogged,
    wasReset,
    assign,
    restore,
    dropAll,
    clear,
    seek,
    pause,
    resume,
    drain
  }
}

/** @internal */
export type Fetch = ReturnType<typeof makeFetch>
