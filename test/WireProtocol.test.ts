// dprint-ignore-file: the byte layouts below are laid out one protocol field per group, as the message definitions read
/**
 * The stable offset reads of the kafkajs driver, byte by byte: kafkajs's OffsetFetch v4 request sent as version 7 with
 * `require_stable`, the version 7 answer turned back into the version 4 layout kafkajs decodes, the OffsetFetch
 * version an ApiVersions answer lists, and the socket layer's tap replacing an answer in a stream of frames. The
 * expected bytes are written out from the Kafka protocol's message definitions (OffsetFetchRequest.json,
 * OffsetFetchResponse.json, ApiVersionsResponse.json; request header v1 and v2, response header v0 and v1).
 */
import { assert, describe, it } from "@effect/vitest"
import { createRequire } from "node:module"
import {
  fromStableOffsetFetch,
  offsetFetchVersion,
  ResponseTap,
  STABLE_OFFSET_FETCH,
  toStableOffsetFetch
} from "../src/internal/kafkajs/wire.js"

const require = createRequire(import.meta.url)

/** kafkajs's own request framing and OffsetFetch v4, so that the bytes taken in are the ones kafkajs writes. */
const createRequest = require("kafkajs/src/protocol/request") as (options: {
  readonly correlationId: number
  readonly clientId: string
  readonly request: unknown
}) => Promise<{ readonly buffer: Buffer }>
const offsetFetchV4 = require("kafkajs/src/protocol/requests/offsetFetch/v4/request") as (options: {
  readonly groupId: string
  readonly topics: ReadonlyArray<{ readonly topic: string; readonly partitions: ReadonlyArray<{ partition: number }> }>
}) => unknown
const offsetFetchV4Response = require("kafkajs/src/protocol/requests/offsetFetch/v4/response") as {
  readonly decode: (data: Buffer) => Promise<unknown>
  readonly parse: (data: unknown) => Promise<unknown>
}

/** Bytes from a list of numbers (each one byte) and strings (their ASCII bytes). */
const bytes = (...parts: ReadonlyArray<number | string | ReadonlyArray<number>>): Buffer =>
  Buffer.concat(parts.map((part) =>
    typeof part === "string" ? Buffer.from(part, "ascii") : Buffer.from(typeof part === "number" ? [part] : part)
  ))
const int16 = (n: number) => {
  const b = Buffer.alloc(2)
  b.writeInt16BE(n)
  return [...b]
}
const int32 = (n: number) => {
  const b = Buffer.alloc(4)
  b.writeInt32BE(n)
  return [...b]
}
const int64 = (n: bigint) => {
  const b = Buffer.alloc(8)
  b.writeBigInt64BE(n)
  return [...b]
}
/** A whole frame: int32 size, then the rest. */
const framed = (rest: Buffer) => Buffer.concat([Buffer.from(int32(rest.length)), rest])

/** OffsetFetch v4 (request header v1) as the protocol defines it: group "g", topic "t" [0, 1, 2], topic "u" [5]. */
const requestV4 = framed(bytes(
  int16(9), // api_key OffsetFetch
  int16(4), // api_version
  int32(42), // correlation_id
  int16(2), "c1", // client_id STRING
  int16(1), "g", // group_id STRING
  int32(2), // topics ARRAY
  int16(1), "t", int32(3), int32(0), int32(1), int32(2),
  int16(1), "u", int32(1), int32(5)
))

describe("OffsetFetch v4 to v7 with require_stable", () => {
  it("kafkajs writes version 4 as the protocol defines it", async () => {
    const request = offsetFetchV4({
      groupId: "g",
      topics: [{ topic: "t", partitions: [{ partition: 0 }, { partition: 1 }, { partition: 2 }] }, {
        topic: "u",
        partitions: [{ partition: 5 }]
      }]
    })
    const { buffer } = await createRequest({ correlationId: 42, clientId: "c1", request })
    assert.deepStrictEqual([...buffer], [...requestV4])
  })

  it("the same group and partitions, as version 7: flexible header and body, require_stable set", () => {
    const expected = framed(bytes(
      int16(9), // api_key
      int16(7), // api_version
      int32(42), // correlation_id
      int16(2), "c1", // client_id: still a STRING in request header v2
      0, // header tagged fields: none
      2, "g", // group_id COMPACT_STRING: length + 1
      3, // topics COMPACT_NULLABLE_ARRAY: 2 + 1
      2, "t", 4, int32(0), int32(1), int32(2), 0, // name, partition_indexes COMPACT_ARRAY (3 + 1), tagged fields
      2, "u", 2, int32(5), 0,
      1, // require_stable
      0 // tagged fields
    ))
    assert.strictEqual(STABLE_OFFSET_FETCH, 7)
    assert.deepStrictEqual([...toStableOffsetFetch(requestV4)], [...expected])
  })

  it("asks for the partitions of one read alone: another partition's pending commit cannot fail it", () => {
    const only = new Map([["t", new Set([1])]])
    const expected = framed(bytes(
      int16(9), int16(7), int32(42), int16(2), "c1", 0,
      2, "g",
      2, // one topic: "u" is not read
      2, "t", 2, int32(1), 0,
      1, 0
    ))
    assert.deepStrictEqual([...toStableOffsetFetch(requestV4, only)], [...expected])
  })

  it("a topic with many partitions (kafkajs asks for every partition of a topic)", async () => {
    const partitions = Array.from({ length: 120 }, (_, i) => i)
    const request = offsetFetchV4({
      groupId: "g",
      topics: [{ topic: "t", partitions: partitions.map((partition) => ({ partition })) }]
    })
    const { buffer } = await createRequest({ correlationId: 9, clientId: "c1", request })
    const expected = framed(bytes(
      int16(9), int16(7), int32(9), int16(2), "c1", 0,
      2, "g",
      2, 2, "t", [121], partitions.flatMap(int32), 0, // 120 + 1 partitions: one varint byte
      1, 0
    ))
    assert.deepStrictEqual([...toStableOffsetFetch(buffer)], [...expected])
    const wanted = new Set([3, 77, 119])
    const only = framed(bytes(int16(9), int16(7), int32(9), int16(2), "c1", 0, 2, "g", 2, 2, "t", 4,
      [3, 77, 119].flatMap(int32), 0, 1, 0))
    assert.deepStrictEqual([...toStableOffsetFetch(buffer, new Map([["t", wanted]]))], [...only])
  })

  it("a null topic list (every topic of the group) stays null", () => {
    const all = framed(bytes(int16(9), int16(4), int32(7), int16(-1), int16(1), "g", int32(-1)))
    const expected = framed(bytes(int16(9), int16(7), int32(7), int16(-1), 0, 2, "g", 0, 1, 0))
    assert.deepStrictEqual([...toStableOffsetFetch(all)], [...expected])
  })

  it("anything but an OffsetFetch v4 request is refused, so that it is sent as it is", () => {
    const v3 = Buffer.from(requestV4)
    v3.writeInt16BE(3, 6)
    assert.throws(() => toStableOffsetFetch(v3), RangeError)
    assert.throws(() => toStableOffsetFetch(requestV4.subarray(0, requestV4.length - 2)), RangeError)
    const longer = framed(Buffer.concat([requestV4.subarray(4), Buffer.from([0])]))
    assert.throws(() => toStableOffsetFetch(longer), RangeError)
  })
})

/** The answer converted; a conversion that throws fails the test naming why. */
const toV4 = (answer: Buffer): Buffer => {
  try {
    return fromStableOffsetFetch(answer)
  } catch (error) {
    return assert.fail(`the answer was not converted: ${String(error)}`)
  }
}

describe("OffsetFetch v7 answer to v4", () => {
  /** The bytes after the correlation id of a v7 answer (response header v1). */
  const answerV7 = (headerTags: ReadonlyArray<number> = [0]) =>
    bytes(
      headerTags, // response header v1: tagged fields
      int32(0), // throttle_time_ms
      2, // topics COMPACT_ARRAY: 1 + 1
      2, "t", // name COMPACT_STRING
      3, // partitions COMPACT_ARRAY: 2 + 1
      // partition_index, committed_offset, committed_leader_epoch, metadata (null), error_code, tagged fields
      int32(0), int64(5n), int32(-1), 0, int16(0), 0,
      int32(1), int64(-1n), int32(3), 2, "m", int16(88), 0, // metadata "m"; UNSTABLE_OFFSET_COMMIT
      0, // topic tagged fields
      int16(0), // error_code
      0 // tagged fields
    )
  const answerV4 = bytes(
    int32(0), // throttle_time_ms
    int32(1), // responses ARRAY
    int16(1), "t",
    int32(2),
    int32(0), int64(5n), int16(-1), int16(0), // partition, offset, metadata NULLABLE_STRING null, error_code
    int32(1), int64(-1n), int16(1), "m", int16(88),
    int16(0) // error_code
  )

  it("the same positions, metadata and error codes, without the leader epoch and the tagged fields", () => {
    assert.deepStrictEqual([...toV4(answerV7())], [...answerV4])
    // Tagged fields in the header are skipped whatever they hold.
    assert.deepStrictEqual([...toV4(answerV7([1, 0, 2, 0xab, 0xcd]))], [...answerV4])
  })

  it("kafkajs decodes it, and fails the read with the retriable UNSTABLE_OFFSET_COMMIT", async () => {
    const decoded = await offsetFetchV4Response.decode(toV4(answerV7()))
    assert.deepStrictEqual(decoded, {
      throttleTime: 0,
      clientSideThrottleTime: 0,
      errorCode: 0,
      responses: [{
        topic: "t",
        partitions: [
          { partition: 0, offset: "5", metadata: null, errorCode: 0 },
          { partition: 1, offset: "-1", metadata: "m", errorCode: 88 }
        ]
      }]
    })
    const error = await offsetFetchV4Response.parse(decoded).then(() => undefined, (e: unknown) => e)
    assert.deepInclude(error, { type: "UNSTABLE_OFFSET_COMMIT", retriable: true })
  })

  it("lengths past one byte of varint, and metadata too long for version 4", () => {
    // 3,000 bytes of metadata: its compact length 3,001 is 0xb9 0x17 (57 + 23 * 128).
    const metadata = "x".repeat(3000)
    const v7 = bytes(0, int32(0), 2, 2, "t", 2, int32(0), int64(1n), int32(-1), [0xb9, 0x17], metadata, int16(0), 0, 0,
      int16(0), 0)
    const v4 = bytes(int32(0), int32(1), int16(1), "t", int32(1), int32(0), int64(1n), int16(3000), metadata, int16(0),
      int16(0))
    assert.deepStrictEqual([...toV4(v7)], [...v4])
    // A string of 40,000 bytes has no int16 length: refused rather than cut.
    const long = "y".repeat(40_000)
    const varint = [(40_001 & 0x7f) | 0x80, ((40_001 >> 7) & 0x7f) | 0x80, 40_001 >> 14]
    const tooLong = bytes(0, int32(0), 2, 2, "t", 2, int32(0), int64(1n), int32(-1), varint, long, int16(0), 0, 0,
      int16(0), 0)
    assert.throws(() => fromStableOffsetFetch(tooLong), RangeError)
  })

  it("a cut answer, or one with bytes after its end, is refused", () => {
    const full = answerV7()
    assert.throws(() => fromStableOffsetFetch(full.subarray(0, full.length - 3)), RangeError)
    assert.throws(() => fromStableOffsetFetch(Buffer.concat([full, Buffer.from([0])])), RangeError)
  })
})

describe("ApiVersions", () => {
  it("the highest OffsetFetch version a version 0 to 2 answer lists", () => {
    const answer = bytes(
      int16(0), // error_code
      int32(3), // api_keys ARRAY
      int16(2), int16(0), int16(9), // ListOffsets
      int16(9), int16(1), int16(10), // OffsetFetch: 1 to 10
      int16(18), int16(0), int16(4), // ApiVersions
      int32(0) // throttle_time_ms (v1, v2)
    )
    assert.strictEqual(offsetFetchVersion(answer), 10)
    assert.strictEqual(offsetFetchVersion(bytes(int16(0), int32(1), int16(9), int16(0), int16(4))), 4)
    assert.isUndefined(offsetFetchVersion(bytes(int16(35), int32(0))), "UNSUPPORTED_VERSION lists nothing")
    assert.isUndefined(offsetFetchVersion(bytes(int16(0), int32(1), int16(2), int16(0), int16(9))))
  })
})

describe("the socket layer's tap", () => {
  const random = (seed: number) => () => {
    seed = (seed * 1103515245 + 12345) % 2147483648
    return seed / 2147483648
  }
  const frame = (correlationId: number, body: Buffer) =>
    framed(Buffer.concat([Buffer.from(int32(correlationId)), body]))

  it("replaces the answers it waits for, in place, however the broker's bytes are split", () => {
    for (let seed = 1; seed <= 200; seed++) {
      const next = random(seed)
      const tap = new ResponseTap()
      const stream: Array<Buffer> = []
      const expected: Array<Buffer> = []
      for (let i = 0; i < 30; i++) {
        const body = Buffer.alloc(Math.floor(next() < 0.1 ? next() * 70_000 : next() * 40))
        for (let b = 0; b < body.length; b++) body[b] = Math.floor(next() * 256)
        stream.push(frame(i, body))
        if (next() < 0.3) {
          // An answer to be rewritten: registered before it arrives, replaced by a body of another size.
          const replacement = Buffer.from(`rewritten ${i} `.repeat(1 + Math.floor(next() * 5)))
          tap.waiting.set(i, (received) => {
            assert.isTrue(received.equals(body), `seed ${seed}: frame ${i} collected wrong`)
            return replacement
          })
          expected.push(frame(i, replacement))
        } else {
          expected.push(frame(i, body))
        }
      }
      const all = Buffer.concat(stream)
      const forwarded: Array<Buffer> = []
      for (let at = 0; at < all.length;) {
        const size = Math.max(1, Math.floor(next() < 0.2 ? next() * 5 : next() * 3000))
        tap.feed(all.subarray(at, at + size), (data) => forwarded.push(Buffer.from(data)))
        at += size
      }
      assert.isTrue(Buffer.concat(forwarded).equals(Buffer.concat(expected)), `seed ${seed}: the stream differs`)
      assert.strictEqual(tap.waiting.size, 0)
    }
  })
})
