/**
 * The Kafka protocol as the session's socket layer reads and writes it: the API keys it looks at, request headers, and
 * a reader and a writer of the protocol's types.
 *
 * kafkajs writes every request as one buffer (`int32 size, int16 apiKey, int16 apiVersion, int32 correlationId,
 * string clientId, body`), which is all this layer reads. It is Node-only, like kafkajs.
 */

/** @internal */
export const LIST_OFFSETS = 2
/** @internal */
export const OFFSET_COMMIT = 8
/** @internal */
export const OFFSET_FETCH = 9
/** @internal */
export const JOIN_GROUP = 11
/** @internal */
export const HEARTBEAT = 12
/** @internal */
export const SYNC_GROUP = 14
/** @internal */
export const API_VERSIONS = 18

/** A cursor over a request or answer; every read checks its bounds and throws a RangeError past the end. @internal */
export class Reader {
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

/** Builds a request or an answer, growing as needed. @internal */
export class Writer {
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

/** @internal */
export interface RequestHeader {
  readonly apiKey: number
  readonly apiVersion: number
  readonly correlationId: number
  readonly clientId: string | null
  /** Where the request body starts. */
  readonly body: number
}

/** @internal */
export const readHeader = (buffer: Buffer): RequestHeader | undefined => {
  if (buffer.length < 14 || buffer.readInt32BE(0) !== buffer.length - 4) return undefined
  const reader = new Reader(buffer, 4)
  const apiKey = reader.int16()
  const apiVersion = reader.int16()
  const correlationId = reader.int32()
  const clientId = reader.string()
  return { apiKey, apiVersion, correlationId, clientId, body: reader.offset }
}

/** @internal */
export const writeString = (value: string | null): Buffer => {
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
