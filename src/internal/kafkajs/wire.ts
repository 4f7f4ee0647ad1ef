/**
 * The sockets of a session's kafkajs clients, seen at the Kafka protocol level.
 *
 * kafkajs has no revoke callback: when it learns of a rebalance it sends its JoinGroup at once, and the group can then
 * complete the rebalance and hand this member's partitions to another one while the runloop still works on them.
 * Holding this member's JoinGroup holds the whole group (the eager protocol completes a rebalance only when every
 * member has joined, or its rebalance timeout has passed), which is what the Java consumer gets by calling
 * `onPartitionsRevoked` before it sends its JoinGroup. While the JoinGroup is held kafkajs sends no heartbeats, so this
 * layer sends them itself, with the member's generation, and keeps their answers away from kafkajs (`makeWire`).
 *
 * kafkajs implements OffsetFetch versions 1 to 4 only (its `src/protocol/requests/offsetFetch`), and those cannot ask
 * for stable offsets: `require_stable` came with version 7 (KIP-447). Without it a committed position read while the
 * group coordinator still completes a transactional offset commit (a transaction of `sendOffsetsToTransaction` that
 * is open, or committed but not yet materialized by the coordinator) is the old position. The session's reads go
 * through a client of their own (`makeReadWire`) whose OffsetFetch v4 requests are sent as version 7 with
 * `require_stable`, and whose answers are turned back into the version 4 layout kafkajs decodes; a partition with a
 * transactional commit pending answers UNSTABLE_OFFSET_COMMIT (88, retriable). Its ListOffsets ask for what a
 * read-uncommitted consumer can reach, the high watermark: kafkajs's admin asks read-committed, the last stable offset.
 *
 * kafkajs writes every request as one buffer (`int32 size, int16 apiKey, int16 apiVersion, int32 correlationId,
 * string clientId, body`), which is all this layer reads. It is Node-only, like kafkajs.
 */
import * as net from "node:net"
import * as tls from "node:tls"
import type { ISocketFactory, ISocketFactoryArgs } from "kafkajs"

const LIST_OFFSETS = 2
const OFFSET_COMMIT = 8
const OFFSET_FETCH = 9
const JOIN_GROUP = 11
const HEARTBEAT = 12
const SYNC_GROUP = 14
const API_VERSIONS = 18

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

type Listen = (event: string | symbol, listener: (...args: Array<unknown>) => void) => net.Socket
type Write = (chunk: unknown, ...rest: Array<unknown>) => boolean

/** kafkajs's default socket factory keeps connections alive with this delay. */
const KEEP_ALIVE_DELAY = 60_000

/** What the member's heartbeats carry, taken from the last SyncGroup or Heartbeat kafkajs sent. */
interface Membership {
  readonly socket: net.Socket
  readonly clientId: string | null
  readonly version: number
  readonly groupId: string
  readonly generationId: number
  readonly memberId: string
  readonly groupInstanceId: string | null
}

/** A cursor over a request or answer; every read checks its bounds and throws a RangeError past the end. */
class Reader {
  offset: number
  constructor(readonly buffer: Buffer, offset: number) {
    this.offset = offset
  }
  int8(): number {
    const value = this.buffer.readInt8(this.offset)
    this.offset += 1
    return value
  }
  int16(): number {
    const value = this.buffer.readInt16BE(this.offset)
    this.offset += 2
    return value
  }
  int32(): number {
    const value = this.buffer.readInt32BE(this.offset)
    this.offset += 4
    return value
  }
  int64(): bigint {
    const value = this.buffer.readBigInt64BE(this.offset)
    this.offset += 8
    return value
  }
  /** Skips an int64 and returns where it is. */
  skipInt64(): number {
    const at = this.offset
    this.buffer.readBigInt64BE(at)
    this.offset += 8
    return at
  }
  /** An unsigned varint, as the flexible versions write lengths and tags. */
  uvarint(): number {
    let value = 0
    for (let shift = 0; shift < 35; shift += 7) {
      const byte = this.buffer.readUInt8(this.offset++)
      value += (byte & 0x7f) * 2 ** shift
      if ((byte & 0x80) === 0) return value
    }
    throw new RangeError("varint longer than 5 bytes")
  }
  bytes(length: number): Buffer {
    if (length < 0 || this.offset + length > this.buffer.length) throw new RangeError("field past the end")
    const value = this.buffer.subarray(this.offset, this.offset + length)
    this.offset += length
    return value
  }
  /** A nullable string (int16 length, -1 for null), as its bytes. */
  stringBytes(): Buffer | null {
    const length = this.int16()
    return length < 0 ? null : this.bytes(length)
  }
  string(): string | null {
    const bytes = this.stringBytes()
    return bytes === null ? null : bytes.toString("utf8")
  }
  /** A compact nullable string (uvarint length + 1, 0 for null), as its bytes. */
  compactStringBytes(): Buffer | null {
    const length = this.uvarint()
    return length === 0 ? null : this.bytes(length - 1)
  }
  /** A compact array's length (uvarint length + 1); -1 for null. */
  compactLength(): number {
    return this.uvarint() - 1
  }
  /** Skips the tagged fields of a flexible version. */
  skipTags(): void {
    const count = this.uvarint()
    for (let i = 0; i < count; i++) {
      this.uvarint() // tag
      this.bytes(this.uvarint())
    }
  }
}

/** Builds a request or an answer, growing as needed. */
class Writer {
  private buffer = Buffer.alloc(256)
  private length = 0
  private room(n: number): number {
    if (this.length + n > this.buffer.length) {
      const grown = Buffer.alloc(Math.max(this.buffer.length * 2, this.length + n))
      this.buffer.copy(grown, 0, 0, this.length)
      this.buffer = grown
    }
    const at = this.length
    this.length += n
    return at
  }
  // `room` may replace the buffer: it is called before the buffer is looked up.
  int8(value: number): this {
    const at = this.room(1)
    this.buffer.writeInt8(value, at)
    return this
  }
  int16(value: number): this {
    const at = this.room(2)
    this.buffer.writeInt16BE(value, at)
    return this
  }
  int32(value: number): this {
    const at = this.room(4)
    this.buffer.writeInt32BE(value, at)
    return this
  }
  int64(value: bigint): this {
    const at = this.room(8)
    this.buffer.writeBigInt64BE(value, at)
    return this
  }
  uvarint(value: number): this {
    let rest = value
    while (rest >= 0x80) {
      const at = this.room(1)
      this.buffer.writeUInt8((rest % 0x80) | 0x80, at)
      rest = Math.floor(rest / 0x80)
    }
    const at = this.room(1)
    this.buffer.writeUInt8(rest, at)
    return this
  }
  bytes(value: Uint8Array): this {
    const at = this.room(value.length)
    this.buffer.set(value, at)
    return this
  }
  /** A nullable string (int16 length); longer than an int16 allows, it throws a RangeError. */
  stringBytes(value: Buffer | null): this {
    if (value === null) return this.int16(-1)
    return this.int16(value.length).bytes(value)
  }
  compactStringBytes(value: Buffer | null): this {
    if (value === null) return this.uvarint(0)
    return this.uvarint(value.length + 1).bytes(value)
  }
  /** No tagged fields. */
  noTags(): this {
    return this.uvarint(0)
  }
  toBuffer(): Buffer {
    return Buffer.from(this.buffer.subarray(0, this.length))
  }
}

interface RequestHeader {
  readonly apiKey: number
  readonly apiVersion: number
  readonly correlationId: number
  readonly clientId: string | null
  /** Where the request body starts. */
  readonly body: number
}

const readHeader = (buffer: Buffer): RequestHeader | undefined => {
  if (buffer.length < 14 || buffer.readInt32BE(0) !== buffer.length - 4) return undefined
  const reader = new Reader(buffer, 4)
  const apiKey = reader.int16()
  const apiVersion = reader.int16()
  const correlationId = reader.int32()
  const clientId = reader.string()
  return { apiKey, apiVersion, correlationId, clientId, body: reader.offset }
}

const writeString = (value: string | null): Buffer => {
  if (value === null) {
    const out = Buffer.alloc(2)
    out.writeInt16BE(-1)
    return out
  }
  const bytes = Buffer.from(value, "utf8")
  const out = Buffer.alloc(2 + bytes.length)
  out.writeInt16BE(bytes.length)
  bytes.copy(out, 2)
  return out
}

/** A Heartbeat request (versions 0 to 3 share this layout; version 3 adds the group instance id). */
const encodeHeartbeat = (membership: Membership, correlationId: number): Buffer => {
  const header = Buffer.alloc(8)
  header.writeInt16BE(HEARTBEAT, 0)
  header.writeInt16BE(membership.version, 2)
  header.writeInt32BE(correlationId, 4)
  const generation = Buffer.alloc(4)
  generation.writeInt32BE(membership.generationId)
  const parts = [
    header,
    writeString(membership.clientId),
    writeString(membership.groupId),
    generation,
    writeString(membership.memberId)
  ]
  if (membership.version >= 3) parts.push(writeString(membership.groupInstanceId))
  const body = Buffer.concat(parts)
  const size = Buffer.alloc(4)
  size.writeInt32BE(body.length)
  return Buffer.concat([size, body])
}

/**
 * What becomes of the answer to a request this layer looks after, given the answer's bytes after its correlation id:
 * `undefined` takes it out of the stream (nobody else waits for it), a buffer goes on to kafkajs as the answer's body
 * in its place (with the same correlation id).
 *
 * @internal
 */
export type Answer = (body: Buffer) => Buffer | undefined

/**
 * Follows the frames (`int32 size, int32 correlationId, ...`) a broker sends on one connection. The answers to
 * requests registered in `waiting` are collected whole and given to their `Answer`; every other byte passes through,
 * and chunks that hold none of those answers pass through untouched.
 *
 * @internal
 */
export class ResponseTap {
  /** Correlation id of a request still waiting for its answer, to what becomes of that answer. */
  readonly waiting = new Map<number, Answer>()
  private readonly header = Buffer.alloc(8)
  private headerLength = 0
  /** The header bytes received so far were passed on already (nothing was waiting when they came). */
  private headerForwarded = false
  /** Bytes of the current frame after its header still to come. */
  private remaining = 0
  private own: { readonly correlationId: number; readonly answer: Answer; readonly body: Array<Buffer> } | undefined

  feed(chunk: Buffer, forward: (data: Buffer) => void): void {
    if (this.own === undefined && this.remaining >= chunk.length) {
      this.remaining -= chunk.length
      forward(chunk)
      return
    }
    const out: Array<Buffer> = []
    let altered = false
    let i = 0
    while (i < chunk.length) {
      if (this.remaining > 0) {
        const n = Math.min(this.remaining, chunk.length - i)
        const piece = chunk.subarray(i, i + n)
        if (this.own === undefined) {
          out.push(piece)
        } else {
          this.own.body.push(piece)
          altered = true
        }
        this.remaining -= n
        i += n
        if (this.remaining === 0) this.settle(out)
        continue
      }
      const n = Math.min(8 - this.headerLength, chunk.length - i)
      if (this.headerLength === 0) this.headerForwarded = this.waiting.size === 0
      chunk.copy(this.header, this.headerLength, i, i + n)
      if (this.headerForwarded) out.push(chunk.subarray(i, i + n))
      else altered = true
      this.headerLength += n
      i += n
      if (this.headerLength < 8) break
      this.headerLength = 0
      this.remaining = this.header.readInt32BE(0) - 4
      const correlationId = this.header.readInt32BE(4)
      const answer = this.waiting.get(correlationId)
      if (!this.headerForwarded && answer !== undefined) {
        this.waiting.delete(correlationId)
        this.own = { correlationId, answer, body: [] }
        if (this.remaining <= 0) this.settle(out)
      } else if (!this.headerForwarded) {
        out.push(Buffer.from(this.header))
      }
    }
    if (!altered) forward(chunk)
    else if (out.length === 1) forward(out[0]!)
    else if (out.length > 1) forward(Buffer.concat(out))
  }

  private settle(out: Array<Buffer>): void {
    const own = this.own
    if (own === undefined) return
    this.own = undefined
    let body: Buffer | undefined
    try {
      body = own.answer(Buffer.concat(own.body))
    } catch {
      // An answer this layer cannot read is dropped; the request it belongs to times out in kafkajs.
      body = undefined
    }
    if (body === undefined) return
    const head = Buffer.alloc(8)
    head.writeInt32BE(body.length + 4, 0)
    head.writeInt32BE(own.correlationId, 4)
    out.push(head, body)
  }
}

/**
 * The answer to one of this layer's heartbeats: taken out, its error code handed to `onAnswer`.
 *
 * @internal
 */
export const heartbeatAnswer = (version: number, onAnswer: (errorCode: number) => void): Answer => (body) => {
  // Heartbeat v0 answers `error_code`; v1 and later `throttle_time_ms, error_code`.
  const at = version >= 1 ? 4 : 0
  if (body.length >= at + 2) onAnswer(body.readInt16BE(at))
  return undefined
}

/**
 * Wraps a new connection so that `onWrite` sees every request kafkajs writes (and may replace it, or hold it back by
 * returning `false`), and `tap` every byte the broker sends back. Returns the socket and a write that bypasses
 * `onWrite`, for requests of this layer's own.
 */
const openSocket = (
  { host, onConnect, port, ssl }: ISocketFactoryArgs,
  tap: ResponseTap,
  onWrite: (buffer: Buffer, write: (data: Buffer) => void) => Buffer | false
): { readonly socket: net.Socket; readonly write: (data: Buffer) => void } => {
  const socket: net.Socket = ssl
    ? tls.connect(Object.assign({ host, port }, net.isIP(host) ? {} : { servername: host }, ssl), onConnect)
    : net.connect({ host, port }, onConnect)
  socket.setKeepAlive(true, KEEP_ALIVE_DELAY)

  const on = socket.on.bind(socket) as Listen
  socket.on = ((event: string | symbol, listener: (...args: Array<unknown>) => void) =>
    event === "data"
      ? on("data", (chunk: unknown) => {
        if (Buffer.isBuffer(chunk)) tap.feed(chunk, listener)
        else listener(chunk)
      })
      : on(event, listener)) as typeof socket.on

  const write = socket.write.bind(socket) as Write
  const writeBuffer = (data: Buffer) => {
    write(data)
  }
  socket.write = ((chunk: unknown, ...rest: Array<unknown>) => {
    if (!Buffer.isBuffer(chunk)) return write(chunk, ...rest)
    let out: Buffer | false
    try {
      out = onWrite(chunk, writeBuffer)
    } catch {
      // Not a request this layer understands: kafkajs's own business.
      out = chunk
    }
    return out === false ? true : write(out, ...rest)
  }) as typeof socket.write
  return { socket, write: writeBuffer }
}

/** @internal */
export interface WireHooks {
  /**
   * kafkajs is about to send a JoinGroup for `memberId` (empty when it joins as a new member). Answering `true` holds
   * the request until `release`.
   */
  readonly onJoinGroup: (memberId: string) => boolean
  /**
   * kafkajs commits its default offset (-2 or -1) when a fetch answers OFFSET_OUT_OF_RANGE. The position the group
   * had, when known, is written instead, so that only the runloop's commits move the group's positions.
   */
  readonly committedPosition: (topic: string, partition: number) => bigint | undefined
  /** A heartbeat sent during a hold was answered with this error code (0: none). */
  readonly onHeartbeatAnswer: (errorCode: number) => void
}

/** @internal */
export interface Wire {
  readonly socketFactory: ISocketFactory
  /** Sends the JoinGroup requests held so far, in order. Later ones are sent at once until `hold` is called again. */
  readonly release: () => void
  /** Sends one heartbeat for the member's current generation; false when there is no membership to send it for. */
  readonly heartbeat: () => boolean
}

/**
 * Rewrites, in a copy of an OffsetCommit request (versions 1 to 5), the negative offsets kafkajs commits when it
 * resets an out-of-range partition, to the positions `committedPosition` knows. Returns the request unchanged when
 * there is nothing to rewrite or its layout is not one of those.
 */
const rewriteResetCommit = (
  buffer: Buffer,
  header: RequestHeader,
  committedPosition: WireHooks["committedPosition"]
): Buffer => {
  const version = header.apiVersion
  if (version < 1 || version > 5) return buffer
  const reader = new Reader(buffer, header.body)
  reader.string() // group_id
  reader.int32() // generation_id
  reader.string() // member_id
  if (version >= 2 && version <= 4) reader.skipInt64() // retention_time_ms
  let copy: Buffer | undefined
  const topics = reader.int32()
  for (let t = 0; t < topics; t++) {
    const topic = reader.string()
    const partitions = reader.int32()
    for (let p = 0; p < partitions; p++) {
      const partition = reader.int32()
      const at = reader.skipInt64()
      if (version === 1) reader.skipInt64() // timestamp
      reader.string() // metadata
      if (topic === null || buffer.readBigInt64BE(at) >= 0n) continue
      const position = committedPosition(topic, partition)
      if (position === undefined) continue
      copy ??= Buffer.from(buffer)
      copy.writeBigInt64BE(position, at)
    }
  }
  return copy ?? buffer
}

/**
 * Makes the socket factory of one kafkajs client, and the hold and heartbeats that act on its sockets.
 *
 * @internal
 */
export const makeWire = (hooks: WireHooks): Wire => {
  let membership: Membership | undefined
  /** A heartbeat kafkajs sent itself on this socket: its version is the one the broker agreed to. */
  let heartbeatVersion: number | undefined
  const held: Array<{ readonly socket: net.Socket; readonly write: () => void }> = []
  const taps = new WeakMap<net.Socket, { readonly tap: ResponseTap; readonly write: (data: Buffer) => void }>()
  let nextCorrelationId = -1

  const readMembership = (socket: net.Socket, buffer: Buffer, header: RequestHeader): Membership => {
    const reader = new Reader(buffer, header.body)
    const groupId = reader.string() ?? ""
    const generationId = reader.int32()
    const memberId = reader.string() ?? ""
    const groupInstanceId = header.apiVersion >= 3 ? reader.string() : null
    return {
      socket,
      clientId: header.clientId,
      version: Math.min(header.apiVersion, 3),
      groupId,
      generationId,
      memberId,
      groupInstanceId
    }
  }

  /** Looks at one request kafkajs writes; returns false when it is held, or the buffer to write. */
  const inspect = (socket: net.Socket, buffer: Buffer, write: (data: Buffer) => void): Buffer | false => {
    const header = readHeader(buffer)
    if (header === undefined) return buffer
    switch (header.apiKey) {
      case SYNC_GROUP:
        if (header.apiVersion <= 3) membership = readMembership(socket, buffer, header)
        return buffer
      case HEARTBEAT:
        if (header.apiVersion <= 3) {
          heartbeatVersion = header.apiVersion
          membership = readMembership(socket, buffer, header)
        }
        return buffer
      case JOIN_GROUP: {
        const reader = new Reader(buffer, header.body)
        reader.string() // group_id
        reader.int32() // session_timeout_ms
        if (header.apiVersion >= 1) reader.int32() // rebalance_timeout_ms
        const memberId = reader.string() ?? ""
        if (!hooks.onJoinGroup(memberId)) return buffer
        held.push({ socket, write: () => write(buffer) })
        // The coordinator kafkajs looked up for the rejoin is where the heartbeats of the hold go.
        if (membership !== undefined) membership = { ...membership, socket }
        return false
      }
      case OFFSET_COMMIT:
        return rewriteResetCommit(buffer, header, hooks.committedPosition)
      default:
        return buffer
    }
  }

  const socketFactory: ISocketFactory = (args) => {
    const tap = new ResponseTap()
    const opened = openSocket(args, tap, (buffer, write) => inspect(opened.socket, buffer, write))
    taps.set(opened.socket, { tap, write: opened.write })
    return opened.socket
  }

  const release = () => {
    for (const { socket, write } of held.splice(0)) {
      // A connection that closed meanwhile fails kafkajs's request on its own; nothing is left to send.
      if (socket.writable) write()
    }
  }

  const heartbeat = () => {
    const current = membership
    if (current === undefined || !current.socket.writable || current.memberId.length === 0) return false
    const own = taps.get(current.socket)
    if (own === undefined) return false
    const correlationId = nextCorrelationId
    nextCorrelationId = nextCorrelationId <= -0x7fffffff ? -1 : nextCorrelationId - 1
    const version = heartbeatVersion ?? current.version
    own.tap.waiting.set(correlationId, heartbeatAnswer(version, hooks.onHeartbeatAnswer))
    own.write(encodeHeartbeat({ ...current, version }, correlationId))
    return true
  }

  return { socketFactory, release, heartbeat }
}

// ---------------------------------------------------------------------------------------------------------------------
// reads: stable committed positions, high watermarks
// ---------------------------------------------------------------------------------------------------------------------

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
