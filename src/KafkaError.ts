/**
 * @since 0.1.0
 */
import * as Schema from "effect/Schema"

/**
 * A configuration value is invalid. Raised before anything connects; `field` names the setting to fix.
 *
 * @since 0.1.0
 * @category errors
 */
export class ConfigError extends Schema.TaggedError<ConfigError>()("ConfigError", {
  field: Schema.String,
  reason: Schema.String
}) {
  override get message(): string {
    return `Invalid configuration "${this.field}": ${this.reason}`
  }
}

/**
 * The client could not talk to the cluster (connect, poll, seek).
 *
 * @since 0.1.0
 * @category errors
 */
export class DriverError extends Schema.TaggedError<DriverError>()("DriverError", {
  operation: Schema.String,
  reason: Schema.String,
  cause: Schema.optional(Schema.Defect)
}) {
  override get message(): string {
    return `Kafka ${this.operation} failed: ${this.reason}`
  }
}

/**
 * A commit was refused. `retriable` commits (a coordinator moving, a rebalance starting) are retried on the
 * configured schedule; the others mean this member no longer owns the partitions it tried to commit.
 *
 * @since 0.1.0
 * @category errors
 */
export class CommitFailed extends Schema.TaggedError<CommitFailed>()("CommitFailed", {
  reason: Schema.Literal("RebalanceInProgress", "IllegalGeneration", "UnknownMember", "CoordinatorNotAvailable", "Other"),
  retriable: Schema.Boolean,
  detail: Schema.optional(Schema.String)
}) {
  override get message(): string {
    return `Commit refused (${this.reason})${this.detail === undefined ? "" : `: ${this.detail}`}`
  }
}

/**
 * The handler kept failing on a record after every retry of the configured schedule. The partition's position
 * stays at this record: nothing after it was committed.
 *
 * @since 0.1.0
 * @category errors
 */
export class HandlerFailed extends Schema.TaggedError<HandlerFailed>()("HandlerFailed", {
  topic: Schema.String,
  partition: Schema.Number,
  offset: Schema.BigIntFromSelf,
  cause: Schema.Defect
}) {
  override get message(): string {
    return `Handler failed on ${this.topic}-${this.partition} at offset ${this.offset} after its retries: ${
      this.cause instanceof Error ? this.cause.message : String(this.cause)
    }`
  }
}

/**
 * A record could not be decoded. It carries where the record is so that nothing is skipped silently.
 *
 * @since 0.1.0
 * @category errors
 */
export class DecodeError extends Schema.TaggedError<DecodeError>()("DecodeError", {
  topic: Schema.String,
  partition: Schema.Number,
  offset: Schema.BigIntFromSelf,
  reason: Schema.String
}) {
  override get message(): string {
    return `Cannot decode record ${this.topic}-${this.partition}@${this.offset}: ${this.reason}`
  }
}
