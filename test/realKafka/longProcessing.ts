/**
 * A handler slower than the session timeout, on a real broker: the member must keep its partitions (heartbeats go on
 * while the batch is processed), so no rebalance happens and no record is handled twice.
 */
import * as Chunk from "effect/Chunk"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import { Kafka, logLevel } from "kafkajs"
import * as CommitPolicy from "../../src/CommitPolicy.js"
import * as Consumer from "../../src/Consumer.js"
import * as KafkaJs from "../../src/KafkaJs.js"
import { eventually } from "../support/kit.js"

export interface LongProcessingOutcome {
  readonly assigned: number
  readonly revoked: number
  readonly handled: number
  readonly duplicated: number
  /** Longest time one chunk spent in the handler. */
  readonly slowestMillis: number
  readonly membersBefore: ReadonlyArray<string>
  readonly membersAfter: ReadonlyArray<string>
  readonly stateAfter: string
}

export const longProcessing = (options: {
  readonly brokers: string
  readonly sessionTimeoutMillis: number
  readonly slowBatchMillis: number
}) =>
  Effect.gen(function*() {
    const id = crypto.randomUUID().slice(0, 8)
    const topic = `long-processing-${id}`
    const groupId = `${topic}-group`
    const partitions = 2
    const perPartition = 30
    yield* KafkaJs.createTopic(options.brokers, topic, partitions)
    yield* KafkaJs.produce(
      options.brokers,
      topic,
      Array.from({ length: partitions * perPartition }, (_, i) => ({ partition: i % partitions, value: String(i) }))
    )
    const admin = new Kafka({
      clientId: "long-processing",
      brokers: options.brokers.split(","),
      logLevel: logLevel.NOTHING
    })
      .admin()
    yield* Effect.acquireRelease(
      Effect.tryPromise(() => admin.connect()),
      () =>
        Effect.tryPromise(async () => {
          await admin.deleteGroups([groupId]).catch(() => undefined)
          await admin.deleteTopics({ topics: [topic] }).catch(() => undefined)
          await admin.disconnect()
        }).pipe(Effect.timeoutOption("20 seconds"), Effect.ignore)
    )
    const members = Effect.tryPromise(async () => {
      const { groups } = await admin.describeGroups([groupId])
      const group = groups[0]
      return { state: group?.state ?? "", members: (group?.members ?? []).map((m) => m.memberId).sort() }
    })

    let assigned = 0
    let revoked = 0
    let slowestMillis = 0
    const counts = new Map<string, number>()
    const slowDone = new Set<number>()
    const consumer = Consumer.run(
      {
        groupId,
        topics: [topic],
        maxPollRecords: 5,
        sessionTimeout: options.sessionTimeoutMillis,
        rebalanceTimeout: "30 seconds",
        revokeTimeout: "20 seconds"
      },
      (records, tp) =>
        Effect.gen(function*() {
          const started = Date.now()
          // The first chunk of every partition is slow, so that at one moment no partition is being fetched.
          if (!slowDone.has(tp.partition)) {
            slowDone.add(tp.partition)
            yield* Effect.sleep(options.slowBatchMillis)
          }
          for (const r of Chunk.toReadonlyArray(records)) {
            const key = `${r.partition}@${r.offset}`
            counts.set(key, (counts.get(key) ?? 0) + 1)
          }
          slowestMillis = Math.max(slowestMillis, Date.now() - started)
        }),
      {
        onAssign: () => Effect.sync(() => void assigned++),
        onRevoke: () => Effect.sync(() => void revoked++)
      }
    ).pipe(
      Effect.provide(CommitPolicy.commitAfter({ maxBatch: 1, maxInterval: "100 millis" })),
      Effect.provide(
        KafkaJs.layer({ brokers: options.brokers.split(","), maxWaitTime: "200 millis", logLevel: "error" })
      )
    )
    const fiber = yield* Effect.fork(consumer)
    yield* eventually("the member to own both partitions", Effect.sync(() => assigned === partitions), "60 seconds")
    const before = yield* members
    yield* eventually(
      "every record to be handled",
      Effect.sync(() => counts.size === partitions * perPartition),
      "120 seconds"
    )
    const after = yield* members
    const outcome: LongProcessingOutcome = {
      assigned,
      revoked,
      handled: counts.size,
      duplicated: Array.from(counts.values()).reduce((sum, n) => sum + n - 1, 0),
      slowestMillis,
      membersBefore: before.members,
      membersAfter: after.members,
      stateAfter: after.state
    }
    yield* Fiber.interrupt(fiber)
    return outcome
  }).pipe(Effect.scoped)
