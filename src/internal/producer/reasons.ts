/**
 * What a Kafka protocol error means for a write.
 */
import type { ProduceFailureReason } from "../../KafkaError.js"

/**
 * The reason a write or a transaction failed, by the Kafka protocol error behind it; `undefined` for the others.
 *
 * @internal
 */
export const reasonOfType = (type: string | undefined): ProduceFailureReason | undefined => {
  switch (type) {
    case "UNKNOWN_TOPIC_OR_PARTITION":
      return "UnknownTopic"
    case "MESSAGE_TOO_LARGE":
    case "RECORD_LIST_TOO_LARGE":
      return "RecordTooLarge"
    case "INVALID_PRODUCER_EPOCH":
    case "PRODUCER_FENCED":
    case "TRANSACTION_COORDINATOR_FENCED":
    case "UNKNOWN_PRODUCER_ID":
    case "INVALID_PRODUCER_ID_MAPPING":
      return "Fenced"
    case "NOT_ENOUGH_REPLICAS":
    case "NOT_ENOUGH_REPLICAS_AFTER_APPEND":
      return "NotEnoughReplicas"
    case "REQUEST_TIMED_OUT":
      return "Timeout"
    case "TOPIC_AUTHORIZATION_FAILED":
    case "CLUSTER_AUTHORIZATION_FAILED":
    case "TRANSACTIONAL_ID_AUTHORIZATION_FAILED":
      return "Unauthorized"
    default:
      return undefined
  }
}
