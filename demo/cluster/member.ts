/**
 * One consumer of the cluster lab as a process of its own: it consumes a topic under the chosen commit policy and
 * counts each record it handles in a Postgres results table, so that a run can tell, after SIGKILLs and restarts,
 * which records were lost or handled twice. Under `transactional` with `--mysql-url`, the positions
 * (`SqlOffsetStore`) and the results table are in MariaDB instead, written through the member's own `SqlClient`.
 *
 *   node --import tsx demo/cluster/member.ts --brokers 127.0.0.1:19092 --topic T --group G --policy commitAfter \
 *     --database-url postgres://postgres@127.0.0.1:5432/test --results-table results [--offsets-table offsets] \
 *     [--mysql-url mysql://root@127.0.0.1:3306/test]
 *
 * It prints `ready` once it has been assigned partitions, `assigned <topic>-<partition>` and
 * `revoked <topic>-<partition>` as its assignment changes, and runs until SIGTERM or SIGINT, on which it leaves the
 * group cleanly: in-flight work finishes and the final positions are committed or stored.
 */
import * as NodeRuntime from "@effect/platform-node/NodeRuntime"
import * as Chunk from "effect/Chunk"
import * as Console from "effect/Console"
import * as Data from "effect/Data"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Logger from "effect/Logger"
import * as LogLevel from "effect/LogLevel"
import { createInterface } from "node:readline"
import postgres from "postgres"
import * as CommitPolicy from "../../src/CommitPolicy.js"
import * as Consumer from "../../src/Consumer.js"
import type { ConsumerRecord } from "../../src/ConsumerRecord.js"
import type { Driver } from "../../src/Driver.js"
import * as KafkaJs from "../../src/KafkaJs.js"
import * as Platformatic from "../../src/Platformatic.js"
import * as PgOffsetStore from "../../src/PgOffsetStore.js"
import * as SqlOffsetStore from "../../src/SqlOffsetStore.js"
import * as Producer from "../../src/Producer.js"
import * as Codec from "../../src/Codec.js"
import * as FailureRoute from "../../src/FailureRoute.js"
import { type DecodeFailed, type ProduceFailed, RecordFailed } from "../../src/KafkaError.js"
import * as Schema from "effect/Schema"
import * as TopicPartition from "../../src/TopicPartition.js"
import { type MemberOptions, outputTopicOf, parse } from "./options.js"
import { mysqlClient, recordHandled, recordHandledSql } from "./results.js"

class ResultsWriteFailed extends Data.TaggedError("ResultsWriteFailed")<{ readonly cause: unknown }> {
  override get message() {
    return `writing results failed: ${this.cause instanceof Error ? this.cause.message : String(this.cause)}`
  }
}

const offsetsOf = (records: Chunk.Chunk<ConsumerRecord>) => Chunk.toReadonlyArray(Chunk.map(records, (r) => r.offset))

// Under key ordering units run side by side, each holding a connection while it works: the pool grows with them.
const transactionalLayer = (options: MemberOptions) =>
  CommitPolicy.transactional().pipe(
    Layer.provide(
      options.ordering === "partition"
        ? PgOffsetStore.layer({ url: options.databaseUrl, table: options.offsetsTable, migrate: true })
        : Layer.unwrapScoped(Effect.map(
          Effect.acquireRelease(
            Effect.sync(() =>
              postgres(options.databaseUrl, { max: Math.min(16, options.concurrency), onnotice: () => {} })
            ),
            (sql) => Effect.promise(() => sql.end({ timeout: 5 }))
          ),
          (sql) => PgOffsetStore.layer({ sql, table: options.offsetsTable, migrate: true })
        ))
    )
  )

// The store and the handler share the member's MariaDB client: the handler's `sql` writes in the unit's transaction.
const mysqlTransactionalLayer = (options: MemberOptions, url: string) =>
  CommitPolicy.transactional().pipe(
    Layer.provideMerge(SqlOffsetStore.layer({ table: options.offsetsTable, migrate: true })),
    Layer.provideMerge(
      mysqlClient(url, options.ordering === "partition" ? 8 : Math.min(16, options.concurrency))
    )
  )

const kafkaPolicyLayer = (policy: Exclude<MemberOptions["policy"], "transactional" | "kafkaTransactional">) => {
  switch (policy) {
    case "atMostOnce":
      return CommitPolicy.atMostOnce()
    case "autoCommit":
      return CommitPolicy.autoCommit({ interval: "500 millis" })
    case "commitAfter":
      return CommitPolicy.commitAfter({ maxBatch: 200, maxInterval: "500 millis" })
  }
}

/** The handler's time per chunk; the supervisor may change it while the member runs. */
let handlerMillis = 0

/** Half of the handler's time before its write and half after, so that a kill can land on either side of it. */
const pace = <A, E, R>(write: Effect.Effect<A, E, R>) =>
  Effect.suspend(() => {
    const millis = handlerMillis
    if (millis === 0) return Effect.asVoid(write)
    const half = Math.floor(millis / 2)
    return Effect.sleep(half).pipe(Effect.zipRight(write), Effect.zipRight(Effect.sleep(millis - half)))
  })

class Refused extends Data.TaggedError("Refused")<{ readonly offset: bigint }> {
  override get message() {
    return `the record at offset ${this.offset} is refused`
  }
}

/** A record's value: a number, or an order to refuse it. */
const Value = Codec.json(Schema.Union(Schema.Number, Schema.Struct({ refuse: Schema.Number })))

/**
 * With a dead-letter topic: the chunk decoded first (a record that does not decode fails the chunk with its
 * `DecodeFailed`), and a refused record fails it with `RecordFailed` once the records before it are handled.
 */
const withPoison = <E, R>(
  options: MemberOptions,
  handle: (records: Chunk.Chunk<ConsumerRecord>, tp: TopicPartition.TopicPartition) => Effect.Effect<void, E, R>
): Consumer.Handler<E | DecodeFailed | RecordFailed<Refused>, R> =>
  options.deadLetterTopic === undefined ? handle : Consumer.decodedChunk({ value: Value }, (decoded, tp) => {
    const records = Chunk.map(decoded, (d) => d.record)
    const at = Chunk.findFirstIndex(decoded, (d) => typeof d.value !== "number")
    if (at._tag === "None") return handle(records, tp)
    const offset = Chunk.unsafeGet(records, at.value).offset
    const fail = Effect.fail(new RecordFailed<Refused>({ offset, cause: new Refused({ offset }) }))
    return at.value === 0 ? fail : Effect.zipRight(handle(Chunk.take(records, at.value), tp), fail)
  })

const member = (options: MemberOptions) =>
  Effect.gen(function*() {
    let ready = false
    const config: Omit<Consumer.Config, "onFailure"> = {
      groupId: options.groupId,
      clientId: options.clientId,
      ...(options.staticMembership ? { groupInstanceId: options.clientId } : {}),
      topics: [options.topic],
      maxPollRecords: options.maxPollRecords,
      sessionTimeout: options.sessionTimeoutMillis,
      rebalanceTimeout: "30 seconds",
      revokeTimeout: "20 seconds",
      ordering: options.ordering,
      concurrency: options.concurrency
    }
    // With a dead-letter topic, records that keep failing go there, through the `Producer` the member runs with.
    const routed = <E, R>(
      handler: Consumer.Handler<E, R>
    ): Effect.Effect<never, unknown, Driver | CommitPolicy.CommitPolicy | Producer.Producer | R> =>
      options.deadLetterTopic === undefined
        ? Consumer.run(config, handler, hooks)
        : Consumer.run(
          {
            ...config,
            onFailure: options.retryDelays.length === 0
              ? FailureRoute.deadLetter({ topic: options.deadLetterTopic, maxInARow: 1_000 })
              : FailureRoute.retryTopics(options.retryDelays, {
                deadLetter: { topic: options.deadLetterTopic },
                maxInARow: 1_000
              })
          },
          withPoison(options, handler),
          hooks
        )
    const layers = driverLayers(options)
    // Outside Kafka transactions the dead-letter writes are acknowledged by every in-sync replica, and idempotent.
    const consume = <E, R>(
      handler: Consumer.Handler<E, R>
    ): Effect.Effect<never, unknown, Driver | CommitPolicy.CommitPolicy | R> =>
      options.deadLetterTopic === undefined
        ? Consumer.run(config, handler, hooks)
        : routed(handler).pipe(Effect.provide(layers.producer(`${options.clientId}-dead-letters`)))
    const hooks: Consumer.Hooks = {
      onAssign: (tp) =>
        Effect.gen(function*() {
          yield* Console.log(`assigned ${TopicPartition.key(tp)}`)
          if (!ready) {
            ready = true
            yield* Console.log("ready")
          }
        }),
      onRevoke: (tp) => Console.log(`revoked ${TopicPartition.key(tp)}`)
    }
    const write = (sql: postgres.ISql, records: Chunk.Chunk<ConsumerRecord>, tp: TopicPartition.TopicPartition) =>
      Effect.tryPromise({
        try: () => recordHandled(sql, options.resultsTable, tp.topic, tp.partition, offsetsOf(records)),
        catch: (cause) => new ResultsWriteFailed({ cause })
      }).pipe(Effect.asVoid)

    if (options.policy === "kafkaTransactional") {
      // One record per input record into the output topic, in the chunk's Kafka transaction with its position.
      const output = outputTopicOf(options.topic)
      // The member's name survives its restarts: a restarted member ends the transaction its predecessor left open.
      const policy = CommitPolicy.kafkaTransactional({ instanceId: options.clientId }).pipe(
        Layer.provide(layers.transactionalProducers(`${options.clientId}-producer`))
      )
      // The dead-letter writes go through the unit's transactional producer.
      const handler: Consumer.Handler<ProduceFailed, Producer.Producer> = (records) =>
        pace(Producer.sendAll(Chunk.map(records, (r) => ({
          topic: output,
          partition: r.partition,
          key: `${r.partition}@${r.offset}`,
          value: `${r.partition}@${r.offset}`
        }))))
      return yield* routed(handler).pipe(Effect.provide(policy))
    }
    if (options.policy === "transactional" && options.mysqlUrl !== undefined) {
      // The results go through the member's own `sql`, which the store runs in the unit's transaction.
      const { mysqlUrl, resultsTable } = options
      return yield* consume((records, tp) =>
        pace(Effect.mapError(
          recordHandledSql(resultsTable, tp.topic, tp.partition, offsetsOf(records)),
          (cause) => new ResultsWriteFailed({ cause })
        ))
      ).pipe(Effect.provide(mysqlTransactionalLayer(options, mysqlUrl)))
    }
    if (options.policy === "transactional") {
      // The results go through the offset store's transaction: they commit with the position, or not at all.
      return yield* consume((records, tp) =>
        pace(
          Effect.flatMap(
            Effect.mapError(PgOffsetStore.sql, (cause) => new ResultsWriteFailed({ cause })),
            (tx) => write(tx, records, tp)
          )
        )
      ).pipe(Effect.provide(transactionalLayer(options)))
    }
    const policy = kafkaPolicyLayer(options.policy)
    const pool = yield* Effect.acquireRelease(
      Effect.sync(() => postgres(options.databaseUrl, { max: 4, onnotice: () => {} })),
      (sql) => Effect.tryPromise(() => sql.end({ timeout: 5 })).pipe(Effect.timeoutOption("10 seconds"), Effect.ignore)
    )
    return yield* consume((records, tp) => pace(write(pool, records, tp))).pipe(Effect.provide(policy))
  }).pipe(
    Effect.scoped,
    Effect.provide(driverLayers(options).consumer)
  )

/** The consumer's driver and the producers, on the client the member was told to use. */
function driverLayers(options: MemberOptions) {
  const brokers = options.brokers.split(",")
  if (options.driver === "platformatic") {
    return {
      consumer: Platformatic.layer({
        brokers,
        clientId: options.clientId,
        maxWaitTime: "200 millis",
        heartbeatInterval: "1 second",
        // A broker that restarts is gone for some seconds: keep trying for about half a minute before giving up.
        retries: 10,
        retryDelay: "1 second",
        rebalance: options.rebalance
      }),
      producer: (clientId: string) => Platformatic.layerProducer({ brokers, clientId }),
      transactionalProducers: (clientId: string) =>
        Platformatic.layerTransactionalProducers({ brokers, clientId, linger: "2 millis" })
    }
  }
  return {
    consumer: KafkaJs.layer({
      brokers,
      clientId: options.clientId,
      maxWaitTime: "200 millis",
      heartbeatInterval: "1 second",
      logLevel: "error",
      // A broker that restarts is gone for some seconds: keep trying for about half a minute before giving up.
      retry: { retries: 10, initialRetryTime: "300 millis", maxRetryTime: "5 seconds" }
    }),
    producer: (clientId: string) => KafkaJs.layerProducer({ brokers, clientId, logLevel: "error" }),
    transactionalProducers: (clientId: string) =>
      KafkaJs.layerTransactionalProducers({ brokers, clientId, logLevel: "error", linger: "2 millis" })
  }
}

/**
 * The supervisor's pipe. When the process that started this member dies, even by SIGKILL, the pipe closes: leave
 * too, cleanly if that can be done in time.
 */
const listenToSupervisor = Effect.sync(() => {
  createInterface({ input: process.stdin }).on("line", (line) => {
    const pace = /^pace (\d+)$/.exec(line.trim())
    if (pace !== null) handlerMillis = Number(pace[1])
  })
  process.stdin.on("end", () => {
    setTimeout(() => process.exit(2), 30_000).unref()
    process.kill(process.pid, "SIGTERM")
  })
})

const main = Effect.gen(function*() {
  const options = yield* parse(process.argv.slice(2), process.env)
  handlerMillis = options.handlerMillis
  if (options.supervised) yield* listenToSupervisor
  return yield* member(options)
}).pipe(Logger.withMinimumLogLevel(LogLevel.Warning))

NodeRuntime.runMain(main)
