/**
 * Compaction of a partition: the results since the last checkpoint archived, a checkpoint linked, the older segments
 * deleted.
 */
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import type * as TopicPartition from "../../../TopicPartition.js"
import { linkAfter, listSegments, readSegment } from "./chain.js"
import { createFile, type Files, partitionDirectory, removeIfPresent } from "./directory.js"
import {
  ARCHIVE_DIRECTORY,
  ARCHIVE_FORMAT,
  ARCHIVE_NAME,
  archiveName,
  encodeArchive,
  encodeCheckpoint,
  FORMAT,
  type Head,
  ioError,
  join,
  type Range,
  render,
  type Segment,
  segmentName,
  storeError
} from "./format.js"

/**
 * Writes the results of the segments since the newest checkpoint to an archive, links a checkpoint after `head`
 * (the owner's unit just linked), and deletes the segments below it. Returns the newest head. The unit has
 * committed whatever happens here: a failure is logged and the next compaction tries again.
 *
 * @internal
 */
export const compact = (
  files: Files,
  groupId: string,
  tp: TopicPartition.TopicPartition,
  head: Head
): Effect.Effect<Head> => {
  const operation = "compact"
  const directory = partitionDirectory(files, groupId, tp)
  const archiveDirectory = join(directory, ARCHIVE_DIRECTORY)
  return Effect.gen(function*() {
    // The owner's own segments down to the newest checkpoint (or to segment 1): no other store deletes them
    // while it owns the partition, so each one is there.
    const segments: Array<Segment> = []
    for (let sequence = head.sequence; sequence >= 1; sequence--) {
      const segment = yield* readSegment(files, operation, groupId, tp, sequence)
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
    yield* files.fs.makeDirectory(archiveDirectory, { recursive: true }).pipe(
      Effect.mapError(ioError(operation, archiveDirectory))
    )
    const archivePath = join(archiveDirectory, archiveName(range))
    let created = yield* createFile(files, operation, archiveDirectory, archiveName(range), archive)
    if (!created) {
      // Left by a compaction of the same range that never linked its checkpoint (no checkpoint can refer to it:
      // it would be the one this compaction links). The same segments make the same archive; anything else is
      // replaced.
      const existing = yield* files.fs.readFileString(archivePath).pipe(
        Effect.mapError(ioError(operation, archivePath))
      )
      if (existing !== archive) {
        yield* removeIfPresent(files, operation, archivePath)
        created = yield* createFile(files, operation, archiveDirectory, archiveName(range), archive)
        if (!created) return yield* storeError(operation, `${archivePath} keeps being written by another store`)
      }
    }
    const linked = yield* linkAfter(files, operation, groupId, tp, head, (sequence, id, writtenAt) => ({
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
      if (created) yield* removeIfPresent(files, operation, archivePath)
      return head
    }
    const checkpoint = linked.head
    yield* Effect.gen(function*() {
      // Ascending, which the check after every link relies on (see the top of chain.ts).
      for (const sequence of yield* listSegments(files, operation, groupId, tp)) {
        if (sequence >= checkpoint.sequence) break
        yield* removeIfPresent(files, operation, join(directory, segmentName(sequence)))
      }
      // Archives of this range from compactions that never linked their checkpoint.
      const archives = yield* files.fs.readDirectory(archiveDirectory).pipe(
        Effect.mapError(ioError(operation, archiveDirectory))
      )
      for (const name of archives) {
        const match = ARCHIVE_NAME.exec(name)
        if (match !== null && Number(match[1]) === range.first && Number(match[2]) !== range.last) {
          yield* removeIfPresent(files, operation, join(archiveDirectory, name))
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
