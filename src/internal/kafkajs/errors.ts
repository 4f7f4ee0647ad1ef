/**
 * kafkajs's errors as this library's: which ones pass once the cluster is reachable again (`isRetriable`), and how a
 * refused commit is classified (`commitFailed`).
 */
import { CommitFailed, DriverError } from "../../KafkaError.js"
import type { TopicPartition } from "../../TopicPartition.js"
import { commitReasonOfProtocol } from "../shared/commitReasons.js"

interface ErrorLike {
  readonly name?: unknown
  readonly type?: unknown
  readonly message?: unknown
  readonly retriable?: unknown
  readonly cause?: unknown
}

const isErrorLike = (u: unknown): u is ErrorLike => typeof u === "object" && u !== null

/**
 * kafkajs wraps errors (retries exceeded, non-retriable) with the original as `cause`; the protocol type is inside.
 *
 * @internal
 */
export const causeChain = (error: unknown): Array<ErrorLike> => {
  const chain: Array<ErrorLike> = []
  let current: unknown = error
  while (isErrorLike(current) && chain.length < 8 && !chain.includes(current)) {
    chain.push(current)
    current = current.cause
  }
  return chain
}

/** @internal */
export const protocolType = (error: unknown): string | undefined => {
  for (const e of causeChain(error)) {
    if (typeof e.type === "string") return e.type
  }
  return undefined
}

/** @internal */
export const describe = (error: unknown): string => {
  const chain = causeChain(error)
  if (chain.length === 0) return String(error)
  const messages: Array<string> = []
  for (const e of chain) {
    const text = typeof e.message === "string" && e.message.length > 0 ? e.message : String(e.name ?? "error")
    if (!messages.includes(text)) messages.push(text)
  }
  const type = protocolType(error)
  return type === undefined ? messages.join(": ") : `${messages.join(": ")} (${type})`
}

/** @internal */
export const isRebalanceError = (error: unknown): boolean => {
  const type = protocolType(error)
  return type === "REBALANCE_IN_PROGRESS" || type === "ILLEGAL_GENERATION" || type === "NOT_COORDINATOR_FOR_GROUP"
}

/** The connection to a broker failed or closed, or no broker could be reached. */
const disconnectedNames = new Set([
  "KafkaJSConnectionError",
  "KafkaJSConnectionClosedError",
  "KafkaJSBrokerNotFound",
  "KafkaJSNoBrokerAvailableError"
])

/**
 * No broker could say where the group's coordinator is (every one refused the connection, or answered that it is
 * not available): kafkajs marks it non-retriable, but it goes away with the cluster's coming back.
 */
const COORDINATOR_NOT_FOUND = "KafkaJSGroupCoordinatorNotFound"

/** Protocol errors (names as in kafkajs's src/protocol/error.js) that go away once the cluster is reachable again. */
const transientTypes = new Set([
  "REQUEST_TIMED_OUT",
  "NETWORK_EXCEPTION",
  "BROKER_NOT_AVAILABLE",
  "LEADER_NOT_AVAILABLE",
  "NOT_LEADER_FOR_PARTITION",
  "REPLICA_NOT_AVAILABLE",
  "FENCED_LEADER_EPOCH",
  "UNKNOWN_LEADER_EPOCH",
  "KAFKA_STORAGE_ERROR",
  "NOT_ENOUGH_REPLICAS",
  "GROUP_COORDINATOR_NOT_AVAILABLE",
  "NOT_COORDINATOR_FOR_GROUP",
  "GROUP_LOAD_IN_PROGRESS",
  // The same conditions under the names newer Kafka versions give them.
  "COORDINATOR_NOT_AVAILABLE",
  "NOT_COORDINATOR",
  "COORDINATOR_LOAD_IN_PROGRESS",
  "NOT_LEADER_OR_FOLLOWER",
  // A stable read of a committed position that a transaction is still committing: read again once it has ended.
  "UNSTABLE_OFFSET_COMMIT"
])

/**
 * Whether an error goes away when the cluster is reachable again: a closed or refused connection, a request timeout,
 * a broker, leader or coordinator moving or loading, also after kafkajs gave up retrying them; and a committed position
 * that a transaction is still committing (UNSTABLE_OFFSET_COMMIT), once the transaction has ended. An unknown topic, a
 * refused login or authorization, a bad setting are not.
 *
 * @internal
 */
export const isRetriable = (error: unknown): boolean =>
  causeChain(error).some((e) =>
    (typeof e.name === "string" &&
      (disconnectedNames.has(e.name) || e.name === "KafkaJSRequestTimeoutError" || e.name === COORDINATOR_NOT_FOUND)) ||
    (typeof e.type === "string" && transientTypes.has(e.type))
  )

/** @internal */
export const driverError = (operation: string) => (cause: unknown): DriverError =>
  new DriverError({ operation, reason: describe(cause), retriable: isRetriable(cause), cause })

type CommitFailureReason = CommitFailed["reason"]

/**
 * Classifies a refused commit of `partitions` by the protocol error inside it (kafkajs wraps it when it gave up
 * retrying), then by the kafkajs error around it: a timeout, a lost connection, and any other error kafkajs marks
 * retriable are retried; an unknown error that is not retriable ends the consumer.
 *
 * @internal
 */
export const commitFailed = (
  cause: unknown,
  partitions: ReadonlyArray<TopicPartition>
): CommitFailed => {
  const detail = describe(cause)
  const chain = causeChain(cause)
  const names = chain.map((e) => e.name)
  const root = chain[chain.length - 1]
  const reason: CommitFailureReason = commitReasonOfProtocol(protocolType(cause)) ??
    (names.includes(COORDINATOR_NOT_FOUND)
      ? "CoordinatorNotAvailable"
      : names.includes("KafkaJSRequestTimeoutError")
      ? "Timeout"
      : names.some((name) => typeof name === "string" && disconnectedNames.has(name))
      ? "Disconnected"
      : root !== undefined && root.retriable === true
      ? "Transient"
      : "Other")
  return new CommitFailed({
    reason,
    partitions: partitions.map(({ partition, topic }) => ({ topic, partition })),
    detail
  })
}
