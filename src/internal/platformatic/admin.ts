/**
 * The admin functions of `Platformatic` (create a topic, produce, read end offsets), each on a client of its own.
 */
import { Admin, Consumer } from "@platformatic/kafka"
import * as Effect from "effect/Effect"
import { awaitLeaders, checkNewTopic } from "../shared/topics.js"
import { DriverError, type InvalidConfig } from "../../KafkaError.js"
import type { ProducerRecord } from "../../Producer.js"
import * as producer from "../producer/producer.js"
import { parseBrokers } from "../shared/config.js"
import { makeClientOptions } from "./config.js"
import { apiIds, driverError } from "./errors.js"
import * as platformaticProducer from "./producer.js"

/** A record of `produce`: the `Producer`'s record without its topic. */
type ProduceRecord = Omit<ProducerRecord, "topic">

const clientOptions = (brokers: string | ReadonlyArray<string>) =>
  Effect.flatMap(parseBrokers(brokers), (list) => makeClientOptions({ brokers: list }))

/**
 * Each partition's end, read through a consumer that never joins its group: the last stable offset (read committed),
 * which is the high watermark when no transaction is open.
 */
const latest = (consumer: Consumer, topic: string) =>
  Effect.tryPromise({
    try: () => consumer.listOffsets({ topics: [topic], timestamp: -1n, isolationLevel: 1 }),
    catch: driverError("endOffsets")
  }).pipe(Effect.map((offsets) => {
    const out = new Map<number, bigint>()
    ;(offsets.get(topic) ?? []).forEach((offset, partition) => out.set(partition, offset))
    return out
  }))

/** @internal */
export const createTopic = (
  brokers: string | ReadonlyArray<string>,
  topic: string,
  partitions: number
): Effect.Effect<void, InvalidConfig | DriverError> =>
  Effect.gen(function*() {
    yield* checkNewTopic(topic, partitions)
    const options = yield* clientOptions(brokers)
    const admin = yield* platformaticProducer.closing(new Admin({ ...options, clientId: "effect-kafka-admin" }))
    // A topic that exists already is left as it is.
    yield* Effect.tryPromise({
      try: () => admin.createTopics({ topics: [topic], partitions, replicas: -1 }),
      catch: (cause) => cause
    }).pipe(
      Effect.catchAll((cause) =>
        apiIds(cause).includes("TOPIC_ALREADY_EXISTS") ? Effect.void : Effect.fail(driverError("createTopic")(cause))
      )
    )
    // A new topic's partitions are written to only once every one has a leader that answers for it: their offsets,
    // which only the leaders answer, are read until they all are.
    const consumer = yield* platformaticProducer.closing(
      new Consumer({ ...options, clientId: "effect-kafka-admin", groupId: "effect-kafka-admin" })
    )
    const ready = latest(consumer, topic).pipe(
      Effect.map((offsets) => offsets.size >= partitions),
      Effect.catchAll(() => Effect.succeed(false))
    )
    yield* awaitLeaders(topic, ready)
  }).pipe(Effect.scoped)

/** @internal */
export const produce = (
  brokers: string | ReadonlyArray<string>,
  topic: string,
  records: Iterable<ProduceRecord>
): Effect.Effect<void, InvalidConfig | DriverError> =>
  Effect.gen(function*() {
    const given = Array.from(records)
    if (given.length === 0) return
    const options = yield* clientOptions(brokers)
    // Records with neither key nor partition go round the partitions, one each in turn, as KafkaJs.produce does.
    let count = 1
    if (given.some((r) => r.partition === undefined && (r.key === undefined || r.key === null))) {
      const reader = yield* platformaticProducer.closing(
        new Consumer({ ...options, clientId: "effect-kafka-admin", groupId: "effect-kafka-admin" })
      )
      const metadata = yield* Effect.tryPromise({
        try: () => reader.metadata({ topics: [topic], autocreateTopics: false }),
        catch: driverError("produce")
      })
      count = metadata.topics.get(topic)?.partitionsCount ?? 1
    }
    let turn = 0
    const batch = given.map((record): ProducerRecord =>
      record.partition === undefined && (record.key === undefined || record.key === null)
        ? { ...record, topic, partition: turn++ % count }
        : { ...record, topic }
    )
    const resolved = yield* producer.resolve({})
    const service = yield* platformaticProducer.make(options, "effect-kafka-producer", resolved)
    yield* Effect.mapError(
      service.sendAll(batch),
      (failure) => new DriverError({ operation: "produce", reason: failure.message, retriable: failure.retriable })
    )
  }).pipe(Effect.scoped)

/** @internal */
export const endOffsets = (
  brokers: string | ReadonlyArray<string>,
  topic: string
): Effect.Effect<ReadonlyMap<number, bigint>, InvalidConfig | DriverError> =>
  Effect.gen(function*() {
    const options = yield* clientOptions(brokers)
    const consumer = yield* platformaticProducer.closing(
      new Consumer({ ...options, clientId: "effect-kafka-admin", groupId: "effect-kafka-admin" })
    )
    return yield* latest(consumer, topic)
  }).pipe(Effect.scoped)
