/**
 * The two ends of a session's queue: kafkajs's batch calls, which wait until the runloop polled their records (and
 * heartbeat meanwhile), and `poll`.
 */
import * as Clock from "effect/Clock"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Queue from "effect/Queue"
import type { EachBatchPayload } from "kafkajs"
import type { DriverEvent } from "../../Driver.js"
import type { DriverError } from "../../KafkaError.js"
import { isRebalanceError } from "./errors.js"
import { beginRevoke, liveClock, type Session } from "./member.js"
import type { Entry, RecordsEntry } from "./partitions.js"
import { memberState } from "./states.js"

const waitAtMost = <A>(promise: Promise<A>, millis: number): Promise<A | undefined> =>
  new Promise((resolve, reject) => {
    const timer = setTimeout(() => resolve(undefined), Math.max(0, millis))
    promise.then(
      (value) => {
        clearTimeout(timer)
        resolve(value)
      },
      (error: unknown) => {
        clearTimeout(timer)
        reject(error)
      }
    )
  })

/**
 * kafkajs's heartbeat, while records wait for `poll`. A rebalance it reports is thrown back to kafkajs, which
 * rejoins: its JoinGroup is held until the runloop released the partitions.
 */
const heartbeat = async (s: Session, payload: EachBatchPayload, entry: RecordsEntry) => {
  try {
    await payload.heartbeat()
  } catch (error) {
    const rebalance = isRebalanceError(error)
    s.fetcher.finish(entry, rebalance && !s.isStatic ? "revoke" : "stale")
    if (rebalance) beginRevoke(s)
    throw error
  }
}

/**
 * kafkajs's `eachBatch`: hands the batch's records to `poll` and waits for its outcome. Closed, Holding or Released,
 * the member takes no batch (kafkajs fetches it again, or the next owner does).
 *
 * @internal
 */
export const eachBatch = async (s: Session, payload: EachBatchPayload): Promise<void> => {
  const state = memberState(s)
  if (state === "Closed" || !payload.isRunning() || state === "Holding" || state === "Released") return
  const entry = await s.fetcher.accept(payload)
  if (entry === undefined) return
  let outcome = await waitAtMost(entry.outcome, s.tick)
  while (outcome === undefined) {
    if (s.closed || !payload.isRunning()) {
      s.fetcher.finish(entry, "close")
      return
    }
    // Records wait here until the runloop polls them; heartbeats keep the partition meanwhile.
    await heartbeat(s, payload, entry)
    outcome = await waitAtMost(entry.outcome, s.tick)
  }
  // Taken, or kept by the adapter (read ahead, or while the partition is paused): kafkajs moves past the batch.
  if (outcome === "taken" || outcome === "ahead" || outcome === "pause") s.fetcher.resolved(entry, payload)
}

/** @internal */
export const poll = (s: Session): Effect.Effect<ReadonlyArray<DriverEvent>, DriverError> =>
  Effect.gen(function*() {
    const deadline = (yield* Clock.currentTimeMillis) + s.pollTimeout
    let taken: Iterable<Entry> = []
    while (true) {
      if (s.failure !== undefined) return yield* s.failure
      const available = yield* Queue.takeAll(s.queue)
      const events = s.fetcher.drain([...taken, ...available])
      taken = []
      if (events.length > 0) return events
      const remaining = deadline - (yield* Clock.currentTimeMillis)
      if (remaining <= 0) return []
      const next = yield* Effect.timeoutOption(Queue.take(s.queue), Duration.millis(remaining))
      if (Option.isNone(next)) return []
      taken = [next.value]
    }
  }).pipe(Effect.withClock(liveClock))
