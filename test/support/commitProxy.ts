/**
 * A TCP proxy in front of a database server that, once armed, drops the connection that sends COMMIT: `"before"`
 * passing it on (the transaction does not commit), or `"after"`, once the server answered it and before the answer
 * reaches the client (it committed, and the client never hears so). Each connection gets its own COMMIT detector,
 * which reads the client's bytes in the server's protocol.
 */
import * as Effect from "effect/Effect"
import * as net from "node:net"

export interface CommitDroppingProxy {
  readonly state: { armed: "before" | "after" | undefined; dropped: number }
  /** `target` with the proxy's host and port. */
  readonly url: string
}

export const commitDroppingProxy = (
  target: string,
  defaultPort: number,
  detector: () => (chunk: Buffer) => boolean
) =>
  Effect.gen(function*() {
    const state: CommitDroppingProxy["state"] = { armed: undefined, dropped: 0 }
    const upstreamAddress = new URL(target)
    const server = yield* Effect.acquireRelease(
      Effect.async<net.Server>((resume) => {
        const server = net.createServer((downstream) => {
          const upstream = net.connect(Number(upstreamAddress.port || defaultPort), upstreamAddress.hostname)
          const isCommit = detector()
          let committing = false
          const close = () => {
            downstream.destroy()
            upstream.destroy()
          }
          downstream.on("data", (chunk: Buffer) => {
            if (isCommit(chunk) && state.armed !== undefined) {
              if (state.armed === "before") {
                state.armed = undefined
                state.dropped++
                return close()
              }
              committing = true
            }
            upstream.write(chunk)
          })
          upstream.on("data", (chunk: Buffer) => {
            if (!committing) return downstream.write(chunk)
            state.armed = undefined
            state.dropped++
            close()
          })
          for (const socket of [downstream, upstream]) {
            socket.on("error", close)
            socket.on("close", close)
          }
        })
        server.listen(0, "127.0.0.1", () => resume(Effect.succeed(server)))
      }),
      (server) =>
        Effect.async<void>((resume) => {
          server.close(() => resume(Effect.void))
        })
    )
    const address = server.address()
    const proxied = new URL(target)
    proxied.hostname = "127.0.0.1"
    proxied.port = String(typeof address === "object" && address !== null ? address.port : 0)
    return { state, url: proxied.toString() } satisfies CommitDroppingProxy
  })
