/**
 * What @platformatic/kafka's errors mean to the library: the protocol errors inside them (a `ResponseError` holds one
 * per failed partition or group), whether they pass, and how a refused commit is classified.
 */
import { CommitFailed, DriverError } from "../../KafkaError.js"
import type { TopicPartition } from "../../TopicPartition.js"
import { commitReasonOfProtocol } from "../shared/commitReasons.js"

interface ErrorLike {
  readonly message?: unknown
  readonly code?: unknown
  readonly apiId?: unknown
  readonly canRetry?: unknown
  readonly errors?: unknown
  readonly cause?: unknown
}

const isErrorLike = (u: unknown): u is ErrorLike => typeof u === "object" && u !== null

/** The error and every error inside it (`errors` of a `MultipleErrors`, `cause`), depth first. @internal */
export const flatten = (error: unknown): Array<ErrorLike> => {
  const out: Array<ErrorLike> = []
  const visit = (e: unknown) => {
    if (!isErrorLike(e) || out.includes(e) || out.length >= 32) return
    out.push(e)
    if (Array.isArray(e.errors)) { for (const inner of e.errors) visit(inner) }
    visit(e.cause)
  }
  visit(error)
  return out
}

/** The Kafka protocol error names (`apiId`, e.g. `UNKNOWN_MEMBER_ID`) found in the error. @internal */
export const apiIds = (error: unknown): Array<string> => {
  const ids: Array<string> = []
  for (const e of flatten(error)) {
    if (typeof e.apiId === "string" && !ids.includes(e.apiId)) ids.push(e.apiId)
  }
  return ids
}

/** @internal */
export const describe = (error: unknown): string => {
  const all = flatten(error)
  if (all.length === 0) return String(error)
  const messages: Array<string> = []
  for (const e of all) {
    const text = typeof e.message === "string" && e.message.length > 0 ? e.message : undefined
    if (text !== undefined && !messages.includes(text)) messages.push(text)
  }
  const ids = apiIds(error)
  const text = messages.length > 0 ? messages.join(": ") : String(error)
  return ids.length === 0 ? text : `${text} (${ids.join(", ")})`
}

/** Protocol errors that go away once the cluster is reachable again, or a transaction has ended. */
const transientIds = new Set([
  "REQUEST_TIMED_OUT",
  "NETWORK_EXCEPTION",
  "BROKER_NOT_AVAILABLE",
  "LEADER_NOT_AVAILABLE",
  "NOT_LEADER_OR_FOLLOWER",
  "REPLICA_NOT_AVAILABLE",
  "FENCED_LEADER_EPOCH",
  "UNKNOWN_LEADER_EPOCH",
  "KAFKA_STORAGE_ERROR",
  "NOT_ENOUGH_REPLICAS",
  "COORDINATOR_NOT_AVAILABLE",
  "NOT_COORDINATOR",
  "COORDINATOR_LOAD_IN_PROGRESS",
  "UNSTABLE_OFFSET_COMMIT",
  "CONCURRENT_TRANSACTIONS"
])

/** The client's own codes for a connection that failed or timed out. */
const networkCodes = new Set(["PLT_KFK_NETWORK", "PLT_KFK_TIMEOUT"])

/**
 * Whether an error passes: a connection closed, refused or timed out, a broker, leader or coordinator moving or
 * loading, a committed position a transaction is still committing. An unknown topic, a refused login or
 * authorization, a bad setting do not.
 *
 * @internal
 */
export const isRetriable = (error: unknown): boolean =>
  flatten(error).some((e) =>
    (typeof e.code === "string" && networkCodes.has(e.code)) ||
    (typeof e.apiId === "string" && transientIds.has(e.apiId))
  )

/** @internal */
export const driverError = (operation: string) => (cause: unknown): DriverError =>
  new DriverError({ operation, reason: describe(cause), retriable: isRetriable(cause), cause })

type CommitFailureReason = CommitFailed["reason"]

/**
 * Classifies a refused commit of `partitions` by the protocol errors in it, then by the client's own: a lost
 * connection or a timeout is retried, any other error that passes too; an unknown one that does not ends the consumer.
 *
 * @internal
 */
export const commitFailed = (cause: unknown, partitions: ReadonlyArray<TopicPartition>): CommitFailed => {
  const reasons = apiIds(cause).map(commitReasonOfProtocol).filter((r): r is CommitFailureReason => r !== undefined)
  const codes = flatten(cause).map((e) => e.code)
  const reason: CommitFailureReason = reasons[0] ??
    (codes.includes("PLT_KFK_TIMEOUT")
      ? "Timeout"
      : codes.includes("PLT_KFK_NETWORK")
      ? "Disconnected"
      : isRetriable(cause)
      ? "Transient"
      : "Other")
  return new CommitFailed({
    reason,
    partitions: partitions.map(({ partition, topic }) => ({ topic, partition })),
    detail: describe(cause)
  })
}

/**
 * Whether a metadata read failed because the topic does not exist. The client answers UNKNOWN_TOPIC_OR_PARTITION with
 * an error of its own that carries no protocol code, only its message ("Unknown topic <name>."), so that is read.
 */
/** @internal */
export const isUnknownTopic = (error: unknown): boolean =>
  apiIds(error).includes("UNKNOWN_TOPIC_OR_PARTITION") ||
  flatten(error).some((e) => typeof e.message === "string" && e.message.startsWith("Unknown topic "))
