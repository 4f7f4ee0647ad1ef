/**
 * A partition's chain of segments: listing and reading it, and linking the segment that follows its newest one.
 */
import type { OffsetStoreError } from "../../../KafkaError.js"
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import type * as TopicPartition from "../../../TopicPartition.js"
import {
  createFile,
  type Files,
  groupDirectory,
  partitionDirectory,
  removeIfPresent,
  syncDirectory,
  topicDirectory
} from "./directory.js"
import {
  ARCHIVE_DIRECTORY,
  corrupt,
  decodeSegment,
  EMPTY,
  fromFile,
  type Head,
  headOf,
  idOf,
  ioError,
  isNotFound,
  join,
  READ_ATTEMPTS,
  SEGMENT_NAME,
  type Segment,
  segmentName,
  storeError
} from "./format.js"

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

/** Reads one segment; `None` when there is no file of that name. @internal */
export const readSegment = (
  files: Files,
  operation: string,
  groupId: string,
  tp: TopicPartition.TopicPartition,
  sequence: number
): Effect.Effect<Option.Option<Segment>, OffsetStoreError> => {
  const path = join(partitionDirectory(files, groupId, tp), segmentName(sequence))
  return files.fs.readFileString(path).pipe(
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

/**
 * Sequence numbers of the segments of a partition, ascending; archives, junk and temporary files are ignored.
 *
 * @internal
 */
export const listSegments = (
  files: Files,
  operation: string,
  groupId: string,
  tp: TopicPartition.TopicPartition
): Effect.Effect<Array<number>, OffsetStoreError> => {
  const directory = partitionDirectory(files, groupId, tp)
  return files.fs.readDirectory(directory).pipe(
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
 *
 * @internal
 */
export const scanHead = (
  files: Files,
  operation: string,
  groupId: string,
  tp: TopicPartition.TopicPartition
): Effect.Effect<Head, OffsetStoreError> => {
  const attempt = (left: number): Effect.Effect<Head, OffsetStoreError> =>
    Effect.flatMap(listSegments(files, operation, groupId, tp), (sequences) => {
      const newest = sequences.at(-1)
      if (newest === undefined) return Effect.succeed(EMPTY)
      return Effect.flatMap(readSegment(files, operation, groupId, tp, newest), (segment) => {
        if (Option.isSome(segment)) return Effect.succeed(headOf(segment.value, sequences[0] - 1))
        // A compaction of another store can delete it only once a newer segment exists: list again.
        return left > 1 ? attempt(left - 1) : Effect.fail(
          storeError(
            operation,
            `the newest segment of ${tp.topic}-${tp.partition} vanished while it was read, ${READ_ATTEMPTS} ` +
              `times in a row, in ${partitionDirectory(files, groupId, tp)}; is something deleting its files?`
          )
        )
      })
    })
  return attempt(READ_ATTEMPTS)
}

/** The check after a link (see the top of this file): is `head`, which the new segment follows, still there? */
const stillThere = (
  files: Files,
  operation: string,
  groupId: string,
  tp: TopicPartition.TopicPartition,
  head: Head
): Effect.Effect<boolean, OffsetStoreError> => {
  if (head.sequence === 0) {
    const archive = join(partitionDirectory(files, groupId, tp), ARCHIVE_DIRECTORY)
    return files.fs.exists(archive).pipe(Effect.map((exists) => !exists), Effect.mapError(ioError(operation, archive)))
  }
  // Not a decoded segment: only its identity matters here. A file that is not a segment any more was replaced.
  const path = join(partitionDirectory(files, groupId, tp), segmentName(head.sequence))
  return files.fs.readFileString(path).pipe(
    Effect.map((text) => idOf(text) === head.id),
    Effect.catchIf(isNotFound, () => Effect.succeed(false)),
    Effect.mapError(ioError(operation, path))
  )
}

/** @internal */
export type Linked =
  | { readonly _tag: "Linked"; readonly head: Head }
  /** Another writer took the name: the chain moved on. */
  | { readonly _tag: "Taken" }
  /** The name was free only because compaction had freed it: the new segment was taken back. */
  | { readonly _tag: "Dropped" }

/** Links the segment that follows `head`, made by `segment` from its sequence and id. @internal */
export const linkAfter = (
  files: Files,
  operation: string,
  groupId: string,
  tp: TopicPartition.TopicPartition,
  head: Head,
  segment: (sequence: number, id: string, writtenAt: string) => { readonly text: string; readonly head: Head }
): Effect.Effect<Linked, OffsetStoreError> =>
  Effect.gen(function*() {
    const directory = partitionDirectory(files, groupId, tp)
    if (head.sequence === 0) {
      yield* files.fs.makeDirectory(directory, { recursive: true }).pipe(Effect.mapError(ioError(operation, directory)))
      // The partition's directory may be new, and its topic's and group's too: their names are made durable
      // before the first segment is, which a crash would otherwise lose with them.
      yield* syncDirectory(files.fs, topicDirectory(files, groupId, tp.topic))
      yield* syncDirectory(files.fs, groupDirectory(files, groupId))
      yield* syncDirectory(files.fs, files.root)
    }
    const sequence = head.sequence + 1
    const writtenAt = new Date(yield* Clock.currentTimeMillis).toISOString()
    const made = segment(sequence, crypto.randomUUID(), writtenAt)
    const name = segmentName(sequence)
    if (!(yield* createFile(files, operation, directory, name, made.text))) return { _tag: "Taken" } as const
    if (yield* stillThere(files, operation, groupId, tp, head)) return { _tag: "Linked", head: made.head } as const
    yield* removeIfPresent(files, operation, join(directory, name))
    return { _tag: "Dropped" } as const
  })
