/**
 * A kafkajs connection with a layer in between: every request kafkajs writes passes `onWrite`, which may replace it or
 * hold it back, and every answer the broker sends passes a `ResponseTap`, which takes out or replaces the answers
 * registered with it. It is Node-only, like kafkajs.
 */
import * as net from "node:net"
import * as tls from "node:tls"
import type { ISocketFactoryArgs } from "kafkajs"

type Listen = (event: string | symbol, listener: (...args: Array<unknown>) => void) => net.Socket
type Write = (chunk: unknown, ...rest: Array<unknown>) => boolean

/** kafkajs's default socket factory keeps connections alive with this delay. */
const KEEP_ALIVE_DELAY = 60_000

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
 * Wraps a new connection so that `onWrite` sees every request kafkajs writes (and may replace it, or hold it back by
 * returning `false`), and `tap` every byte the broker sends back. Returns the socket and a write that bypasses
 * `onWrite`, for requests of this layer's own.
 *
 * @internal
 */
export const openSocket = (
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
