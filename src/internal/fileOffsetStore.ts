import type { PlatformError } from "@effect/platform/Error"
import * as FileSystem from "@effect/platform/FileSystem"
import * as Clock from "effect/Clock"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import * as Schema from "effect/Schema"
import { ConfigError } from "../KafkaError.js"
import type { CommitUnit } from "../OffsetStore.js"
import { type Fenced, OffsetStore, OffsetStoreError, Results, type Transaction } from "../OffsetStore.js"
import * as TopicPartition from "../TopicPartition.js"
import { fencedUnit, runUnit } from "./unitBuffer.js"

// Layout: <directory>/<group>/<topic>/<partition>/<sequence>.json, one immutable segment per committed unit.
// Segment n+1 can only be created by a unit that saw segment n as the newest one, and it is created with `link`,
// which fails when the name is taken: of two units that started from the same segment, one gets the name and the
// other is fenced, whichever process they run in. The newest segment holds the partition's position.

const STORE = "file"
const FORMAT = "effect-kafka-delivery/offset-segment/1"
const SEQUENCE_DIGITS = 20
const SEGMENT_NAME = /^(\d{20})\.json$/
const PARTITION_NAME = /^(0|[1-9]\d*)$/

const Segment = Schema.Struct({
  format: Schema.Literal(FORMAT),
  groupId: Schema.String,
  topic: Schema.String,
  partition: Schema.Int.pipe(Schema.nonNegative()),
  sequence: Schema.Int.pipe(Schema.positive()),
  from: Schema.NullOr(Schema.BigInt),
  next: Schema.BigInt,
  committedAt: Schema.String,
  results: Schema.Array(Schema.Unknown)
})
type Segment = typeof Segment.Type

const decodeSegment = Schema.decodeUnknownEither(Schema.parseJson(Segment))
const encodeSegment = Schema.encodeSync(Segment)

/** The newest segment of a partition as this store last saw it; sequence 0: no segment. */
interface Head {
  readonly sequence: number
  readonly next: bigint | null
}

const EMPTY: Head = { sequence: 0, next: null }

// Names stay readable for ordinary group ids and topics; anything that could mean something to a file system
// (separators, dots, reserved characters) is percent-encoded, so a name can never climb out of its directory.
const encodeName = (name: string): string =>
  encodeURIComponent(name).replace(/[.!~*'()]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`)

const decodeName = (name: string): Option.Option<string> => {
  try {
    return Option.some(decodeURIComponent(name))
  } catch {
    return Option.none()
  }
}

const join = (directory: string, name: string): string =>
  directory.endsWith("/") ? `${directory}${name}` : `${directory}/${name}`

const segmentName = (sequence: number): string => `${String(sequence).padStart(SEQUENCE_DIGITS, "0")}.json`

const isNotFound = (error: PlatformError): boolean => error._tag === "SystemError" && error.reason === "NotFound"
const isAlreadyExists = (error: PlatformError): boolean =>
  error._tag === "SystemError" && error.reason === "AlreadyExists"

const storeError = (operation: string, reason: string, cause?: unknown) =>
  new OffsetStoreError({ store: STORE, operation, reason, cause })

const ioError = (operation: string, path: string) => (error: PlatformError) =>
  storeError(operation, `cannot access ${path}: ${error.message}`, error)

const corrupt = (operation: string, path: string, detail: string, cause?: unknown) =>
  storeError(
    operation,
    `segment file ${path} is damaged: ${detail}. Nothing was changed. Restore the file from a backup; or, if it is ` +
      "the newest segment of its partition, move it out of the directory to roll the partition back to the previous " +
      "segment (its results go with it, so nothing is duplicated)",
    cause
  )

/** @internal */
export const make = (
  directory: string
): Effect.Effect<Context.Context<OffsetStore | Results>, ConfigError | OffsetStoreError, FileSystem.FileSystem> =>
  Effect.gen(function*() {
    if (directory.trim() === "" || directory.includes("\u0000")) {
      return yield* new ConfigError({
        field: "directory",
        reason: "the offset store needs a directory path (non-empty, without NUL characters)"
      })
    }
    const fs = yield* FileSystem.FileSystem
    const root = directory.length > 1 ? directory.replace(/\/+$/, "") || "/" : directory

    yield* fs.makeDirectory(root, { recursive: true }).pipe(
      Effect.mapError((error) => storeError("open", `cannot create the directory ${root}: ${error.message}`, error))
    )
    const info = yield* fs.stat(root).pipe(Effect.mapError(ioError("open", root)))
    if (info.type !== "Directory") {
      return yield* storeError("open", `${root} is a ${info.type}, not a directory; give the store a directory`)
    }

    const heads = new Map<string, Head>()
    const locks = new Map<string, Effect.Semaphore>()
    const lockOf = (key: string): Effect.Semaphore => {
      let lock = locks.get(key)
      if (lock === undefined) {
        lock = Effect.unsafeMakeSemaphore(1)
        locks.set(key, lock)
      }
      return lock
    }

    const groupDirectory = (groupId: string) => join(root, encodeName(groupId))
    const partitionDirectory = (groupId: string, tp: TopicPartition.TopicPartition) =>
      join(join(groupDirectory(groupId), encodeName(tp.topic)), String(tp.partition))
    const cacheKey = (groupId: string, tp: TopicPartition.TopicPartition) =>
      `${encodeName(groupId)}/${encodeName(tp.topic)}/${tp.partition}`

    const validate = (operation: string, groupId: string, tp?: TopicPartition.TopicPartition) => {
      if (groupId === "") return Effect.fail(storeError(operation, "the group id is empty"))
      if (tp !== undefined) {
        if (tp.topic === "") return Effect.fail(storeError(operation, "the topic name is empty"))
        if (!Number.isSafeInteger(tp.partition) || tp.partition < 0) {
          return Effect.fail(storeError(operation, `${tp.partition} is not a partition number (topic ${tp.topic})`))
        }
      }
      return Effect.void
    }

    /** Reads one segment; `None` when there is no file of that name. */
    const readSegment = (
      operation: string,
      path: string,
      groupId: string,
      tp: TopicPartition.TopicPartition,
      sequence: number
    ): Effect.Effect<Option.Option<Segment>, OffsetStoreError> =>
      fs.readFileString(path).pipe(
        Effect.map(Option.some),
        Effect.catchIf(isNotFound, () => Effect.succeed(Option.none<string>())),
        Effect.mapError(ioError(operation, path)),
        Effect.flatMap(Option.match({
          onNone: () => Effect.succeed(Option.none<Segment>()),
          onSome: (text) =>
            Either.match(decodeSegment(text), {
              onLeft: (error) => Effect.fail(corrupt(operation, path, `it is not a valid segment (${error.message})`)),
              onRight: (segment) =>
                segment.groupId !== groupId || segment.topic !== tp.topic || segment.partition !== tp.partition ||
                  segment.sequence !== sequence
                  ? Effect.fail(
                    corrupt(
                      operation,
                      path,
                      `it says it is segment ${segment.sequence} of ${segment.topic}-${segment.partition} in group ` +
                        `${segment.groupId}, which is not where it is stored`
                    )
                  )
                  : Effect.succeed(Option.some(segment))
            })
        }))
      )

    /** Sequence numbers of the segments of a partition, ascending; junk and temporary files are ignored. */
    const listSegments = (operation: string, directory: string): Effect.Effect<Array<number>, OffsetStoreError> =>
      fs.readDirectory(directory).pipe(
        Effect.catchIf(isNotFound, () => Effect.succeed<Array<string>>([])),
        Effect.mapError(ioError(operation, directory)),
        Effect.map((names) =>
          names.flatMap((name) => {
            const match = SEGMENT_NAME.exec(name)
            return match === null ? [] : [Number(match[1])]
          }).sort((a, b) => a - b)
        )
      )

    const scanHead = (
      operation: string,
      groupId: string,
      tp: TopicPartition.TopicPartition
    ): Effect.Effect<Head, OffsetStoreError> => {
      const directory = partitionDirectory(groupId, tp)
      return listSegments(operation, directory).pipe(
        Effect.flatMap((sequences) => {
          const sequence = sequences.at(-1)
          if (sequence === undefined) return Effect.succeed(EMPTY)
          const path = join(directory, segmentName(sequence))
          return readSegment(operation, path, groupId, tp, sequence).pipe(
            Effect.flatMap(Option.match({
              onNone: () => Effect.fail(storeError(operation, `segment file ${path} disappeared while it was read`)),
              onSome: (segment): Effect.Effect<Head, OffsetStoreError> =>
                Effect.succeed({ sequence, next: segment.next })
            }))
          )
        })
      )
    }

    /** Follows segments written after `head` (by another store sharing the directory) to the newest one. */
    const probeForward = (
      operation: string,
      groupId: string,
      tp: TopicPartition.TopicPartition,
      head: Head
    ): Effect.Effect<Head, OffsetStoreError> => {
      const sequence = head.sequence + 1
      const path = join(partitionDirectory(groupId, tp), segmentName(sequence))
      return readSegment(operation, path, groupId, tp, sequence).pipe(
        Effect.flatMap(Option.match({
          onNone: () => Effect.succeed(head),
          onSome: (segment) => probeForward(operation, groupId, tp, { sequence, next: segment.next })
        }))
      )
    }

    // The directory entry of a new segment is made durable on a best-effort basis: not every platform lets a
    // directory be opened and synced, and the segment's own content was synced before it got its name.
    const syncDirectory = (directory: string) =>
      Effect.scoped(Effect.flatMap(fs.open(directory, { flag: "r" }), (file) => file.sync)).pipe(Effect.ignore)

    /** Writes the segment under its final name; `false` when another unit took the name first. */
    const createSegment = (
      directory: string,
      sequence: number,
      text: string
    ): Effect.Effect<boolean, OffsetStoreError> => {
      const temporary = join(directory, `.tmp-${crypto.randomUUID()}.json`)
      const path = join(directory, segmentName(sequence))
      return Effect.gen(function*() {
        yield* Effect.scoped(Effect.gen(function*() {
          const file = yield* fs.open(temporary, { flag: "wx" })
          yield* file.writeAll(new TextEncoder().encode(text))
          yield* file.sync
        })).pipe(Effect.mapError(ioError("commit", temporary)))
        const created = yield* fs.link(temporary, path).pipe(
          Effect.as(true),
          Effect.catchIf(isAlreadyExists, () => Effect.succeed(false)),
          Effect.mapError((error) =>
            storeError(
              "commit",
              `cannot link ${temporary} to ${path}: ${error.message}. The store needs a file system with hard links`,
              error
            )
          )
        )
        if (created) yield* syncDirectory(directory)
        return created
      }).pipe(Effect.ensuring(fs.remove(temporary).pipe(Effect.ignore)))
    }

    const store = (unit: CommitUnit, entries: ReadonlyArray<string>): Effect.Effect<void, OffsetStoreError | Fenced> =>
      Effect.gen(function*() {
        const key = cacheKey(unit.groupId, unit.partition)
        const directory = partitionDirectory(unit.groupId, unit.partition)
        let head = heads.get(key) ?? (yield* scanHead("commit", unit.groupId, unit.partition))
        const results = entries.map((text): unknown => JSON.parse(text))
        while (true) {
          if (head.next !== unit.expected) {
            head = yield* probeForward("commit", unit.groupId, unit.partition, head)
            heads.set(key, head)
            if (head.next !== unit.expected) return yield* fencedUnit(unit, head.next)
          }
          if (head.sequence === 0) {
            yield* fs.makeDirectory(directory, { recursive: true }).pipe(Effect.mapError(ioError("commit", directory)))
          }
          const sequence = head.sequence + 1
          const committedAt = new Date(yield* Clock.currentTimeMillis).toISOString()
          const segment: Segment = {
            format: FORMAT,
            groupId: unit.groupId,
            topic: unit.partition.topic,
            partition: unit.partition.partition,
            sequence,
            from: unit.expected,
            next: unit.next,
            committedAt,
            results
          }
          const text = `${JSON.stringify(encodeSegment(segment), null, 2)}\n`
          if (yield* createSegment(directory, sequence, text)) {
            heads.set(key, { sequence, next: unit.next })
            return
          }
          // Another store took this sequence: the loop re-reads the newest segment and checks the position again.
          head = yield* probeForward("commit", unit.groupId, unit.partition, head)
          heads.set(key, head)
          if (head.next !== unit.expected) return yield* fencedUnit(unit, head.next)
        }
      }).pipe(Effect.uninterruptible, lockOf(cacheKey(unit.groupId, unit.partition)).withPermits(1))

    const commit = <A, E, R>(
      unit: CommitUnit,
      work: Effect.Effect<A, E, R>
    ): Effect.Effect<A, E | OffsetStoreError | Fenced, Exclude<R, Transaction>> =>
      validate("commit", unit.groupId, unit.partition).pipe(
        Effect.zipRight(runUnit(STORE, work)),
        Effect.flatMap(([value, entries]) => Effect.as(store(unit, entries), value))
      )

    const load = (
      groupId: string,
      partitions: ReadonlyArray<TopicPartition.TopicPartition>
    ): Effect.Effect<ReadonlyMap<string, bigint>, OffsetStoreError> =>
      Effect.forEach(
        partitions,
        (tp) =>
          validate("load", groupId, tp).pipe(
            Effect.zipRight(scanHead("load", groupId, tp)),
            Effect.tap((head) => Effect.sync(() => heads.set(cacheKey(groupId, tp), head))),
            Effect.map((head) => [TopicPartition.key(tp), head.next] as const)
          ),
        { concurrency: 8 }
      ).pipe(
        Effect.map((entries) => {
          const positions = new Map<string, bigint>()
          for (const [key, next] of entries) {
            if (next !== null) positions.set(key, next)
          }
          return positions
        })
      )

    const readPartition = (groupId: string, tp: TopicPartition.TopicPartition) => {
      const directory = partitionDirectory(groupId, tp)
      return listSegments("read", directory).pipe(
        Effect.flatMap((sequences) =>
          Effect.forEach(sequences, (sequence) => {
            const path = join(directory, segmentName(sequence))
            return readSegment("read", path, groupId, tp, sequence).pipe(
              Effect.flatMap(Option.match({
                onNone: () => Effect.fail(storeError("read", `segment file ${path} disappeared while it was read`)),
                onSome: (segment) => Effect.succeed([path, segment] as const)
              }))
            )
          }, { concurrency: 8 })
        ),
        Effect.flatMap((segments) => {
          let previous: Segment | undefined
          for (const [path, segment] of segments) {
            const expectedSequence = previous === undefined ? 1 : previous.sequence + 1
            const expectedFrom = previous === undefined ? null : previous.next
            if (segment.sequence !== expectedSequence || segment.from !== expectedFrom) {
              return Effect.fail(
                corrupt(
                  "read",
                  path,
                  `it does not continue the segment before it (expected segment ${expectedSequence} starting from ${
                    expectedFrom ?? "nothing"
                  })`
                )
              )
            }
            previous = segment
          }
          return Effect.succeed(segments.flatMap(([, segment]) => segment.results))
        })
      )
    }

    const partitionsOf = (groupId: string): Effect.Effect<Array<TopicPartition.TopicPartition>, OffsetStoreError> => {
      const directory = groupDirectory(groupId)
      return fs.readDirectory(directory).pipe(
        Effect.catchIf(isNotFound, () => Effect.succeed<Array<string>>([])),
        Effect.mapError(ioError("read", directory)),
        Effect.flatMap((topics) =>
          Effect.forEach(topics, (name) =>
            Option.match(decodeName(name), {
              onNone: () => Effect.succeed([]),
              onSome: (topic) => {
                const topicDirectory = join(directory, name)
                return fs.readDirectory(topicDirectory).pipe(
                  Effect.catchIf(isNotFound, () => Effect.succeed<Array<string>>([])),
                  Effect.mapError(ioError("read", topicDirectory)),
                  Effect.map((partitions) =>
                    partitions.filter((partition) => PARTITION_NAME.test(partition)).map((partition) =>
                      TopicPartition.make(topic, Number(partition))
                    )
                  )
                )
              }
            }))
        ),
        Effect.map((nested) => nested.flat().sort(TopicPartition.compare))
      )
    }

    const read = (
      groupId: string,
      partition?: TopicPartition.TopicPartition
    ): Effect.Effect<ReadonlyArray<unknown>, OffsetStoreError> =>
      validate("read", groupId, partition).pipe(
        Effect.zipRight(partition === undefined ? partitionsOf(groupId) : Effect.succeed([partition])),
        Effect.flatMap((partitions) => Effect.forEach(partitions, (tp) => readPartition(groupId, tp))),
        Effect.map((results) => results.flat())
      )

    return Context.make(OffsetStore, { name: STORE, load, commit }).pipe(Context.add(Results, { read }))
  })
