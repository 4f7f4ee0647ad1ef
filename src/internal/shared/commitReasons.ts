/**
 * What a Kafka protocol error (by its name, in the names kafkajs and newer Kafka versions give it) means for a refused
 * commit: the reason that decides what happens to its positions.
 */
import type { CommitFailed } from "../../KafkaError.js"

/** @internal */
export const commitReasonOfProtocol = (type: string | undefined): CommitFailed["reason"] | undefined => {
  switch (type) {
    case "REBALANCE_IN_PROGRESS":
      return "RebalanceInProgress"
    case "NOT_COORDINATOR_FOR_GROUP":
    case "NOT_COORDINATOR":
    case "GROUP_COORDINATOR_NOT_AVAILABLE":
    case "COORDINATOR_NOT_AVAILABLE":
    case "GROUP_LOAD_IN_PROGRESS":
    case "COORDINATOR_LOAD_IN_PROGRESS":
      return "CoordinatorNotAvailable"
    case "REQUEST_TIMED_OUT":
      return "Timeout"
    case "NETWORK_EXCEPTION":
      return "Disconnected"
    case "ILLEGAL_GENERATION":
    // KIP-848: the member's epoch is not the group's any more (it was evicted).
    case "FENCED_MEMBER_EPOCH":
      return "IllegalGeneration"
    // KIP-848: sent with an epoch a later heartbeat replaced; the member still owns its partitions.
    case "STALE_MEMBER_EPOCH":
      return "RebalanceInProgress"
    case "UNKNOWN_MEMBER_ID":
      return "UnknownMember"
    // A newer member joined with this member's instance id (KIP-345): a rejoin would fence it in turn, so the
    // consumer ends, as Kafka's own clients do.
    case "FENCED_INSTANCE_ID":
      return "Other"
    case "GROUP_AUTHORIZATION_FAILED":
    case "TOPIC_AUTHORIZATION_FAILED":
      return "Unauthorized"
    case "OFFSET_METADATA_TOO_LARGE":
    case "INVALID_COMMIT_OFFSET_SIZE":
      return "Other"
    default:
      return undefined
  }
}
