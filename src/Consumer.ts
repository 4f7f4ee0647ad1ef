/**
 * Kafka consumers as Effect programs. The poll loop is a stream; partitions are processed concurrently and in order
 * within each partition; the delivery guarantee is the `CommitPolicy` layer you provide.
 *
 * @since 0.1.0
 */
import * as Cause from "effect/Cause"
import * as Chunk from "effect/Chunk"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Option from "effect/Option"
import * as Queue from "effect/Queue"
import * as Schedule from "effect/Schedule"
import type * as Scope from "effect/Scope"
import * as Stream from "effect/Stream"
import type { CommitPolicy } from "./CommitPolicy.js"
import type { ConsumerRecord } from "./ConsumerRecord.js"
import type { Driver, IsolationLevel } from "./Driver.js"
import * as Codec from "./Codec.js"
import * as FailureRoute from "./FailureRoute.js"
import * as route from "./internal/route/router.js"
import * as runloop from "./internal/consumer/runloop.js"
import { resolve } from "./internal/consumer/settings.js"
import {
  type CircuitOpen,
  type CommitFailed,
  InvalidConfig,
  DecodeFailed,
  type DriverError,
  type HandlerFailed,
  type OffsetOutOfRange,
  type PartitionsLost,
  type ProduceFailed,
  RecordFailed,
  RecordNotInChunk,
  type TransactionFailed,
  type WorkerStuck
} from "./KafkaError.js"
import type { Fenced, OffsetStoreError } from "./OffsetStore.js"
import type { Producer } from "./Producer.js"
import * as TopicPartition from "./TopicPartition.js"

/**
 * @since 0.1.0
 * @category models
 */
export interface Config<Route extends FailureRoute.FailureRoute = FailureRoute.Stop> {
  /** The consumer group; under `transactional` also the key of positions in the offset store. */
  readonly groupId: string
  /** Topics to subscribe to through the group protocol. Give either `topics` or `partitions`. */
  readonly topics?: ReadonlyArray<string>
  /** Chosen partitions, assigned statically with no group membership (no rebalances). */
  readonly partitions?: ReadonlyArray<TopicPartition.TopicPartition>
  readonly clientId?: string
  /**
   * Static membership (KIP-345): the member's own name in the group, the same on every start of the same member (a
   * pod's name, say). A member that restarts within its session timeout gets its partitions back without a rebalance
   * of the others; one that leaves does not leave the group, and its partitions wait for it until its session
   * expires. Of two members running with the same id, the newer one fences the older (which ends with a `DriverError`
   * naming `FENCED_INSTANCE_ID`). With `topics` only. On `Platformatic.layer` and the in-memory broker; kafkajs refuses
   * it when the consumer joins (a `DriverError`).
   *
   * @since 0.3.0
   */
  readonly groupInstanceId?: string
  /** Most records fetched for one partition per poll, and so the largest chunk a handler gets. Default 500. */
  readonly maxPollRecords?: number
  /** Records of one partition fetched and not yet handled never exceed this. Default 2 x `maxPollRecords`. */
  readonly bufferSize?: number
  /** Default 100 millis. */
  readonly pollTimeout?: Duration.DurationInput
  /** Default 10 seconds. */
  readonly sessionTimeout?: Duration.DurationInput
  /**
   * How long the group waits for revoked partitions to be released. Every step of a revoke is bounded so that the
   * whole fits in it. Default 60 seconds.
   */
  readonly rebalanceTimeout?: Duration.DurationInput
  /**
   * How long in-flight work of a revoked partition may run on before it is interrupted. The later steps of a revoke
   * (waiting for interrupted work to stop, the final commit, `onRevoke`, the partition's finalizers) get a quarter
   * each of what is left of `rebalanceTimeout`; a step that misses its deadline is logged with the partition and the
   * revoke goes on. Default 30 seconds.
   */
  readonly revokeTimeout?: Duration.DurationInput
  /** Retries of a failed handler, on the same records. Default: exponential from 100 millis, 5 retries. */
  readonly retry?: Schedule.Schedule<unknown, unknown>
  /**
   * Where a partition starts when nothing was committed or stored for it, or when its position is no longer in its
   * log (records removed by retention or `deleteRecords`): `"earliest"` (the default), `"latest"`, or `"none"`, which
   * ends the consumer with `OffsetOutOfRange` naming the partition. Kafka's `auto.offset.reset`.
   */
  readonly offsetReset?: "earliest" | "latest" | "none"
  /**
   * What the consumer reads of transactional writes: `"read_committed"` (the default) never hands over a record of an
   * open or aborted transaction; `"read_uncommitted"` hands over every record as soon as it is written. Kafka's
   * `isolation.level`.
   */
  readonly isolationLevel?: IsolationLevel
  /**
   * How long the cluster may stay unreachable (a broker restarting, a network cut) before the consumer ends with the
   * error: until then it reconnects with backoff, and commits that fail meanwhile keep their positions. Default
   * 2 minutes.
   */
  readonly reconnectTimeout?: Duration.DurationInput
  /**
   * A member that loses its partitions without a revoke (evicted: paused past its session, say), whose unit the
   * offset store fences (another member claimed the partition), or whose commit the group refuses for a stale
   * membership (an old generation, an unknown member id), gives those partitions up and goes on in the group
   * (rejoining when fenced or refused). `false` ends the consumer with `PartitionsLost`, `Fenced` or `CommitFailed`
   * instead. Default `true`.
   */
  readonly rejoin?: boolean
  /**
   * Which records of a partition `run` and `runEach` hand over one after another (a partition stream is always read
   * in order):
   *
   * - `"partition"` (the default): every record of a partition, in offset order; partitions side by side.
   * - `"key"`: records with the same key, in offset order; records with different keys (and records without a key)
   *   side by side. `run` gets a chunk per key, `runEach` a record at a time per key.
   * - `"unordered"`: every record side by side.
   *
   * Under `"key"` and `"unordered"` at most `concurrency` handler calls are in flight over the whole consumer, and
   * every policy keeps its guarantee:
   *
   * - `commitAfter`, `autoCommit` and `transactional` let records finish out of offset order, across fetched chunks:
   *   a key's record waits only for the key's earlier ones. The committed or stored position is the lowest offset not
   *   finished, with the ranges finished above it (so a new owner skips them); a failed handler call is retried alone,
   *   with the records it was given.
   * - `atMostOnce` and `kafkaTransactional` keep a fetched chunk as their unit: its position is committed before (or
   *   its transaction commits after) all of its records, handled side by side; a failed call is retried with its
   *   chunk, and the partition's next chunk starts when this one is done.
   *
   * What a partition may hold meanwhile is bounded: records fetched and not finished stay within `bufferSize`, and the
   * window between the lowest unfinished offset and the last fetched one within ten times `bufferSize`.
   */
  readonly ordering?: "partition" | "key" | "unordered"
  /**
   * Under `"key"` and `"unordered"` ordering, the most handler calls in flight at once, over all partitions of the
   * consumer. Default 64.
   */
  readonly concurrency?: number
  /**
   * Where a record goes when the handler keeps failing on it after its retries (or when it does not decode):
   * `FailureRoute.stop` (the default) ends the consumer with `HandlerFailed`; `FailureRoute.deadLetter({ topic })`
   * writes it to a dead-letter topic and goes on. See `FailureRoute` for the guarantee under each policy. With a
   * dead-letter route the consumer needs a `Producer`, and can end with `ProduceFailed` (the dead-letter write failed)
   * or `CircuitOpen`.
   *
   * The route is part of the type: `Consumer.Config` takes none (the `stop` route), and a configuration written apart
   * from the call with a route says which, `Consumer.Config<FailureRoute.DeadLetter>` say, so that what `run` requires
   * (a `Producer`) and how it can end follow from it.
   */
  readonly onFailure?: Route
}

/**
 * A configuration with any failure route.
 *
 * @since 0.2.0
 * @category models
 */
export type AnyConfig = Config<FailureRoute.FailureRoute>

type RouteOf<C extends AnyConfig> = "onFailure" extends keyof C ? C["onFailure"] : undefined

/**
 * What a consumer with the configuration `C` needs besides the driver, the policy and the handler's services: a
 * `Producer` when it may dead-letter records.
 *
 * @since 0.1.0
 * @category models
 */
export type Requires<C extends AnyConfig> = [RouteOf<C>] extends [FailureRoute.Stop | undefined] ? never : Producer

/**
 * How a consumer with the configuration `C` can end because of its handler's error `E`: with `HandlerFailed` under
 * the `stop` route; with `ProduceFailed` (the dead-letter write failed) or `CircuitOpen` under `deadLetter`.
 *
 * @since 0.1.0
 * @category models
 */
export type Failures<C extends AnyConfig, E> = [RouteOf<C>] extends [FailureRoute.Stop | undefined] ? HandlerFailed<E>
  : [RouteOf<C>] extends [FailureRoute.DeadLetter | FailureRoute.RetryTopics] ? ProduceFailed | CircuitOpen<E>
  : HandlerFailed<E> | ProduceFailed | CircuitOpen<E>

/**
 * How a chunk handler whose error `E` can be a `RecordFailed` can end the consumer besides: with `RecordNotInChunk`,
 * when the `RecordFailed` names a record that is not in the chunk. A handler that never fails with `RecordFailed`
 * cannot.
 *
 * @since 0.2.0
 * @category models
 */
export type Misnamed<E> = [Extract<E, RecordFailed<unknown>>] extends [never] ? never
  : RecordNotInChunk<Extract<E, RecordFailed<unknown>>>

/**
 * Errors a consumer can end with, besides the handler's own (in `HandlerFailed`) and the hooks'.
 *
 * @since 0.1.0
 * @category errors
 */
export type ConsumerError =
  | InvalidConfig
  | DriverError
  | CommitFailed
  | Fenced
  | OffsetStoreError
  | OffsetOutOfRange
  | PartitionsLost
  | TransactionFailed
  | WorkerStuck

/**
 * Per-partition lifecycle hooks. `onAssign` runs in the partition's scope: resources it acquires are released when
 * the partition is revoked, after its final position is committed or stored.
 *
 * @since 0.1.0
 * @category models
 */
export interface Hooks<E = never, R = never> {
  readonly onAssign?: (partition: TopicPartition.TopicPartition) => Effect.Effect<void, E, R | Scope.Scope>
  /** Runs in the partition's scope too, before it closes; bounded like every step of a revoke. */
  readonly onRevoke?: (partition: TopicPartition.TopicPartition) => Effect.Effect<void, E, R | Scope.Scope>
}

/**
 * Checks a configuration before anything connects; each invalid value fails with a `InvalidConfig` naming its field.
 *
 * @example
 * ```ts
 * import { Consumer } from "effect-kafka-delivery"
 * import * as Effect from "effect/Effect"
 *
 * // A revoke has to end within the rebalance, so this configuration is refused before anything connects.
 * const config = { groupId: "ledger", topics: ["payments"], revokeTimeout: "90 seconds" } as const
 * const error = Effect.runSync(Effect.flip(Consumer.validate(config)))
 * assert.strictEqual(error.field, "revokeTimeout")
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const validate = (config: AnyConfig): Effect.Effect<void, InvalidConfig> => Effect.asVoid(resolve(config))

/**
 * A handler of a chunk of records of one partition, in offset order.
 *
 * @since 0.1.0
 * @category models
 */
export type Handler<E, R> = (
  records: Chunk.Chunk<ConsumerRecord>,
  partition: TopicPartition.TopicPartition
) => Effect.Effect<void, E, R>

/**
 * Runs the consumer: partitions concurrently, and within a partition the records one after another in offset order,
 * by key, or side by side, as `ordering` says (a chunk handler gets a chunk of one partition's records; under `"key"`,
 * of one key's); positions committed or stored as the provided `CommitPolicy` says. Never succeeds; it ends by
 * interruption or with the first error. A handler that keeps failing ends it with `HandlerFailed`, whose `cause` is
 * the handler's own error, typed, unless the configuration's failure route (`onFailure`) routes the record. A handler
 * that fails with a `RecordFailed` naming a record its chunk does not hold ends it with `RecordNotInChunk`.
 *
 * A handler that writes through the offset store's transaction (it requires `OffsetStore.Transaction`) can run only
 * under `CommitPolicy.transactional`, the one policy that provides it.
 *
 * @example
 * ```ts
 * import { CommitPolicy, Consumer } from "effect-kafka-delivery"
 * import * as Platformatic from "effect-kafka-delivery/Platformatic"
 * import * as Console from "effect/Console"
 * import * as Effect from "effect/Effect"
 * import * as Layer from "effect/Layer"
 *
 * // Each chunk holds records of one partition in offset order; its position is committed after the handler succeeds.
 * const consumer = Consumer.run({ groupId: "ledger", topics: ["payments"] }, (records, partition) =>
 *   Console.log(`${partition.topic}-${partition.partition}: ${records.length} records`))
 *
 * // Building the program connects to nothing: the driver connects when the program runs.
 * const program = consumer.pipe(
 *   Effect.provide(Layer.merge(
 *     Platformatic.layer({ brokers: ["localhost:9092"] }),
 *     CommitPolicy.commitAfter({ maxBatch: 500, maxInterval: "1 second" })
 *   ))
 * )
 * ```
 *
 * @since 0.1.0
 * @category running
 */
export const run = <C extends AnyConfig, E, R, EH = never, RH = never>(
  config: C,
  handler: Handler<E, R>,
  hooks: Hooks<EH, RH> = {}
): Effect.Effect<
  never,
  ConsumerError | Failures<C, E> | Misnamed<E> | EH,
  Driver | CommitPolicy | Requires<C> | R | Exclude<RH, Scope.Scope>
> =>
  Effect.flatMap(resolve(config), (resolved) => {
    const call = (records: Chunk.Chunk<ConsumerRecord>, partition: TopicPartition.TopicPartition) =>
      Effect.mapError(
        handler(records, partition),
        // A record that did not decode names itself, as does a `RecordFailed`: the route takes that one record. A
        // `RecordFailed` naming a record the chunk does not hold says nothing of which record failed: it ends the
        // consumer rather than route or retry the wrong records.
        (error) => {
          if (error instanceof RecordFailed) {
            if (route.indexOf(records, error.offset) >= 0) return new runloop.HandlerFailure(error, error.offset, true)
            return new route.Fatal(
              new RecordNotInChunk({
                topic: partition.topic,
                partition: partition.partition,
                offset: error.offset,
                first: Chunk.unsafeHead(records).offset,
                last: Chunk.unsafeLast(records).offset,
                cause: error
              })
            )
          }
          return new runloop.HandlerFailure(error, error instanceof DecodeFailed ? error.offset : undefined, false)
        }
      )
    return typed<C, E, EH, R | Exclude<RH, Scope.Scope>>(runloop.run(resolved, call, hooks))
  })

/**
 * The runloop's errors narrowed to what the configuration allows: it routes failed records only when `onFailure`
 * is a dead-letter route (then `HandlerFailed` cannot happen and the route's errors can), and it reads the
 * `Producer` only then.
 */
const typed = <C extends AnyConfig, E, EH, R>(
  effect: Effect.Effect<
    never,
    runloop.RunError | HandlerFailed<E> | runloop.RouteError<E> | EH,
    Driver | CommitPolicy | R
  >
) => effect as Effect.Effect<never, ConsumerError | Failures<C, E> | EH, Driver | CommitPolicy | Requires<C> | R>

/**
 * Runs the consumer with a handler per record. When the handler fails, `HandlerFailed` names the record it failed on.
 *
 * @since 0.1.0
 * @category running
 */
export const runEach = <C extends AnyConfig, E, R, EH = never, RH = never>(
  config: C,
  handler: (record: ConsumerRecord) => Effect.Effect<void, E, R>,
  hooks: Hooks<EH, RH> = {}
): Effect.Effect<
  never,
  ConsumerError | Failures<C, E> | EH,
  Driver | CommitPolicy | Requires<C> | R | Exclude<RH, Scope.Scope>
> =>
  Effect.flatMap(resolve(config), (resolved) => {
    const call = (record: ConsumerRecord) =>
      Effect.mapError(handler(record), (error) => new runloop.HandlerFailure(error, record.offset))
    // The records by index, not through `Effect.forEach`, which copies a chunk into an array (twice for a slice: the
    // rest of a chunk after a failed record, which the failure route hands back).
    // Each run of the effect (a retry runs it again) starts from the first record.
    const each = (records: Chunk.Chunk<ConsumerRecord>) => {
      const size = Chunk.size(records)
      if (size === 1) return call(Chunk.unsafeHead(records))
      return Effect.suspend(() => {
        let i = 0
        return Effect.whileLoop({
          while: () => i < size,
          body: () => call(Chunk.unsafeGet(records, i)),
          step: () => {
            i++
          }
        })
      })
    }
    return typed<C, E, EH, R | Exclude<RH, Scope.Scope>>(runloop.run(resolved, each, hooks))
  })

/**
 * A record handler for `runEach` that gets records decoded by `schemas` (see `Codec`). A record that does not decode
 * fails with `DecodeFailed`, which is not retried: the consumer's failure route takes it.
 *
 * @example
 * ```ts
 * import { Codec, Consumer } from "effect-kafka-delivery"
 * import * as Console from "effect/Console"
 * import * as Schema from "effect/Schema"
 *
 * const Payment = Schema.Struct({ id: Schema.String, cents: Schema.Number })
 *
 * // A value that is not a payment fails with `DecodeFailed`, naming the record, before the handler sees it.
 * const consumer = Consumer.runEach(
 *   { groupId: "ledger", topics: ["payments"] },
 *   Consumer.decoded({ value: Codec.json(Payment) }, (record) =>
 *     Console.log(`${record.value.id}: ${record.value.cents}`))
 * )
 * ```
 *
 * @since 0.1.0
 * @category decoding
 */
export const decoded = <const S extends Codec.RecordSchemas, E, R>(
  schemas: S,
  handler: (record: Codec.Decoded<S>) => Effect.Effect<void, E, R>
): (record: ConsumerRecord) => Effect.Effect<void, E | DecodeFailed, R | Codec.Context<S>> => {
  const decode = Codec.decoder(schemas)
  return (record) => Effect.flatMap(decode(record), handler)
}

/**
 * A chunk handler for `run` that gets records decoded by `schemas` (see `Codec`). A chunk with a record that does not
 * decode fails with that record's `DecodeFailed`, which is not retried: the consumer's failure route takes that
 * record, and the others are handled.
 *
 * @since 0.1.0
 * @category decoding
 */
export const decodedChunk = <const S extends Codec.RecordSchemas, E, R>(
  schemas: S,
  handler: (
    records: Chunk.Chunk<Codec.Decoded<S>>,
    partition: TopicPartition.TopicPartition
  ) => Effect.Effect<void, E, R>
): Handler<E | DecodeFailed, R | Codec.Context<S>> => {
  const decode = Codec.decoder(schemas)
  return (records, partition) =>
    Effect.flatMap(Effect.forEach(records, decode), (all) => handler(Chunk.unsafeFromArray(all), partition))
}

/**
 * One assigned partition and its records. The stream ends when the partition is revoked. A chunk counts as handled
 * when the next one is pulled, so the commit policy sees the pace of the code that reads the stream.
 *
 * @since 0.1.0
 * @category models
 */
export interface PartitionStream {
  readonly partition: TopicPartition.TopicPartition
  readonly records: Stream.Stream<Chunk.Chunk<ConsumerRecord>>
}

/**
 * The consumer as a stream of partition streams: one per assignment, each living exactly as long as it.
 *
 * @since 0.1.0
 * @category streams
 */
export const partitions = (
  config: Config
): Stream.Stream<PartitionStream, ConsumerError | HandlerFailed<never>, Driver | CommitPolicy> =>
  Stream.unwrapScoped(Effect.gen(function*() {
    if (config.ordering !== undefined && config.ordering !== "partition") {
      return yield* new InvalidConfig({
        field: "ordering",
        reason: `a partition stream is read in offset order; ordering ${JSON.stringify(config.ordering)} applies to ` +
          "run and runEach"
      })
    }
    if (config.onFailure !== undefined && config.onFailure._tag !== "Stop") {
      return yield* new InvalidConfig({
        field: "onFailure",
        reason: "a partition stream has no handler that fails: route failed records in run and runEach"
      })
    }
    type Handoff = readonly [Chunk.Chunk<ConsumerRecord>, Deferred.Deferred<void>] | null
    const out = yield* Queue.unbounded<PartitionStream>()
    const handoffs = new Map<string, Queue.Queue<Handoff>>()
    const failed = yield* Deferred.make<never, ConsumerError | HandlerFailed<never>>()

    const partitionStream = (tp: TopicPartition.TopicPartition, handoff: Queue.Queue<Handoff>) => {
      let previous: Deferred.Deferred<void> | undefined
      const pull = Effect.gen(function*() {
        if (previous !== undefined) yield* Deferred.succeed(previous, undefined)
        previous = undefined
        const next = yield* Queue.take(handoff)
        if (next === null) return yield* Effect.fail(Option.none())
        previous = next[1]
        return next[0]
      })
      return { partition: tp, records: Stream.repeatEffectOption(pull) }
    }

    const consumer = run(
      { ...config, onFailure: FailureRoute.stop },
      (records, tp) =>
        Effect.gen(function*() {
          const handoff = handoffs.get(TopicPartition.key(tp))
          if (handoff === undefined) return
          const done = yield* Deferred.make<void>()
          yield* Queue.offer(handoff, [records, done])
          yield* Deferred.await(done)
        }),
      {
        onAssign: (tp) =>
          Effect.gen(function*() {
            const handoff = yield* Queue.unbounded<Handoff>()
            handoffs.set(TopicPartition.key(tp), handoff)
            yield* Queue.offer(out, partitionStream(tp, handoff))
          }),
        onRevoke: (tp) =>
          Effect.suspend(() => {
            const handoff = handoffs.get(TopicPartition.key(tp))
            handoffs.delete(TopicPartition.key(tp))
            return handoff === undefined ? Effect.void : Queue.offer(handoff, null)
          })
      }
    )
    const fiber = yield* consumer.pipe(
      Effect.catchAllCause((cause) => Cause.isInterruptedOnly(cause) ? Effect.void : Deferred.failCause(failed, cause)),
      Effect.forkScoped
    )
    yield* Effect.addFinalizer(() => Fiber.interrupt(fiber))
    return Stream.fromQueue(out).pipe(Stream.interruptWhen(Deferred.await(failed)))
  }))

/**
 * All records as one stream, partitions merged. A record counts as handled when the merged stream pulls the next
 * chunk of its partition, which can be before your code is done with it: for a guarantee you can rely on, use `run`
 * or `partitions`.
 *
 * @since 0.1.0
 * @category streams
 */
export const records = (
  config: Config
): Stream.Stream<ConsumerRecord, ConsumerError | HandlerFailed<never>, Driver | CommitPolicy> =>
  partitions(config).pipe(
    Stream.flatMap((p) => p.records, { concurrency: "unbounded" }),
    Stream.flattenChunks
  )

/**
 * The chunk of records as an array, for handlers that prefer one.
 *
 * @since 0.1.0
 * @category utils
 */
export const toArray = (records: Chunk.Chunk<ConsumerRecord>): ReadonlyArray<ConsumerRecord> =>
  Chunk.toReadonlyArray(records)
