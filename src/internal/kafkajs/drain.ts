/**
 * What one `poll` returns of what kafkajs fetched: the queued entries in fetch order, turned into events.
 */
import * as Chunk from "effect/Chunk"
import type { ConsumerRecord } from "../../ConsumerRecord.js"
import type { DriverEvent } from "../../Driver.js"
import { cursor, type Entry, type Fetcher, finish, offsetAt, park } from "./partitions.js"
import { toConsumerRecord } from "./records.js"

/**
 * Builds the events of one `poll` from `taken` (what the queue held) and what earlier polls left, at most
 * `maxPollRecords` records per partition. A partition's `OutOfRange` comes after all of its records.
 *
 * @internal
 */
export const drain = (f: Fetcher, taken: Iterable<Entry>): Array<DriverEvent> => {
  for (const entry of taken) f.pending.push(entry)
  const out: Array<DriverEvent> = []
  const counts = new Map<string, number>()
  /** Partitions with records still waiting: their `OutOfRange` waits too. */
  const waiting = new Set<string>()
  const rest: Array<Entry> = []
  let stop = false
  for (const entry of f.pending) {
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
        if (f.states.get(state.key) !== state || state.epoch !== entry.epoch || !state.outOfRange) continue
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
        if (f.states.get(state.key) !== state) {
          finish(f, entry, "stale")
          continue
        }
        if (state.paused) {
          park(f, state)
          rest.push(entry)
          waiting.add(state.key)
          continue
        }
        const room = f.options.maxPollRecords - (counts.get(state.key) ?? 0)
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
          finish(f, entry, "taken")
        } else {
          rest.push(entry)
          waiting.add(state.key)
        }
        continue
      }
    }
  }
  f.pending = rest
  return out
}
