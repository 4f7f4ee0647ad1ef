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
import { type DriverError, ProduceFailed, type ProduceFailureReason, type TransactionFailed } from "../../KafkaError.js"
import type { Producer, ProducerRecord, TransactionalProducers } from "../../Producer.js"
import {
  causeChain,
  type ClientConfig,
  describe,
  disconnect,
  driverError,
  isRetriable,
  makeClient,
  protocolType
} from "./driver.js"
import * as producer from "../producer/producer.js"

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

/** Refusals that hold for every partition of a request: the producer's id or epoch, or the client's rights. */
const wholeRequest = new Set([
  "INVALID_PRODUCER_EPOCH",
  "PRODUCER_FENCED",
  "TRANSACTION_COORDINATOR_FENCED",
  "INVALID_PRODUCER_ID_MAPPING",
  "CLUSTER_AUTHORIZATION_FAILED",
  "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
])

/**
 * A record of a request that the broker refused for one of its partitions without the client learning which: kafkajs
 * keeps the first partition error of a produce answer and drops the rest of it, though the partitions without an
 * error were written. So the record may have been written, or not.
 *
 * @internal
 */
export const outcomeUnknown = (cause: unknown, topic: string, partition: number, partitions: number) =>
  new ProduceFailed({
    reason: "OutcomeUnknown",
    topic,
    partition,
    detail: `outcome unknown: the broker refused one of the ${partitions} partitions of the request, and kafkajs ` +
      `does not say which, so this record may or may not have been written (${describe(cause)})`
  })

/**
 * The records of one request that kafkajs failed. An error that holds for the whole request (the connection, a
 * timeout, the producer fenced), or the refusal of a request of one partition, is each record's answer. A partition's
 * refusal in a request of several partitions is not: each record gets `outcomeUnknown`, unless the reason already says
 * the record may have been written (`retriable`).
 */
const refused = ({ out, partitionOf, topics }: producer.Layout, error: unknown) => {
  const type = protocolType(error)
  let partitions = 0
  if (type !== undefined && !wholeRequest.has(type)) {
    for (const { indexes } of topics) {
      const seen = new Set<number>()
      for (const i of indexes) seen.add(partitionOf[i]!)
      partitions += seen.size
    }
  }
  for (const { indexes, topic } of topics) {
    for (const i of indexes) {
      const partition = partitionOf[i]!
      const failure = produceFailed(error, topic, partition)
      out[i] = partitions > 1 && !failure.retriable ? outcomeUnknown(error, topic, partition, partitions) : failure
    }
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

/** A topic's partition count and each partition's leader, as the admin client last read them. */
interface TopicMetadata {
  readonly count: number
  /** Per partition, the node id of its leader (-1 without one). */
  readonly leaders: ReadonlyArray<number>
  /** The leader of every partition, when they all have the same one. */
  readonly sole: number | undefined
  readonly at: number
}

/**
 * A batch laid out per request: per leader (as the admin client last saw the leaders), the records of the partitions
 * it leads. kafkajs writes one request per broker and, when one of them fails, fails the whole `sendBatch` with that
 * request's error, whatever the others did; a `sendBatch` per leader answers each on its own. A batch whose
 * partitions all have one leader (one broker, or one partition) is one request, as it is.
 */
const byLeader = (layout: producer.Layout, metadata: ReadonlyMap<string, TopicMetadata>): Array<producer.Layout> => {
  let sole: number | undefined
  let one = true
  for (const { topic } of layout.topics) {
    const leader = metadata.get(topic)?.sole
    if (leader === undefined || (sole !== undefined && leader !== sole)) {
      one = false
      break
    }
    sole = leader
  }
  if (one) return [layout]
  const requests = new Map<number, Array<producer.TopicRecords>>()
  for (const { count, indexes, topic } of layout.topics) {
    const leaders = metadata.get(topic)?.leaders ?? []
    const ofTopic = new Map<number, Array<number>>()
    for (const i of indexes) {
      const leader = leaders[layout.partitionOf[i]!] ?? -1
      let list = ofTopic.get(leader)
      if (list === undefined) {
        ofTopic.set(leader, list = [])
        let topics = requests.get(leader)
        if (topics === undefined) requests.set(leader, topics = [])
        topics.push({ topic, count, indexes: list })
      }
      list.push(i)
    }
  }
  return Array.from(requests.values(), (topics) => ({ out: layout.out, partitionOf: layout.partitionOf, topics }))
}

/**
 * Writes batches with `send`: a kafkajs admin client reads each topic's partition count and leaders (cached for five
 * minutes, and read again before a record is refused for naming a partition the topic does not have), so that
 * partitions are chosen here, records for unknown topics or partitions are refused before they are batched with
 * others, each leader's records are sent on their own (see `byLeader`), and each record's offset is known from its
 * partition's base offset in the answer. `afterFailure` runs once the requests of a batch are answered, when one of
 * them failed, before the batch is answered.
 *
 * @internal
 */
export const makeWriter = (
  admin: Pick<Admin, "fetchTopicMetadata">,
  resolved: producer.Resolved,
  clock: Clock.Clock,
  send: () => SendBatch,
  afterFailure?: () => Promise<void>
) => {
  const cache = new Map<string, TopicMetadata>()
  const readMetadata = (topic: string, now: number) =>
    Effect.tryPromise(() => admin.fetchTopicMetadata({ topics: [topic] })).pipe(
      Effect.map(({ topics }) => {
        const found = topics.find((t) => t.name === topic)
        if (found === undefined || found.partitions.length === 0) return producer.unknownTopic(topic)
        const count = found.partitions.length
        const leaders: Array<number> = new Array(count).fill(-1)
        for (const p of found.partitions) {
          if (p.partitionId >= 0 && p.partitionId < count) leaders[p.partitionId] = p.leader
        }
        const sole = leaders.every((leader) => leader === leaders[0]) ? leaders[0] : undefined
        const metadata: TopicMetadata = { count, leaders, sole, at: now }
        cache.set(topic, metadata)
        return metadata
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
  const requestOf = (batch: ReadonlyArray<ProducerRecord>, layout: producer.Layout) => ({
    topicMessages: messagesOf(batch, layout),
    acks: resolved.acks,
    timeout: resolved.timeoutMillis,
    compression
  })

  // A batch is laid out, sent and answered in plain code around one asynchronous step (kafkajs's send): the
  // writer runs between kafkajs's own work on every batch, where each step of the runtime costs more than alone.
  const sendLaidOut = (
    batch: ReadonlyArray<ProducerRecord>,
    known: ReadonlyMap<string, number | ProduceFailed>,
    metadata: ReadonlyMap<string, TopicMetadata>
  ) => {
    const layout = partitioner(batch, known)
    if (layout.topics.length === 0) return Effect.succeed(layout.out)
    const requests = byLeader(layout, metadata)
    if (requests.length === 1) {
      const request = requestOf(batch, layout)
      return Effect.async<Array<producer.Written>>((resume) => {
        send()(request).then(
          (answer) => resume(Effect.sync(() => answered(layout, answer, resolved.acks))),
          (error: unknown) => {
            const answer = () => resume(Effect.sync(() => refused(layout, error)))
            if (afterFailure === undefined) answer()
            else afterFailure().then(answer, answer)
          }
        )
      })
    }
    return Effect.async<Array<producer.Written>>((resume) => {
      const outcomes: Array<{ readonly answer: Array<KafkaRecordMetadata> } | { readonly error: unknown }> = new Array(
        requests.length
      )
      let pending = requests.length
      let failed = false
      const settled = () => {
        if (--pending > 0) return
        const answer = () =>
          resume(Effect.sync(() => {
            requests.forEach((request, r) => {
              const outcome = outcomes[r]!
              if ("answer" in outcome) answered(request, outcome.answer, resolved.acks)
              else refused(request, outcome.error)
            })
            return layout.out
          }))
        if (!failed || afterFailure === undefined) answer()
        else afterFailure().then(answer, answer)
      }
      requests.forEach((request, r) => {
        send()(requestOf(batch, request)).then(
          (answer) => {
            outcomes[r] = { answer }
            settled()
          },
          (error: unknown) => {
            failed = true
            outcomes[r] = { error }
            settled()
          }
        )
      })
    })
  }

  const write = (batch: ReadonlyArray<ProducerRecord>): Effect.Effect<Array<producer.Written>> =>
    Effect.suspend(() => {
      const now = clock.unsafeCurrentTimeMillis()
      const known = new Map<string, number | ProduceFailed>()
      let stale: Array<string> | undefined
      for (const [topic, partition] of highestPartitions(batch)) {
        const cached = cache.get(topic)
        if (cached === undefined || now - cached.at > METADATA_MAX_AGE || partition >= cached.count) {
          ;(stale ??= []).push(topic)
        } else {
          known.set(topic, cached.count)
        }
      }
      if (stale === undefined) return sendLaidOut(batch, known, cache)
      return Effect.forEach(
        stale,
        (topic) =>
          Effect.map(readMetadata(topic, now), (read) =>
            known.set(topic, read instanceof ProduceFailed ? read : read.count)),
        { discard: true }
      ).pipe(Effect.zipRight(Effect.suspend(() => sendLaidOut(batch, known, cache))))
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
    const send: SendBatch = (request) => current.sendBatch(request)
    // An idempotent kafkajs producer whose send failed gives the failed batch's sequence numbers to the next batch;
    // had the failed batch been written after all (its answer lost), the broker would take the next batch for a
    // retry of it, acknowledge it, and drop it. So after a failed send the producer starts over with a new producer
    // id, once every request of the batch is answered. Batches are written one at a time when idempotent, so nothing
    // else uses the producer meanwhile.
    const startOver = resolved.idempotent
      ? async () => {
        const failed = current
        current = create()
        await failed.disconnect().catch(() => undefined)
        await current.connect().catch(() => undefined)
      }
      : undefined
    const clock = yield* Effect.clock
    return yield* producer.make(resolved, { write: makeWriter(admin, resolved, clock, () => send, startOver) })
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
