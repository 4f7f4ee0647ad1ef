/**
 * The sockets of a session's kafkajs consumer, seen at the Kafka protocol level.
 *
 * kafkajs has no revoke callback: when it learns of a rebalance it sends its JoinGroup at once, and the group can then
 * complete the rebalance and hand this member's partitions to another one while the runloop still works on them.
 * Holding this member's JoinGroup holds the whole group (the eager protocol completes a rebalance only when every
 * member has joined, or its rebalance timeout has passed), which is what the Java consumer gets by calling
 * `onPartitionsRevoked` before it sends its JoinGroup. While the JoinGroup is held kafkajs sends no heartbeats, so this
 * layer sends them itself, with the member's generation, and keeps their answers away from kafkajs (`makeWire`).
 *
 * The stable committed reads and the high watermarks go through a client of their own (`readWire.ts`).
 */
import type * as net from "node:net"
import type { ISocketFactory } from "kafkajs"
import {
  HEARTBEAT,
  JOIN_GROUP,
  OFFSET_COMMIT,
  Reader,
  readHeader,
  type RequestHeader,
  SYNC_GROUP,
  writeString
} from "./protocol.js"
import { type Answer, openSocket, ResponseTap } from "./socket.js"

export {
  fromStableOffsetFetch,
  makeReadWire,
  offsetFetchVersion,
  type Only,
  type ReadWire,
  STABLE_OFFSET_FETCH,
  toStableOffsetFetch
} from "./readWire.js"
export { type Answer, ResponseTap } from "./socket.js"

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
