/**
 * The producer's machinery, as the drivers use it: settings, the service on a transport, the partitioner, and
 * transactions.
 */
export { make } from "./batcher.js"
export { type OnFailure, type Transport } from "./buffer.js"
export {
  groupBy,
  highestPartitions,
  type Layout,
  makePartitioner,
  type TopicRecords,
  withPartitionCounts
} from "./partitioner.js"
export { refuse, sizeOf, unknownTopic } from "./record.js"
export { checkTransactionalId, resolve, type Resolved, resolveTransactional } from "./settings.js"
export {
  inTransaction,
  makeTransactional,
  transactionFailed,
  type TxnClient,
  type TxnSession,
  withoutGroupMetadata
} from "./transaction.js"
export { isFailure, type Written } from "./written.js"
