/**
 * The admin functions of `KafkaJs` (create a topic, produce, read end offsets), each on a kafkajs client of its own.
 */
import * as Effect from "effect/Effect"
import { awaitLeaders, checkNewTopic } from "../shared/topics.js"
import { Partitioners } from "kafkajs"
import type { Message } from "kafkajs"
import { DriverError, type InvalidConfig } from "../../KafkaError.js"
import type { ProducerRecord } from "../../Producer.js"
import { disconnect, makeClient, makeClientConfig, parseBrokers } from "./driver.js"
import { driverError } from "./errors.js"
import { toBuffer } from "./records.js"

/** A record of `produce`: the `Producer`'s record without its topic. */
type ProduceRecord = Omit<ProducerRecord, "topic">

const adminClient = (brokers: string | ReadonlyArray<string>, clientId: string) =>
  Effect.gen(function*() {
    const list = yield* parseBrokers(brokers)
    const runtime = yield* Effect.runtime<never>()
    const config = yield* makeClientConfig({ brokers: list, clientId }, runtime)
    return makeClient(config)
  })

/** @internal */
export const createTopic = (
  brokers: string | ReadonlyArray<string>,
  topic: string,
  partitions: number
): Effect.Effect<void, InvalidConfig | DriverError> =>
  Effect.gen(function*() {
    yield* checkNewTopic(topic, partitions)
    const client = yield* adminClient(brokers, "effect-kafka-admin")
    const admin = client.admin()
    yield* Effect.acquireRelease(
      Effect.tryPromise({ try: () => admin.connect(), catch: driverError("createTopic") }),
      () => disconnect(() => admin.disconnect())
    )
    yield* Effect.tryPromise({
      try: () => admin.createTopics({ topics: [{ topic, numPartitions: partitions }], waitForLeaders: false }),
      catch: driverError("createTopic")
    })
    // kafkajs's own wait for leaders gives up on the UNKNOWN_TOPIC_OR_PARTITION a KRaft broker answers until its
    // metadata has caught up with the new topic; wait here until every partition has a leader. A leader named in the
    // metadata may still refuse a partition for a moment (NOT_LEADER_OR_FOLLOWER): a write to it would fail, and a
    // client that retries a whole request would write the partitions that took it twice. So the partitions' offsets,
    // which only their leaders answer, must be read too.
    const ready = Effect.tryPromise({
      try: () => admin.fetchTopicMetadata({ topics: [topic] }),
      catch: driverError("createTopic")
    }).pipe(
      Effect.map(({ topics }) => {
        const found = topics.find((t) => t.name === topic)
        return found !== undefined && found.partitions.length >= partitions &&
          found.partitions.every((p) => p.leader >= 0)
      }),
      Effect.flatMap((led) =>
        led
          ? Effect.tryPromise({
            try: () => admin.fetchTopicOffsets(topic),
            catch: driverError("createTopic")
          }).pipe(Effect.map((offsets) => offsets.length >= partitions))
          : Effect.succeed(false)
      ),
      Effect.catchAll(() => Effect.succeed(false))
    )
    yield* awaitLeaders(topic, ready)
  }).pipe(Effect.scoped)

const toMessage = (record: ProduceRecord): Message => {
  const message: Message = { value: record.value === null ? null : toBuffer(record.value) }
  if (record.partition !== undefined) message.partition = record.partition
  if (record.key !== undefined) message.key = record.key === null ? null : toBuffer(record.key)
  if (record.headers !== undefined) {
    const headers: Record<string, Buffer | string> = {}
    for (const [name, value] of Object.entries(record.headers)) headers[name] = toBuffer(value)
    message.headers = headers
  }
  if (record.timestamp !== undefined) message.timestamp = String(record.timestamp)
  return message
}

/** @internal */
export const produce = (
  brokers: string | ReadonlyArray<string>,
  topic: string,
  records: Iterable<ProduceRecord>
): Effect.Effect<void, InvalidConfig | DriverError> =>
  Effect.gen(function*() {
    const messages = Array.from(records, toMessage)
    if (messages.length === 0) return
    const client = yield* adminClient(brokers, "effect-kafka-producer")
    const producer = client.producer({
      createPartitioner: Partitioners.DefaultPartitioner,
      allowAutoTopicCreation: false,
      idempotent: true,
      maxInFlightRequests: 1
    })
    yield* Effect.acquireRelease(
      Effect.tryPromise({ try: () => producer.connect(), catch: driverError("produce") }),
      () => disconnect(() => producer.disconnect())
    )
    const batchSize = 1000
    for (let start = 0; start < messages.length; start += batchSize) {
      yield* Effect.tryPromise({
        try: () => producer.send({ topic, acks: -1, messages: messages.slice(start, start + batchSize) }),
        catch: driverError("produce")
      })
    }
  }).pipe(Effect.scoped)

/** @internal */
export const endOffsets = (
  brokers: string | ReadonlyArray<string>,
  topic: string
): Effect.Effect<ReadonlyMap<number, bigint>, InvalidConfig | DriverError> =>
  Effect.gen(function*() {
    const client = yield* adminClient(brokers, "effect-kafka-admin")
    const admin = client.admin()
    yield* Effect.acquireRelease(
      Effect.tryPromise({ try: () => admin.connect(), catch: driverError("endOffsets") }),
      () => disconnect(() => admin.disconnect())
    )
    const offsets = yield* Effect.tryPromise({
      try: () => admin.fetchTopicOffsets(topic),
      catch: driverError("endOffsets")
    })
    return new Map(offsets.map(({ partition, high }) => [partition, BigInt(high)] as const))
  }).pipe(Effect.scoped)
