/**
 * What a driver's session is given to join, checked, with the timings it follows: the same on every driver on Kafka.
 */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import type { SessionOptions } from "../../Driver.js"
import { DriverError } from "../../KafkaError.js"
import * as TopicPartition from "../../TopicPartition.js"

/** @internal */
export interface SessionPlan {
  /** A `Partitions` subscription: the partitions it names, no group assignment. */
  readonly isStatic: boolean
  readonly requested: ReadonlyArray<TopicPartition.TopicPartition>
  readonly topics: Array<string>
  readonly sessionTimeout: number
  readonly rebalanceTimeout: number
  readonly pollTimeout: number
  readonly heartbeatInterval: number
  /** How long a revoke may hold the member's rejoin. */
  readonly holdLimit: number
}

/**
 * Checks a session's options. The heartbeat interval is the driver's setting, or a third of the session timeout, at
 * most 3 seconds.
 *
 * @internal
 */
export const planSession = (
  heartbeatSetting: number | undefined,
  options: SessionOptions
): Effect.Effect<SessionPlan, DriverError> =>
  Effect.gen(function*() {
    const subscription = options.subscription
    const isStatic = subscription._tag === "Partitions"
    const requested = subscription._tag === "Partitions"
      ? Array.from(subscription.partitions).sort(TopicPartition.compare)
      : []
    const topics = subscription._tag === "Topics"
      ? Array.from(new Set(subscription.topics))
      : Array.from(new Set(requested.map((tp) => tp.topic)))
    if (topics.length === 0) {
      return yield* new DriverError({ operation: "connect", reason: "the subscription names no topic or partition" })
    }
    if (!(options.maxPollRecords >= 1)) {
      return yield* new DriverError({ operation: "connect", reason: "maxPollRecords must be at least 1" })
    }
    const sessionTimeout = Math.round(Duration.toMillis(options.sessionTimeout))
    const rebalanceTimeout = Math.round(Duration.toMillis(options.rebalanceTimeout))
    const pollTimeout = Math.max(0, Math.round(Duration.toMillis(options.pollTimeout)))
    const heartbeatInterval = heartbeatSetting ?? Math.max(100, Math.min(3000, sessionTimeout / 3))
    if (heartbeatInterval >= sessionTimeout) {
      return yield* new DriverError({
        operation: "connect",
        reason: `heartbeatInterval (${heartbeatInterval} ms) must be below the session timeout (${sessionTimeout} ms)`
      })
    }
    // The group's rebalance started up to a heartbeat before this member noticed it; the held JoinGroup must reach the
    // coordinator before the rebalance timeout, or the group goes on without this member.
    const holdLimit = Math.max(0, rebalanceTimeout - heartbeatInterval - 1000)
    return { isStatic, requested, topics, sessionTimeout, rebalanceTimeout, pollTimeout, heartbeatInterval, holdLimit }
  })
