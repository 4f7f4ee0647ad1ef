import * as Cause from "effect/Cause"
import * as Chunk from "effect/Chunk"
import * as Clock from "effect/Clock"
import type * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Option from "effect/Option"
import type { ConsumerRecord } from "../../ConsumerRecord.js"
import { deadLetterRecord } from "../../FailureRoute.js"
import { CircuitOpen, DecodeFailed, ProduceFailed, type RecordNotInChunk } from "../../KafkaError.js"
import { Producer, type ProducerRecord, type RecordMetadata } from "../../Producer.js"
import * as TopicPartition from "../../TopicPartition.js"

/** The failure route after validation. */
export interface RouteSettings {
  /** The dead-letter topic. */
  readonly topic: string
  readonly maxInARow: number
  /** The waits of the retry topics before it, in milliseconds; none for a plain dead-letter route. */
  readonly delays: ReadonlyArray<number>
}

/** The retry step a topic is for (`<source>-retry-<step>`), when it is one of the route's retry topics. */
export const retryStepOf = (settings: RouteSettings, topic: string): number | undefined => {
  if (settings.delays.length === 0) return undefined
  const match = /-retry-(\d+)$/.exec(topic)
  if (match === null) return undefined
  const step = Number(match[1])
  return step < settings.delays.length ? step : undefined
}

/** Where a record of `topic` that failed goes: the next retry topic and when it is due, or the dead-letter topic. */
const targetOf = (settings: RouteSettings, topic: string, now: number) => {
  const step = retryStepOf(settings, topic)
  const next = step === undefined ? 0 : step + 1
  if (next >= settings.delays.length) return { topic: settings.topic, due: undefined }
  const source = step === undefined ? topic : topic.slice(0, topic.lastIndexOf("-retry-"))
  return { topic: `${source}-retry-${next}`, due: now + settings.delays[next]! }
}

/**
 * A failure of the user's handler, wrapped where the handler is called, so that it is never taken for one of the
 * policy's own errors (a handler may well fail with a `DriverError` of its own); `offset` locates it when known.
 */
export class HandlerFailure<E> {
  constructor(
    readonly error: E,
    readonly offset: bigint | undefined,
    /** Whether the records before `offset` were handled (a record handler goes in order; a chunk handler not). */
    readonly handledBefore: boolean = true
  ) {}
}

/** The route's writes a unit started, which it waits for before it ends. */
type Pending = Array<Fiber.RuntimeFiber<void, Fatal>>

/**
 * The route's writes apart from the units that routed their records, under a policy whose commits wait for them
 * (`PolicyInstance.awaitsRoutes`): a unit goes on, and a commit, once it has taken the positions it carries, waits
 * for every record routed so far to be acknowledged. A write that failed stays failed: no later commit passes it.
 *
 * Routed records are written together, with one `sendAll`: the first of them waits up to `maxWait` for others
 * (or less, when a commit needs them first), so that failures coming one after another cost one request per batch
 * rather than one per record, and no fiber per record. A record not written yet holds no commit back that it is not
 * part of, and is written again by the partition's next owner should this member stop before writing it: no commit
 * passed it.
 */
export interface SideWrites {
  /** Queues a routed record; `written` runs once it is acknowledged. */
  readonly start: (
    record: ProducerRecord,
    written: (metadata: RecordMetadata) => Effect.Effect<void>
  ) => Effect.Effect<void>
  /**
   * Writes every record routed so far and waits for them: `undefined` when all were acknowledged, else the first
   * failure.
   */
  readonly settled: Effect.Effect<Fatal | undefined>
  /**
   * When the session has ended (after its last commit): writes what is still queued and lets the writes in flight
   * end, for up to `patience`, so that a record routed just before a failure ended the consumer is not left
   * half-sent; then stops the rest. With no patience (a crash), what was not handed to the producer is dropped.
   */
  readonly close: (patience: Duration.Duration) => Effect.Effect<void>
}

interface Queued {
  readonly record: ProducerRecord
  readonly written: (metadata: RecordMetadata) => Effect.Effect<void>
}

export const makeSideWrites = (maxWait: Duration.Duration): SideWrites => {
  let queue: Array<Queued> = []
  /** When the oldest record of `queue` was queued. */
  let since = 0
  let producer: Context.Tag.Service<typeof Producer> | undefined
  /** The batches handed to the producer and not answered yet. */
  const inFlight = new Set<Fiber.RuntimeFiber<void>>()
  let timer: Fiber.RuntimeFiber<void> | undefined
  /** A timer fiber will write the queue. */
  let armed = false
  let closed = false
  let failed: Fatal | undefined
  const waitMillis = Duration.toMillis(maxWait)

  const write = (batch: ReadonlyArray<Queued>, send: Context.Tag.Service<typeof Producer>["sendAll"]) =>
    Effect.matchCauseEffect(send(batch.map((queued) => queued.record)), {
      onSuccess: (metadata) => Effect.forEach(batch, (queued, i) => queued.written(metadata[i]!), { discard: true }),
      onFailure: (cause) =>
        Effect.sync(() => {
          const failure = Cause.failureOption(cause)
          failed ??= new Fatal(
            Option.isSome(failure) ? failure.value : new ProduceFailed({
              reason: "Other",
              topic: batch[0]!.record.topic,
              detail: `the write ended without an answer: ${Cause.pretty(cause)}`
            })
          )
        })
    })

  /** Hands what is queued to the producer, in a fiber of its own. */
  const flush: Effect.Effect<void> = Effect.suspend(() => {
    if (queue.length === 0 || producer === undefined) return Effect.void
    const batch = queue
    queue = []
    return Effect.flatMap(Effect.forkDaemon(write(batch, producer.sendAll)), (fiber) =>
      Effect.sync(() => {
        inFlight.add(fiber)
        fiber.addObserver(() => inFlight.delete(fiber))
      }))
  })

  /** Writes the queue once its oldest record has waited `maxWait`, unless a commit did first. */
  const tick: Effect.Effect<void> = Effect.flatMap(Clock.currentTimeMillis, (now) => {
    if (queue.length === 0 || closed) {
      armed = false
      return Effect.void
    }
    const left = since + waitMillis - now
    if (left > 0) return Effect.zipRight(Effect.sleep(Duration.millis(left)), tick)
    armed = false
    return flush
  })

  return {
    start: (record, written) =>
      Effect.suspend(() => {
        if (producer === undefined) {
          return Effect.flatMap(Effect.serviceOption(Producer), (found) => {
            if (Option.isNone(found)) return Effect.dieMessage("the failure route needs a Producer")
            producer = found.value
            return Effect.suspend(() => enqueue(record, written))
          })
        }
        return enqueue(record, written)
      }),
    settled: Effect.suspend(() => {
      if (failed !== undefined) return Effect.succeed(failed)
      return Effect.zipRight(
        flush,
        Effect.suspend(() => {
          if (inFlight.size === 0) return Effect.succeed(failed)
          return Effect.map(Effect.forEach(Array.from(inFlight), Fiber.await, { discard: true }), () => failed)
        })
      )
    }),
    close: (patience) =>
      Effect.suspend(() => {
        closed = true
        const stopTimer = timer === undefined ? Effect.void : Fiber.interrupt(timer)
        if (Duration.toMillis(patience) <= 0) queue = []
        return Effect.zipRight(
          Effect.zipRight(stopTimer, flush),
          Effect.suspend(() => {
            if (inFlight.size === 0) return Effect.void
            const fibers = Array.from(inFlight)
            return Effect.zipRight(
              Effect.timeoutOption(Effect.forEach(fibers, Fiber.await, { discard: true }), patience),
              Fiber.interruptAll(fibers)
            )
          })
        )
      })
  }

  function enqueue(record: ProducerRecord, written: Queued["written"]): Effect.Effect<void> {
    if (closed) return Effect.void
    return Effect.flatMap(Clock.currentTimeMillis, (now) => {
      if (queue.length === 0) since = now
      queue.push({ record, written })
      if (armed) return Effect.void
      armed = true
      return Effect.flatMap(Effect.forkDaemon(tick), (fiber) =>
        Effect.sync(() => {
          timer = fiber
        }))
    })
  }
}

/**
 * A failure that ends the consumer as it is, neither retried nor routed: the route's own write failed or its circuit
 * opened, or the handler named a record that is not in its chunk.
 */
export class Fatal {
  constructor(readonly error: ProduceFailed | CircuitOpen<unknown> | RecordNotInChunk<unknown>) {}
}

/**
 * Where the record at `offset` is in `records`, whose offsets grow: by halves, reading records in place (a chunk may
 * be a slice, which a search through its iterator would copy); -1 when it is not there.
 */
export const indexOf = (records: Chunk.Chunk<ConsumerRecord>, offset: bigint): number => {
  let low = 0
  let high = Chunk.size(records) - 1
  while (low <= high) {
    const middle = (low + high) >>> 1
    const found = Chunk.unsafeGet(records, middle).offset
    if (found === offset) return middle
    if (found < offset) low = middle + 1
    else high = middle - 1
  }
  // Not found by halves: offsets that do not grow would be a caller's mistake, but the record is looked for anyway.
  for (let i = 0; i < Chunk.size(records); i++) if (Chunk.unsafeGet(records, i).offset === offset) return i
  return -1
}

/** The handler as the runloop calls it. */
export type Work<E, R> = (
  records: Chunk.Chunk<ConsumerRecord>,
  partition: TopicPartition.TopicPartition
) => Effect.Effect<void, HandlerFailure<E> | Fatal, R>

/** A handler failure worth another attempt: decoding the same bytes again gives the same answer. */
export const retryable = (error: unknown): boolean =>
  error instanceof HandlerFailure && !(error.error instanceof DecodeFailed)

/**
 * How a policy lets a failed record be set aside:
 * - `inPlace`: the record is retried alone and, failing still, routed where it is, inside the unit;
 * - `once`: the handler runs once per record (at-most-once): a failed record is routed at once, inside the unit;
 * - `rerun`: a failed unit is rolled back; it runs again with the record routed in it rather than handled. When the
 *   unit holds the route's write (a Kafka transaction), each run writes it; else a record written once is not again.
 */
export type Mode = "inPlace" | "once" | "rerun"

interface PartitionRoute {
  /** Records to route rather than handle when their unit runs again, with the error they failed with. */
  readonly poisoned: Map<bigint, unknown>
  /** Records dead-lettered by a write that a rolled-back unit does not take back: not written again. */
  readonly written: Set<bigint>
  /**
   * A partition read in order: the highest offset handled, and the records routed above it: the failures in a row,
   * in offset order.
   */
  handledUpTo: bigint
  streak: Array<bigint>
  /**
   * A partition whose records finish out of order: the ranges of the records it routed, by where they start and by
   * where they end. Records in a row are those whose ranges meet: consecutive records of the partition, whatever the
   * order they failed in. A record not finished, or handled, between two routed ones breaks the row.
   */
  readonly routedFrom: Map<bigint, bigint>
  readonly routedUntil: Map<bigint, bigint>
}

/** Where a record's range lies, for a partition whose records finish out of order (see `Progress`). */
export type Locate = (offset: bigint) => readonly [from: bigint, until: bigint] | undefined

export interface Router<E, R> {
  readonly work: Work<E, R>
  /**
   * Under `rerun`, after a unit's retries: marks the record it failed on to be routed when the unit runs again, and
   * returns `true`; `false` when the record is not known (a chunk handler failed on a chunk of several records): then
   * the unit is to be taken apart, a record per unit.
   */
  readonly poison: (
    partition: TopicPartition.TopicPartition,
    records: Chunk.Chunk<ConsumerRecord>,
    failure: HandlerFailure<unknown>
  ) => boolean
  /** The partition's position passed `position`: what was kept of the records below it is dropped. */
  readonly passed: (partition: TopicPartition.TopicPartition, position: bigint) => void
  /** The partition is assigned anew, or given up: what was known of its failures is dropped. */
  readonly reset: (partition: TopicPartition.TopicPartition) => void
  /**
   * The partition's records finish out of order: `locate` gives the range of a record in flight, with which records
   * in a row are counted in offset order (see `PartitionRoute`).
   */
  readonly outOfOrder: (partition: TopicPartition.TopicPartition, locate: Locate) => void
  /**
   * How many records the router remembers something of (failed attempts, poison, dead letters written): what its memory
   * grows with. The streak of failures in a row is not counted: it never holds more than `maxInARow` records.
   */
  readonly remembered: () => number
}

/**
 * How many records in a row, in offset order, a record of range `range` would make with the routed records whose
 * ranges meet it on either side; counted up to `most`.
 */
const inARow = (state: PartitionRoute, range: readonly [bigint, bigint], most: number): number => {
  let row = 1
  for (let at = state.routedUntil.get(range[0]); at !== undefined && row < most; at = state.routedUntil.get(at)) row++
  for (let at = state.routedFrom.get(range[1]); at !== undefined && row < most; at = state.routedFrom.get(at)) row++
  return row
}

/**
 * The handler with the dead-letter route around it. `retry` runs an effect with the consumer's retry schedule.
 */
export const makeRouter = <E, R>(
  settings: RouteSettings,
  mode: Mode,
  unitHoldsWrites: boolean,
  work: Work<E, R>,
  retry: <E2, R2>(effect: Effect.Effect<void, E2, R2>) => Effect.Effect<void, E2, R2>,
  /** Under `inPlace`, when the policy's commits wait for the writes: units do not. */
  side?: SideWrites,
  /** Told of each record written to a retry or dead-letter topic. */
  onRouted?: (partition: TopicPartition.TopicPartition, topic: string) => void
): Router<E, R> => {
  const apart = mode === "inPlace" ? side : undefined
  const partitions = new Map<string, PartitionRoute>()
  /** Partitions whose records finish out of order. */
  const locators = new Map<string, Locate>()
  /**
   * Failed attempts of records not handled or routed yet, by partition key, then offset. A record's count goes when it
   * is handled or routed, and a partition's below its position, or all of them when it is assigned anew.
   */
  const attempts = new Map<string, Map<bigint, number>>()
  /** The records of `records` no longer fail: their counts go (a partition with none costs a lookup). */
  const succeeded = (tp: TopicPartition.TopicPartition, records: Chunk.Chunk<ConsumerRecord>) => {
    if (attempts.size === 0) return
    const counts = attempts.get(TopicPartition.key(tp))
    if (counts === undefined) return
    for (const record of records) counts.delete(record.offset)
    if (counts.size === 0) attempts.delete(TopicPartition.key(tp))
  }
  const attemptsOf = (k: string, offset: bigint) => attempts.get(k)?.get(offset)
  const dropAttempt = (k: string, offset: bigint) => {
    const counts = attempts.get(k)
    if (counts === undefined) return
    counts.delete(offset)
    if (counts.size === 0) attempts.delete(k)
  }

  const stateOf = (k: string) => {
    let state = partitions.get(k)
    if (state === undefined) {
      state = {
        poisoned: new Map(),
        written: new Set(),
        handledUpTo: -1n,
        streak: [],
        routedFrom: new Map(),
        routedUntil: new Map()
      }
      partitions.set(k, state)
    }
    return state
  }

  const counted = (
    tp: TopicPartition.TopicPartition,
    records: Chunk.Chunk<ConsumerRecord>,
    effect: Effect.Effect<void, HandlerFailure<E> | Fatal, R>
  ) =>
    Effect.tapError(effect, (failure) =>
      Effect.sync(() => {
        if (!(failure instanceof HandlerFailure)) return
        const offset = failure.offset ?? (Chunk.size(records) === 1 ? Chunk.unsafeHead(records).offset : undefined)
        if (offset === undefined) return
        const k = TopicPartition.key(tp)
        let counts = attempts.get(k)
        if (counts === undefined) {
          counts = new Map()
          attempts.set(k, counts)
        }
        counts.set(offset, (counts.get(offset) ?? 0) + 1)
      }))

  /** Records up to `upTo` were handled: failures below them are no longer in a row. */
  const handled = (tp: TopicPartition.TopicPartition, upTo: bigint) =>
    Effect.sync(() => {
      const state = partitions.get(TopicPartition.key(tp))
      if (state === undefined || upTo <= state.handledUpTo) return
      state.handledUpTo = upTo
      if (state.streak.length > 0) state.streak = state.streak.filter((offset) => offset > upTo)
    })
  const lastOf = (records: Chunk.Chunk<ConsumerRecord>) => Chunk.unsafeLast(records).offset
  /** Every record of `records` was handled. */
  const handledAll = (tp: TopicPartition.TopicPartition, records: Chunk.Chunk<ConsumerRecord>) =>
    Effect.zipRight(Effect.sync(() => succeeded(tp, records)), handled(tp, lastOf(records)))

  /**
   * Routes a record: the circuit is checked at once, and the write is started in a fiber of its own, added to
   * `pending`, so that the unit goes on with its next records meanwhile; the unit ends only once every write it
   * started is acknowledged. Under a policy whose commits wait for the writes, it is queued apart (`SideWrites`),
   * to be written with the records routed around it.
   */
  const park = (
    pending: Pending,
    tp: TopicPartition.TopicPartition,
    record: ConsumerRecord,
    error: unknown,
    /** Whether it is one more failure for the circuit: the records of one failed chunk count once. */
    counts = true
  ): Effect.Effect<void, Fatal> =>
    Effect.suspend(() => {
      const k = TopicPartition.key(tp)
      const state = stateOf(k)
      const tries = Math.max(attemptsOf(k, record.offset) ?? 1, 1)
      // In a row means in offset order. A record routed again (its unit ran again after a rollback) is not one more;
      // nor is a record of a retry topic, which holds nothing but records that failed before: the circuit watches
      // the consumer's topics.
      const locate = locators.get(k)
      const range = locate?.(record.offset)
      const counted = counts && retryStepOf(settings, tp.topic) === undefined
      let row = 0
      if (range !== undefined) {
        // Out of order: the routed records whose ranges meet this one's, on both sides.
        if (counted && !state.routedFrom.has(range[0])) row = inARow(state, range, settings.maxInARow)
      } else if (counted && record.offset > state.handledUpTo && !state.streak.includes(record.offset)) {
        // In order, with no record handled after it.
        row = state.streak.length + 1
      }
      if (row >= settings.maxInARow) {
        return Effect.fail(
          new Fatal(
            new CircuitOpen({ topic: tp.topic, partition: tp.partition, offset: record.offset, count: row, cause: error })
          )
        )
      }
      if (row > 0 && range !== undefined) {
        state.routedFrom.set(range[0], range[1])
        state.routedUntil.set(range[1], range[0])
      } else if (row > 0) {
        state.streak.push(record.offset)
      }
      if (state.written.has(record.offset)) return Effect.void
      const written = (metadata: RecordMetadata) =>
        Effect.suspend(() => {
          dropAttempt(k, record.offset)
          onRouted?.(tp, metadata.topic)
          if (mode === "rerun" && !unitHoldsWrites) state.written.add(record.offset)
          // A record parked in a retry topic is expected to pass later: only a dead letter asks for attention.
          const log = metadata.topic === settings.topic ? Effect.logWarning : Effect.logDebug
          return log(
            `${k}@${record.offset} failed ${tries} time(s) and was routed to ${metadata.topic}-` +
              `${metadata.partition}@${metadata.offset}`
          )
        })
      const letter = (now: number) => {
        const target = targetOf(settings, tp.topic, now)
        return deadLetterRecord(target.topic, record, error, tries, target.due)
      }
      if (apart !== undefined) return Effect.flatMap(Clock.currentTimeMillis, (now) => apart.start(letter(now), written))
      const write = Effect.all([Effect.serviceOption(Producer), Clock.currentTimeMillis]).pipe(
        Effect.flatMap(([producer, now]) => {
          if (Option.isNone(producer)) return Effect.dieMessage("the failure route needs a Producer")
          return producer.value.send(letter(now))
        }),
        Effect.mapError((error) => new Fatal(error)),
        Effect.flatMap(written)
      )
      return Effect.flatMap(Effect.fork(write), (fiber) =>
        Effect.sync(() => {
          pending.push(fiber)
        }))
    })

  /**
   * Runs a unit's work with the route's writes it starts, and waits for them all before the unit ends (unless the
   * commits wait for them instead).
   */
  const withPending = <A, E2, R2>(body: (pending: Pending) => Effect.Effect<A, E2, R2>) =>
    Effect.suspend(() => {
      if (apart !== undefined) return body([])
      const pending: Pending = []
      return body(pending).pipe(
        Effect.zipLeft(Effect.suspend(() => Effect.forEach(pending, Fiber.join, { discard: true }))),
        // A unit that failed still lets the writes it started end, so that what was written is known.
        Effect.onError(() => Effect.forEach(pending, Fiber.await, { discard: true }))
      )
    })

  const errorOf = (failure: HandlerFailure<E> | Fatal) =>
    failure instanceof HandlerFailure ? Effect.succeed(failure) : Effect.fail(failure)

  // inPlace and once: the unit goes on past a record that keeps failing, which is routed in it.
  const inPlaceIn = (
    pending: Pending,
    records: Chunk.Chunk<ConsumerRecord>,
    tp: TopicPartition.TopicPartition
  ): Effect.Effect<void, HandlerFailure<E> | Fatal, R> =>
    Effect.matchEffect(counted(tp, records, work(records, tp)), {
      onSuccess: () => {
        succeeded(tp, records)
        return handled(tp, lastOf(records))
      },
      onFailure: (failure) => Effect.flatMap(errorOf(failure), (failure) => salvage(pending, records, tp, failure))
    })
  const inPlace: Work<E, R> = (records, tp) => withPending((pending) => inPlaceIn(pending, records, tp))

  const single = (
    pending: Pending,
    record: ConsumerRecord,
    tp: TopicPartition.TopicPartition,
    first: HandlerFailure<E>
  ) => {
    if (mode === "once" || !retryable(first)) return park(pending, tp, record, first.error)
    const one = Chunk.of(record)
    // The schedule's retries after the failure already seen, which counts as its first attempt.
    let replayed = false
    const attempt = Effect.suspend(() => {
      if (replayed) return counted(tp, one, work(one, tp))
      replayed = true
      return Effect.fail(first)
    })
    return Effect.catchAll(
      Effect.zipLeft(retry(attempt), Effect.zipRight(Effect.sync(() => succeeded(tp, one)), handled(tp, record.offset))),
      (failure) => Effect.flatMap(errorOf(failure), (failure) => park(pending, tp, record, failure.error))
    )
  }

  const salvage = (
    pending: Pending,
    records: Chunk.Chunk<ConsumerRecord>,
    tp: TopicPartition.TopicPartition,
    failure: HandlerFailure<E>
  ): Effect.Effect<void, HandlerFailure<E> | Fatal, R> => {
    const offset = failure.offset ?? (Chunk.size(records) === 1 ? Chunk.unsafeHead(records).offset : undefined)
    if (offset === undefined) {
      // A chunk handler failed without saying on which record. At most once, none may be handed again: each is
      // routed. Else each is handled alone, and the ones that still fail are routed.
      return Effect.forEach(
        records,
        (record, i) =>
          mode === "once"
            ? park(pending, tp, record, failure.error, i === 0)
            : Effect.matchEffect(counted(tp, Chunk.of(record), work(Chunk.of(record), tp)), {
              onSuccess: () => {
                succeeded(tp, Chunk.of(record))
                return handled(tp, record.offset)
              },
              onFailure: (again) => Effect.flatMap(errorOf(again), (again) => single(pending, record, tp, again))
            }),
        { discard: true }
      )
    }
    const at = indexOf(records, offset)
    if (at < 0) return Effect.fail(failure)
    const record = Chunk.unsafeGet(records, at)
    const before = at === 0
      ? Effect.void
      : failure.handledBefore
      ? handled(tp, Chunk.unsafeGet(records, at - 1).offset)
      : inPlaceIn(pending, Chunk.take(records, at), tp)
    const routed = Effect.zipRight(before, single(pending, record, tp, failure))
    // The rest is a slice of the same records (a view, not a copy), however many records of the chunk fail.
    return at + 1 === Chunk.size(records)
      ? routed
      : Effect.zipRight(routed, Effect.suspend(() => inPlaceIn(pending, Chunk.drop(records, at + 1), tp)))
  }

  // rerun: records marked in an earlier attempt of their unit are routed; the others are handled.
  const rerun: Work<E, R> = (records, tp) => {
    const state = partitions.get(TopicPartition.key(tp))
    if (state === undefined || state.poisoned.size === 0) {
      return Effect.zipLeft(counted(tp, records, work(records, tp)), handledAll(tp, records))
    }
    return withPending((pending) => Effect.suspend(() => {
      const steps: Array<Effect.Effect<void, HandlerFailure<E> | Fatal, R>> = []
      let run: Array<ConsumerRecord> = []
      const flush = () => {
        if (run.length === 0) return
        const part = Chunk.unsafeFromArray(run)
        steps.push(Effect.zipLeft(counted(tp, part, work(part, tp)), handledAll(tp, part)))
        run = []
      }
      for (const record of records) {
        if (state.poisoned.has(record.offset)) {
          flush()
          steps.push(park(pending, tp, record, state.poisoned.get(record.offset)))
        } else {
          run.push(record)
        }
      }
      flush()
      return Effect.forEach(steps, (step) => step, { discard: true })
    }))
  }

  return {
    work: mode === "rerun" ? rerun : inPlace,
    poison: (tp, records, failure) => {
      const offset = failure.offset ?? (Chunk.size(records) === 1 ? Chunk.unsafeHead(records).offset : undefined)
      if (offset === undefined) return false
      stateOf(TopicPartition.key(tp)).poisoned.set(offset, failure.error)
      return true
    },
    outOfOrder: (tp, locate) => {
      locators.set(TopicPartition.key(tp), locate)
    },
    passed: (tp, position) => {
      const routed = partitions.get(TopicPartition.key(tp))
      if (routed !== undefined && routed.routedFrom.size > 0) {
        for (const [from, until] of routed.routedFrom) {
          if (until > position) continue
          routed.routedFrom.delete(from)
          routed.routedUntil.delete(until)
        }
      }
      const counts = attempts.get(TopicPartition.key(tp))
      if (counts !== undefined) {
        for (const offset of counts.keys()) if (offset < position) counts.delete(offset)
        if (counts.size === 0) attempts.delete(TopicPartition.key(tp))
      }
      const state = partitions.get(TopicPartition.key(tp))
      if (state === undefined || (state.poisoned.size === 0 && state.written.size === 0)) return
      for (const offset of state.poisoned.keys()) if (offset < position) state.poisoned.delete(offset)
      for (const offset of state.written) if (offset < position) state.written.delete(offset)
    },
    reset: (tp) => {
      partitions.delete(TopicPartition.key(tp))
      attempts.delete(TopicPartition.key(tp))
      locators.delete(TopicPartition.key(tp))
    },
    remembered: () => {
      let n = 0
      for (const counts of attempts.values()) n += counts.size
      for (const state of partitions.values()) n += state.poisoned.size + state.written.size + state.routedFrom.size
      return n
    }
  }
}
