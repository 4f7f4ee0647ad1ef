/**
 * The records of a partition waiting to be handled out of order, in lanes: one per key under `key` ordering (a record
 * without a key, and every record under `unordered`, has a lane of its own). A lane's records are handled in offset
 * order by one worker at a time; lanes are handed to workers in the order they became ready.
 *
 * @internal
 */
import type { ConsumerRecord } from "../../ConsumerRecord.js"
import { keyText, type Ordering } from "./ordering.js"

/** Records of one key (or one record without a key, or any one record when unordered) waiting to be handled. */
export interface Lane {
  readonly key: string | undefined
  records: Array<ConsumerRecord>
  /** The records' indexes in the partition's progress. */
  indexes: Array<number>
}

export class Lanes {
  /** The lanes of keys with records waiting or in flight. */
  private readonly byKey = new Map<string, Lane>()
  private ready: Array<Lane | undefined> = []
  private readyAt = 0

  constructor(private readonly ordering: Ordering) {}

  /** How many lanes wait for a worker. */
  get waiting(): number {
    return this.ready.length - this.readyAt
  }

  /** The next lane ready for a worker, taken out of the ready ones. */
  take(): Lane | undefined {
    if (this.readyAt === this.ready.length) {
      if (this.readyAt > 0) {
        this.ready = []
        this.readyAt = 0
      }
      return undefined
    }
    const lane = this.ready[this.readyAt]!
    this.ready[this.readyAt++] = undefined
    return lane
  }

  /** A fetched record, in its key's lane (behind the records of that key not handled yet) or in a lane of its own. */
  place(record: ConsumerRecord, index: number): void {
    if (this.ordering === "key" && record.key !== null) {
      const key = keyText(record.key)
      const lane = this.byKey.get(key)
      if (lane !== undefined) {
        lane.records.push(record)
        lane.indexes.push(index)
        return
      }
      const fresh: Lane = { key, records: [record], indexes: [index] }
      this.byKey.set(key, fresh)
      this.ready.push(fresh)
      return
    }
    this.ready.push({ key: undefined, records: [record], indexes: [index] })
  }

  /** A lane whose records were handled: ready again if more came meanwhile, else its key is forgotten. */
  handled(lane: Lane): void {
    if (lane.records.length > 0) this.ready.push(lane)
    else this.forget(lane)
  }

  /** A lane that has nothing more: its key's next record starts a new one. */
  forget(lane: Lane): void {
    if (lane.key !== undefined) this.byKey.delete(lane.key)
  }
}
