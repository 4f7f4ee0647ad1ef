/**
 * Reading a partition's committed results back: the segments since the newest checkpoint, and the archives before.
 */
import type { OffsetStoreError } from "../../../KafkaError.js"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Option from "effect/Option"
import * as TopicPartition from "../../../TopicPartition.js"
import { listSegments, readSegment } from "./chain.js"
import { type Files, groupDirectory, partitionDirectory } from "./directory.js"
import {
  ARCHIVE_DIRECTORY,
  archiveName,
  corrupt,
  corruptArchive,
  decodeArchive,
  decodeName,
  ioError,
  isNotFound,
  join,
  Moved,
  PARTITION_NAME,
  type Range,
  READ_ATTEMPTS,
  type Segment,
  segmentName,
  storeError
} from "./format.js"

/** The archived results a checkpoint stands for, oldest first, along the chain of archives back to segment 1. */
const readArchives = (
  files: Files,
  groupId: string,
  tp: TopicPartition.TopicPartition,
  newest: Range
): Effect.Effect<Array<unknown>, OffsetStoreError> =>
  Effect.gen(function*() {
    const archiveDirectory = join(partitionDirectory(files, groupId, tp), ARCHIVE_DIRECTORY)
    const chunks: Array<ReadonlyArray<unknown>> = []
    let range: Range | null = newest
    while (range !== null) {
      const path = join(archiveDirectory, archiveName(range))
      const text = yield* files.fs.readFileString(path).pipe(
        Effect.mapError((error) =>
          isNotFound(error)
            ? corruptArchive("read", path, "a checkpoint refers to it, but it does not exist", error)
            : ioError("read", path)(error)
        )
      )
      const archive = yield* Either.match(decodeArchive(text), {
        onLeft: (error) => Effect.fail(corruptArchive("read", path, `it is not a valid archive (${error.message})`)),
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
  files: Files,
  groupId: string,
  tp: TopicPartition.TopicPartition
): Effect.Effect<Array<Segment>, OffsetStoreError | Moved> =>
  Effect.gen(function*() {
    const sequences = yield* listSegments(files, "read", groupId, tp)
    const newest = sequences.at(-1)
    const segments: Array<Segment> = []
    if (newest === undefined) return segments
    for (let sequence = newest; sequence >= 1; sequence--) {
      const segment = yield* readSegment(files, "read", groupId, tp, sequence)
      if (Option.isNone(segment)) {
        return yield* new Moved({ path: join(partitionDirectory(files, groupId, tp), segmentName(sequence)) })
      }
      segments.push(segment.value)
      if (segment.value.kind === "checkpoint") break
    }
    return segments.reverse()
  })

/** @internal */
export const readPartition = (
  files: Files,
  groupId: string,
  tp: TopicPartition.TopicPartition
): Effect.Effect<Array<unknown>, OffsetStoreError> => {
  const live = (left: number): Effect.Effect<Array<Segment>, OffsetStoreError> =>
    Effect.catchIf(
      liveSegments(files, groupId, tp),
      (error): error is Moved => error instanceof Moved,
      (moved) =>
        left > 1 ? live(left - 1) : Effect.fail(
          storeError(
            "read",
            `segment file ${moved.path} is missing: the chain of segments has a gap (or something keeps deleting ` +
              "its files). Restore the file from a backup"
          )
        )
    )
  return Effect.flatMap(live(READ_ATTEMPTS), (segments) => {
    for (let i = 1; i < segments.length; i++) {
      const previous = segments[i - 1]
      const segment = segments[i]
      if (segment.from !== undefined && previous.from !== undefined && segment.from !== previous.next) {
        return Effect.fail(
          corrupt(
            "read",
            join(partitionDirectory(files, groupId, tp), segmentName(segment.sequence)),
            `it does not continue the segment before it (expected it to start from ${previous.next ?? "nothing"})`
          )
        )
      }
    }
    const results = segments.flatMap((segment) => segment.results)
    const oldest = segments[0]
    return oldest?.archive === undefined
      ? Effect.succeed(results)
      : Effect.map(readArchives(files, groupId, tp, oldest.archive), (archived) => [...archived, ...results])
  })
}

/** @internal */
export const partitionsOf = (
  files: Files,
  groupId: string
): Effect.Effect<Array<TopicPartition.TopicPartition>, OffsetStoreError> => {
  const directory = groupDirectory(files, groupId)
  return files.fs.readDirectory(directory).pipe(
    Effect.catchIf(isNotFound, () => Effect.succeed<Array<string>>([])),
    Effect.mapError(ioError("read", directory)),
    Effect.flatMap((topics) =>
      Effect.forEach(topics, (name) =>
        Option.match(decodeName(name), {
          onNone: () => Effect.succeed([]),
          onSome: (topic) => {
            const topicDirectory = join(directory, name)
            return files.fs.readDirectory(topicDirectory).pipe(
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
