import * as Clock from "effect/Clock"
import type * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
import type {
  Admin,
  Message,
  Producer as KafkaProducer,
  RecordMetadata as KafkaRecordMetadata,
  TopicMessages,
  Transaction
} from "kafkajs"
import { CompressionTypes } from "kafkajs"
import { type DriverError, ProduceFailed, type ProduceFailureReason, type TransactionFailed } from "../KafkaError.js"
import type { Producer, ProducerRecord, TransactionalProducers } from "../Producer.js"
import {
  causeChain,
  type ClientConfig,
  describe,
  disconnect,
  driverError,
  isRetriable,
  makeClient,
  protocolType
} from "./kafkajs.js"
import * as producer from "./producer.js"

/** How long a topic's partition count is trusted before it is read again (the Java client's `metadata.max.age.ms`). */
const METADATA_MAX_AGE = 5 * 60 * 1000

const reasonOfType = (type: string | undefined): ProduceFailureReason | undefined => {
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

/**
 * A refused write, classified by the protocol error inside it, then by the kafkajs error around it.
 *
 * @internal
 */
export const produceFailed = (cause: unknown, topic: string, partition: number | undefined): ProduceFailed => {
  const type = protocolType(cause)
  const names = causeChain(cause).map((e) => e.name)
  const reason: ProduceFailureReason = reasonOfType(type) ??
    (names.includes("KafkaJSRequestTimeoutError")
      ? "Timeout"
      : isRetriable(cause)
      ? "Disconnected"
      : "Other")
  return new ProduceFailed({
    reason,
    topic,
    ...(partition === undefined ? {} : { partition }),
    ...(type === undefined ? {} : { code: type }),
    detail: describe(cause)
  })
}

/** Bytes as kafkajs writes them: a string as it is (kafkajs encodes it into the request), bytes as a `Buffer`. */
const toKafka = (bytes: Uint8Array | string): Buffer | string =>
  typeof bytes === "string" || Buffer.isBuffer(bytes)
    ? bytes
    : Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength)

const isKafkaBytes = (bytes: Uint8Array | string | null | undefined): boolean =>
  bytes === undefined || bytes === null || typeof bytes === "string" || Buffer.isBuffer(bytes)

/** A record kafkajs can take as its message as it is: strings or `Buffer`s, no timestamp (kafkajs ignores `topic`). */
const isMessage = (record: ProducerRecord): record is ProducerRecord & Message =>
  record.timestamp === undefined && isKafkaBytes(record.value) && isKafkaBytes(record.key) &&
  (record.headers === undefined || Object.values(record.headers).every(isKafkaBytes))

/** The message kafkajs sends for a record: the record itself when it names its partition and kafkajs can take it. */
const toMessage = (record: ProducerRecord, partition: number): Message => {
  if (record.partition === partition && isMessage(record)) return record
  const message: Message = {
    partition,
    key: record.key === undefined || record.key === null ? null : toKafka(record.key),
    value: record.value === null ? null : toKafka(record.value)
  }
  if (record.headers !== undefined) {
    const headers: Record<string, Buffer | string> = {}
    for (const name in record.headers) {
      const value = record.headers[name]
      if (value !== undefined) headers[name] = toKafka(value)
    }
    message.headers = headers
  }
  if (record.timestamp !== undefined) message.timestamp = String(record.timestamp)
  return message
}

/** kafkajs's partitioner is never asked: every message names its partition. */
const explicitPartition = () => ({ message }: { readonly message: Message }) => message.partition ?? 0

/** kafkajs's `sendBatch`, of a producer or of an open transaction. */
type SendBatch = (request: {
  readonly topicMessages: Array<TopicMessages>
  readonly acks: -1 | 0 | 1
  readonly timeout: number
  readonly compression: CompressionTypes
}) => Promise<Array<KafkaRecordMetadata>>

const connected = <A extends { connect: () => Promise<void>; disconnect: () => Promise<void> }>(client: A) =>
  Effect.acquireRelease(
    Effect.as(Effect.tryPromise({ try: () => client.connect(), catch: driverError("connect") }), client),
    () => disconnect(() => client.disconnect())
  )

/** Each topic of a batch, with the highest partition a record of it names (-1 for none). */
const highestPartitions = (batch: ReadonlyArray<ProducerRecord>): Map<string, number> => {
  const highest = new Map<string, number>()
  let last: string | undefined
  let lastHighest = -1
  for (let i = 0; i < batch.length; i++) {
    const record = batch[i]!
    if (record.topic !== last) {
      if (last !== undefined) highest.set(last, lastHighest)
      last = record.topic
      lastHighest = highest.get(last) ?? -1
    }
    if (record.partition !== undefined && record.partition > lastHighest) lastHighest = record.partition
  }
  if (last !== undefined) highest.set(last, lastHighest)
  return highest
}

/**
 * Per topic its messages in the order sent (so, per partition, its records in that order). A batch of one topic whose
 * records kafkajs can all take as they are is its own messages (kafkajs only reads them).
 */
const messagesOf = (batch: ReadonlyArray<ProducerRecord>, { partitionOf, topics }: producer.Layout) => {
  const topicMessages: Array<TopicMessages> = new Array(topics.length)
  for (let t = 0; t < topics.length; t++) {
    const { indexes, topic } = topics[t]!
    // Places that are all of the batch are 0 to n - 1, so a record's message goes at its own place.
    const all = indexes.length === batch.length
    let messages: Array<Message> | undefined
    for (let j = 0; j < indexes.length; j++) {
      const i = indexes[j]!
      const record = batch[i]!
      const message = toMessage(record, partitionOf[i]!)
      if (messages === undefined) {
        if (all && (message as unknown) === record) continue
        messages = new Array(indexes.length)
        for (let k = 0; k < j; k++) messages[k] = batch[indexes[k]!] as unknown as Message
      }
      messages[j] = message
    }
    topicMessages[t] = { topic, messages: messages ?? (batch as unknown as Array<Message>) }
  }
  return topicMessages
}

/** Every record of a batch kafkajs refused as a whole gets the refusal. */
const refused = ({ out, partitionOf, topics }: producer.Layout, error: unknown) => {
  for (const { indexes, topic } of topics) {
    for (const i of indexes) out[i] = produceFailed(error, topic, partitionOf[i]!)
  }
  return out
}

/** Each written record's metadata, from its partition's base offset in the broker's answer. */
const answered = (
  { out, partitionOf, topics }: producer.Layout,
  answer: ReadonlyArray<KafkaRecordMetadata>,
  acks: -1 | 0 | 1
) => {
  const byTopic = new Map<string, Map<number, KafkaRecordMetadata>>()
  for (const m of answer) {
    let partitions = byTopic.get(m.topicName)
    if (partitions === undefined) byTopic.set(m.topicName, partitions = new Map())
    partitions.set(m.partition, m)
  }
  for (const { count, indexes, topic } of topics) {
    const partitions = byTopic.get(topic)
    // Per partition the offset of its next record in this batch, or why its records were not written.
    const next: Array<bigint | ProduceFailed | undefined> = new Array(count)
    for (let j = 0; j < indexes.length; j++) {
      const i = indexes[j]!
      const partition = partitionOf[i]!
      if (acks === 0) {
        out[i] = { topic, partition, offset: -1n }
        continue
      }
      let offset = next[partition]
      if (offset === undefined) {
        const m = partitions?.get(partition)
        offset = m !== undefined && m.baseOffset !== undefined && Number(m.errorCode) === 0
          ? BigInt(m.baseOffset)
          : new ProduceFailed({
            reason: "Other",
            topic,
            partition,
            detail: m === undefined
              ? "the broker did not answer for the partition"
              : `the broker answered error code ${m.errorCode}`
          })
      }
      if (typeof offset === "bigint") {
        out[i] = { topic, partition, offset }
        next[partition] = offset + 1n
      } else {
        out[i] = offset
        next[partition] = offset
      }
    }
  }
  return out
}

/**
 * Writes batches with `send`: a kafkajs admin client reads each topic's partition count (cached for five minutes,
 * and read again before a record is refused for naming a partition the topic does not have), so that partitions are
 * chosen here, records for unknown topics or partitions are refused before they are batched with others, and each
 * record's offset is known from its partition's base offset in the answer.
 */
const makeWriter = (admin: Admin, resolved: producer.Resolved, clock: Clock.Clock, send: () => SendBatch) => {
  const counts = new Map<string, { readonly count: number; readonly at: number }>()
  const readCount = (topic: string, now: number) =>
    Effect.tryPromise(() => admin.fetchTopicMetadata({ topics: [topic] })).pipe(
      Effect.map(({ topics }) => {
        const found = topics.find((t) => t.name === topic)
        if (found === undefined || found.partitions.length === 0) return producer.unknownTopic(topic)
        counts.set(topic, { count: found.partitions.length, at: now })
        return found.partitions.length
      }),
      Effect.catchAll(({ error }) =>
        Effect.succeed(
          protocolType(error) === "UNKNOWN_TOPIC_OR_PARTITION"
            ? producer.unknownTopic(topic)
            : produceFailed(error, topic, undefined)
        )
      )
    )
  const partitioner = producer.makePartitioner()
  const compression = resolved.compression === "gzip" ? CompressionTypes.GZIP : CompressionTypes.None

  // A batch is laid out, sent and answered in plain code around one asynchronous step (kafkajs's send): the
  // writer runs between kafkajs's own work on every batch, where each step of the runtime costs more than alone.
  const sendLaidOut = (batch: ReadonlyArray<ProducerRecord>, known: ReadonlyMap<string, number | ProduceFailed>) => {
    const layout = partitioner(batch, known)
    if (layout.topics.length === 0) return Effect.succeed(layout.out)
    const request = {
      topicMessages: messagesOf(batch, layout),
      acks: resolved.acks,
      timeout: resolved.timeoutMillis,
      compression
    }
    return Effect.async<Array<producer.Written>>((resume) => {
      send()(request).then(
        (answer) => resume(Effect.sync(() => answered(layout, answer, resolved.acks))),
        (error: unknown) => resume(Effect.sync(() => refused(layout, error)))
      )
    })
  }

  const write = (batch: ReadonlyArray<ProducerRecord>): Effect.Effect<Array<producer.Written>> =>
    Effect.suspend(() => {
      const now = clock.unsafeCurrentTimeMillis()
      const known = new Map<string, number | ProduceFailed>()
      let stale: Array<string> | undefined
      for (const [topic, partition] of highestPartitions(batch)) {
        const cached = counts.get(topic)
        if (cached === undefined || now - cached.at > METADATA_MAX_AGE || partition >= cached.count) {
          ;(stale ??= []).push(topic)
        } else {
          known.set(topic, cached.count)
        }
      }
      if (stale === undefined) return sendLaidOut(batch, known)
      return Effect.forEach(stale, (topic) => Effect.map(readCount(topic, now), (count) => known.set(topic, count)), {
        discard: true
      }).pipe(Effect.zipRight(Effect.suspend(() => sendLaidOut(batch, known))))
    })
  return write
}

/**
 * The producer service on kafkajs (see `makeWriter` for how batches are written).
 *
 * @internal
 */
export const make = (
  client: ClientConfig,
  resolved: producer.Resolved,
  retries: number | undefined
): Effect.Effect<Context.Tag.Service<typeof Producer>, DriverError, Scope.Scope> =>
  Effect.gen(function*() {
    const kafka = makeClient(client)
    const admin = yield* connected(kafka.admin())
    const create = () =>
      kafka.producer({
        idempotent: resolved.idempotent,
        allowAutoTopicCreation: false,
        createPartitioner: explicitPartition,
        ...(retries === undefined ? {} : { retry: { ...client.kafka.retry, retries } })
      })
    let current = create()
    yield* Effect.tryPromise({ try: () => current.connect(), catch: driverError("connect") })
    yield* Effect.addFinalizer(() => disconnect(() => current.disconnect()))
    // An idempotent kafkajs producer whose send failed gives the failed batch's sequence numbers to the next batch;
    // had the failed batch been written after all (its answer lost), the broker would take the next batch for a
    // retry of it, acknowledge it, and drop it. So after a failed send the producer starts over with a new producer
    // id. Writes are one at a time when idempotent, so nothing else uses the producer meanwhile.
    const send: SendBatch = (request) =>
      current.sendBatch(request).catch(async (error: unknown) => {
        if (resolved.idempotent) {
          const failed = current
          current = create()
          await failed.disconnect().catch(() => undefined)
          await current.connect().catch(() => undefined)
        }
        throw error
      })
    const clock = yield* Effect.clock
    return yield* producer.make(resolved, { write: makeWriter(admin, resolved, clock, () => send) })
  })

const transactionFailed = (transactionalId: string, operation: TransactionFailed["operation"]) => (cause: unknown) => {
  const type = protocolType(cause)
  const names = causeChain(cause).map((e) => e.name)
  const reason: TransactionFailed["reason"] = reasonOfType(type) === "Fenced"
    ? "Fenced"
    : names.includes("KafkaJSRequestTimeoutError") || type === "REQUEST_TIMED_OUT"
    ? "Timeout"
    : isRetriable(cause)
    ? "Disconnected"
    : "Other"
  return producer.transactionFailed(transactionalId, operation, reason, describe(cause))
}

/**
 * Transactional producers on kafkajs, sharing one kafkajs client and admin connection. Each is one kafkajs producer
 * with its transactional id; its `init` opens and aborts an empty transaction, which makes kafkajs send
 * InitProducerId (bumping the id's epoch, fencing earlier producers and aborting their open transaction) and nothing
 * else.
 *
 * @internal
 */
export const makeTransactionClients = (
  client: ClientConfig,
  resolved: producer.Resolved,
  transactionTimeout: number,
  retries: number | undefined
): Effect.Effect<Context.Tag.Service<typeof TransactionalProducers>, DriverError, Scope.Scope> =>
  Effect.gen(function*() {
    const kafka = makeClient(client)
    const admin = yield* connected(kafka.admin())
    const make = (transactionalId: string) =>
      Effect.gen(function*() {
        const create = () =>
          kafka.producer({
            transactionalId,
            transactionTimeout,
            idempotent: true,
            maxInFlightRequests: 1,
            allowAutoTopicCreation: false,
            createPartitioner: explicitPartition,
            ...(retries === undefined ? {} : { retry: { ...client.kafka.retry, retries } })
          })
        // `init` starts a kafkajs producer of its own each time: kafkajs sends InitProducerId once per producer, and
        // a producer whose send failed would give the failed batch's sequence numbers to the next one.
        let kafkaProducer: KafkaProducer | undefined
        yield* Effect.addFinalizer(() =>
          kafkaProducer === undefined ? Effect.void : disconnect(() => kafkaProducer!.disconnect())
        )
        let current: Transaction | undefined
        const send: SendBatch = (request) =>
          current === undefined ? Promise.reject(new Error("no open transaction")) : current.sendBatch(request)
        const write = makeWriter(admin, resolved, yield* Effect.clock, () => send)
        const begin = (operation: "init" | "begin") =>
          Effect.tryPromise({
            try: () => kafkaProducer!.transaction(),
            catch: transactionFailed(transactionalId, operation)
          })
        const start = Effect.suspend(() => {
          const previous = kafkaProducer
          const next = create()
          kafkaProducer = next
          current = undefined
          return (previous === undefined ? Effect.void : disconnect(() => previous.disconnect())).pipe(
            Effect.zipRight(
              Effect.tryPromise({ try: () => next.connect(), catch: transactionFailed(transactionalId, "init") })
            )
          )
        })
        const txnClient: producer.TxnClient = {
          transactionalId,
          init: start.pipe(
            Effect.zipRight(begin("init")),
            Effect.flatMap((txn) =>
              Effect.tryPromise({ try: () => txn.abort(), catch: transactionFailed(transactionalId, "init") })
            )
          ),
          begin: Effect.map(begin("begin"), (txn): producer.TxnSession => {
            current = txn
            const end = (operation: "commit" | "abort") =>
              Effect.tryPromise({
                try: () => operation === "commit" ? txn.commit() : txn.abort(),
                catch: transactionFailed(transactionalId, operation)
              }).pipe(Effect.ensuring(Effect.sync(() => {
                if (current === txn) current = undefined
              })))
            return {
              write,
              sendOffsets: (groupId, positions) =>
                Effect.tryPromise({
                  try: () =>
                    txn.sendOffsets({
                      consumerGroupId: groupId,
                      topics: Array.from(
                        producer.groupBy(positions, (p) => p.topic),
                        ([topic, list]) => ({
                          topic,
                          partitions: list.map((p) => ({ partition: p.partition, offset: String(p.next) }))
                        })
                      )
                    }),
                  catch: transactionFailed(transactionalId, "sendOffsets")
                }),
              commit: end("commit"),
              abort: end("abort")
            }
          })
        }
        return yield* producer.makeTransactional(resolved, txnClient)
      })
    return { make }
  })
