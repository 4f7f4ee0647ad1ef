/**
 * Topics the real-broker benchmarks read: produced once per process run with raw kafkajs (the fastest way in), reused
 * by every round and variant, deleted at the end.
 */
import * as Effect from "effect/Effect"
import { CompressionTypes, Kafka, logLevel, Partitioners } from "kafkajs"
import * as KafkaJs from "../src/KafkaJs.js"

/**
 * Creates topics and waits until every partition has a leader. kafkajs's `waitForLeaders` gives up on the
 * UNKNOWN_TOPIC_OR_PARTITION a KRaft broker answers until its metadata has caught up (seen right after another topic
 * was deleted); the library's `createTopic` waits that out.
 */
export const createTopics = (brokers: string, topics: ReadonlyArray<string>, partitions: number): Promise<void> =>
  Effect.runPromise(
    Effect.forEach(topics, (topic) => KafkaJs.createTopic(brokers, topic, partitions), { discard: true })
  )

export interface BenchTopic {
  readonly name: string
  readonly partitions: number
  readonly records: number
  readonly valueBytes: number
}

export interface Topics {
  /** A topic of `records` records of `valueBytes` bytes, spread evenly over `partitions`; made on first use. */
  readonly get: (records: number, valueBytes: number, partitions: number) => Promise<BenchTopic>
  readonly close: () => Promise<void>
}

export const makeTopics = (brokers: string, runId: string, log: (line: string) => void): Topics => {
  const kafka = new Kafka({ clientId: "bench-setup", brokers: brokers.split(","), logLevel: logLevel.NOTHING })
  const admin = kafka.admin()
  let connected: Promise<void> | undefined
  const made = new Map<string, Promise<BenchTopic>>()

  const produce = async (topic: BenchTopic): Promise<void> => {
    const producer = kafka.producer({
      createPartitioner: Partitioners.DefaultPartitioner,
      allowAutoTopicCreation: false
    })
    await producer.connect()
    try {
      const value = Buffer.alloc(topic.valueBytes, 0x61)
      const perSend = 6_000
      const inFlight = 4
      let next = 0
      const sender = async () => {
        while (next < topic.records) {
          const start = next
          const end = Math.min(topic.records, start + perSend)
          next = end
          const messages = []
          for (let i = start; i < end; i++) {
            messages.push({ partition: i % topic.partitions, key: null, value })
          }
          await producer.send({ topic: topic.name, acks: 1, compression: CompressionTypes.None, messages })
        }
      }
      await Promise.all(Array.from({ length: inFlight }, sender))
    } finally {
      await producer.disconnect()
    }
  }

  const get = (records: number, valueBytes: number, partitions: number): Promise<BenchTopic> => {
    const key = `${records}-${valueBytes}-${partitions}`
    let topic = made.get(key)
    if (topic === undefined) {
      topic = (async () => {
        connected ??= admin.connect()
        await connected
        const name = `bench-${runId}-${records}x${valueBytes}b`
        const spec: BenchTopic = { name, partitions, records, valueBytes }
        const started = performance.now()
        await createTopics(brokers, [name], partitions)
        await produce(spec)
        const offsets = await admin.fetchTopicOffsets(name)
        const total = offsets.reduce((sum, o) => sum + Number(o.high) - Number(o.low), 0)
        if (total !== records) throw new Error(`topic ${name} holds ${total} records, expected ${records}`)
        log(
          `setup: produced ${records.toLocaleString("en-US")} x ${valueBytes} B to ${name} in ${
            ((performance.now() - started) / 1000).toFixed(1)
          } s`
        )
        return spec
      })()
      made.set(key, topic)
    }
    return topic
  }

  const close = async () => {
    if (connected === undefined) return
    const names: Array<string> = []
    for (const topic of made.values()) {
      try {
        names.push((await topic).name)
      } catch {
        // a topic that was never made needs no cleanup
      }
    }
    if (names.length > 0) await admin.deleteTopics({ topics: names }).catch(() => undefined)
    await admin.disconnect()
  }

  return { get, close }
}
