/**
 * The socket layer of a session's reads.
 *
 * kafkajs implements OffsetFetch versions 1 to 4 only (its `src/protocol/requests/offsetFetch`), and those cannot ask
 * for stable offsets: `require_stable` came with version 7 (KIP-447). Without it a committed position read while the
 * group coordinator still completes a transactional offset commit (a transaction of `sendOffsetsToTransaction` that
 * is open, or committed but not yet materialized by the coordinator) is the old position. The session's reads go
 * through a client of their own (`makeReadWire`) whose OffsetFetch v4 requests are sent as version 7 with
 * `require_stable`, and whose answers are turned back into the version 4 layout kafkajs decodes; a partition with a
 * transactional commit pending answers UNSTABLE_OFFSET_COMMIT (88, retriable). Its ListOffsets ask for what a
 * read-uncommitted consumer can reach, the high watermark: kafkajs's admin asks read-committed, the last stable offset.
 */
import type { ISocketFactory } from "kafkajs"
import { API_VERSIONS, LIST_OFFSETS, OFFSET_FETCH, Reader, readHeader, type RequestHeader, Writer } from "./protocol.js"
import { type Answer, openSocket, ResponseTap } from "./socket.js"

/**
 * The first OffsetFetch version that can ask for stable offsets (KIP-447, Kafka 2.5).
 *
 * @internal
 */
export const STABLE_OFFSET_FETCH = 7

/** The version kafkajs sends (its highest); the only one `toStableOffsetFetch` takes. */
const KAFKAJS_OFFSET_FETCH = 4

/** UNKNOWN_SERVER_ERROR: what an answer this layer could not read is passed on as. */
const UNKNOWN_SERVER_ERROR = -1

/**
 * Partition numbers by topic name: the partitions one committed read asks for.
 *
 * @internal
 */
export type Only = ReadonlyMap<string, ReadonlySet<number>>

/**
 * kafkajs's OffsetFetch v4 request as version 7 with `require_stable` set, for the same group and the same partitions
 * (those of `only` alone, when given: a partition of the topic with a transactional commit pending fails the whole of
 * kafkajs's read, and kafkajs asks for every partition of a topic).
 *
 * Version 4 (request header v1): `group_id STRING, topics NULLABLE_ARRAY(name STRING, partition_indexes
 * ARRAY(INT32))`. Version 7 is flexible (request header v2: header v1 then tagged fields): `group_id COMPACT_STRING,
 * topics COMPACT_NULLABLE_ARRAY(name COMPACT_STRING, partition_indexes COMPACT_ARRAY(INT32), tagged fields),
 * require_stable BOOLEAN, tagged fields`. Throws a RangeError for anything but an OffsetFetch v4 request.
 *
 * @internal
 */
export const toStableOffsetFetch = (request: Buffer, only?: Only): Buffer => {
  const header = readHeader(request)
  if (header === undefined || header.apiKey !== OFFSET_FETCH || header.apiVersion !== KAFKAJS_OFFSET_FETCH) {
    throw new RangeError("not an OffsetFetch v4 request")
  }
  const reader = new Reader(request, header.body)
  const groupId = reader.stringBytes()
  const count = reader.int32()
  const topics: Array<{ readonly name: Buffer | null; readonly partitions: Array<number> }> = []
  for (let t = 0; t < count; t++) {
    const name = reader.stringBytes()
    const partitions: Array<number> = []
    const n = reader.int32()
    for (let p = 0; p < n; p++) partitions.push(reader.int32())
    if (only === undefined) {
      topics.push({ name, partitions })
      continue
    }
    const wanted = name === null ? undefined : only.get(name.toString("utf8"))
    if (wanted !== undefined) topics.push({ name, partitions: partitions.filter((p) => wanted.has(p)) })
  }
  if (reader.offset !== request.length) throw new RangeError("bytes after the end of the request")
  const out = new Writer()
    .int32(0) // the size, written below
    .int16(OFFSET_FETCH)
    .int16(STABLE_OFFSET_FETCH)
    .int32(header.correlationId)
    .bytes(request.subarray(12, header.body)) // client_id, as kafkajs wrote it
    .noTags()
    .compactStringBytes(groupId)
  if (count < 0) {
    out.uvarint(0) // null: every topic of the group
  } else {
    out.uvarint(topics.length + 1)
    for (const { name, partitions } of topics) {
      out.compactStringBytes(name).uvarint(partitions.length + 1)
      for (const partition of partitions) out.int32(partition)
      out.noTags()
    }
  }
  const frame = out.int8(1).noTags().toBuffer() // require_stable = true
  frame.writeInt32BE(frame.length - 4, 0)
  return frame
}

/**
 * An OffsetFetch v7 answer in the version 4 layout kafkajs decodes. `body` is what follows the correlation id: the
 * tagged fields of response header v1, then `throttle_time_ms INT32, topics COMPACT_ARRAY(name COMPACT_STRING,
 * partitions COMPACT_ARRAY(partition_index INT32, committed_offset INT64, committed_leader_epoch INT32, metadata
 * COMPACT_NULLABLE_STRING, error_code INT16, tagged fields), tagged fields), error_code INT16, tagged fields`.
 * Version 4 is `throttle_time_ms INT32, responses ARRAY(topic STRING, partition_responses ARRAY(partition INT32,
 * offset INT64, metadata NULLABLE_STRING, error_code INT16)), error_code INT16`: the leader epoch and the tagged
 * fields go. Throws a RangeError for an answer it cannot read, or one that version 4 cannot carry.
 *
 * @internal
 */
export const fromStableOffsetFetch = (body: Buffer): Buffer => {
  const reader = new Reader(body, 0)
  reader.skipTags() // response header v1
  const out = new Writer().int32(reader.int32()) // throttle_time_ms
  const topics = Math.max(0, reader.compactLength())
  out.int32(topics)
  for (let t = 0; t < topics; t++) {
    out.stringBytes(reader.compactStringBytes())
    const partitions = Math.max(0, reader.compactLength())
    out.int32(partitions)
    for (let p = 0; p < partitions; p++) {
      out.int32(reader.int32()) // partition_index
      out.int64(reader.int64()) // committed_offset
      reader.int32() // committed_leader_epoch
      out.stringBytes(reader.compactStringBytes()) // metadata
      out.int16(reader.int16()) // error_code
      reader.skipTags()
    }
    reader.skipTags()
  }
  out.int16(reader.int16()) // error_code
  reader.skipTags()
  if (reader.offset !== body.length) throw new RangeError("bytes after the end of the answer")
  return out.toBuffer()
}

/** An OffsetFetch v4 answer that fails kafkajs's read as a whole with `errorCode`. */
const offsetFetchFailure = (errorCode: number): Buffer => new Writer().int32(0).int32(0).int16(errorCode).toBuffer()

/**
 * The highest OffsetFetch version an ApiVersions answer lists. kafkajs sends versions 0 to 2, whose answers are
 * `error_code INT16, api_keys ARRAY(api_key INT16, min_version INT16, max_version INT16)` (then `throttle_time_ms
 * INT32` from version 1); `undefined` for an error, or when OffsetFetch is not listed.
 *
 * @internal
 */
export const offsetFetchVersion = (body: Buffer): number | undefined => {
  const reader = new Reader(body, 0)
  if (reader.int16() !== 0) return undefined
  const count = reader.int32()
  for (let i = 0; i < count; i++) {
    const apiKey = reader.int16()
    reader.int16() // min_version
    const max = reader.int16()
    if (apiKey === OFFSET_FETCH) return max
  }
  return undefined
}

/**
 * A ListOffsets request (versions 2 to 5: `replica_id INT32, isolation_level INT8, ...`) asking what a
 * read-uncommitted consumer can reach: the latest offset it answers is the high watermark.
 */
const readUncommittedListOffsets = (request: Buffer, header: RequestHeader): Buffer => {
  if (header.apiVersion < 2 || header.apiVersion > 5) return request
  const at = header.body + 4
  if (request.readInt8(at) === 0) return request
  const copy = Buffer.from(request)
  copy.writeInt8(0, at)
  return copy
}

/** @internal */
export interface ReadWire {
  readonly socketFactory: ISocketFactory
  /**
   * Whether the cluster takes stable offset reads (OffsetFetch v7, Kafka 2.5 and later), as the first broker asked
   * for its API versions answered (kafkajs asks its seed broker only, and takes the others to be alike); `undefined`
   * until then.
   */
  readonly stableReads: () => boolean | undefined
  /**
   * The OffsetFetch requests written from now on ask for these partitions alone (`undefined`: for every partition
   * kafkajs asks for). Reads that set it must not overlap.
   */
  readonly only: (partitions: Only | undefined) => void
}

/**
 * Makes the socket factory of a kafkajs client for reads: its OffsetFetch requests are stable (version 7 with
 * `require_stable`, when the cluster has it), its ListOffsets requests read the high watermark.
 *
 * @internal
 */
export const makeReadWire = (): ReadWire => {
  let offsetFetchMax: number | undefined
  let only: Only | undefined

  const stableAnswer: Answer = (body) => {
    try {
      return fromStableOffsetFetch(body)
    } catch {
      return offsetFetchFailure(UNKNOWN_SERVER_ERROR)
    }
  }

  const socketFactory: ISocketFactory = (args) => {
    const tap = new ResponseTap()
    return openSocket(args, tap, (buffer) => {
      const header = readHeader(buffer)
      if (header === undefined) return buffer
      switch (header.apiKey) {
        case API_VERSIONS:
          if (header.apiVersion <= 2) {
            tap.waiting.set(header.correlationId, (body) => {
              const max = offsetFetchVersion(body)
              if (max !== undefined) offsetFetchMax = max
              return body
            })
          }
          return buffer
        case OFFSET_FETCH: {
          if (header.apiVersion !== KAFKAJS_OFFSET_FETCH) return buffer
          if (offsetFetchMax === undefined || offsetFetchMax < STABLE_OFFSET_FETCH) return buffer
          const stable = toStableOffsetFetch(buffer, only)
          tap.waiting.set(header.correlationId, stableAnswer)
          return stable
        }
        case LIST_OFFSETS:
          return readUncommittedListOffsets(buffer, header)
        default:
          return buffer
      }
    }).socket
  }

  return {
    socketFactory,
    stableReads: () => offsetFetchMax === undefined ? undefined : offsetFetchMax >= STABLE_OFFSET_FETCH,
    only: (partitions) => {
      only = partitions
    }
  }
}
