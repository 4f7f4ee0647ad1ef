/**
 * @since 0.1.0
 */
import * as Data from "effect/Data"
import * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"

const Partition = Schema.Struct({ topic: Schema.String, partition: Schema.Number })

/** The message of a typed cause carried by an error. */
const causeText = (cause: unknown): string => cause instanceof Error ? cause.message : String(cause)

const describe = (partitions: ReadonlyArray<{ readonly topic: string; readonly partition: number }>) =>
  partitions.map((tp) => `${tp.topic}-${tp.partition}`).join(", ")

/**
 * A configuration value is invalid. Raised before anything connects; `field` names the setting to fix.
 *
 * @since 0.1.0
 * @category errors
 */
export class InvalidConfig extends Schema.TaggedError<InvalidConfig>()("InvalidConfig", {
  field: Schema.String,
  reason: Schema.String
}) {
  override get message(): string {
    return `Invalid configuration "${this.field}": ${this.reason}`
  }
}

/**
 * The client could not talk to the cluster (connect, poll, seek, offsets). A `retriable` error is one that goes away
 * when the cluster is reachable again (a closed connection, a broker restarting, a timeout): the consumer reconnects on
 * its own until `reconnectTimeout` has passed. The others (an unknown topic, a refused login) end the consumer.
 *
 * @since 0.1.0
 * @category errors
 */
export class DriverError extends Schema.TaggedError<DriverError>()("DriverError", {
  operation: Schema.String,
  reason: Schema.String,
  retriable: Schema.optionalWith(Schema.Boolean, { default: () => false }),
  cause: Schema.optional(Schema.Defect)
}) {
  override get message(): string {
    return `Kafka ${this.operation} failed: ${this.reason}`
  }
}

/**
 * Why a commit was refused, in three kinds that decide what happens to the positions:
 *
 * - retried, positions kept for the next commit: `RebalanceInProgress`, `CoordinatorNotAvailable` (the group's
 *   coordinator is loading, moved, or unreachable), `Timeout`, `Disconnected`, `Transient` (any other error the client
 *   marks retriable);
 * - the member no longer owns the partitions, whose positions are dropped (the next owner repeats what was handled
 *   since the last commit): `NotOwned` (these partitions only: the client knows they moved), `IllegalGeneration` and
 *   `UnknownMember` (all of them: the member's generation or member id is not the group's any more, though its client
 *   may not know it yet, so the member gives up its partitions and rejoins; with `rejoin: false` the consumer ends);
 * - fatal, the consumer ends: `Unauthorized` (the group or the topic is not this client's to commit), `Other`.
 *
 * @since 0.1.0
 * @category models
 */
export type CommitFailureReason = typeof CommitFailed.fields.reason.Type

/**
 * A commit was refused. `partitions` names the partitions the refusal concerns (for `NotOwned`, only those; for the
 * other reasons, the whole commit). What the consumer does about it follows from `reason`: see
 * {@link CommitFailureReason}.
 *
 * @since 0.1.0
 * @category errors
 */
export class CommitFailed extends Schema.TaggedError<CommitFailed>()("CommitFailed", {
  reason: Schema.Literal(
    "RebalanceInProgress",
    "CoordinatorNotAvailable",
    "Timeout",
    "Disconnected",
    "Transient",
    "IllegalGeneration",
    "UnknownMember",
    "NotOwned",
    "Unauthorized",
    "Other"
  ),
  partitions: Schema.Array(Partition),
  detail: Schema.optional(Schema.String)
}) {
  /** The commit may succeed if tried again: the positions are kept. */
  get retriable(): boolean {
    switch (this.reason) {
      case "RebalanceInProgress":
      case "CoordinatorNotAvailable":
      case "Timeout":
      case "Disconnected":
      case "Transient":
        return true
      default:
        return false
    }
  }

  /** The member no longer owns `partitions`: their positions are dropped, and only theirs. */
  get notOwned(): boolean {
    return this.reason === "IllegalGeneration" || this.reason === "UnknownMember" || this.reason === "NotOwned"
  }

  /** Neither retriable nor a lost partition: the consumer ends with this error. */
  get fatal(): boolean {
    return !this.retriable && !this.notOwned
  }

  override get message(): string {
    const where = this.partitions.length === 0 ? "" : ` for ${describe(this.partitions)}`
    return `Commit refused${where} (${this.reason})${this.detail === undefined ? "" : `: ${this.detail}`}`
  }
}

/**
 * The handler kept failing on a record after every retry of the configured schedule. The partition's position stays
 * at this record: nothing after it was committed. `cause` is the handler's own error, typed.
 *
 * @since 0.1.0
 * @category errors
 */
export class HandlerFailed<out E = unknown> extends Data.TaggedError("HandlerFailed")<{
  readonly topic: string
  readonly partition: number
  readonly offset: bigint
  readonly cause: unknown
}> {
  /**
   * The handler's own error, the one it failed with on its last retry.
   *
   * @since 0.1.0
   */
  declare readonly cause: E

  override get message(): string {
    return `Handler failed on ${this.topic}-${this.partition} at offset ${this.offset} after its retries: ${
      causeText(this.cause)
    }`
  }
}

/**
 * A partition's position is not in its log: nothing was committed or stored for it (`position` is `null`), or the
 * position is below the log's earliest offset (records removed by retention or `deleteRecords`) or above its latest.
 * Raised when the consumer's `offsetReset` is `"none"`; `"earliest"` and `"latest"` move the partition there instead.
 *
 * @since 0.1.0
 * @category errors
 */
export class OffsetOutOfRange extends Schema.TaggedError<OffsetOutOfRange>()("OffsetOutOfRange", {
  topic: Schema.String,
  partition: Schema.Number,
  position: Schema.NullOr(Schema.BigIntFromSelf),
  earliest: Schema.BigIntFromSelf,
  latest: Schema.BigIntFromSelf
}) {
  override get message(): string {
    const where = `${this.topic}-${this.partition}`
    const range = `its log holds offsets ${this.earliest} to ${this.latest}`
    return this.position === null
      ? `No position for ${where} (nothing committed or stored) and offsetReset is "none"; ${range}`
      : `Position ${this.position} of ${where} is out of range: ${range}, and offsetReset is "none"`
  }
}

/**
 * The member lost partitions without a revoke (it was evicted, e.g. paused past its session) and `rejoin` is off.
 *
 * @since 0.1.0
 * @category errors
 */
export class PartitionsLost extends Schema.TaggedError<PartitionsLost>()("PartitionsLost", {
  partitions: Schema.Array(Partition)
}) {
  override get message(): string {
    return `Partitions ${
      describe(this.partitions)
    } were lost without a revoke (the member was evicted) and rejoin is off`
  }
}

/**
 * The work of a revoked partition did not stop when it was interrupted (it sits in an uninterruptible region), and
 * the partition was assigned to this member again. The consumer ends rather than run two workers on one partition.
 *
 * @since 0.1.0
 * @category errors
 */
export class WorkerStuck extends Schema.TaggedError<WorkerStuck>()("WorkerStuck", {
  topic: Schema.String,
  partition: Schema.Number
}) {
  override get message(): string {
    return `The worker of ${this.topic}-${this.partition} did not stop after it was interrupted on revoke, and the ` +
      "partition came back to this member: stopping rather than running two workers on one partition"
  }
}

/**
 * A record could not be decoded by the consumer's schemas. `field` names what did not decode (`"key"`, `"value"` or
 * `"headers"`), `cause` is the Schema's `ParseError` (match on its `issue`, or format it your own way), `reason` and
 * the message give it formatted (it names the path inside the field). It is routed like any failure of the handler,
 * without retries (decoding the same bytes again gives the same answer): under the `stop` route the consumer ends
 * with it in `HandlerFailed`; under `deadLetter` the record is dead-lettered as it was.
 *
 * @since 0.1.0
 * @category errors
 */
export class DecodeFailed extends Schema.TaggedError<DecodeFailed>()("DecodeFailed", {
  topic: Schema.String,
  partition: Schema.Number,
  offset: Schema.BigIntFromSelf,
  field: Schema.String,
  cause: Schema.instanceOf(ParseResult.ParseError)
}) {
  /**
   * The `ParseError`, formatted as a tree.
   *
   * @since 0.1.0
   */
  get reason(): string {
    return ParseResult.TreeFormatter.formatErrorSync(this.cause)
  }

  override get message(): string {
    return `Cannot decode the ${this.field} of ${this.topic}-${this.partition}@${this.offset}: ${this.reason}`
  }
}

/**
 * What a chunk handler (`Consumer.run`) fails with to say which record it failed on: the records of the chunk before
 * `offset` were handled, the one at `offset` failed with `cause`. Without it, a failure route knows only that the
 * chunk failed, and takes the chunk apart, a record per attempt (or, under `atMostOnce`, which hands no record twice,
 * routes every record of the chunk).
 *
 * @since 0.1.0
 * @category errors
 */
export class RecordFailed<out E = unknown> extends Data.TaggedError("RecordFailed")<{
  readonly offset: bigint
  readonly cause: unknown
}> {
  /**
   * The error the record at `offset` failed with.
   *
   * @since 0.1.0
   */
  declare readonly cause: E

  override get message(): string {
    return `Failed on the record at offset ${this.offset}: ${causeText(this.cause)}`
  }
}

/**
 * A chunk handler failed with a `RecordFailed` naming an offset (`offset`) that is not one of the records of the chunk
 * it was given (`first` to `last`): which record failed is not known, so nothing of the chunk can be routed or counted
 * as handled. The consumer ends with it whatever its failure route; the partition's position stays before the chunk.
 * `cause` is the handler's `RecordFailed`.
 *
 * @since 0.2.0
 * @category errors
 */
export class RecordNotInChunk<out E = unknown> extends Data.TaggedError("RecordNotInChunk")<{
  readonly topic: string
  readonly partition: number
  readonly offset: bigint
  readonly first: bigint
  readonly last: bigint
  readonly cause: unknown
}> {
  /**
   * The handler's `RecordFailed`, naming an offset that is not in the chunk.
   *
   * @since 0.2.0
   */
  declare readonly cause: E

  override get message(): string {
    return `The handler of ${this.topic}-${this.partition} failed with RecordFailed naming offset ${this.offset}, ` +
      `which is not a record of its chunk (offsets ${this.first} to ${this.last}): the failed record is unknown`
  }
}

/**
 * A value could not be encoded by the producer's schemas for `topic`; `field` names what (`"key"`, `"value"` or
 * `"headers"`), `cause` is the Schema's `ParseError`, `reason` and the message give it formatted. A schema whose
 * encoded side is not what Kafka carries (bytes, a string or `null`; for headers, bytes or a string per header) fails
 * here too, the `ParseError` naming what it gave instead. Nothing was sent.
 *
 * @since 0.1.0
 * @category errors
 */
export class EncodeFailed extends Schema.TaggedError<EncodeFailed>()("EncodeFailed", {
  topic: Schema.String,
  field: Schema.String,
  cause: Schema.instanceOf(ParseResult.ParseError)
}) {
  /**
   * The `ParseError`, formatted as a tree.
   *
   * @since 0.1.0
   */
  get reason(): string {
    return ParseResult.TreeFormatter.formatErrorSync(this.cause)
  }

  override get message(): string {
    return `Cannot encode the ${this.field} of a record for ${this.topic}: ${this.reason}`
  }
}

/**
 * The failure route's circuit opened: `count` records of one partition in a row kept failing (the last, at `offset`,
 * with `cause`, the handler's own error). The consumer stops rather than drain the partition into the dead-letter
 * topic, which is what a dependency that is down would otherwise do. The record at `offset` was not routed: the
 * partition's position stays before it.
 *
 * @since 0.1.0
 * @category errors
 */
export class CircuitOpen<out E = unknown> extends Data.TaggedError("CircuitOpen")<{
  readonly topic: string
  readonly partition: number
  readonly offset: bigint
  readonly count: number
  readonly cause: unknown
}> {
  /**
   * The handler's own error on the last record of the run of failures.
   *
   * @since 0.1.0
   */
  declare readonly cause: E

  override get message(): string {
    return `${this.count} records of ${this.topic}-${this.partition} in a row failed, the last at offset ${this.offset} ` +
      `(${causeText(this.cause)}): stopping rather than routing them all; the ` +
      "position stays before that record"
  }
}

/**
 * Why a record was not written:
 *
 * - `UnknownTopic`: the topic does not exist (and the cluster does not create topics on first use);
 * - `UnknownPartition`: the record names a partition the topic does not have;
 * - `RecordTooLarge`: the record is larger than the producer's `maxRequestSize` (checked before sending), or than
 *   the broker or the topic accepts (`message.max.bytes`, `max.message.bytes`);
 * - `Fenced`: a newer producer with the same transactional id has started, or the broker no longer knows this
 *   producer's id: this producer can write nothing more;
 * - `Timeout`, `Disconnected`, `NotEnoughReplicas`: the cluster did not acknowledge the record in time, could not be
 *   reached, or had fewer in-sync replicas than `min.insync.replicas`, after every retry. The record may or may not
 *   have been written: sending it again can duplicate it, unless the producer is idempotent and still running;
 * - `Unauthorized`: the topic is not this client's to write;
 * - `Closed`: the producer was shut down before the record was sent;
 * - `BufferFull`: the records waiting to be sent already filled the producer's `bufferMemory`, and stayed so for
 *   `maxBlock`: the record was not sent (the Java client's `buffer.memory` and `max.block.ms`);
 * - `OutcomeUnknown`: the cluster refused another record of the request this record was sent in, and the client
 *   cannot tell whether this one was written (kafkajs keeps one error per produce request): it may have been, and
 *   sending it again can duplicate it;
 * - `Other`: any other refusal; `detail` says what the client said.
 *
 * @since 0.1.0
 * @category models
 */
export type ProduceFailureReason = typeof ProduceFailed.fields.reason.Type

/**
 * A record was not written (or not acknowledged). `topic` and, when one was chosen, `partition` say where it was
 * going; `code` is the broker's error name when the broker refused it.
 *
 * @since 0.1.0
 * @category errors
 */
export class ProduceFailed extends Schema.TaggedError<ProduceFailed>()("ProduceFailed", {
  reason: Schema.Literal(
    "UnknownTopic",
    "UnknownPartition",
    "RecordTooLarge",
    "Fenced",
    "Timeout",
    "Disconnected",
    "NotEnoughReplicas",
    "Unauthorized",
    "Closed",
    "BufferFull",
    "OutcomeUnknown",
    "Other"
  ),
  topic: Schema.String,
  partition: Schema.optional(Schema.Number),
  code: Schema.optional(Schema.String),
  detail: Schema.optional(Schema.String)
}) {
  /** The record may have been written, or may be written if sent again: the cluster was slow or unreachable. */
  get retriable(): boolean {
    return this.reason === "Timeout" || this.reason === "Disconnected" || this.reason === "NotEnoughReplicas"
  }

  override get message(): string {
    const where = this.partition === undefined ? this.topic : `${this.topic}-${this.partition}`
    const code = this.code === undefined ? "" : ` ${this.code}`
    return `Producing to ${where} failed (${this.reason}${code})${this.detail === undefined ? "" : `: ${this.detail}`}`
  }
}

/**
 * A transaction of a transactional producer could not begin, commit or abort:
 *
 * - `Fenced`: a newer producer with the same transactional id has started (its `init` bumped the epoch and aborted
 *   this producer's open transaction): this one can write nothing more, and none of its open transaction lands;
 * - `Aborted`: a send of the transaction failed, so it could not commit: it was aborted, and nothing of it lands;
 * - `Timeout`, `Disconnected`: the cluster did not answer in time or could not be reached; an open transaction the
 *   broker does not hear the end of is aborted after its transaction timeout;
 * - `Other`: any other refusal; `detail` says what the client said. Positions sent with a consumer's group metadata
 *   that the group's coordinator does not take (KIP-447) fail so, with `code` `ILLEGAL_GENERATION` (the member's
 *   generation moved on), `UNKNOWN_MEMBER_ID` (it is not in the group) or `FENCED_INSTANCE_ID` (a newer member took
 *   its instance id); the transaction is aborted, and the producer goes on.
 *
 * `code` is the Kafka protocol error behind the failure, when the driver knows it.
 *
 * @since 0.1.0
 * @category errors
 */
export class TransactionFailed extends Schema.TaggedError<TransactionFailed>()("TransactionFailed", {
  transactionalId: Schema.String,
  operation: Schema.Literal("init", "begin", "sendOffsets", "commit", "abort"),
  reason: Schema.Literal("Fenced", "Aborted", "Timeout", "Disconnected", "Other"),
  code: Schema.optional(Schema.String),
  detail: Schema.optional(Schema.String)
}) {
  override get message(): string {
    const code = this.code === undefined ? "" : ` ${this.code}`
    return `Transaction ${this.operation} of producer "${this.transactionalId}" failed (${this.reason}${code})${
      this.detail === undefined ? "" : `: ${this.detail}`
    }`
  }
}

/**
 * The store could not be read or written. `operation` says which call failed; nothing stored is lost.
 *
 * @since 0.1.0
 * @category errors
 */
export class OffsetStoreError extends Schema.TaggedError<OffsetStoreError>()("OffsetStoreError", {
  store: Schema.String,
  operation: Schema.String,
  reason: Schema.String,
  cause: Schema.optional(Schema.Defect)
}) {
  override get message(): string {
    return `Offset store (${this.store}) ${this.operation} failed: ${this.reason}`
  }
}

/**
 * The unit of work belongs to an owner that is no longer the partition's owner: another member claimed the partition
 * (`OffsetStore.claim`) after this one did, so the unit's owner epoch is not the partition's any more. The unit of
 * work was rolled back: neither its writes nor its position landed. The member has lost the partition (it is a
 * zombie: paused, timed out, rebalanced away) and must give it up, not retry.
 *
 * @since 0.1.0
 * @category errors
 */
export class Fenced extends Schema.TaggedError<Fenced>()("Fenced", {
  groupId: Schema.String,
  topic: Schema.String,
  partition: Schema.Number,
  /** The owner epoch the unit was started with. */
  epoch: Schema.BigIntFromSelf,
  /** The partition's owner epoch in the store when the unit tried to commit; `null` when it was never claimed. */
  currentEpoch: Schema.NullOr(Schema.BigIntFromSelf)
}) {
  override get message(): string {
    return `Fenced on ${this.topic}-${this.partition} (group ${this.groupId}): the unit belongs to owner epoch ${this.epoch}` +
      ` but the partition ${
        this.currentEpoch === null ? "was never claimed" : `was claimed by epoch ${this.currentEpoch}`
      }; another member owns it now`
  }
}
