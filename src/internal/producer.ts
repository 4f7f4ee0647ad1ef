import * as Cause from "effect/Cause"
import * as Clock from "effect/Clock"
import type * as Context from "effect/Context"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as FiberId from "effect/FiberId"
import * as Option from "effect/Option"
import * as Scope from "effect/Scope"
import { ConfigError, ProduceFailed, TransactionFailed } from "../KafkaError.js"
import {
  Producer,
  type ProducerRecord,
  type RecordMetadata,
  type Settings,
  type TransactionalProducer,
  type TransactionalSettings,
  type TransactionOffsets
} from "../Producer.js"
import { positiveDuration } from "./config.js"
import { partitionOfKey } from "./murmur2.js"

/**
 * Settings checked and defaulted. `acks` is the protocol's number (`-1` for all).
 *
 * @internal
 */
export interface Resolved {
  readonly acks: -1 | 0 | 1
  readonly idempotent: boolean
  readonly maxInFlightRequests: number
  readonly lingerMillis: number
  readonly batchSize: number
  readonly maxRequestSize: number
  readonly compression: "none" | "gzip"
  readonly timeoutMillis: number
  readonly closeTimeout: Duration.Duration
}

const integerIn = (field: string, value: number | undefined, fallback: number, min: number, max: number) =>
  Effect.suspend(() => {
    if (value === undefined) return Effect.succeed(fallback)
    return Number.isInteger(value) && value >= min && value <= max
      ? Effect.succeed(value)
      : Effect.fail(new ConfigError({ field, reason: `must be an integer from ${min} to ${max}, got ${value}` }))
  })

/** @internal */
export const resolve = (settings: Settings): Effect.Effect<Resolved, ConfigError> =>
  Effect.gen(function*() {
    const acks = settings.acks ?? "all"
    if (acks !== "all" && acks !== 1 && acks !== 0) {
      return yield* new ConfigError({ field: "acks", reason: `must be 0, 1 or "all", got ${String(acks)}` })
    }
    const idempotent = settings.idempotent ?? true
    if (typeof idempotent !== "boolean") {
      return yield* new ConfigError({ field: "idempotent", reason: `must be true or false, got ${String(idempotent)}` })
    }
    if (idempotent && acks !== "all") {
      return yield* new ConfigError({
        field: "acks",
        reason: `an idempotent producer needs acks "all" (got ${acks}): a record acknowledged by the leader alone can ` +
          "be lost with it, which idempotence cannot repair; set idempotent: false to use acks 0 or 1"
      })
    }
    const maxInFlightRequests = yield* integerIn("maxInFlightRequests", settings.maxInFlightRequests, 1, 1, 5)
    if (idempotent && maxInFlightRequests > 1) {
      return yield* new ConfigError({
        field: "maxInFlightRequests",
        reason: `an idempotent producer keeps one batch in flight (got ${maxInFlightRequests}): kafkajs gives a ` +
          "retried batch new sequence numbers, so a batch sent behind one that failed could land before it"
      })
    }
    const linger = settings.linger === undefined || settings.linger === 0
      ? Duration.zero
      : yield* positiveDuration("linger", settings.linger)
    const batchSize = yield* integerIn("batchSize", settings.batchSize, 256 * 1024, 1, 64 * 1024 * 1024)
    const maxRequestSize = yield* integerIn("maxRequestSize", settings.maxRequestSize, 1024 * 1024, 1, 1024 * 1024 * 1024)
    const compression = settings.compression ?? "none"
    if (compression !== "none" && compression !== "gzip") {
      return yield* new ConfigError({
        field: "compression",
        reason: `must be "none" or "gzip", got ${String(compression)}`
      })
    }
    const timeout = yield* positiveDuration("timeout", settings.timeout ?? "30 seconds")
    const closeTimeout = yield* positiveDuration("closeTimeout", settings.closeTimeout ?? "30 seconds")
    return {
      acks: acks === "all" ? -1 : acks,
      idempotent,
      maxInFlightRequests,
      lingerMillis: settings.linger === undefined ? 5 : Duration.toMillis(linger),
      batchSize,
      maxRequestSize,
      compression,
      timeoutMillis: Duration.toMillis(timeout),
      closeTimeout
    }
  })

/**
 * A record with its key, value and headers as bytes, and its size as the batcher counts it.
 *
 * @internal
 */
export interface Prepared {
  readonly topic: string
  readonly partition: number | undefined
  readonly key: Uint8Array | null
  readonly value: Uint8Array | null
  readonly headers: Readonly<Record<string, Uint8Array>> | undefined
  readonly timestamp: number | undefined
  readonly size: number
}

/** What a write did for one record. @internal */
export type Written = Either.Either<RecordMetadata, ProduceFailed>

/**
 * Where batches go: `write` gets the records of one batch in the order they were sent and answers for each, in the
 * same order. It never fails as a whole: a refusal of the whole batch is the same `ProduceFailed` for each record.
 *
 * @internal
 */
export interface Transport {
  readonly write: (batch: ReadonlyArray<Prepared>) => Effect.Effect<ReadonlyArray<Written>>
}

const encoder = new TextEncoder()
const toBytes = (value: Uint8Array | string): Uint8Array => typeof value === "string" ? encoder.encode(value) : value

/** Per-record overhead in a record batch (length, attributes, deltas, varint lengths), as an estimate. */
const RECORD_OVERHEAD = 21

/** @internal */
export const prepare = (record: ProducerRecord): Prepared => {
  const key = record.key === undefined || record.key === null ? null : toBytes(record.key)
  const value = record.value === null ? null : toBytes(record.value)
  let size = RECORD_OVERHEAD + (key === null ? 0 : key.length) + (value === null ? 0 : value.length)
  let headers: Record<string, Uint8Array> | undefined
  if (record.headers !== undefined) {
    for (const name in record.headers) {
      const raw = record.headers[name]
      if (raw === undefined) continue
      const bytes = toBytes(raw)
      headers ??= {}
      headers[name] = bytes
      size += name.length + bytes.length + 2
    }
  }
  return { topic: record.topic, partition: record.partition, key, value, headers, timestamp: record.timestamp, size }
}

/** A record that cannot be sent at all, whatever the cluster says: refused before it is batched. @internal */
export const refuse = (record: Prepared, maxRequestSize: number): ProduceFailed | undefined => {
  if (typeof record.topic !== "string" || record.topic.length === 0) {
    return new ProduceFailed({ reason: "UnknownTopic", topic: String(record.topic), detail: "the topic name is empty" })
  }
  if (record.partition !== undefined && (!Number.isInteger(record.partition) || record.partition < 0)) {
    return new ProduceFailed({
      reason: "UnknownPartition",
      topic: record.topic,
      detail: `partition must be a non-negative integer, got ${record.partition}`
    })
  }
  if (record.size > maxRequestSize) {
    return new ProduceFailed({
      reason: "RecordTooLarge",
      topic: record.topic,
      ...(record.partition === undefined ? {} : { partition: record.partition }),
      detail: `the record is ${record.size} bytes, more than maxRequestSize (${maxRequestSize})`
    })
  }
  return undefined
}

/**
 * Picks each record's partition: its own, its key's (murmur2, as the Java client), or for a record with neither the
 * partition of its topic for this batch (sticky: one per batch, the next one for the next batch). `partitions` is the
 * topic's partition count; a record naming a partition the topic does not have is refused.
 *
 * @internal
 */
export const makePartitioner = () => {
  const sticky = new Map<string, number>()
  return (batch: ReadonlyArray<Prepared>, partitions: (topic: string) => number) => {
    const chosen = new Map<string, number>()
    return batch.map((record): Either.Either<number, ProduceFailed> => {
      const count = partitions(record.topic)
      if (record.partition !== undefined) {
        return record.partition < count ? Either.right(record.partition) : Either.left(
          new ProduceFailed({
            reason: "UnknownPartition",
            topic: record.topic,
            partition: record.partition,
            detail: `${record.topic} has ${count} partition${count === 1 ? "" : "s"}`
          })
        )
      }
      if (record.key !== null) return Either.right(partitionOfKey(record.key, count))
      let partition = chosen.get(record.topic)
      if (partition === undefined) {
        const next = (sticky.get(record.topic) ?? Math.floor(Math.random() * count)) + 1
        sticky.set(record.topic, next)
        partition = next % count
        chosen.set(record.topic, partition)
      }
      return Either.right(partition)
    })
  }
}

/** A record of a batch with the partition chosen for it; `index` is its place in the batch. @internal */
export interface Placed {
  readonly index: number
  readonly record: Prepared
  readonly partition: number
}

/**
 * Chooses the partition of each record of a batch, given each topic's partition count (or why the topic cannot be
 * written). Records that cannot be placed get their answer in `out`; the others are in `placed`, in batch order.
 *
 * @internal
 */
export const place = (
  batch: ReadonlyArray<Prepared>,
  counts: ReadonlyMap<string, Either.Either<number, ProduceFailed>>,
  partitioner: ReturnType<typeof makePartitioner>
): { readonly out: Array<Written | undefined>; readonly placed: ReadonlyArray<Placed> } => {
  const out: Array<Written | undefined> = batch.map((record) => {
    const count = counts.get(record.topic)!
    return Either.isLeft(count) ? Either.left(count.left) : undefined
  })
  const sendable = batch.filter((_, i) => out[i] === undefined)
  const partitions = partitioner(sendable, (topic) => Either.getOrThrow(counts.get(topic)!))
  const placed: Array<Placed> = []
  let k = 0
  batch.forEach((record, index) => {
    if (out[index] !== undefined) return
    const partition = partitions[k++]!
    if (Either.isLeft(partition)) out[index] = Either.left(partition.left)
    else placed.push({ index, record, partition: partition.right })
  })
  return { out, placed }
}

/** Items grouped by key, each group in the order of `items`. @internal */
export const groupBy = <K, A>(items: Iterable<A>, key: (a: A) => K): Map<K, Array<A>> => {
  const groups = new Map<K, Array<A>>()
  for (const item of items) {
    const k = key(item)
    const group = groups.get(k)
    if (group === undefined) groups.set(k, [item])
    else group.push(item)
  }
  return groups
}

/** A topic that does not exist. @internal */
export const unknownTopic = (topic: string) =>
  new ProduceFailed({
    reason: "UnknownTopic",
    topic,
    code: "UNKNOWN_TOPIC_OR_PARTITION",
    detail: `topic "${topic}" does not exist`
  })

/**
 * The records of one `send` or `sendAll`, answered together: one callback for the whole call, not a deferred per
 * record (which costs more than the rest of the producer's work on a record).
 */
class Group {
  readonly results: Array<Written>
  remaining: number
  /** Who waits for the answers: the caller, and any `flush` that came meanwhile. */
  waiting: Array<() => void> | undefined = undefined
  constructor(size: number) {
    this.results = new Array(size)
    this.remaining = size
  }
  settle(index: number, written: Written): void {
    if (this.results[index] !== undefined) return
    this.results[index] = written
    if (--this.remaining === 0 && this.waiting !== undefined) {
      for (const resume of this.waiting) resume()
      this.waiting = undefined
    }
  }
  /** Waits until every record of the group has its answer. */
  get await(): Effect.Effect<ReadonlyArray<Written>> {
    return Effect.async<ReadonlyArray<Written>>((resume) => {
      if (this.remaining === 0) return resume(Effect.succeed(this.results))
      const waiter = () => resume(Effect.succeed(this.results))
      ;(this.waiting ??= []).push(waiter)
      return Effect.sync(() => {
        if (this.waiting !== undefined) this.waiting = this.waiting.filter((w) => w !== waiter)
      })
    })
  }
}

interface Pending {
  readonly record: Prepared
  readonly at: number
  readonly group: Group
  readonly index: number
}

const closed = (record: Prepared, detail: string) =>
  new ProduceFailed({
    reason: "Closed",
    topic: record.topic,
    ...(record.partition === undefined ? {} : { partition: record.partition }),
    detail
  })

/**
 * The producer service on a transport: sends from any number of fibers go into one buffer; a collector fiber cuts
 * batches of up to `batchSize` bytes once the oldest record has waited `linger` (at once when the buffer holds a full
 * batch or a flush asks), and writes at most `maxInFlightRequests` of them at a time, in the order they were cut.
 *
 * @internal
 */
export const make = (
  settings: Resolved,
  transport: Transport
): Effect.Effect<Context.Tag.Service<typeof Producer>, never, Scope.Scope> =>
  Effect.gen(function*() {
    let buffer: Array<Pending> = []
    let bufferBytes = 0
    let closing = false
    let flushes = 0
    const inFlight = new Set<ReadonlyArray<Pending>>()
    const writers = new Set<Fiber.RuntimeFiber<void>>()
    let wake: Deferred.Deferred<void> | undefined
    let running = 0
    const slotFree: { current: Deferred.Deferred<void> | undefined } = { current: undefined }
    const drained = yield* Deferred.make<void>()

    const signal = () => {
      const w = wake
      if (w !== undefined) {
        wake = undefined
        Deferred.unsafeDone(w, Exit.void)
      }
    }

    const settle = (pending: Pending, written: Written) => pending.group.settle(pending.index, written)

    const writeBatch = (batch: ReadonlyArray<Pending>) =>
      transport.write(batch.map((p) => p.record)).pipe(
        Effect.exit,
        Effect.map((exit) => {
          if (Exit.isSuccess(exit)) {
            batch.forEach((p, i) => {
              const written = exit.value[i]
              settle(
                p,
                written ??
                  Either.left(new ProduceFailed({ reason: "Other", topic: p.record.topic, detail: "no answer" }))
              )
            })
          } else {
            const detail = Cause.isInterruptedOnly(exit.cause)
              ? "the producer was shut down while the record was in flight"
              : Cause.pretty(exit.cause)
            for (const p of batch) {
              settle(
                p,
                Either.left(
                  Cause.isInterruptedOnly(exit.cause)
                    ? closed(p.record, detail)
                    : new ProduceFailed({ reason: "Other", topic: p.record.topic, detail })
                )
              )
            }
          }
          inFlight.delete(batch)
          running--
          const free = slotFree.current
          if (free !== undefined) {
            slotFree.current = undefined
            Deferred.unsafeDone(free, Exit.void)
          }
        })
      )

    const cut = (): Array<Pending> => {
      let bytes = 0
      let n = 0
      while (n < buffer.length && (n === 0 || bytes + buffer[n]!.record.size <= settings.batchSize)) {
        bytes += buffer[n]!.record.size
        n++
      }
      const batch = n === buffer.length ? buffer : buffer.slice(0, n)
      buffer = n === buffer.length ? [] : buffer.slice(n)
      bufferBytes -= bytes
      if (flushes > 0 && buffer.length === 0) flushes = 0
      return batch
    }

    const waitForWake = (millis: number | undefined) =>
      Effect.suspend(() => {
        const w = Deferred.unsafeMake<void>(FiberId.none)
        wake = w
        const waiting = Deferred.await(w)
        return millis === undefined ? waiting : Effect.asVoid(Effect.timeoutOption(waiting, Duration.millis(millis)))
      })

    const collector: Effect.Effect<void> = Effect.gen(function*() {
      while (true) {
        if (buffer.length === 0) {
          if (closing) {
            if (running === 0) return
          } else {
            yield* waitForWake(undefined)
            continue
          }
        }
        if (buffer.length > 0 && !closing && flushes === 0 && bufferBytes < settings.batchSize) {
          const now = yield* Clock.currentTimeMillis
          const remaining = buffer[0]!.at + settings.lingerMillis - now
          if (remaining > 0) {
            yield* waitForWake(remaining)
            continue
          }
        }
        if (running >= settings.maxInFlightRequests || (buffer.length === 0 && running > 0)) {
          const free = Deferred.unsafeMake<void>(FiberId.none)
          slotFree.current = free
          yield* Deferred.await(free)
          continue
        }
        const batch = cut()
        inFlight.add(batch)
        running++
        const writer = yield* Effect.forkDaemon(Effect.interruptible(writeBatch(batch)))
        writers.add(writer)
        writer.addObserver(() => writers.delete(writer))
      }
    })

    // The collector and the writers wait on timeouts: they must be interruptible even when the producer is made in
    // an uninterruptible region (a transaction is).
    const collectorFiber = yield* collector.pipe(
      Effect.interruptible,
      Effect.ensuring(Deferred.succeed(drained, undefined)),
      Effect.forkDaemon
    )

    const submit = (records: ReadonlyArray<Prepared>) =>
      Effect.flatMap(Clock.currentTimeMillis, (now) =>
        Effect.sync(() => {
          const group = new Group(records.length)
          const wasEmpty = buffer.length === 0
          for (let index = 0; index < records.length; index++) {
            const record = records[index]!
            const refused = closing
              ? closed(record, "the producer is shut down")
              : refuse(record, settings.maxRequestSize)
            if (refused !== undefined) {
              group.settle(index, Either.left(refused))
              continue
            }
            buffer.push({ record, at: now, group, index })
            bufferBytes += record.size
          }
          // The collector waits with no deadline while the buffer is empty, and with the linger deadline of the oldest
          // record otherwise: it is woken when the buffer stops being empty or holds a full batch.
          if (buffer.length > 0 && (wasEmpty || bufferBytes >= settings.batchSize)) signal()
          return group
        }))

    const send: Context.Tag.Service<typeof Producer>["send"] = (record) =>
      Effect.flatMap(submit([prepare(record)]), (group) =>
        Effect.flatMap(group.await, (results) => {
          const written = results[0]!
          return Either.isRight(written) ? Effect.succeed(written.right) : Effect.fail(written.left)
        }))

    const sendAll: Context.Tag.Service<typeof Producer>["sendAll"] = (records) =>
      Effect.suspend(() => submit(Array.from(records, prepare))).pipe(
        Effect.flatMap((group) => group.await),
        Effect.flatMap((results) => {
          const out: Array<RecordMetadata> = new Array(results.length)
          for (let i = 0; i < results.length; i++) {
            const r = results[i]!
            if (Either.isLeft(r)) return Effect.fail(r.left)
            out[i] = r.right
          }
          return Effect.succeed(out)
        })
      )

    const flush: Effect.Effect<void> = Effect.suspend(() => {
      const waiting = new Set<Group>()
      for (const p of buffer) waiting.add(p.group)
      for (const batch of inFlight) for (const p of batch) waiting.add(p.group)
      if (waiting.size === 0) return Effect.void
      if (buffer.length > 0) {
        flushes++
        signal()
      }
      return Effect.forEach(waiting, (group) => group.await, { discard: true })
    })

    yield* Effect.addFinalizer(() =>
      Effect.gen(function*() {
        closing = true
        signal()
        // Finalizers run uninterruptibly: the wait must be interruptible for the timeout to end it.
        const finished = yield* Effect.interruptible(Deferred.await(drained)).pipe(
          Effect.timeoutOption(settings.closeTimeout)
        )
        yield* Fiber.interrupt(collectorFiber)
        if (Option.isNone(finished)) {
          yield* Fiber.interruptAll(writers)
          for (const p of [...buffer, ...Array.from(inFlight).flat()]) {
            settle(p, Either.left(closed(p.record, "the producer was shut down before the record was written")))
          }
          buffer = []
          inFlight.clear()
        }
      })
    )

    return { send, sendAll, flush }
  })

/**
 * One open transaction of a transactional producer, as a transport sees it.
 *
 * @internal
 */
export interface TxnSession {
  readonly write: (batch: ReadonlyArray<Prepared>) => Effect.Effect<ReadonlyArray<Written>>
  /** Commits these positions for the group, with the transaction: they land if it commits, and only then. */
  readonly sendOffsets: (
    groupId: string,
    positions: ReadonlyArray<{ readonly topic: string; readonly partition: number; readonly next: bigint }>
  ) => Effect.Effect<void, TransactionFailed>
  readonly commit: Effect.Effect<void, TransactionFailed>
  readonly abort: Effect.Effect<void, TransactionFailed>
}

/**
 * A transactional producer, as a transport sees it: `init` fences every earlier producer with the same transactional
 * id (the broker bumps the id's epoch and aborts their open transaction); `begin` opens a transaction.
 *
 * @internal
 */
export interface TxnClient {
  readonly transactionalId: string
  readonly init: Effect.Effect<void, TransactionFailed>
  readonly begin: Effect.Effect<TxnSession, TransactionFailed>
}

/** @internal */
export const transactionFailed = (
  transactionalId: string,
  operation: TransactionFailed["operation"],
  reason: TransactionFailed["reason"],
  detail?: string
) => new TransactionFailed({ transactionalId, operation, reason, ...(detail === undefined ? {} : { detail }) })

/**
 * Runs `body` in a transaction of `client`: its `Producer` sends go into the transaction (batched as the settings
 * say). When `body` succeeds and every send succeeded, `offsets` are sent with the transaction and it
 * commits; otherwise, and on interruption, it is aborted. Sends still in the buffer are written first either way.
 *
 * @internal
 */
export const inTransaction = <A, E, R>(
  settings: Resolved,
  client: TxnClient,
  body: Effect.Effect<A, E, R>,
  offsets: TransactionOffsets | undefined,
  /** Told when a send of the transaction failed or its end did: the client must start over before the next one. */
  unclean: () => void = () => {}
): Effect.Effect<A, E | TransactionFailed, Exclude<R, Producer>> =>
  Effect.uninterruptibleMask((restore) =>
    Effect.gen(function*() {
      const session = yield* client.begin
      let failed: ProduceFailed | undefined
      const write = (batch: ReadonlyArray<Prepared>) =>
        Effect.tap(session.write(batch), (results) => {
          if (failed !== undefined) return
          for (const r of results) {
            if (Either.isLeft(r)) {
              failed = r.left
              return
            }
          }
        })
      const scope = yield* Scope.make()
      const producer = yield* make(settings, { write }).pipe(Scope.extend(scope))
      const exit = yield* Effect.exit(restore(Effect.provideService(body, Producer, producer)))
      yield* Scope.close(scope, Exit.void)
      if (failed !== undefined) unclean()
      if (Exit.isFailure(exit)) {
        yield* Effect.ignore(session.abort)
        return yield* Effect.failCause(exit.cause)
      }
      if (failed !== undefined) {
        yield* Effect.ignore(session.abort)
        return yield* transactionFailed(
          client.transactionalId,
          "commit",
          "Aborted",
          `a send of the transaction failed, so it was aborted: ${failed.message}`
        )
      }
      const committed = yield* Effect.exit(
        offsets === undefined
          ? session.commit
          : Effect.zipRight(session.sendOffsets(offsets.groupId, offsets.positions), session.commit)
      )
      if (Exit.isFailure(committed)) {
        unclean()
        yield* Effect.ignore(session.abort)
        return yield* Effect.failCause(committed.cause)
      }
      return exit.value
    })
  )

/** A transactional id: a non-empty string. @internal */
export const checkTransactionalId = (transactionalId: string): Effect.Effect<string, ConfigError> =>
  typeof transactionalId === "string" && transactionalId.trim().length > 0
    ? Effect.succeed(transactionalId)
    : Effect.fail(new ConfigError({ field: "transactionalId", reason: "must be a non-empty string" }))

/**
 * Transactional settings checked: a transactional producer is idempotent, with acks "all" and one batch in flight.
 *
 * @internal
 */
export const resolveTransactional = (settings: Omit<TransactionalSettings, "transactionalId">) =>
  Effect.gen(function*() {
    const { transactionTimeout: _, ...rest } = settings
    const resolved = yield* resolve({ ...rest, acks: "all", idempotent: true, maxInFlightRequests: 1 })
    const transactionTimeout = yield* positiveDuration("transactionTimeout", settings.transactionTimeout ?? "60 seconds")
    return { resolved, transactionTimeout }
  })

/**
 * The `TransactionalProducer` service on a client: fenced earlier producers at once, then one transaction at a time.
 *
 * @internal
 */
export const makeTransactional = (
  settings: Resolved,
  client: TxnClient
): Effect.Effect<Context.Tag.Service<typeof TransactionalProducer>, TransactionFailed> =>
  Effect.gen(function*() {
    yield* client.init
    const one = yield* Effect.makeSemaphore(1)
    // Once fenced, a producer stays fenced: its client may not even be able to begin (kafkajs stays in the state of
    // the refused commit), and nothing it could write would land.
    let fenced: string | undefined
    // A transaction whose send or end failed leaves the client's sequence numbers behind the broker's: the next
    // transaction starts with a fresh producer session (the same id, a new epoch).
    let restart = false
    const noteFenced = (error: unknown) => {
      if (
        (error instanceof TransactionFailed || error instanceof ProduceFailed) && error.reason === "Fenced" &&
        fenced === undefined
      ) fenced = error.message
    }
    return {
      transactionalId: client.transactionalId,
      transaction: (body, options) =>
        one.withPermits(1)(Effect.suspend(() =>
          fenced !== undefined
            ? Effect.fail(transactionFailed(client.transactionalId, "begin", "Fenced", `fenced earlier: ${fenced}`))
            : Effect.zipRight(
              restart ? Effect.tap(client.init, () => Effect.sync(() => (restart = false))) : Effect.void,
              inTransaction(settings, client, body, options?.offsets, () => (restart = true))
            ).pipe(Effect.tapError((error) => Effect.sync(() => noteFenced(error))))
        ))
    }
  })
