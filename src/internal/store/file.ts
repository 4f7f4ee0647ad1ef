import type { PlatformError } from "@effect/platform/Error"
import * as FileSystem from "@effect/platform/FileSystem"
import * as Clock from "effect/Clock"
import * as Context from "effect/Context"
import * as Data from "effect/Data"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import * as Schema from "effect/Schema"
import { InvalidConfig } from "../../KafkaError.js"
import type { Claim, CommitUnit } from "../../OffsetStore.js"
import { type Fenced, OffsetStore, OffsetStoreError, Results, type Transaction } from "../../OffsetStore.js"
import * as TopicPartition from "../../TopicPartition.js"
import { advance, type Range as FinishedRange } from "../consumer/progress.js"
import { fencedUnit, runUnit } from "./unitBuffer.js"

// Layout of a partition, <directory>/<group>/<topic>/<partition>/:
//
//   <sequence>.json               a chain of immutable segments, numbered from 1 (20 digits); the newest one holds the
//                                 partition's owner epoch and position. A `claim` segment raises the epoch, a `unit`
//                                 segment stores a unit's position and results, a `checkpoint` marks a compaction.
//   archive/<first>-<last>.json   the results of segments first..last, written by a compaction before its checkpoint.
//
// Fencing. Segment n+1 is written to a temporary file, synced, then `link`ed to its name, which fails when the name is
// taken: of two writers that saw segment n as the newest, one gets n+1 and the other re-reads. A unit is linked only
// on top of a segment of its own epoch, and every owner's first segment is its claim, so a unit of an earlier owner
// can follow only segments of its own epoch: once a claim is linked, the earlier owner's next link fails and it finds
// the claim. All of this holds between processes sharing the directory: nothing but `link` decides.
//
// Compaction. After `compactEvery` units the owner writes their results to one archive, links a checkpoint on top of
// its last unit, then deletes every segment below the checkpoint in ascending order. Reads start from the newest
// segment (positions, claims) or the newest checkpoint (results), so neither depends on the partition's history.
// Each archive names the one before it, and the checkpoint names the newest: results are read along that chain from
// the checkpoint back to segment 1, so an archive left by a compaction that never linked its checkpoint is never read.
//
// The hole deletion opens, and how it is closed. Deleting segments frees their names: a zombie that still takes
// segment k for the newest could link a freed k+1 far below the newest checkpoint, where nobody reads it, and believe
// its unit committed. So after linking k+1 a writer checks that k is still there and is still the segment it knows
// (each segment has a random id; the writer wrote k or read it). Why that is enough: a name is freed only by a
// compaction, which deletes in ascending order every segment below its checkpoint, so had k+1 been deleted before the
// link, k would have been deleted before k+1, and could be there now only linked afresh by another zombie, with
// another id. So if k is there with its id, k+1 had never been taken before the link; as segments are only ever linked
// after the one before them, nothing above k existed: k was the newest and k+1 is its true successor. Otherwise the
// writer takes its k+1 back and reads the partition again. Segment 0 does not exist: a writer that linked segment 1
// checks instead that the partition was never compacted (no `archive` directory, which the first compaction creates
// before it deletes anything). This assumes what claims guarantee: one owner epoch belongs to one store.
//
// Crashes. A file's content is synced before it gets its name, and the directory that holds the name is synced after
// it (so is the parent of every directory the store makes): a crash leaves a segment or an archive whole or absent,
// never torn, and a unit that returned is there after it. What a crash leaves behind is never read: temporary files,
// an archive whose checkpoint was never linked (the next compaction of its range deletes it), segments below the
// newest checkpoint. test/FileStoreCrash.test.ts crashes a run after each of its file operations and checks this.

const STORE = "file"
const FORMAT_1 = "effect-kafka-delivery/offset-segment/1"
const FORMAT = "effect-kafka-delivery/offset-segment/2"
const ARCHIVE_FORMAT = "effect-kafka-delivery/offset-archive/1"
const SEQUENCE_DIGITS = 20
const SEGMENT_NAME = /^(\d{20})\.json$/
const ARCHIVE_NAME = /^(\d{20})-(\d{20})\.json$/
const PARTITION_NAME = /^(0|[1-9]\d*)$/
const ARCHIVE_DIRECTORY = "archive"

/**
 * Units between two compactions of a partition. A partition directory holds at most this many segments and a few
 * more, which bounds what a load or a claim lists; an archive holds the results of about this many units.
 *
 * @internal
 */
export const compactEvery = 256

/** How often a read starts over when a concurrent compaction deletes a segment under it. */
const READ_ATTEMPTS = 5

const Sequence = Schema.Int.pipe(Schema.positive())

const Place = {
  groupId: Schema.String,
  topic: Schema.String,
  partition: Schema.Int.pipe(Schema.nonNegative())
}

// What the previous version wrote, one segment per committed unit; read as units of epoch 0 (never claimed).
const SegmentV1 = Schema.Struct({
  format: Schema.Literal(FORMAT_1),
  ...Place,
  sequence: Sequence,
  from: Schema.NullOr(Schema.BigInt),
  next: Schema.BigInt,
  committedAt: Schema.String,
  results: Schema.Array(Schema.Unknown)
})

const Common = {
  format: Schema.Literal(FORMAT),
  id: Schema.String,
  ...Place,
  sequence: Sequence,
  epoch: Schema.BigInt,
  next: Schema.NullOr(Schema.BigInt),
  /** Offset ranges above `next` finished by units of records handled out of order; absent when none. */
  finished: Schema.optional(Schema.Array(Schema.Tuple(Schema.BigInt, Schema.BigInt)))
}

const ClaimOrUnit = Schema.Struct({
  ...Common,
  kind: Schema.Literal("claim", "unit"),
  writtenAt: Schema.String,
  results: Schema.Array(Schema.Unknown)
})

const Checkpoint = Schema.Struct({
  ...Common,
  kind: Schema.Literal("checkpoint"),
  archivedFrom: Sequence,
  archivedThrough: Sequence,
  writtenAt: Schema.String
})

const SegmentFile = Schema.Union(SegmentV1, ClaimOrUnit, Checkpoint)
const decodeSegment = Schema.decodeUnknownEither(Schema.parseJson(SegmentFile))
const encodeClaimOrUnit = Schema.encodeSync(ClaimOrUnit)
const encodeCheckpoint = Schema.encodeSync(Checkpoint)

const Range = Schema.Struct({ first: Sequence, last: Sequence })
type Range = typeof Range.Type

const Archive = Schema.Struct({
  format: Schema.Literal(ARCHIVE_FORMAT),
  ...Place,
  first: Sequence,
  last: Sequence,
  previous: Schema.NullOr(Range),
  results: Schema.Array(Schema.Unknown)
})
const decodeArchive = Schema.decodeUnknownEither(Schema.parseJson(Archive))
const encodeArchive = Schema.encodeSync(Archive)

/** A segment as the chain sees it, whatever its format. */
interface Segment {
  readonly sequence: number
  /** `null` for segments of format 1, which have none. */
  readonly id: string | null
  readonly kind: "claim" | "unit" | "checkpoint"
  readonly epoch: bigint
  readonly next: bigint | null
  readonly finished: ReadonlyArray<FinishedRange>
  /** The archived results a checkpoint stands for. */
  readonly archive: Range | undefined
  /** For format 1 only: the position the unit started from, which the previous segment must hold. */
  readonly from: bigint | null | undefined
  readonly results: ReadonlyArray<unknown>
}

const fromFile = (file: typeof SegmentFile.Type): Segment => {
  switch (file.format) {
    case FORMAT_1:
      return {
        sequence: file.sequence,
        id: null,
        kind: "unit",
        epoch: 0n,
        next: file.next,
        finished: [],
        archive: undefined,
        from: file.from,
        results: file.results
      }
    case FORMAT:
      return file.kind === "checkpoint"
        ? {
          sequence: file.sequence,
          id: file.id,
          kind: file.kind,
          epoch: file.epoch,
          next: file.next,
          finished: file.finished ?? [],
          archive: { first: file.archivedFrom, last: file.archivedThrough },
          from: undefined,
          results: []
        }
        : {
          sequence: file.sequence,
          id: file.id,
          kind: file.kind,
          epoch: file.epoch,
          next: file.next,
          finished: file.finished ?? [],
          archive: undefined,
          from: undefined,
          results: file.results
        }
  }
}

/**
 * The id of a segment, without decoding the rest of it: `null` for format 1 (which has none), `undefined` for what is
 * not a segment at all. Reading a segment's id is on every commit's path.
 */
const idOf = (text: string): string | null | undefined => {
  let parsed: unknown
  try {
    parsed = JSON.parse(text)
  } catch {
    return undefined
  }
  if (typeof parsed !== "object" || parsed === null || !("format" in parsed)) return undefined
  if (parsed.format === FORMAT_1) return null
  return parsed.format === FORMAT && "id" in parsed && typeof parsed.id === "string" ? parsed.id : undefined
}

/** The newest segment of a partition as this store last saw it. */
interface Head {
  /** 0: the partition has no segment. */
  readonly sequence: number
  readonly id: string | null
  readonly epoch: bigint
  readonly next: bigint | null
  readonly finished: ReadonlyArray<FinishedRange>
  /** The newest checkpoint at or below the head as far as this store knows (0: none); it decides when to compact. */
  readonly checkpoint: number
}

const EMPTY: Head = { sequence: 0, id: null, epoch: 0n, next: null, finished: [], checkpoint: 0 }

const headOf = (segment: Segment, checkpoint: number): Head => ({
  sequence: segment.sequence,
  id: segment.id,
  epoch: segment.epoch,
  next: segment.next,
  finished: segment.finished,
  checkpoint: segment.kind === "checkpoint" ? segment.sequence : checkpoint
})

/** Epoch 0 is a partition nobody claimed: segments of format 1, or no segment at all. */
const claimedEpoch = (head: Head): bigint | null => head.epoch === 0n ? null : head.epoch

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

/** The directory that holds `path` (itself for a root); either separator, as paths may come from any platform. */
const parentOf = (path: string): string => {
  const at = Math.max(path.lastIndexOf("/"), path.lastIndexOf("\\"))
  if (at < 0) return "."
  if (at === 0 || path[at - 1] === ":") return path.slice(0, at + 1)
  return path.slice(0, at)
}

const pad = (sequence: number): string => String(sequence).padStart(SEQUENCE_DIGITS, "0")
const segmentName = (sequence: number): string => `${pad(sequence)}.json`
const archiveName = (range: Range): string => `${pad(range.first)}-${pad(range.last)}.json`

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

const corruptArchive = (operation: string, path: string, detail: string, cause?: unknown) =>
  storeError(
    operation,
    `archive file ${path} is damaged or missing: ${detail}. Nothing was changed; positions still load and commits ` +
      "still land, but the partition's results cannot be read until the file is restored from a backup",
    cause
  )

/** A segment vanished while a read walked the chain: a compaction deleted it, and the read starts over. */
class Moved extends Data.TaggedError("Moved")<{ readonly path: string }> {}

/**
 * `compactEvery` is for tests, which go through many compactions in a few units.
 *
 * @internal
 */
export const make = (
  directory: string,
  options?: { readonly compactEvery?: number }
): Effect.Effect<Context.Context<OffsetStore | Results>, InvalidConfig | OffsetStoreError, FileSystem.FileSystem> =>
  Effect.gen(function*() {
    const unitsPerCompaction = options?.compactEvery ?? compactEvery
    if (directory.trim() === "" || directory.includes("\u0000")) {
      return yield* new InvalidConfig({
        field: "directory",
        reason: "the offset store needs a directory path (non-empty, without NUL characters)"
      })
    }
    const fs = yield* FileSystem.FileSystem
    const root = directory.length > 1 ? directory.replace(/\/+$/, "") || "/" : directory

    // A name in a directory (a new file's, a new directory's) is durable only once that directory is synced. This is
    // done on a best-effort basis: not every platform lets a directory be opened and synced, and a file's own content
    // is synced before it gets its name.
    const syncDirectory = (directory: string) =>
      Effect.scoped(Effect.flatMap(fs.open(directory, { flag: "r" }), (file) => file.sync)).pipe(Effect.ignore)

    // The levels of the root that do not exist yet, the deepest first: each one made is synced into its parent, or a
    // crash could take the whole store with it.
    const missing: Array<string> = []
    let level = root
    while (!(yield* fs.exists(level).pipe(Effect.orElseSucceed(() => true)))) {
      missing.push(level)
      const parent = parentOf(level)
      if (parent === level) break
      level = parent
    }
    yield* fs.makeDirectory(root, { recursive: true }).pipe(
      Effect.mapError((error) => storeError("open", `cannot create the directory ${root}: ${error.message}`, error))
    )
    for (const made of missing) yield* syncDirectory(parentOf(made))
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
    const topicDirectory = (groupId: string, topic: string) => join(groupDirectory(groupId), encodeName(topic))
    const partitionDirectory = (groupId: string, tp: TopicPartition.TopicPartition) =>
      join(topicDirectory(groupId, tp.topic), String(tp.partition))
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
      groupId: string,
      tp: TopicPartition.TopicPartition,
      sequence: number
    ): Effect.Effect<Option.Option<Segment>, OffsetStoreError> => {
      const path = join(partitionDirectory(groupId, tp), segmentName(sequence))
      return fs.readFileString(path).pipe(
        Effect.map(Option.some),
        Effect.catchIf(isNotFound, () => Effect.succeed(Option.none<string>())),
        Effect.mapError(ioError(operation, path)),
        Effect.flatMap(Option.match({
          onNone: () => Effect.succeed(Option.none<Segment>()),
          onSome: (text) =>
            Either.match(decodeSegment(text), {
              onLeft: (error) => Effect.fail(corrupt(operation, path, `it is not a valid segment (${error.message})`)),
              onRight: (file) =>
                file.groupId !== groupId || file.topic !== tp.topic || file.partition !== tp.partition ||
                  file.sequence !== sequence
                  ? Effect.fail(
                    corrupt(
                      operation,
                      path,
                      `it says it is segment ${file.sequence} of ${file.topic}-${file.partition} in group ` +
                        `${file.groupId}, which is not where it is stored`
                    )
                  )
                  : Effect.succeed(Option.some(fromFile(file)))
            })
        }))
      )
    }

    /** Sequence numbers of the segments of a partition, ascending; archives, junk and temporary files are ignored. */
    const listSegments = (
      operation: string,
      groupId: string,
      tp: TopicPartition.TopicPartition
    ): Effect.Effect<Array<number>, OffsetStoreError> => {
      const directory = partitionDirectory(groupId, tp)
      return fs.readDirectory(directory).pipe(
        Effect.catchIf(isNotFound, () => Effect.succeed<Array<string>>([])),
        Effect.mapError(ioError(operation, directory)),
        Effect.map((names) =>
          names.flatMap((name) => {
            const match = SEGMENT_NAME.exec(name)
            return match === null ? [] : [Number(match[1])]
          }).sort((a, b) => a - b)
        )
      )
    }

    /**
     * The newest segment, from a listing: the partition directory holds at most `compactEvery` and a few segments, so
     * this costs the same whatever the partition's history.
     */
    const scanHead = (
      operation: string,
      groupId: string,
      tp: TopicPartition.TopicPartition
    ): Effect.Effect<Head, OffsetStoreError> => {
      const attempt = (left: number): Effect.Effect<Head, OffsetStoreError> =>
        Effect.flatMap(listSegments(operation, groupId, tp), (sequences) => {
          const newest = sequences.at(-1)
          if (newest === undefined) return Effect.succeed(EMPTY)
          return Effect.flatMap(readSegment(operation, groupId, tp, newest), (segment) => {
            if (Option.isSome(segment)) return Effect.succeed(headOf(segment.value, sequences[0] - 1))
            // A compaction of another store can delete it only once a newer segment exists: list again.
            return left > 1 ? attempt(left - 1) : Effect.fail(
              storeError(
                operation,
                `the newest segment of ${tp.topic}-${tp.partition} vanished while it was read, ${READ_ATTEMPTS} ` +
                  `times in a row, in ${partitionDirectory(groupId, tp)}; is something deleting its files?`
              )
            )
          })
        })
      return attempt(READ_ATTEMPTS)
    }

    /** Writes `text` under `name` in `directory`, all or nothing; `false` when the name was taken already. */
    const createFile = (
      operation: string,
      directory: string,
      name: string,
      text: string
    ): Effect.Effect<boolean, OffsetStoreError> => {
      const temporary = join(directory, `.tmp-${crypto.randomUUID()}.json`)
      const path = join(directory, name)
      return Effect.gen(function*() {
        yield* Effect.scoped(Effect.gen(function*() {
          const file = yield* fs.open(temporary, { flag: "wx" })
          yield* file.writeAll(new TextEncoder().encode(text))
          yield* file.sync
        })).pipe(Effect.mapError(ioError(operation, temporary)))
        const created = yield* fs.link(temporary, path).pipe(
          Effect.as(true),
          Effect.catchIf(isAlreadyExists, () => Effect.succeed(false)),
          Effect.mapError((error) =>
            storeError(
              operation,
              `cannot link ${temporary} to ${path}: ${error.message}. The store needs a file system with hard links`,
              error
            )
          )
        )
        if (created) yield* syncDirectory(directory)
        return created
      }).pipe(Effect.ensuring(fs.remove(temporary).pipe(Effect.ignore)))
    }

    const removeIfPresent = (operation: string, path: string) =>
      fs.remove(path).pipe(Effect.catchIf(isNotFound, () => Effect.void), Effect.mapError(ioError(operation, path)))

    /** The check after a link (see the top of this file): is `head`, which the new segment follows, still there? */
    const stillThere = (
      operation: string,
      groupId: string,
      tp: TopicPartition.TopicPartition,
      head: Head
    ): Effect.Effect<boolean, OffsetStoreError> => {
      if (head.sequence === 0) {
        const archive = join(partitionDirectory(groupId, tp), ARCHIVE_DIRECTORY)
        return fs.exists(archive).pipe(Effect.map((exists) => !exists), Effect.mapError(ioError(operation, archive)))
      }
      // Not a decoded segment: only its identity matters here. A file that is not a segment any more was replaced.
      const path = join(partitionDirectory(groupId, tp), segmentName(head.sequence))
      return fs.readFileString(path).pipe(
        Effect.map((text) => idOf(text) === head.id),
        Effect.catchIf(isNotFound, () => Effect.succeed(false)),
        Effect.mapError(ioError(operation, path))
      )
    }

    type Linked =
      | { readonly _tag: "Linked"; readonly head: Head }
      /** Another writer took the name: the chain moved on. */
      | { readonly _tag: "Taken" }
      /** The name was free only because compaction had freed it: the new segment was taken back. */
      | { readonly _tag: "Dropped" }

    /** Links the segment that follows `head`, made by `segment` from its sequence and id. */
    const linkAfter = (
      operation: string,
      groupId: string,
      tp: TopicPartition.TopicPartition,
      head: Head,
      segment: (sequence: number, id: string, writtenAt: string) => { readonly text: string; readonly head: Head }
    ): Effect.Effect<Linked, OffsetStoreError> =>
      Effect.gen(function*() {
        const directory = partitionDirectory(groupId, tp)
        if (head.sequence === 0) {
          yield* fs.makeDirectory(directory, { recursive: true }).pipe(Effect.mapError(ioError(operation, directory)))
          // The partition's directory may be new, and its topic's and group's too: their names are made durable
          // before the first segment is, which a crash would otherwise lose with them.
          yield* syncDirectory(topicDirectory(groupId, tp.topic))
          yield* syncDirectory(groupDirectory(groupId))
          yield* syncDirectory(root)
        }
        const sequence = head.sequence + 1
        const writtenAt = new Date(yield* Clock.currentTimeMillis).toISOString()
        const made = segment(sequence, crypto.randomUUID(), writtenAt)
        const name = segmentName(sequence)
        if (!(yield* createFile(operation, directory, name, made.text))) return { _tag: "Taken" } as const
        if (yield* stillThere(operation, groupId, tp, head)) return { _tag: "Linked", head: made.head } as const
        yield* removeIfPresent(operation, join(directory, name))
        return { _tag: "Dropped" } as const
      })

    const render = (value: unknown) => `${JSON.stringify(value, null, 2)}\n`

    const claimOrUnit = (
      kind: "claim" | "unit",
      groupId: string,
      tp: TopicPartition.TopicPartition,
      head: Head,
      epoch: bigint,
      next: bigint | null,
      finished: ReadonlyArray<FinishedRange>,
      results: ReadonlyArray<unknown>
    ) =>
    (sequence: number, id: string, writtenAt: string) => ({
      text: render(encodeClaimOrUnit({
        format: FORMAT,
        id,
        groupId,
        topic: tp.topic,
        partition: tp.partition,
        sequence,
        epoch,
        next,
        ...(finished.length === 0 ? {} : { finished }),
        kind,
        writtenAt,
        results
      })),
      head: { sequence, id, epoch, next, finished, checkpoint: head.checkpoint }
    })

    /**
     * Writes the results of the segments since the newest checkpoint to an archive, links a checkpoint after `head`
     * (the owner's unit just linked), and deletes the segments below it. Returns the newest head. The unit has
     * committed whatever happens here: a failure is logged and the next compaction tries again.
     */
    const compact = (groupId: string, tp: TopicPartition.TopicPartition, head: Head): Effect.Effect<Head> => {
      const operation = "compact"
      const directory = partitionDirectory(groupId, tp)
      const archiveDirectory = join(directory, ARCHIVE_DIRECTORY)
      return Effect.gen(function*() {
        // The owner's own segments down to the newest checkpoint (or to segment 1): no other store deletes them
        // while it owns the partition, so each one is there.
        const segments: Array<Segment> = []
        for (let sequence = head.sequence; sequence >= 1; sequence--) {
          const segment = yield* readSegment(operation, groupId, tp, sequence)
          if (Option.isNone(segment)) {
            return yield* storeError(operation, `segment ${sequence} vanished before it was archived`)
          }
          segments.push(segment.value)
          if (segment.value.kind === "checkpoint") break
        }
        segments.reverse()
        const oldest = segments[0]
        const range: Range = { first: oldest.sequence, last: head.sequence }
        const archive = render(encodeArchive({
          format: ARCHIVE_FORMAT,
          groupId,
          topic: tp.topic,
          partition: tp.partition,
          first: range.first,
          last: range.last,
          previous: oldest.kind === "checkpoint" ? oldest.archive ?? null : null,
          results: segments.flatMap((segment) => segment.results)
        }))
        yield* fs.makeDirectory(archiveDirectory, { recursive: true }).pipe(
          Effect.mapError(ioError(operation, archiveDirectory))
        )
        const archivePath = join(archiveDirectory, archiveName(range))
        let created = yield* createFile(operation, archiveDirectory, archiveName(range), archive)
        if (!created) {
          // Left by a compaction of the same range that never linked its checkpoint (no checkpoint can refer to it:
          // it would be the one this compaction links). The same segments make the same archive; anything else is
          // replaced.
          const existing = yield* fs.readFileString(archivePath).pipe(Effect.mapError(ioError(operation, archivePath)))
          if (existing !== archive) {
            yield* removeIfPresent(operation, archivePath)
            created = yield* createFile(operation, archiveDirectory, archiveName(range), archive)
            if (!created) return yield* storeError(operation, `${archivePath} keeps being written by another store`)
          }
        }
        const linked = yield* linkAfter(operation, groupId, tp, head, (sequence, id, writtenAt) => ({
          text: render(encodeCheckpoint({
            format: FORMAT,
            id,
            groupId,
            topic: tp.topic,
            partition: tp.partition,
            sequence,
            epoch: head.epoch,
            next: head.next,
            ...(head.finished.length === 0 ? {} : { finished: head.finished }),
            kind: "checkpoint",
            archivedFrom: range.first,
            archivedThrough: range.last,
            writtenAt
          })),
          head: { sequence, id, epoch: head.epoch, next: head.next, finished: head.finished, checkpoint: sequence }
        }))
        if (linked._tag !== "Linked") {
          // Another member claimed the partition meanwhile; the archive would never be read.
          if (created) yield* removeIfPresent(operation, archivePath)
          return head
        }
        const checkpoint = linked.head
        yield* Effect.gen(function*() {
          // Ascending, which the check after every link relies on (see the top of this file).
          for (const sequence of yield* listSegments(operation, groupId, tp)) {
            if (sequence >= checkpoint.sequence) break
            yield* removeIfPresent(operation, join(directory, segmentName(sequence)))
          }
          // Archives of this range from compactions that never linked their checkpoint.
          const archives = yield* fs.readDirectory(archiveDirectory).pipe(
            Effect.mapError(ioError(operation, archiveDirectory))
          )
          for (const name of archives) {
            const match = ARCHIVE_NAME.exec(name)
            if (match !== null && Number(match[1]) === range.first && Number(match[2]) !== range.last) {
              yield* removeIfPresent(operation, join(archiveDirectory, name))
            }
          }
        }).pipe(Effect.catchAll((error) =>
          Effect.logWarning(
            `Offset store (file): ${tp.topic}-${tp.partition} of group ${groupId} is compacted, but not all of its ` +
              `old files could be deleted; the next compaction deletes them: ${error.message}`
          )
        ))
        return checkpoint
      }).pipe(Effect.catchAll((error) =>
        Effect.as(
          Effect.logWarning(
            `Offset store (file): could not compact ${tp.topic}-${tp.partition} of group ${groupId}; the unit ` +
              `committed, and the next unit tries again: ${error.message}`
          ),
          head
        )
      ))
    }

    // The newest segment this store linked is where its next unit goes. Whenever that is not so (another store linked
    // after it, or it is gone), the partition is listed again rather than followed segment by segment: a segment
    // followed from one that was deleted could be a zombie's, below the newest checkpoint, while the listing always
    // holds the newest segment.
    const store = (unit: CommitUnit, entries: ReadonlyArray<string>): Effect.Effect<void, OffsetStoreError | Fenced> =>
      Effect.gen(function*() {
        const { groupId, partition: tp } = unit
        const key = cacheKey(groupId, tp)
        const cached = heads.get(key)
        let head = cached ?? (yield* scanHead("commit", groupId, tp))
        let fresh = cached === undefined
        const results = entries.map((text): unknown => JSON.parse(text))
        while (true) {
          if (head.epoch !== unit.epoch) {
            if (!fresh) head = yield* scanHead("commit", groupId, tp)
            heads.set(key, head)
            if (head.epoch !== unit.epoch) return yield* fencedUnit(unit, claimedEpoch(head))
          }
          const stored = advance({ position: head.next, finished: head.finished }, unit)
          const linked = yield* linkAfter(
            "commit",
            groupId,
            tp,
            head,
            claimOrUnit("unit", groupId, tp, head, unit.epoch, stored.position, stored.finished, results)
          )
          if (linked._tag === "Linked") {
            head = linked.head
            heads.set(key, head)
            if (head.sequence - head.checkpoint >= unitsPerCompaction) {
              heads.set(key, yield* compact(groupId, tp, head))
            }
            return
          }
          // Another store linked this sequence, or the name was free only because compaction had freed it: the loop
          // checks the epoch of the newest segment.
          head = yield* scanHead("commit", groupId, tp)
          fresh = true
          heads.set(key, head)
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

    // A claim links on top of whatever segment is the newest, of any epoch, so it starts from a listing of the
    // partition, never from what this store last saw (see `store`).
    const claimPartition = (
      groupId: string,
      tp: TopicPartition.TopicPartition
    ): Effect.Effect<Claim, OffsetStoreError> =>
      Effect.gen(function*() {
        while (true) {
          const head = yield* scanHead("claim", groupId, tp)
          const epoch = head.epoch + 1n
          const linked = yield* linkAfter(
            "claim",
            groupId,
            tp,
            head,
            claimOrUnit("claim", groupId, tp, head, epoch, head.next, head.finished, [])
          )
          if (linked._tag === "Linked") {
            heads.set(cacheKey(groupId, tp), linked.head)
            return {
              epoch,
              position: head.next,
              ...(head.finished.length === 0 ? {} : { finished: head.finished })
            }
          }
        }
      }).pipe(Effect.uninterruptible, lockOf(cacheKey(groupId, tp)).withPermits(1))

    const claim = (
      groupId: string,
      partitions: ReadonlyArray<TopicPartition.TopicPartition>
    ): Effect.Effect<ReadonlyMap<string, Claim>, OffsetStoreError> =>
      Effect.forEach(
        partitions,
        (tp) =>
          validate("claim", groupId, tp).pipe(
            Effect.zipRight(claimPartition(groupId, tp)),
            Effect.map((claimed) => [TopicPartition.key(tp), claimed] as const)
          ),
        { concurrency: 8 }
      ).pipe(Effect.map((entries) => new Map(entries)))

    const load = (
      groupId: string,
      partitions: ReadonlyArray<TopicPartition.TopicPartition>
    ): Effect.Effect<ReadonlyMap<string, bigint>, OffsetStoreError> =>
      Effect.forEach(
        partitions,
        (tp) =>
          validate("load", groupId, tp).pipe(
            Effect.zipRight(scanHead("load", groupId, tp)),
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

    /** The archived results a checkpoint stands for, oldest first, along the chain of archives back to segment 1. */
    const readArchives = (
      groupId: string,
      tp: TopicPartition.TopicPartition,
      newest: Range
    ): Effect.Effect<Array<unknown>, OffsetStoreError> =>
      Effect.gen(function*() {
        const archiveDirectory = join(partitionDirectory(groupId, tp), ARCHIVE_DIRECTORY)
        const chunks: Array<ReadonlyArray<unknown>> = []
        let range: Range | null = newest
        while (range !== null) {
          const path = join(archiveDirectory, archiveName(range))
          const text = yield* fs.readFileString(path).pipe(
            Effect.mapError((error) =>
              isNotFound(error)
                ? corruptArchive("read", path, "a checkpoint refers to it, but it does not exist", error)
                : ioError("read", path)(error)
            )
          )
          const archive = yield* Either.match(decodeArchive(text), {
            onLeft: (error) =>
              Effect.fail(corruptArchive("read", path, `it is not a valid archive (${error.message})`)),
            onRight: Effect.succeed
          })
          if (
            archive.groupId !== groupId || archive.topic !== tp.topic || archive.partition !== tp.partition ||
            archive.first !== range.first || archive.last !== range.last
          ) {
            return yield* corruptArchive("read", path, "its contents are not those of the range it is named after")
          }
          const previous: Range | null = archive.previous
          if (previous === null ? range.first !== 1 : previous.last + 1 !== range.first) {
            return yield* corruptArchive("read", path, "it does not continue the archive before it")
          }
          chunks.push(archive.results)
          range = previous
        }
        return chunks.reverse().flat()
      })

    /** The segments from the newest checkpoint (or from segment 1) up to the newest one. */
    const liveSegments = (
      groupId: string,
      tp: TopicPartition.TopicPartition
    ): Effect.Effect<Array<Segment>, OffsetStoreError | Moved> =>
      Effect.gen(function*() {
        const sequences = yield* listSegments("read", groupId, tp)
        const newest = sequences.at(-1)
        const segments: Array<Segment> = []
        if (newest === undefined) return segments
        for (let sequence = newest; sequence >= 1; sequence--) {
          const segment = yield* readSegment("read", groupId, tp, sequence)
          if (Option.isNone(segment)) {
            return yield* new Moved({ path: join(partitionDirectory(groupId, tp), segmentName(sequence)) })
          }
          segments.push(segment.value)
          if (segment.value.kind === "checkpoint") break
        }
        return segments.reverse()
      })

    const readPartition = (
      groupId: string,
      tp: TopicPartition.TopicPartition
    ): Effect.Effect<Array<unknown>, OffsetStoreError> => {
      const live = (left: number): Effect.Effect<Array<Segment>, OffsetStoreError> =>
        Effect.catchIf(liveSegments(groupId, tp), (error): error is Moved => error instanceof Moved, (moved) =>
          left > 1 ? live(left - 1) : Effect.fail(
            storeError(
              "read",
              `segment file ${moved.path} is missing: the chain of segments has a gap (or something keeps deleting ` +
                "its files). Restore the file from a backup"
            )
          ))
      return Effect.flatMap(live(READ_ATTEMPTS), (segments) => {
        for (let i = 1; i < segments.length; i++) {
          const previous = segments[i - 1]
          const segment = segments[i]
          if (segment.from !== undefined && previous.from !== undefined && segment.from !== previous.next) {
            return Effect.fail(
              corrupt(
                "read",
                join(partitionDirectory(groupId, tp), segmentName(segment.sequence)),
                `it does not continue the segment before it (expected it to start from ${previous.next ?? "nothing"})`
              )
            )
          }
        }
        const results = segments.flatMap((segment) => segment.results)
        const oldest = segments[0]
        return oldest?.archive === undefined
          ? Effect.succeed(results)
          : Effect.map(readArchives(groupId, tp, oldest.archive), (archived) => [...archived, ...results])
      })
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

    return Context.make(OffsetStore, { name: STORE, load, claim, commit }).pipe(Context.add(Results, { read }))
  })
