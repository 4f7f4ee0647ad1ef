/**
 * Where a record goes when its handler keeps failing: the consumer's `onFailure` setting.
 *
 * | route | a record that fails after its retries | the consumer |
 * | --- | --- | --- |
 * | `stop` (the default) | stays where it is: the position never passes it | ends with `HandlerFailed` |
 * | `deadLetter({ topic })` | is written to `topic`, as it was, with headers saying where it came from and why | goes on |
 *
 * A dead-lettered record keeps its key, value and headers; the headers in {@link headers} are added. How the write and
 * the position are tied follows the commit policy:
 *
 * - `commitAfter`, `autoCommit`: the dead-letter write is acknowledged before the position passes the record; a crash
 *   in between writes it again (the dead-letter topic can hold it twice), never loses it. The partition does not wait
 *   for the write, and records routed close together are written together, in one `sendAll`: a routed record waits up
 *   to 100 ms for others (at most a tenth of the route's shortest retry delay), or until a commit needs it.
 * - `atMostOnce`: the handler is called once; a record it failed on is dead-lettered without retries, after its
 *   position was committed, so a crash can lose it, as the policy says of every record.
 * - `kafkaTransactional`: the unit is aborted and handled again without the record, which is dead-lettered in the
 *   unit's transaction: the dead-letter write, the other records' writes and the position commit together or not at
 *   all. No record is both handled and dead-lettered. The dead-letter topic holds it at least once: in memory once,
 *   but on a real broker with members killed a few were seen twice, for reasons not yet known.
 * - `transactional`: the unit is rolled back (the record's failed attempts leave no writes) and handled again without
 *   the record; the dead-letter write is acknowledged before the unit commits. A crash, a fence or a revoke between
 *   the two writes it again: the dead-letter topic can hold it twice, never not at all; the store holds the rest once.
 *
 * Decoding failures (`DecodeFailed`) are routed at once, without retries. A circuit stops the consumer with
 * `CircuitOpen` when `maxInARow` records of one partition in a row fail: a dependency that is down should stop the
 * consumer, not drain the topic into the dead-letter topic.
 *
 * The dead-letter write goes through the `Producer` the consumer runs with (under `kafkaTransactional`, the unit's
 * transactional producer). Use acks `"all"` (the default) so that an acknowledged dead-letter record survives a
 * broker's death.
 *
 * @since 0.1.0
 */
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Schema from "effect/Schema"
import type { ConsumerRecord } from "./ConsumerRecord.js"
import { Driver } from "./Driver.js"
import type { CommitFailed, DriverError, ProduceFailed } from "./KafkaError.js"
import * as OffsetBatch from "./OffsetBatch.js"
import { Producer, type ProducerRecord } from "./Producer.js"
import * as TopicPartition from "./TopicPartition.js"

/**
 * @since 0.1.0
 * @category models
 */
export interface Stop {
  readonly _tag: "Stop"
}

/**
 * @since 0.1.0
 * @category models
 */
export interface DeadLetter {
  readonly _tag: "DeadLetter"
  readonly topic: string
  /** The circuit: this many records of one partition failing in a row stop the consumer. */
  readonly maxInARow: number
}

/**
 * @since 0.1.0
 * @category models
 */
export interface RetryTopics {
  readonly _tag: "RetryTopics"
  /** The wait before each retry, in milliseconds: retry `i` reads the topic `<source>-retry-<i>`. */
  readonly delays: ReadonlyArray<number>
  /** Where a record goes after its last retry. */
  readonly deadLetter: string
  /** The circuit: this many records of one partition failing in a row stop the consumer. */
  readonly maxInARow: number
}

/**
 * @since 0.1.0
 * @category models
 */
export type FailureRoute = Stop | DeadLetter | RetryTopics

/**
 * The record stops the consumer (`HandlerFailed`): the default.
 *
 * @since 0.1.0
 * @category constructors
 */
export const stop: Stop = { _tag: "Stop" }

/**
 * Records that keep failing are written to `topic` and the partition goes on; `maxInARow` failing in a row (default
 * 10) stop the consumer with `CircuitOpen` instead. See the module's documentation for the guarantee per policy.
 *
 * @example
 * ```ts
 * import { CommitPolicy, Consumer, FailureRoute } from "effect-kafka-delivery"
 * import * as Platformatic from "effect-kafka-delivery/Platformatic"
 * import * as Effect from "effect/Effect"
 * import * as Layer from "effect/Layer"
 *
 * // A record that still fails after its retries goes to `payments-dlq`, and the partition goes on. The route writes
 * // through a `Producer`, which the consumer's type now requires.
 * const consumer = Consumer.runEach({
 *   groupId: "ledger",
 *   topics: ["payments"],
 *   onFailure: FailureRoute.deadLetter({ topic: "payments-dlq" })
 * }, (record) => record.value === null ? Effect.fail("empty payment" as const) : Effect.void)
 *
 * const brokers = ["127.0.0.1:9092"]
 * const program = consumer.pipe(
 *   Effect.provide(Layer.mergeAll(
 *     CommitPolicy.commitAfter({ maxBatch: 500, maxInterval: "1 second" }),
 *     Platformatic.layer({ brokers }),
 *     Platformatic.layerProducer({ brokers, idempotent: true })
 *   ))
 * )
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const deadLetter = (
  options: { readonly topic: string; readonly maxInARow?: number | undefined }
): DeadLetter => ({
  _tag: "DeadLetter",
  topic: options.topic,
  maxInARow: options.maxInARow ?? 10
})

/**
 * Non-blocking retries: a record that keeps failing is written to the retry topic `<source>-retry-0` with the time
 * it is due (now + `delays[0]`), and the partition goes on at once. The consumer reads the retry topics too (they
 * are added to its subscription): a retry topic's partition waits, paused, until its next record is due (no handler
 * sleeps), then hands it over, with the records due within a twentieth of the shortest delay (at most 50 ms) after
 * it; a record failing there goes to `<source>-retry-1`, and so on; after the last retry, to
 * `deadLetter.topic`. Each write keeps the record's key, value and headers, and the `dead-letter-*` headers name the
 * record's first place (topic, partition, offset) and its attempts so far. The guarantee of each write is that of the
 * dead-letter write under the same policy (see the module's documentation). Create the retry topics beforehand. The
 * circuit (`maxInARow`) watches the consumer's own topics: a retry topic holds nothing but records that failed before.
 *
 * @since 0.1.0
 * @category constructors
 */
export const retryTopics = (
  delays: ReadonlyArray<Duration.DurationInput>,
  options: { readonly deadLetter: { readonly topic: string }; readonly maxInARow?: number | undefined }
): RetryTopics => ({
  _tag: "RetryTopics",
  delays: delays.map((delay) => Duration.toMillis(Duration.decode(delay))),
  deadLetter: options.deadLetter.topic,
  maxInARow: options.maxInARow ?? 10
})

/**
 * The retry topic of a source topic for retry `step` (from 0).
 *
 * @since 0.1.0
 * @category constructors
 */
export const retryTopic = (source: string, step: number): string => `${source}-retry-${step}`

/**
 * The headers a dead-lettered record carries besides its own.
 *
 * @since 0.1.0
 * @category headers
 */
export const headers = {
  topic: "dead-letter-topic",
  partition: "dead-letter-partition",
  offset: "dead-letter-offset",
  timestamp: "dead-letter-timestamp",
  errorTag: "dead-letter-error-tag",
  errorMessage: "dead-letter-error-message",
  attempts: "dead-letter-attempts",
  /** In a retry topic: when the record is due, in milliseconds since the epoch. */
  due: "dead-letter-due"
} as const

const names: ReadonlySet<string> = new Set(Object.values(headers))

/**
 * The `_tag` of a tagged error, else its class name, else its type.
 *
 * @since 0.1.0
 * @category headers
 */
export const errorTag = (error: unknown): string => {
  if (typeof error === "object" && error !== null) {
    const tag = (error as { readonly _tag?: unknown })._tag
    if (typeof tag === "string") return tag
    if (error instanceof Error) return error.name
    return "object"
  }
  return typeof error
}

const errorMessage = (error: unknown): string => {
  const message = error instanceof Error ? error.message : typeof error === "string" ? error : JSON.stringify(error)
  // A header is not a log: a long message is cut, its start kept.
  return message === undefined ? String(error) : message.length > 2_000 ? `${message.slice(0, 2_000)}…` : message
}

/**
 * The dead-letter record of `record`, which failed `attempts` times, the last with `error`.
 *
 * @since 0.1.0
 * @category dead letters
 */
export const deadLetterRecord = (
  topic: string,
  record: ConsumerRecord,
  error: unknown,
  attempts: number,
  due?: number
): ProducerRecord => {
  // A record that comes from a retry topic keeps the place it failed first, and counts its attempts from there.
  const earlier = deadLettered(record)
  const { [headers.due]: _due, ...own } = record.headers
  return {
    topic,
    key: record.key,
    value: record.value,
    headers: {
      ...own,
      [headers.topic]: earlier?.topic ?? record.topic,
      [headers.partition]: String(earlier?.partition ?? record.partition),
      [headers.offset]: (earlier?.offset ?? record.offset).toString(),
      [headers.timestamp]: String(earlier?.timestamp ?? record.timestamp),
      [headers.errorTag]: errorTag(error),
      [headers.errorMessage]: errorMessage(error),
      [headers.attempts]: String(attempts + (earlier?.attempts ?? 0)),
      ...(due === undefined ? {} : { [headers.due]: String(due) })
    }
  }
}

/**
 * When a record of a retry topic is due (milliseconds since the epoch); `undefined` when it says nothing.
 *
 * @since 0.1.0
 * @category dead letters
 */
export const dueOf = (record: ConsumerRecord): number | undefined => {
  const bytes = record.headers[headers.due]
  if (bytes === undefined) return undefined
  const due = Number(decoder.decode(bytes))
  return Number.isFinite(due) ? due : undefined
}

/**
 * What a dead-lettered record says of itself.
 *
 * @since 0.1.0
 * @category models
 */
export interface DeadLettered {
  readonly topic: string
  readonly partition: number
  readonly offset: bigint
  readonly timestamp: number
  readonly errorTag: string
  readonly errorMessage: string
  readonly attempts: number
  /** The record's own headers, without the dead-letter ones. */
  readonly headers: Readonly<Record<string, Uint8Array>>
}

const decoder = new TextDecoder()

/**
 * Reads the dead-letter headers of a record; `undefined` when it has none (or damaged ones).
 *
 * @since 0.1.0
 * @category dead letters
 */
export const deadLettered = (record: ConsumerRecord): DeadLettered | undefined => {
  const text = (name: string) => {
    const bytes = record.headers[name]
    return bytes === undefined ? undefined : decoder.decode(bytes)
  }
  const topic = text(headers.topic)
  const partition = Number(text(headers.partition))
  const offset = text(headers.offset)
  if (topic === undefined || !Number.isInteger(partition) || offset === undefined || !/^\d+$/.test(offset)) {
    return undefined
  }
  const own: Record<string, Uint8Array> = {}
  for (const [name, value] of Object.entries(record.headers)) if (!names.has(name)) own[name] = value
  return {
    topic,
    partition,
    offset: BigInt(offset),
    timestamp: Number(text(headers.timestamp) ?? "0"),
    errorTag: text(headers.errorTag) ?? "",
    errorMessage: text(headers.errorMessage) ?? "",
    attempts: Number(text(headers.attempts) ?? "0"),
    headers: own
  }
}

/**
 * What a replay did: records written back to their source topics, records of the dead-letter topic that carried no
 * dead-letter headers (written there by something else), which were left where they are, and records removed from
 * the dead-letter topic (by retention or `deleteRecords`) before they could be replayed.
 *
 * @since 0.1.0
 * @category models
 */
export interface Replayed {
  readonly replayed: number
  readonly foreign: number
  /**
   * Offsets of the dead-letter topic, up to where the replay ended, that its log no longer held when the replay came
   * to them: the records there were removed before anyone replayed them. A transaction's marker takes an offset too,
   * so this is the most records that can have been lost. The replay went on from the log's earliest offset.
   *
   * @since 0.2.0
   */
  readonly removed: number
}

/**
 * A replay stopped before the end of its dead-letter topic because partitions it had not finished left it: revoked
 * (another member joined the group `groupId`) or lost (the member was evicted, after a pause longer than its session
 * say). What it replayed until then is committed: running the replay again goes on from there. `replayed`, `foreign`
 * and `removed` count what it did before it stopped.
 *
 * @since 0.2.0
 * @category errors
 */
export class ReplayStopped extends Schema.TaggedError<ReplayStopped>()("ReplayStopped", {
  topic: Schema.String,
  groupId: Schema.String,
  reason: Schema.Literal("Revoked", "Lost"),
  partitions: Schema.Array(Schema.Struct({ topic: Schema.String, partition: Schema.Number })),
  replayed: Schema.Number,
  foreign: Schema.Number,
  removed: Schema.Number
}) {
  override get message(): string {
    const which = this.partitions.map((tp) => `${tp.topic}-${tp.partition}`).join(", ")
    const why = this.reason === "Revoked"
      ? `were revoked: another member joined the group "${this.groupId}"`
      : "were lost: the member was evicted from its group"
    return `The replay of ${this.topic} stopped: partitions ${which} ${why}. The ${this.replayed} record(s) replayed ` +
      "before are committed; run the replay again, alone in its group, to go on"
  }
}

/**
 * Writes the records of a dead-letter topic back to their source topics (the partition they came from, their own key,
 * value and headers), for after the cause was fixed. Reads the topic from the position the group `groupId` committed
 * (from the start the first time) up to its end as the replay began, commits as it goes, and stops there: run again,
 * it replays only what was dead-lettered since. `filter` picks the records to replay; the others are passed over.
 * A crash repeats at most the records written since the last commit (at-least-once).
 *
 * Records removed from the topic before the replay came to them (retention, `deleteRecords`) cannot be replayed: the
 * replay goes on from the log's earliest offset, counts them in `removed` and logs a warning naming the partition.
 * The replay must be its group's only member: if a partition it has not finished is revoked (another member joined)
 * or lost (it was evicted), it stops with `ReplayStopped`, having committed what it replayed, rather than leave part
 * of the topic to a member that may not be replaying it.
 *
 * @since 0.1.0
 * @category dead letters
 */
export const replay = (options: {
  readonly topic: string
  readonly groupId: string
  readonly filter?: ((letter: DeadLettered) => boolean) | undefined
}): Effect.Effect<Replayed, DriverError | CommitFailed | ProduceFailed | ReplayStopped, Driver | Producer> =>
  Effect.scoped(Effect.gen(function*() {
    const driver = yield* Driver
    const producer = yield* Producer
    const session = yield* driver.connect({
      groupId: options.groupId,
      clientId: `${options.groupId}-replay`,
      subscription: { _tag: "Topics", topics: [options.topic] },
      maxPollRecords: 500,
      pollTimeout: Duration.millis(100),
      sessionTimeout: Duration.seconds(10),
      rebalanceTimeout: Duration.seconds(30),
      isolationLevel: "read_committed"
    })
    // Where each partition ends for this replay: its latest offset when the replay first owned it.
    const ends = new Map<string, bigint>()
    const positions = new Map<string, bigint>()
    let assigned = false
    let replayed = 0
    let foreign = 0
    let removed = 0n
    const finished = (k: string) => (positions.get(k) ?? 0n) >= (ends.get(k) ?? 0n)
    const caughtUp = () => assigned && [...ends.keys()].every(finished)
    /** Partitions that left the replay: finished ones are let go; any other stops it. */
    const left = (reason: "Revoked" | "Lost", partitions: ReadonlyArray<TopicPartition.TopicPartition>) =>
      Effect.suspend(() => {
        const unfinished = partitions.filter((tp) => {
          const k = TopicPartition.key(tp)
          return ends.has(k) && !finished(k)
        })
        if (unfinished.length > 0) {
          return Effect.fail(
            new ReplayStopped({
              topic: options.topic,
              groupId: options.groupId,
              reason,
              partitions: unfinished.map((tp) => ({ topic: tp.topic, partition: tp.partition })),
              replayed,
              foreign,
              removed: Number(removed)
            })
          )
        }
        for (const tp of partitions) {
          ends.delete(TopicPartition.key(tp))
          positions.delete(TopicPartition.key(tp))
        }
        return Effect.void
      })
    while (!caughtUp()) {
      for (const event of yield* session.poll) {
        if (event._tag === "Assigned") {
          assigned = true
          const committed = yield* session.committed(event.partitions)
          const offsets = yield* session.offsets(event.partitions)
          for (const tp of event.partitions) {
            const k = TopicPartition.key(tp)
            const range = offsets.get(k)
            const start = committed.get(k) ?? range?.earliest ?? 0n
            // It reads read_committed: the end it can reach is the last stable offset.
            if (!ends.has(k)) ends.set(k, range?.lastStable ?? 0n)
            positions.set(k, start)
            yield* session.seek(tp, start)
          }
        } else if (event._tag === "Records") {
          const writes: Array<ProducerRecord> = []
          for (const record of event.records) {
            const letter = deadLettered(record)
            if (letter === undefined) {
              foreign++
              continue
            }
            if (options.filter !== undefined && !options.filter(letter)) continue
            writes.push({
              topic: letter.topic,
              partition: letter.partition,
              key: record.key,
              value: record.value,
              headers: letter.headers
            })
          }
          if (writes.length > 0) yield* producer.sendAll(writes)
          replayed += writes.length
          yield* session.commit(OffsetBatch.of(event.partition, event.next))
          positions.set(TopicPartition.key(event.partition), event.next)
        } else if (event._tag === "OutOfRange") {
          // The log no longer holds the position (retention, deleteRecords; or it was truncated below it): what it
          // held is gone, the rest is replayed from the earliest offset, which is committed so that the next replay
          // does not count the same loss again.
          const tp = event.partition
          const k = TopicPartition.key(tp)
          const earliest = (yield* session.offsets([tp])).get(k)?.earliest ?? 0n
          const end = ends.get(k) ?? 0n
          const lost = (earliest < end ? earliest : end) - event.position
          if (lost > 0n) removed += lost
          yield* Effect.logWarning(
            `${k}: replay position ${event.position} is outside the log, which begins at ${earliest}; ` +
              (lost > 0n
                ? `${lost} offset(s) were removed before they were replayed. Going on from ${earliest}`
                : `going on from ${earliest}`)
          )
          yield* session.seek(tp, earliest)
          yield* session.commit(OffsetBatch.of(tp, earliest))
          positions.set(k, earliest)
        } else if (event._tag === "Revoked") {
          // Everything replayed is committed already: releasing loses nothing, and does not hold up the next owner.
          yield* event.release
          yield* left("Revoked", event.partitions)
        } else {
          yield* left("Lost", event.partitions)
        }
      }
    }
    if (foreign > 0) {
      yield* Effect.logWarning(
        `${foreign} record(s) of ${options.topic} had no dead-letter headers and were not replayed`
      )
    }
    return { replayed, foreign, removed: Number(removed) }
  }))
