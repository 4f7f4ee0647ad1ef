/**
 * A batch that fails in part, on the kafkajs writer with a stubbed kafkajs: kafkajs writes one produce request per
 * broker and fails the whole `sendBatch` with one request's error, and a produce request refused for one of its
 * partitions fails whole though its other partitions were written. The writer sends each leader's records on their
 * own and tells, per record, what it knows.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Effect from "effect/Effect"
import type { Admin, RecordMetadata as KafkaRecordMetadata, TopicMessages } from "kafkajs"
import {
  KafkaJSConnectionError,
  KafkaJSNonRetriableError,
  KafkaJSNumberOfRetriesExceeded,
  KafkaJSProtocolError
} from "kafkajs"
import { makeWriter } from "../src/internal/kafkajs/producer.js"
import * as internal from "../src/internal/producer/producer.js"
import type { ProduceFailed } from "../src/KafkaError.js"
import type { ProducerRecord, RecordMetadata } from "../src/Producer.js"

/** An admin client that knows these topics, each partition led by the node given. */
const adminOf = (leaders: Readonly<Record<string, ReadonlyArray<number>>>): Pick<Admin, "fetchTopicMetadata"> => ({
  fetchTopicMetadata: async (options) => ({
    topics: (options?.topics ?? []).map((name) => ({
      name,
      partitions: (leaders[name] ?? []).map((leader, partitionId) => ({
        partitionErrorCode: 0,
        partitionId,
        leader,
        replicas: [leader],
        isr: [leader]
      }))
    }))
  })
})

/** What kafkajs rejects `sendBatch` with when the broker refuses a request with a non-retriable error. */
const refusedWith = (type: string, code: number) => {
  const protocol = new KafkaJSProtocolError(
    Object.assign(new Error(`refused: ${type}`), { type, code, retriable: false })
  )
  return Object.assign(new KafkaJSNonRetriableError(protocol), { cause: protocol })
}

/** What kafkajs rejects `sendBatch` with when a broker cannot be reached, after its retries. */
const unreachable = () => {
  const connection = new KafkaJSConnectionError("Connection error: connect ECONNREFUSED 127.0.0.1:9093")
  return Object.assign(new KafkaJSNumberOfRetriesExceeded(connection, { retryCount: 5, retryTime: 100 }), {
    cause: connection
  })
}

type Request = ReadonlyArray<{ readonly topic: string; readonly partitions: ReadonlyArray<number> }>

/**
 * A kafkajs `sendBatch` stub: records each request (per topic, the partitions of its messages) and answers it with
 * `answer`, which returns the error to reject with, or nothing to write every message (offsets from 0 per partition).
 */
const stubSend = (answer: (request: Request) => unknown) => {
  const requests: Array<Request> = []
  const send = (request: { readonly topicMessages: Array<TopicMessages> }) => {
    const seen: Request = request.topicMessages.map(({ messages, topic }) => ({
      topic,
      partitions: [...new Set(messages.map((m) => m.partition!))]
    }))
    requests.push(seen)
    const error = answer(seen)
    if (error !== undefined) return Promise.reject(error)
    const next = new Map<string, number>()
    const metadata: Array<KafkaRecordMetadata> = []
    for (const { messages, topic } of request.topicMessages) {
      for (const m of messages) {
        const key = `${topic}-${m.partition}`
        if (!next.has(key)) metadata.push({ topicName: topic, partition: m.partition!, errorCode: 0, baseOffset: "0" })
        next.set(key, (next.get(key) ?? 0) + 1)
      }
    }
    return Promise.resolve(metadata)
  }
  return { requests, send }
}

const touches = (request: Request, topic: string, partition: number) =>
  request.some((t) => t.topic === topic && t.partitions.includes(partition))

const writerOf = (
  leaders: Readonly<Record<string, ReadonlyArray<number>>>,
  stub: ReturnType<typeof stubSend>,
  afterFailure?: () => Promise<void>
) =>
  Effect.gen(function*() {
    const resolved = yield* internal.resolve({})
    return makeWriter(adminOf(leaders), resolved, yield* Effect.clock, () => stub.send, afterFailure)
  })

const failure = (written: internal.Written | undefined): ProduceFailed => {
  assert.isDefined(written)
  assert.isTrue(internal.isFailure(written!), `a failure, got ${JSON.stringify(written, (_, v) => String(v))}`)
  return written as ProduceFailed
}

const written = (w: internal.Written | undefined): RecordMetadata => {
  assert.isDefined(w)
  assert.isFalse(internal.isFailure(w!), `written, got ${internal.isFailure(w!) ? (w as ProduceFailed).message : ""}`)
  return w as RecordMetadata
}

const records = (spec: ReadonlyArray<readonly [topic: string, partition: number]>): Array<ProducerRecord> =>
  spec.map(([topic, partition], i) => ({ topic, partition, value: `${i}` }))

describe("kafkajs writer: a batch that fails in part", () => {
  it.effect("each leader's records are one request, answered on its own: a leader that fails fails only its records", () =>
    Effect.gen(function*() {
      // Partitions 0 and 2 are led by node 1, partition 1 by node 2, which cannot be reached.
      const stub = stubSend((request) => touches(request, "t", 1) ? unreachable() : undefined)
      const write = yield* writerOf({ t: [1, 2, 1] }, stub)
      const out = yield* write(records([["t", 0], ["t", 1], ["t", 2], ["t", 0], ["t", 1]]))
      assert.strictEqual(stub.requests.length, 2, "one request per leader")
      assert.deepStrictEqual(written(out[0]), { topic: "t", partition: 0, offset: 0n })
      assert.deepStrictEqual(written(out[2]), { topic: "t", partition: 2, offset: 0n })
      assert.deepStrictEqual(written(out[3]), { topic: "t", partition: 0, offset: 1n })
      for (const i of [1, 4]) {
        const error = failure(out[i])
        assert.strictEqual(error.reason, "Disconnected")
        assert.strictEqual(error.partition, 1)
      }
    }))

  it.effect("one leader's records across topics are one request; a refusal of one partition of it makes every outcome unknown", () =>
    Effect.gen(function*() {
      const stub = stubSend((request) =>
        touches(request, "small", 0) ? refusedWith("MESSAGE_TOO_LARGE", 10) : undefined
      )
      const write = yield* writerOf({ small: [1], normal: [1, 1] }, stub)
      const out = yield* write(records([["normal", 0], ["small", 0], ["normal", 1]]))
      assert.strictEqual(stub.requests.length, 1)
      for (const w of out) {
        const error = failure(w)
        // The broker wrote normal-0 and normal-1 and refused small-0, but kafkajs says only "MESSAGE_TOO_LARGE".
        assert.strictEqual(error.reason, "OutcomeUnknown", "a record that may have been written is not said refused")
        assert.isFalse(error.retriable, "sent again, it may be refused again, or written twice")
        assert.match(error.detail ?? "", /^outcome unknown/)
        assert.include(error.detail ?? "", "MESSAGE_TOO_LARGE")
      }
    }))

  it.effect("a refused request of one partition is that partition's refusal", () =>
    Effect.gen(function*() {
      const stub = stubSend((request) =>
        touches(request, "small", 0) ? refusedWith("MESSAGE_TOO_LARGE", 10) : undefined
      )
      // small-0 on node 1, normal-0 on node 2: two requests.
      const write = yield* writerOf({ small: [1], normal: [2] }, stub)
      const out = yield* write(records([["small", 0], ["normal", 0], ["small", 0]]))
      assert.strictEqual(stub.requests.length, 2)
      for (const i of [0, 2]) {
        const error = failure(out[i])
        assert.strictEqual(error.reason, "RecordTooLarge")
        assert.strictEqual(error.code, "MESSAGE_TOO_LARGE")
      }
      assert.deepStrictEqual(written(out[1]), { topic: "normal", partition: 0, offset: 0n })
    }))

  it.effect("a fenced producer's request is refused whole: every record of it says Fenced", () =>
    Effect.gen(function*() {
      const stub = stubSend(() => refusedWith("PRODUCER_FENCED", 90))
      const write = yield* writerOf({ t: [1, 1] }, stub)
      const out = yield* write(records([["t", 0], ["t", 1]]))
      for (const w of out) assert.strictEqual(failure(w).reason, "Fenced")
    }))

  it.effect("the producer starts over once a batch had a failed request, after every request of it was answered", () =>
    Effect.gen(function*() {
      const events: Array<string> = []
      let answerSlow: () => void = () => {}
      const slow = new Promise<void>((resolve) => (answerSlow = resolve))
      // Should node 2's request not come apart, node 1's is answered all the same, and the order below tells.
      const fallback = setTimeout(() => answerSlow(), 1_000)
      const stub = stubSend((request) => touches(request, "t", 1) ? unreachable() : undefined)
      const send = stub.send
      // Node 1's request is answered only once the failure of node 2's is in.
      const delayed = {
        requests: stub.requests,
        send: (request: Parameters<typeof send>[0]) => {
          const answer = send(request)
          if (request.topicMessages.some((t) => t.messages.some((m) => m.partition === 0))) {
            return slow.then(() => {
              events.push("node 1 answered")
              return answer
            })
          }
          return answer.catch((error: unknown) => {
            events.push("node 2 failed")
            setTimeout(answerSlow, 10)
            throw error
          })
        }
      }
      const write = yield* writerOf({ t: [1, 2] }, delayed, async () => {
        events.push("started over")
      })
      const out = yield* write(records([["t", 0], ["t", 1]]))
      clearTimeout(fallback)
      assert.deepStrictEqual(events, ["node 2 failed", "node 1 answered", "started over"])
      written(out[0])
      failure(out[1])
      // A batch without failures does not start over.
      yield* write(records([["t", 0]]))
      assert.strictEqual(events.filter((e) => e === "started over").length, 1)
    }))
})
