/**
 * What the file store writes: segments and archives (their JSON formats and names), the newest segment as the store
 * keeps it, and the errors that name a damaged or unreachable file.
 */
import type { PlatformError } from "@effect/platform/Error"
import * as Data from "effect/Data"
import * as Option from "effect/Option"
import * as Schema from "effect/Schema"
import type * as TopicPartition from "../../../TopicPartition.js"
import type { Range as FinishedRange } from "../../consumer/progress.js"
import { OffsetStoreError } from "../../../KafkaError.js"

const FORMAT_1 = "effect-kafka-delivery/offset-segment/1"
const SEQUENCE_DIGITS = 20

/** @internal */
export const STORE = "file"
/** @internal */
export const FORMAT = "effect-kafka-delivery/offset-segment/2"
/** @internal */
export const ARCHIVE_FORMAT = "effect-kafka-delivery/offset-archive/1"
/** @internal */
export const SEGMENT_NAME = /^(\d{20})\.json$/
/** @internal */
export const ARCHIVE_NAME = /^(\d{20})-(\d{20})\.json$/
/** @internal */
export const PARTITION_NAME = /^(0|[1-9]\d*)$/
/** @internal */
export const ARCHIVE_DIRECTORY = "archive"

/**
 * Units between two compactions of a partition. A partition directory holds at most this many segments and a few
 * more, which bounds what a load or a claim lists; an archive holds the results of about this many units.
 *
 * @internal
 */
export const compactEvery = 256

/** How often a read starts over when a concurrent compaction deletes a segment under it. @internal */
export const READ_ATTEMPTS = 5

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
/** @internal */
export const decodeSegment = Schema.decodeUnknownEither(Schema.parseJson(SegmentFile))
const encodeClaimOrUnit = Schema.encodeSync(ClaimOrUnit)
/** @internal */
export const encodeCheckpoint = Schema.encodeSync(Checkpoint)

/** @internal */
export const Range = Schema.Struct({ first: Sequence, last: Sequence })
/** @internal */
export type Range = typeof Range.Type

const Archive = Schema.Struct({
  format: Schema.Literal(ARCHIVE_FORMAT),
  ...Place,
  first: Sequence,
  last: Sequence,
  previous: Schema.NullOr(Range),
  results: Schema.Array(Schema.Unknown)
})
/** @internal */
export const decodeArchive = Schema.decodeUnknownEither(Schema.parseJson(Archive))
/** @internal */
export const encodeArchive = Schema.encodeSync(Archive)

/** A segment as the chain sees it, whatever its format. @internal */
export interface Segment {
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

/** @internal */
export const fromFile = (file: typeof SegmentFile.Type): Segment => {
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
      return {
        sequence: file.sequence,
        id: file.id,
        kind: file.kind,
        epoch: file.epoch,
        next: file.next,
        finished: file.finished ?? [],
        archive: file.kind === "checkpoint" ? { first: file.archivedFrom, last: file.archivedThrough } : undefined,
        from: undefined,
        results: file.kind === "checkpoint" ? [] : file.results
      }
  }
}

/**
 * The id of a segment, without decoding the rest of it: `null` for format 1 (which has none), `undefined` for what is
 * not a segment at all. Reading a segment's id is on every commit's path.
 *
 * @internal
 */
export const idOf = (text: string): string | null | undefined => {
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

/** The newest segment of a partition as this store last saw it. @internal */
export interface Head {
  /** 0: the partition has no segment. */
  readonly sequence: number
  readonly id: string | null
  readonly epoch: bigint
  readonly next: bigint | null
  readonly finished: ReadonlyArray<FinishedRange>
  /** The newest checkpoint at or below the head as far as this store knows (0: none); it decides when to compact. */
  readonly checkpoint: number
}

/** @internal */
export const EMPTY: Head = { sequence: 0, id: null, epoch: 0n, next: null, finished: [], checkpoint: 0 }

/** @internal */
export const headOf = (segment: Segment, checkpoint: number): Head => ({
  sequence: segment.sequence,
  id: segment.id,
  epoch: segment.epoch,
  next: segment.next,
  finished: segment.finished,
  checkpoint: segment.kind === "checkpoint" ? segment.sequence : checkpoint
})

/** Epoch 0 is a partition nobody claimed: segments of format 1, or no segment at all. @internal */
export const claimedEpoch = (head: Head): bigint | null => head.epoch === 0n ? null : head.epoch

/**
 * Names stay readable for ordinary group ids and topics; anything that could mean something to a file system
 * (separators, dots, reserved characters) is percent-encoded, so a name can never climb out of its directory.
 *
 * @internal
 */
export const encodeName = (name: string): string =>
  encodeURIComponent(name).replace(/[.!~*'()]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`)

/** @internal */
export const decodeName = (name: string): Option.Option<string> => {
  try {
    return Option.some(decodeURIComponent(name))
  } catch {
    return Option.none()
  }
}

/** @internal */
export const join = (directory: string, name: string): string =>
  directory.endsWith("/") ? `${directory}${name}` : `${directory}/${name}`

/**
 * The directory that holds `path` (itself for a root); either separator, as paths may come from any platform.
 *
 * @internal
 */
export const parentOf = (path: string): string => {
  const at = Math.max(path.lastIndexOf("/"), path.lastIndexOf("\\"))
  if (at < 0) return "."
  if (at === 0 || path[at - 1] === ":") return path.slice(0, at + 1)
  return path.slice(0, at)
}

const pad = (sequence: number): string => String(sequence).padStart(SEQUENCE_DIGITS, "0")
/** @internal */
export const segmentName = (sequence: number): string => `${pad(sequence)}.json`
/** @internal */
export const archiveName = (range: Range): string => `${pad(range.first)}-${pad(range.last)}.json`

/** @internal */
export const isNotFound = (error: PlatformError): boolean => error._tag === "SystemError" && error.reason === "NotFound"
/** @internal */
export const isAlreadyExists = (error: PlatformError): boolean =>
  error._tag === "SystemError" && error.reason === "AlreadyExists"

/** @internal */
export const storeError = (operation: string, reason: string, cause?: unknown) =>
  new OffsetStoreError({ store: STORE, operation, reason, cause })

/** @internal */
export const ioError = (operation: string, path: string) => (error: PlatformError) =>
  storeError(operation, `cannot access ${path}: ${error.message}`, error)

/** @internal */
export const corrupt = (operation: string, path: string, detail: string, cause?: unknown) =>
  storeError(
    operation,
    `segment file ${path} is damaged: ${detail}. Nothing was changed. Restore the file from a backup; or, if it is ` +
      "the newest segment of its partition, move it out of the directory to roll the partition back to the previous " +
      "segment (its results go with it, so nothing is duplicated)",
    cause
  )

/** @internal */
export const corruptArchive = (operation: string, path: string, detail: string, cause?: unknown) =>
  storeError(
    operation,
    `archive file ${path} is damaged or missing: ${detail}. Nothing was changed; positions still load and commits ` +
      "still land, but the partition's results cannot be read until the file is restored from a backup",
    cause
  )

/** A segment vanished while a read walked the chain: a compaction deleted it, and the read starts over. @internal */
export class Moved extends Data.TaggedError("Moved")<{ readonly path: string }> {}

/** A file's text: its JSON, indented, and a final newline. @internal */
export const render = (value: unknown) => `${JSON.stringify(value, null, 2)}\n`

/**
 * The `claim` or `unit` segment that follows `head`, made once its sequence, id and time are known (see `linkAfter`).
 *
 * @internal
 */
export const claimOrUnit = (
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
