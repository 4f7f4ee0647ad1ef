/**
 * A consumer's settings checked and resolved: every field validated (a clear `InvalidConfig` naming it), defaults
 * filled in, and the failure route's topics derived.
 *
 * @internal
 */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import type { AnyConfig } from "../../Consumer.js"
import * as FailureRoute from "../../FailureRoute.js"
import { InvalidConfig } from "../../KafkaError.js"
import type * as route from "../route/router.js"
import * as config_ from "../shared/config.js"
import type * as runloop from "./runloop.js"

const duration = (field: string, input: Duration.DurationInput | undefined, fallback: Duration.Duration) =>
  input === undefined ? Effect.succeed(fallback) : config_.positiveDuration(field, input)

const positiveInt = (field: string, input: number | undefined, fallback: number) =>
  input === undefined ? Effect.succeed(fallback) : config_.positiveInt(field, input)

export const resolve = (config: AnyConfig): Effect.Effect<runloop.Resolved, InvalidConfig> =>
  Effect.gen(function*() {
    if (typeof config.groupId !== "string" || config.groupId.trim().length === 0) {
      return yield* new InvalidConfig({ field: "groupId", reason: "must be a non-empty string" })
    }
    if ((config.topics === undefined) === (config.partitions === undefined)) {
      return yield* new InvalidConfig({ field: "topics", reason: "give either topics or partitions, not both or none" })
    }
    if (config.topics !== undefined) {
      if (config.topics.length === 0) {
        return yield* new InvalidConfig({ field: "topics", reason: "must name at least one topic" })
      }
      const bad = config.topics.find((t) => typeof t !== "string" || !/^[a-zA-Z0-9._-]{1,249}$/.test(t))
      if (bad !== undefined) {
        return yield* new InvalidConfig({
          field: "topics",
          reason: `"${bad}" is not a valid topic name (1-249 of a-z A-Z 0-9 . _ -)`
        })
      }
    }
    if (config.partitions !== undefined) {
      if (config.partitions.length === 0) {
        return yield* new InvalidConfig({ field: "partitions", reason: "must name at least one partition" })
      }
      const bad = config.partitions.find((tp) =>
        typeof tp.topic !== "string" || tp.topic.length === 0 || !Number.isInteger(tp.partition) || tp.partition < 0
      )
      if (bad !== undefined) {
        return yield* new InvalidConfig({
          field: "partitions",
          reason: `${JSON.stringify(bad)} is not a topic and a non-negative partition number`
        })
      }
    }
    const maxPollRecords = yield* positiveInt("maxPollRecords", config.maxPollRecords, 500)
    const bufferSize = yield* positiveInt("bufferSize", config.bufferSize, 2 * maxPollRecords)
    if (bufferSize < maxPollRecords) {
      return yield* new InvalidConfig({
        field: "bufferSize",
        reason: `must be at least maxPollRecords (${maxPollRecords}), got ${bufferSize}`
      })
    }
    const pollTimeout = yield* duration("pollTimeout", config.pollTimeout, Duration.millis(100))
    const sessionTimeout = yield* duration("sessionTimeout", config.sessionTimeout, Duration.seconds(10))
    const rebalanceTimeout = yield* duration("rebalanceTimeout", config.rebalanceTimeout, Duration.seconds(60))
    const revokeTimeout = yield* duration("revokeTimeout", config.revokeTimeout, Duration.seconds(30))
    if (Duration.greaterThanOrEqualTo(revokeTimeout, rebalanceTimeout)) {
      return yield* new InvalidConfig({
        field: "revokeTimeout",
        reason: "must be shorter than rebalanceTimeout, so that the final commit lands before the group moves on"
      })
    }
    const reconnectTimeout = yield* duration("reconnectTimeout", config.reconnectTimeout, Duration.minutes(2))
    const offsetReset = config.offsetReset ?? "earliest"
    if (offsetReset !== "earliest" && offsetReset !== "latest" && offsetReset !== "none") {
      return yield* new InvalidConfig({
        field: "offsetReset",
        reason: `must be "earliest", "latest" or "none", got ${JSON.stringify(offsetReset)}`
      })
    }
    const isolationLevel = config.isolationLevel ?? "read_committed"
    if (isolationLevel !== "read_committed" && isolationLevel !== "read_uncommitted") {
      return yield* new InvalidConfig({
        field: "isolationLevel",
        reason: `must be "read_committed" or "read_uncommitted", got ${JSON.stringify(isolationLevel)}`
      })
    }
    if (config.rejoin !== undefined && typeof config.rejoin !== "boolean") {
      return yield* new InvalidConfig({
        field: "rejoin",
        reason: `must be true or false, got ${String(config.rejoin)}`
      })
    }
    const ordering = config.ordering ?? "partition"
    if (ordering !== "partition" && ordering !== "key" && ordering !== "unordered") {
      return yield* new InvalidConfig({
        field: "ordering",
        reason: `must be "partition", "key" or "unordered", got ${JSON.stringify(ordering)}`
      })
    }
    if (config.groupInstanceId !== undefined) {
      if (typeof config.groupInstanceId !== "string" || !/^\S{1,249}$/.test(config.groupInstanceId)) {
        return yield* new InvalidConfig({
          field: "groupInstanceId",
          reason: `must be 1 to 249 characters without spaces, got ${JSON.stringify(config.groupInstanceId)}`
        })
      }
      if (config.topics === undefined) {
        return yield* new InvalidConfig({
          field: "groupInstanceId",
          reason: "is a group member's name: it goes with topics, not with partitions assigned by hand"
        })
      }
    }
    const concurrency = yield* positiveInt("concurrency", config.concurrency, 64)
    const route = yield* routeOf(config)
    return {
      route,
      ordering,
      concurrency,
      session: {
        groupId: config.groupId,
        clientId: config.clientId ?? config.groupId,
        subscription: config.topics !== undefined
          ? { _tag: "Topics", topics: [...config.topics, ...retryTopicsOf(config.topics, route)] }
          : { _tag: "Partitions", partitions: config.partitions ?? [] },
        maxPollRecords,
        pollTimeout,
        sessionTimeout,
        rebalanceTimeout,
        isolationLevel,
        ...(config.groupInstanceId === undefined ? {} : { groupInstanceId: config.groupInstanceId })
      },
      bufferSize,
      revokeTimeout,
      stepTimeout: Duration.divide(Duration.subtract(rebalanceTimeout, revokeTimeout), 4).pipe(
        Option.getOrElse(() => Duration.millis(1))
      ),
      retry: config.retry ??
        Schedule.exponential(Duration.millis(100)).pipe(Schedule.intersect(Schedule.recurs(5))),
      offsetReset,
      reconnectTimeout,
      rejoin: config.rejoin ?? true
    } satisfies runloop.Resolved
  })

/** The retry topics the consumer reads besides its own. */
const retryTopicsOf = (topics: ReadonlyArray<string>, route: route.RouteSettings | undefined): ReadonlyArray<string> =>
  route === undefined
    ? []
    : topics.flatMap((topic) => route.delays.map((_, step) => FailureRoute.retryTopic(topic, step)))

const validTopic = /^[a-zA-Z0-9._-]{1,249}$/

const routeOf = (config: AnyConfig): Effect.Effect<route.RouteSettings | undefined, InvalidConfig> => {
  const route = config.onFailure
  if (route === undefined || route._tag === "Stop") return Effect.succeed(undefined)
  if (route._tag !== "DeadLetter" && route._tag !== "RetryTopics") {
    return new InvalidConfig({
      field: "onFailure",
      reason: "must be FailureRoute.stop, FailureRoute.deadLetter({ topic }) or FailureRoute.retryTopics(delays, ...)"
    })
  }
  const field = route._tag === "DeadLetter" ? "onFailure.topic" : "onFailure.deadLetter"
  const topic = route._tag === "DeadLetter" ? route.topic : route.deadLetter
  if (typeof topic !== "string" || !validTopic.test(topic)) {
    return new InvalidConfig({
      field,
      reason: `"${String(topic)}" is not a valid topic name (1-249 of a-z A-Z 0-9 . _ -)`
    })
  }
  const subscribed = config.topics ?? (config.partitions ?? []).map((tp) => tp.topic)
  if (subscribed.includes(topic)) {
    return new InvalidConfig({
      field,
      reason: `"${topic}" is a topic the consumer reads: its dead letters would come back to it`
    })
  }
  const delays = route._tag === "RetryTopics" ? route.delays : []
  if (route._tag === "RetryTopics") {
    if (config.topics === undefined) {
      return new InvalidConfig({
        field: "onFailure",
        reason: "retry topics are read through the group's subscription: give topics, not partitions"
      })
    }
    if (delays.length === 0 || delays.some((d) => !Number.isFinite(d) || d < 0)) {
      return new InvalidConfig({
        field: "onFailure.delays",
        reason: `must be one or more finite, non-negative durations, got ${JSON.stringify(delays)}`
      })
    }
    const tooLong = config.topics.find((t) => !validTopic.test(FailureRoute.retryTopic(t, delays.length - 1)))
    if (tooLong !== undefined) {
      return new InvalidConfig({
        field: "onFailure",
        reason: `the retry topics of "${tooLong}" would not be valid topic names (at most 249 characters)`
      })
    }
  }
  return Effect.map(
    config_.positiveInt("onFailure.maxInARow", route.maxInARow),
    (maxInARow) => ({ topic, maxInARow, delays })
  )
}
