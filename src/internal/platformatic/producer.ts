/**
 * The producer service on @platformatic/kafka: the library chooses each record's partition, the client writes each
 * leader's records in a request of their own and answers with each partition's base offset, from which each record's
 * offset is known. A failed send of an idempotent producer makes the client start over with a new producer id, so
 * that a batch whose answer was lost cannot make the broker drop the next one as its retry.
 */
import { Buffer } from "node:buffer"
import { Producer as Client } from "@platformatic/kafka"
import type * as Clock from "effect/Clock"
import type * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
import { type DriverError, ProduceFailed, type ProduceFailureReason } from "../../KafkaError.js"
import type { Producer, ProducerRecord } from "../../Producer.js"
import * as producer from "../producer/producer.js"
import { reasonOfType } from "../producer/reasons.js"
import type { ClientOptions } from "./config.js"
import { apiIds, describe, driverError, flatten, isRetriable, isUnknownTopic } from "./errors.js"

/** A refused write, classified by the protocol error inside it, then by the client's own. @internal */
export const produceFailed = (cause: unknown, topic: string, partition: number | undefined): ProduceFailed => {
  const ids = apiIds(cause)
  const reasons = ids.map(reasonOfType).filter((r): r is ProduceFailureReason => r !== undefined)
  const timeout = flatten(cause).some((e) => typeof e.message === "string" && /timeout|timed out/i.test(e.message))
  const reason: ProduceFailureReason = reasons[0] ??
    (timeout ? "Timeout" : isRetriable(cause) ? "Disconnected" : "Other")
  return new ProduceFailed({
    reason,
    topic,
    ...(partition === undefined ? {} : { partition }),
    ...(ids.length === 0 ? {} : { code: ids[0]! }),
    detail: describe(cause)
  })
}

const toBuffer = (value: Uint8Array | string): Buffer =>
  typeof value === "string"
    ? Buffer.from(value)
    : Buffer.isBuffer(value)
    ? value
    : Buffer.from(value.buffer, value.byteOffset, value.byteLength)

/** A message as the client sends it. @internal */
export interface Message {
  topic: string
  partition: number
  key?: Buffer
  value?: Buffer
  headers?: Map<Buffer, Buffer>
  timestamp?: bigint
}

const toMessage = (record: ProducerRecord, partition: number): Message => {
  const message: Message = { topic: record.topic, partition }
  if (record.key !== undefined && record.key !== null) message.key = toBuffer(record.key)
  if (record.value !== null) message.value = toBuffer(record.value)
  if (record.headers !== undefined) {
    // Header names as bytes too: the client's default serializers take nothing else (a name given as a string makes
    // its send never answer).
    const headers = new Map<Buffer, Buffer>()
    for (const name in record.headers) headers.set(Buffer.from(name), toBuffer(record.headers[name]!))
    message.headers = headers
  }
  if (record.timestamp !== undefined) message.timestamp = BigInt(record.timestamp)
  return message
}

/** A partition's base offset in a send's answer. @internal */
export interface Offset {
  readonly topic: string
  readonly partition: number
  readonly offset: bigint
}

/** Each record's answer: its offset from its partition's base offset, or why it was not written. */
const settle = (
  { out, partitionOf, topics }: producer.Layout,
  written: ReadonlyArray<Offset> | undefined,
  acks: -1 | 0 | 1,
  error: unknown
) => {
  const base = new Map<string, bigint>()
  for (const { offset, partition, topic } of written ?? []) base.set(`${topic}\u0000${partition}`, offset)
  if (acks === 0 && error === undefined) {
    for (const { indexes, topic } of topics) {
      for (const i of indexes) out[i] = { topic, partition: partitionOf[i]!, offset: -1n }
    }
    return out
  }
  let unanswered = 0
  if (error !== undefined) {
    const seen = new Set<string>()
    for (const { indexes, topic } of topics) {
      for (const i of indexes) {
        const key = `${topic}\u0000${partitionOf[i]}`
        if (!base.has(key)) seen.add(key)
      }
    }
    unanswered = seen.size
  }
  for (const { indexes, topic } of topics) {
    // Per partition of the topic, the next record's offset; `null` once the partition is known to be unanswered.
    const next: Array<bigint | null | undefined> = []
    for (const i of indexes) {
      const partition = partitionOf[i]!
      let offset = next[partition]
      if (offset === undefined) {
        const found = base.get(`${topic}\u0000${partition}`)
        offset = found !== undefined && found >= 0n ? found : null
      }
      if (offset !== null) {
        out[i] = { topic, partition, offset }
        next[partition] = offset + 1n
        continue
      }
      next[partition] = null
      if (error === undefined) {
        out[i] = new ProduceFailed({
          reason: "Other",
          topic,
          partition,
          detail: "the broker did not answer for the partition"
        })
      } else {
        const failure = produceFailed(error, topic, partition)
        // A partition's refusal in a request of several: the client fails the send without saying which partitions
        // of the failed request were written, so a record the reason does not already say may be written is unknown.
        out[i] = unanswered > 1 && !failure.retriable
          ? new ProduceFailed({
            reason: "OutcomeUnknown",
            topic,
            partition,
            detail: `outcome unknown: the send failed for one of ${unanswered} partitions, so this record may or ` +
              `may not have been written (${describe(error)})`
          })
          : failure
      }
    }
  }
  return out
}

/** How a batch's messages are sent: by the producer, or in its open transaction. @internal */
export type Send = (messages: Array<Message>) => Promise<{ readonly offsets?: ReadonlyArray<Offset> | undefined }>

/**
 * Writes batches with `send`: the client's metadata gives each topic's partition count (`withPartitionCounts` says
 * when it is read again), so that partitions are chosen here.
 *
 * @internal
 */
export const makeWriter = (
  p: Pick<Client, "metadata">,
  resolved: producer.Resolved,
  clock: Clock.Clock,
  send: () => Send
) => {
  const counts = new Map<string, { readonly count: number; readonly at: number }>()
  const readCount = (topic: string, now: number) =>
    Effect.tryPromise(() => p.metadata({ topics: [topic], forceUpdate: true, retries: 0 })).pipe(
      Effect.map((metadata): number | ProduceFailed => {
        const found = metadata.topics.get(topic)
        if (found === undefined || found.partitionsCount === 0) return producer.unknownTopic(topic)
        counts.set(topic, { count: found.partitionsCount, at: now })
        return found.partitionsCount
      }),
      Effect.catchAll(({ error }) =>
        Effect.succeed(isUnknownTopic(error) ? producer.unknownTopic(topic) : produceFailed(error, topic, undefined))
      )
    )
  const partitioner = producer.makePartitioner()
  const sendLaidOut = (batch: ReadonlyArray<ProducerRecord>, known: ReadonlyMap<string, number | ProduceFailed>) => {
    const layout = partitioner(batch, known)
    if (layout.topics.length === 0) return Effect.succeed(layout.out)
    const { partitionOf, topics } = layout
    let size = 0
    for (const { indexes } of topics) size += indexes.length
    const messages: Array<Message> = new Array(size)
    let m = 0
    for (const { indexes } of topics) {
      for (let k = 0; k < indexes.length; k++) {
        const i = indexes[k]!
        messages[m++] = toMessage(batch[i]!, partitionOf[i]!)
      }
    }
    return Effect.async<Array<producer.Written>>((resume) => {
      send()(messages).then(
        (result) => resume(Effect.sync(() => settle(layout, result.offsets, resolved.acks, undefined))),
        (error: unknown) => {
          const produced = (error as { readonly produced?: { readonly offsets?: ReadonlyArray<Offset> } }).produced
          resume(Effect.sync(() => settle(layout, produced?.offsets, resolved.acks, error)))
        }
      )
    })
  }
  return (batch: ReadonlyArray<ProducerRecord>): Effect.Effect<Array<producer.Written>> =>
    Effect.suspend(() =>
      producer.withPartitionCounts(
        batch,
        clock.unsafeCurrentTimeMillis(),
        counts,
        readCount,
        (known) => sendLaidOut(batch, known)
      )
    )
}

/** A client, closed when the scope closes. @internal */
export const closing = <A extends { close: () => Promise<void> }>(client: A) =>
  Effect.as(
    Effect.addFinalizer(() =>
      Effect.tryPromise({ try: () => client.close(), catch: driverError("close") }).pipe(
        Effect.interruptible,
        Effect.timeoutOption("10 seconds"),
        Effect.ignore
      )
    ),
    client
  )

/** The producer service on @platformatic/kafka. @internal */
export const make = (
  client: ClientOptions,
  clientId: string,
  resolved: producer.Resolved
): Effect.Effect<Context.Tag.Service<typeof Producer>, DriverError, Scope.Scope> =>
  Effect.gen(function*() {
    const p = yield* closing(
      new Client({
        ...client,
        clientId,
        idempotent: resolved.idempotent,
        acks: resolved.acks,
        compression: resolved.compression,
        autocreateTopics: false
      })
    )
    // Reaches the cluster once, so that a broker that does not answer fails the layer. (Not a metadata read of no
    // topic: after one, the client never answers a read of a topic that does not exist.)
    yield* Effect.tryPromise({ try: () => p.listApis(), catch: driverError("connect") })
    const send: Send = (messages) =>
      p.send({ messages, acks: resolved.acks, idempotent: resolved.idempotent, autocreateTopics: false })
    const write = makeWriter(p, resolved, yield* Effect.clock, () => send)
    return yield* producer.make(resolved, { write })
  })
