/**
 * The producer service on kafkajs: batches laid out per leader (`makeWriter`), refusals classified per record. The
 * transactional producers are in `transactional.ts`.
 */
import * as Clock from "effect/Clock"
import type * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
import type { Admin, RecordMetadata as KafkaRecordMetadata, TopicMessages } from "kafkajs"
import { CompressionTypes } from "kafkajs"
import { type DriverError, ProduceFailed, type ProduceFailureReason } from "../../KafkaError.js"
import type { Producer, ProducerRecord } from "../../Producer.js"
import * as producer from "../producer/producer.js"
import { reasonOfType } from "../producer/reasons.js"
import { type ClientConfig, disconnect, makeClient } from "./driver.js"
import { causeChain, describe, driverError, isRetriable, protocolType } from "./errors.js"
import { explicitPartition, messagesOf } from "./messages.js"

export { reasonOfType } from "../producer/reasons.js"

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

/** kafkajs's `sendBatch`, of a producer or of an open transaction. @internal */
export type SendBatch = (request: {
  readonly topicMessages: Array<TopicMessages>
  readonly acks: -1 | 0 | 1
  readonly timeout: number
  readonly compression: CompressionTypes
}) => Promise<Array<KafkaRecordMetadata>>

/** A kafkajs client, connected, and disconnected when the scope closes. @internal */
export const connected = <A extends { connect: () => Promise<void>; disconnect: () => Promise<void> }>(client: A) =>
  Effect.acquireRelease(
    Effect.as(Effect.tryPromise({ try: () => client.connect(), catch: driverError("connect") }), client),
    () => disconnect(() => client.disconnect())
  )

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

  const readCount = (topic: string, now: number) =>
    Effect.map(readMetadata(topic, now), (read) => read instanceof ProduceFailed ? read : read.count)
  const write = (batch: ReadonlyArray<ProducerRecord>): Effect.Effect<Array<producer.Written>> =>
    Effect.suspend(() =>
      producer.withPartitionCounts(
        batch,
        clock.unsafeCurrentTimeMillis(),
        cache,
        readCount,
        (known) => sendLaidOut(batch, known, cache)
      )
    )
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
