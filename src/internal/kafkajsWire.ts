/**
 * The sockets of one session's kafkajs client, seen at the Kafka protocol level.
 *
 * kafkajs has no revoke callback: when it learns of a rebalance it sends its JoinGroup at once, and the group can then
 * complete the rebalance and hand this member's partitions to another one while the runloop still works on them.
 * Holding this member's JoinGroup holds the whole group (the eager protocol completes a rebalance only when every
 * member has joined, or its rebalance timeout has passed), which is what the Java consumer gets by calling
 * `onPartitionsRevoked` before it sends its JoinGroup. While the JoinGroup is held kafkajs sends no heartbeats, so this
 * layer sends them itself, with the member's generation, and keeps their answers away from kafkajs.
 *
 * kafkajs writes every request as one buffer (`int32 size, int16 apiKey, int16 apiVersion, int32 correlationId,
 * string clientId, body`), which is all this layer reads. It is Node-only, like kafkajs.
 */
import * as net from "node:net"
import * as tls from "node:tls"
import type { ISocketFactory } from "kafkajs"

const OFFSET_COMMIT = 8
const JOIN_GROUP = 11
const HEARTBEAT = 12
const SYNC_GROUP = 14

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

/** A cursor over a request buffer; every read checks its bounds and throws a RangeError past the end. */
class Reader {
  offset: number
  constructor(readonly buffer: Buffer, offset: number) {
    this.offset = offset
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
  /** Skips an int64 and returns where it is. */
  skipInt64(): number {
    const at = this.offset
    this.buffer.readBigInt64BE(at)
    this.offset += 8
    return at
  }
  string(): string | null {
    const length = this.int16()
    if (length < 0) return null
    if (this.offset + length > this.buffer.length) throw new RangeError("string past the end of the request")
    const value = this.buffer.toString("utf8", this.offset, this.offset + length)
    this.offset += length
    return value
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
 * Follows the frames (`int32 size, int32 correlationId, ...`) a broker sends on one connection, and takes out the
 * answers to requests this layer wrote itself. Chunks that hold none of them pass through untouched.
 *
 * @internal
 */
export class ResponseTap {
  /** Correlation id to API version of requests of this layer still waiting for an answer. */
  readonly waiting = new Map<number, number>()
  private readonly header = Buffer.alloc(8)
  private headerLength = 0
  /** The header bytes received so far were passed on already (nothing was waiting when they came). */
  private headerForwarded = false
  /** Bytes of the current frame after its header still to come. */
  private remaining = 0
  private own: { readonly version: number; readonly body: Array<Buffer> } | undefined

  constructor(private readonly onAnswer: (errorCode: number) => void) {}

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
        if (this.remaining === 0) this.settle()
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
      const version = this.waiting.get(correlationId)
      if (!this.headerForwarded && version !== undefined) {
        this.waiting.delete(correlationId)
        this.own = { version, body: [] }
        if (this.remaining <= 0) this.settle()
      } else if (!this.headerForwarded) {
        out.push(Buffer.from(this.header))
      }
    }
    if (!altered) forward(chunk)
    else if (out.length === 1) forward(out[0]!)
    else if (out.length > 1) forward(Buffer.concat(out))
  }

  private settle(): void {
    const own = this.own
    if (own === undefined) return
    this.own = undefined
    const body = Buffer.concat(own.body)
    // Heartbeat v0 answers `error_code`; v1 and later `throttle_time_ms, error_code`.
    const at = own.version >= 1 ? 4 : 0
    if (body.length >= at + 2) this.onAnswer(body.readInt16BE(at))
  }
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

  const socketFactory: ISocketFactory = ({ host, onConnect, port, ssl }) => {
    const socket: net.Socket = ssl
      ? tls.connect(Object.assign({ host, port }, net.isIP(host) ? {} : { servername: host }, ssl), onConnect)
      : net.connect({ host, port }, onConnect)
    socket.setKeepAlive(true, KEEP_ALIVE_DELAY)

    const tap = new ResponseTap(hooks.onHeartbeatAnswer)
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
    taps.set(socket, { tap, write: writeBuffer })
    socket.write = ((chunk: unknown, ...rest: Array<unknown>) => {
      if (!Buffer.isBuffer(chunk)) return write(chunk, ...rest)
      let out: Buffer | false
      try {
        out = inspect(socket, chunk, writeBuffer)
      } catch {
        // Not a request this layer understands: kafkajs's own business.
        out = chunk
      }
      return out === false ? true : write(out, ...rest)
    }) as typeof socket.write
    return socket
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
    own.tap.waiting.set(correlationId, version)
    own.write(encodeHeartbeat({ ...current, version }, correlationId))
    return true
  }

  return { socketFactory, release, heartbeat }
}
