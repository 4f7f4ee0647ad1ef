/**
 * What tests need from a real broker beyond the library's own helpers, with kafkajs used directly: transactions of a
 * transactional producer, compacted topics, deleteRecords. Test-only code.
 */
import { execFile } from "node:child_process"
import * as path from "node:path"
import type * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import { Kafka, logLevel } from "kafkajs"
import type { Admin } from "kafkajs"
import * as KafkaJs from "../../src/KafkaJs.js"
import { DriverTestKit, type DriverTestTransactions } from "../driverSuite.js"

/** A compacted topic's settings: segments roll after 100 ms, and the cleaner takes any dirty segment at once. */
export const compactedTopic = [
  { name: "cleanup.policy", value: "compact" },
  { name: "segment.ms", value: "100" },
  { name: "min.cleanable.dirty.ratio", value: "0.01" },
  { name: "min.compaction.lag.ms", value: "0" }
]

export const kafkaClient = (brokers: string) =>
  new Kafka({ brokers: brokers.split(","), clientId: "driver-suite-kit", logLevel: logLevel.NOTHING })

/** kafkajs used directly for what the library has no helper for: test-only. */
const promise = <A>(what: string, f: () => Promise<A>) =>
  Effect.tryPromise({ try: f, catch: (cause) => new Error(`${what} failed: ${String(cause)}`, { cause }) })

export const withAdmin = <A>(brokers: string, f: (admin: Admin) => Promise<A>) =>
  Effect.acquireUseRelease(
    Effect.sync(() => kafkaClient(brokers).admin()).pipe(
      Effect.tap((admin) => promise("admin connect", () => admin.connect()))
    ),
    (admin) => promise("admin", () => f(admin)),
    (admin) => promise("admin disconnect", () => admin.disconnect()).pipe(Effect.ignore)
  )

/**
 * One transaction of a transactional producer, committed or aborted, and its marker in the partition's log: the
 * coordinator writes markers after EndTxn has answered, so without the wait a write made next could land before it.
 */
export const transaction = (
  brokers: string,
  topic: string,
  partition: number,
  messages: ReadonlyArray<{ readonly key: string; readonly value: string }>,
  outcome: "commit" | "abort"
) =>
  Effect.gen(function*() {
    const before = (yield* KafkaJs.endOffsets(brokers, topic)).get(partition) ?? 0n
    yield* transactionOnly(brokers, topic, partition, messages, outcome)
    const marked = before + BigInt(messages.length) + 1n
    const end = yield* KafkaJs.endOffsets(brokers, topic).pipe(
      Effect.map((ends) => ends.get(partition) ?? 0n),
      Effect.repeat({ schedule: Schedule.spaced("20 millis"), until: (end) => end >= marked }),
      Effect.timeoutOption("30 seconds")
    )
    if (end._tag === "None") {
      return yield* Effect.fail(new Error(`${topic}-${partition}: the ${outcome} marker not written within 30 seconds`))
    }
  })

const transactionOnly = (
  brokers: string,
  topic: string,
  partition: number,
  messages: ReadonlyArray<{ readonly key: string; readonly value: string }>,
  outcome: "commit" | "abort"
) =>
  Effect.acquireUseRelease(
    Effect.sync(() =>
      kafkaClient(brokers).producer({
        transactionalId: `driver-suite-${crypto.randomUUID()}`,
        idempotent: true,
        maxInFlightRequests: 1
      })
    ).pipe(Effect.tap((producer) => promise("producer connect", () => producer.connect()))),
    (producer) =>
      promise("transaction", async () => {
        const txn = await producer.transaction()
        try {
          await txn.send({ topic, messages: messages.map((m) => ({ partition, key: m.key, value: m.value })) })
        } catch (error) {
          await txn.abort()
          throw error
        }
        await (outcome === "commit" ? txn.commit() : txn.abort())
      }),
    (producer) => promise("producer disconnect", () => producer.disconnect()).pipe(Effect.ignore)
  )

/**
 * The keys of a partition's records below `end`, read from the beginning by a bare kafkajs consumer (read
 * committed), in offset order.
 */
export const readKeys = (brokers: string, topic: string, partition: number, end: bigint) =>
  Effect.acquireUseRelease(
    Effect.sync(() =>
      kafkaClient(brokers).consumer({ groupId: `driver-suite-reader-${crypto.randomUUID()}`, maxWaitTimeInMs: 100 })
    ),
    (consumer) =>
      promise("read", async () => {
        const keys: Array<string> = []
        await consumer.connect()
        await consumer.subscribe({ topics: [topic], fromBeginning: true })
        await new Promise<void>((resolve, reject) => {
          const timer = setTimeout(() => reject(new Error(`${topic}-${partition} not read to ${end}`)), 15_000)
          void consumer.run({
            eachBatch: async ({ batch }) => {
              if (batch.partition !== partition) return
              for (const m of batch.messages) if (BigInt(m.offset) < end) keys.push(m.key?.toString() ?? "")
              if (BigInt(batch.lastOffset()) + 1n >= end) {
                clearTimeout(timer)
                resolve()
              }
            }
          }).catch(reject)
        })
        return keys
      }),
    (consumer) => promise("reader disconnect", () => consumer.disconnect()).pipe(Effect.ignore)
  )

/** The suite's cluster needs, on a real broker: the module's own helpers, and kafkajs where it has none. */
export const testKit = (brokers: string): Layer.Layer<DriverTestKit> =>
  Layer.succeed(DriverTestKit, {
    createTopic: (topic, partitions, options) =>
      Effect.gen(function*() {
        if (options?.compacted === true) {
          yield* withAdmin(brokers, (admin) =>
            admin.createTopics({
              topics: [{ topic, numPartitions: partitions, configEntries: compactedTopic }],
              waitForLeaders: false
            }))
        }
        // Creates the topic if it is not there yet, and waits until its partitions have leaders.
        yield* KafkaJs.createTopic(brokers, topic, partitions)
      }),
    produce: (topic, partition, values) =>
      KafkaJs.produce(brokers, topic, values.map((value) => ({ partition, value, key: `${partition}` }))),
    produceKeyed: (topic, partition, entries) =>
      // One send per record: each is a record batch of its own, as a stream of updates would be.
      Effect.forEach(entries, ([key, value]) => KafkaJs.produce(brokers, topic, [{ partition, key, value }]), {
        discard: true
      }),
    produceRecords: (topic, partition, records) =>
      KafkaJs.produce(brokers, topic, records.map((record) => ({ ...record, partition }))),
    produceTransaction: (topic, partition, values, outcome) =>
      transaction(brokers, topic, partition, values.map((value) => ({ key: `${partition}`, value })), outcome),
    compact: (topic) =>
      Effect.gen(function*() {
        const ends = yield* KafkaJs.endOffsets(brokers, topic)
        // The log cleaner never touches the active segment: once `segment.ms` has passed, one more append rolls it.
        // That append is an aborted transaction, which no read-committed reader sees.
        yield* Effect.sleep("300 millis")
        for (const [partition, end] of ends) {
          if (end > 0n) yield* transaction(brokers, topic, partition, [{ key: "compact-roll", value: "" }], "abort")
        }
        for (const [partition, end] of ends) {
          if (end === 0n) continue
          const compacted = readKeys(brokers, topic, partition, end).pipe(
            Effect.map((keys) => new Set(keys).size === keys.length)
          )
          const done = yield* compacted.pipe(
            Effect.repeat({ schedule: Schedule.spaced("500 millis"), until: (ok) => ok }),
            Effect.timeoutOption("60 seconds")
          )
          if (done._tag === "None") {
            return yield* Effect.fail(new Error(`${topic}-${partition} was not compacted within 60 seconds`))
          }
        }
      }),
    deleteRecords: (topic, partition, before) =>
      withAdmin(brokers, async (admin) => {
        // kafkajs's admin finds the partition's leader in the metadata it has loaded.
        await admin.fetchTopicMetadata({ topics: [topic] })
        await admin.deleteTopicRecords({ topic, partitions: [{ partition, offset: before.toString() }] })
      }),
    endOffsets: (topic) => KafkaJs.endOffsets(brokers, topic)
  })

/** The folder of the broker's jars (kafka-clients among them), fetched by `scripts/kafka.sh` if need be. */
let brokerLibs: Promise<string> | undefined
const libsFolder = () =>
  brokerLibs ??= new Promise<string>((resolve, reject) =>
    execFile(
      "bash",
      [path.join("scripts", "kafka.sh"), "libs"],
      { timeout: 600_000 },
      (error, stdout, stderr) =>
        error === null ? resolve(stdout.trim()) : reject(new Error(`scripts/kafka.sh libs failed: ${stderr}`))
    )
  )

/**
 * Runs one of the tests' Java helpers (`test/java/<file>`, a single-file program) with the broker's jars on its
 * classpath, and returns what it printed.
 */
export const runJava = (file: string, args: ReadonlyArray<string>) =>
  Effect.flatMap(
    Effect.tryPromise({ try: libsFolder, catch: (cause) => cause as Error }),
    (libs) =>
      Effect.async<string, Error>((resume) => {
        execFile(
          "java",
          ["-cp", path.join(libs, "*"), path.join("test", "java", file), ...args],
          { timeout: 60_000, maxBuffer: 16 * 1024 * 1024 },
          (error, stdout, stderr) =>
            resume(
              error === null
                ? Effect.succeed(stdout)
                : Effect.fail(new Error(`java failed: ${error.message}\n${stderr}`))
            )
        )
      })
  )

/**
 * `DriverTestTransactions.openTransaction` on a real broker: a kafkajs transactional producer, whose transaction
 * stays open until `end`. `KafkaJs.endOffsets` reads the last stable offset, which passes the transaction's last
 * record only once its marker is written (the coordinator writes it after EndTxn has answered).
 */
export const openTransaction =
  (brokers: string): Context.Tag.Service<DriverTestTransactions>["openTransaction"] =>
  (topic, partition, values, offsets) =>
    Effect.gen(function*() {
      const producer = yield* Effect.acquireRelease(
        Effect.tryPromise(async () => {
          const producer = kafkaClient(brokers).producer({
            transactionalId: `driver-suite-${crypto.randomUUID()}`,
            idempotent: true,
            maxInFlightRequests: 1
          })
          await producer.connect()
          return producer
        }),
        (producer) => Effect.promise(() => producer.disconnect().catch(() => undefined))
      )
      const txn = yield* Effect.tryPromise(() => producer.transaction())
      let open = true
      yield* Effect.addFinalizer(() => open ? Effect.promise(() => txn.abort().catch(() => undefined)) : Effect.void)
      let last: bigint | undefined
      if (values.length > 0) {
        const sent = yield* Effect.tryPromise(() =>
          txn.send({ topic, messages: values.map((value) => ({ partition, key: `${partition}`, value })) })
        )
        const base = sent.find((r) => r.partition === partition)?.baseOffset
        if (base === undefined) {
          return yield* Effect.fail(new Error(`no offset for the records sent to ${topic}-${partition}`))
        }
        last = BigInt(base) + BigInt(values.length) - 1n
      }
      if (offsets !== undefined) {
        yield* Effect.tryPromise(() =>
          txn.sendOffsets({
            consumerGroupId: offsets.groupId,
            topics: [{ topic, partitions: [{ partition: offsets.partition, offset: offsets.next.toString() }] }]
          })
        )
      }
      const marked = (end: bigint) => last === undefined || end > last
      return {
        end: (outcome: "commit" | "abort") =>
          Effect.gen(function*() {
            open = false
            yield* Effect.tryPromise(() => outcome === "commit" ? txn.commit() : txn.abort())
            const stable = yield* KafkaJs.endOffsets(brokers, topic).pipe(
              Effect.map((ends) => ends.get(partition) ?? 0n),
              Effect.repeat({ schedule: Schedule.spaced("20 millis"), until: marked }),
              Effect.timeoutOption("30 seconds")
            )
            if (Option.isNone(stable)) {
              return yield* Effect.fail(
                new Error(`${topic}-${partition}: the ${outcome} marker not written in 30 seconds`)
              )
            }
          })
      }
    })
