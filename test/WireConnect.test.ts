// dprint-ignore-file: the byte layouts below are laid out one protocol field per group, as the message definitions read
/**
 * Connecting while the group's coordinator loads or moves, on a real broker behind a proxy that answers the first
 * group requests with the errors a fresh or restarting cluster gives: GROUP_LOAD_IN_PROGRESS (the coordinator loading
 * `__consumer_offsets`), NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE. The proxy passes everything else through to the
 * broker, and points the broker addresses kafkajs learns (Metadata, FindCoordinator) at itself, so that every
 * connection goes through it.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Ref from "effect/Ref"
import * as Schedule from "effect/Schedule"
import * as net from "node:net"
import { inject } from "vitest"
import * as CommitPolicy from "../src/CommitPolicy.js"
import * as Consumer from "../src/Consumer.js"
import { valueString } from "../src/ConsumerRecord.js"
import { Driver, type SessionOptions } from "../src/Driver.js"
import * as KafkaJs from "../src/KafkaJs.js"
import { DriverError } from "../src/KafkaError.js"
import { withAdmin } from "./support/kafkaKit.js"

const brokers = process.env.KAFKA_BROKERS || inject("kafkaBrokers")
const unique = (prefix: string) => `${prefix}-${crypto.randomUUID().slice(0, 8)}`

const METADATA = 3
const FIND_COORDINATOR = 10
const JOIN_GROUP = 11

const GROUP_LOAD_IN_PROGRESS = 14
const COORDINATOR_NOT_AVAILABLE = 15
const NOT_COORDINATOR = 16

/** What the proxy answers in the broker's place, in order: one error per request, while there are any. */
interface Faults {
  readonly joinGroup: () => number | undefined
  readonly findCoordinator: () => number | undefined
  /** How many requests were answered with an error. */
  injected: number
}

const faults = (options: {
  readonly joinGroup?: ReadonlyArray<number> | "always"
  readonly findCoordinator?: ReadonlyArray<number>
}): Faults => {
  const joins = options.joinGroup === "always" ? undefined : [...(options.joinGroup ?? [])]
  const finds = [...(options.findCoordinator ?? [])]
  const out: Faults = {
    injected: 0,
    joinGroup: () => {
      const code = joins === undefined ? GROUP_LOAD_IN_PROGRESS : joins.shift()
      if (code !== undefined) out.injected++
      return code
    },
    findCoordinator: () => {
      const code = finds.shift()
      if (code !== undefined) out.injected++
      return code
    }
  }
  return out
}

const string = (value: string | null): Buffer => {
  if (value === null) return Buffer.from([0xff, 0xff])
  const bytes = Buffer.from(value, "utf8")
  const out = Buffer.alloc(2 + bytes.length)
  out.writeInt16BE(bytes.length)
  bytes.copy(out, 2)
  return out
}
const int16 = (n: number) => {
  const b = Buffer.alloc(2)
  b.writeInt16BE(n)
  return b
}
const int32 = (n: number) => {
  const b = Buffer.alloc(4)
  b.writeInt32BE(n)
  return b
}
const frame = (correlationId: number, body: Buffer): Buffer =>
  Buffer.concat([int32(body.length + 4), int32(correlationId), body])

/** A JoinGroup answer (versions 0 to 5) that fails with `code`. */
const joinGroupFailure = (version: number, code: number) =>
  Buffer.concat([
    version >= 2 ? int32(0) : Buffer.alloc(0), // throttle_time_ms
    int16(code),
    int32(-1), // generation_id
    string(""), // protocol_name
    string(""), // leader
    string(""), // member_id
    int32(0) // members
  ])

/** A FindCoordinator answer (versions 0 to 2) that fails with `code`. */
const findCoordinatorFailure = (version: number, code: number) =>
  Buffer.concat([
    version >= 1 ? int32(0) : Buffer.alloc(0), // throttle_time_ms
    int16(code),
    version >= 1 ? string(null) : Buffer.alloc(0), // error_message
    int32(-1), // node_id
    string(""), // host
    int32(-1) // port
  ])

/** Splits a byte stream into `int32 size`-prefixed frames. */
const frames = (onFrame: (frame: Buffer) => void) => {
  let pending: Buffer = Buffer.alloc(0)
  return (chunk: Buffer) => {
    pending = pending.length === 0 ? chunk : Buffer.concat([pending, chunk])
    while (pending.length >= 4 && pending.length >= 4 + pending.readInt32BE(0)) {
      const size = pending.readInt32BE(0)
      onFrame(pending.subarray(0, 4 + size))
      pending = pending.subarray(4 + size)
    }
  }
}

/** Reads a STRING at `at`; returns it and where it ends. */
const readString = (buffer: Buffer, at: number): [string | null, number] => {
  const length = buffer.readInt16BE(at)
  if (length < 0) return [null, at + 2]
  return [buffer.toString("utf8", at + 2, at + 2 + length), at + 2 + length]
}

interface Proxy {
  readonly address: string
  readonly close: Effect.Effect<void>
}

/**
 * One listening proxy per broker of the cluster. `addressOf` maps a broker's address to its proxy's, for the answers
 * that name brokers.
 */
const startProxies = (target: ReadonlyArray<string>, injected: Faults) =>
  Effect.gen(function*() {
    const nodes = yield* withAdmin(target.join(","), (admin) => admin.describeCluster()).pipe(
      Effect.map((cluster) => cluster.brokers.map((b) => `${b.host}:${b.port}`))
    )
    const listening = new Map<string, number>()
    const sockets = new Set<net.Socket>()
    const addressOf = (host: string, port: number): [string, number] => {
      const proxied = listening.get(`${host}:${port}`)
      return proxied === undefined ? [host, port] : ["127.0.0.1", proxied]
    }

    /** Metadata (versions 1 to 8): the brokers array is rewritten, everything after it is copied. */
    const rewriteMetadata = (body: Buffer, version: number): Buffer => {
      let at = version >= 3 ? 4 : 0
      const head = body.subarray(0, at)
      const count = body.readInt32BE(at)
      at += 4
      const brokers: Array<Buffer> = [int32(count)]
      for (let i = 0; i < count; i++) {
        const nodeId = body.readInt32BE(at)
        const [host, afterHost] = readString(body, at + 4)
        const port = body.readInt32BE(afterHost)
        const [rack, afterRack] = readString(body, afterHost + 4)
        const [newHost, newPort] = addressOf(host ?? "", port)
        brokers.push(int32(nodeId), string(newHost), int32(newPort), string(rack))
        at = afterRack
      }
      return Buffer.concat([head, ...brokers, body.subarray(at)])
    }

    /** FindCoordinator (versions 0 to 2): the coordinator's address is rewritten. */
    const rewriteFindCoordinator = (body: Buffer, version: number): Buffer => {
      let at = version >= 1 ? 6 : 2
      if (version >= 1) at = readString(body, at)[1]
      const head = body.subarray(0, at + 4) // node_id included
      const [host, afterHost] = readString(body, at + 4)
      const port = body.readInt32BE(afterHost)
      const [newHost, newPort] = addressOf(host ?? "", port)
      return Buffer.concat([head, string(newHost), int32(newPort), body.subarray(afterHost + 4)])
    }

    const serve = (upstream: string) => (client: net.Socket) => {
      sockets.add(client)
      const colon = upstream.lastIndexOf(":")
      const broker = net.connect({ host: upstream.slice(0, colon), port: Number(upstream.slice(colon + 1)) })
      sockets.add(broker)
      const rewrites = new Map<number, { readonly apiKey: number; readonly version: number }>()
      client.on("data", frames((request) => {
        const apiKey = request.readInt16BE(4)
        const version = request.readInt16BE(6)
        const correlationId = request.readInt32BE(8)
        if (apiKey === JOIN_GROUP) {
          const code = injected.joinGroup()
          if (code !== undefined) return client.write(frame(correlationId, joinGroupFailure(version, code)))
        }
        if (apiKey === FIND_COORDINATOR) {
          const code = injected.findCoordinator()
          if (code !== undefined) return client.write(frame(correlationId, findCoordinatorFailure(version, code)))
        }
        if (apiKey === METADATA || apiKey === FIND_COORDINATOR) rewrites.set(correlationId, { apiKey, version })
        broker.write(request)
      }))
      broker.on("data", frames((response) => {
        const correlationId = response.readInt32BE(4)
        const rewrite = rewrites.get(correlationId)
        if (rewrite === undefined) return client.write(response)
        rewrites.delete(correlationId)
        const body = response.subarray(8)
        const rewritten = rewrite.apiKey === METADATA
          ? rewriteMetadata(body, rewrite.version)
          : rewriteFindCoordinator(body, rewrite.version)
        client.write(frame(correlationId, rewritten))
      }))
      const close = () => {
        client.destroy()
        broker.destroy()
      }
      client.on("error", close).on("close", close)
      broker.on("error", close).on("close", close)
    }

    const servers: Array<net.Server> = []
    for (const node of nodes) {
      const server = net.createServer(serve(node))
      yield* Effect.async<void>((resume) => {
        server.listen(0, "127.0.0.1", () => resume(Effect.void))
      })
      listening.set(node, (server.address() as net.AddressInfo).port)
      servers.push(server)
    }
    const proxy: Proxy = {
      address: `127.0.0.1:${listening.get(nodes[0]!)!}`,
      close: Effect.async<void>((resume) => {
        for (const socket of sockets) socket.destroy()
        let open = servers.length
        for (const server of servers) server.close(() => --open === 0 && resume(Effect.void))
      })
    }
    return proxy
  })

const withProxy = (injected: Faults) =>
  Effect.acquireRelease(startProxies(brokers.split(","), injected), (proxy) => proxy.close)

const sessionOptions = (topic: string, rebalanceTimeout: Duration.DurationInput = "20 seconds"): SessionOptions => ({
  groupId: unique("group"),
  clientId: "coordinator-loading",
  subscription: { _tag: "Topics", topics: [topic] },
  maxPollRecords: 10,
  pollTimeout: Duration.millis(100),
  sessionTimeout: Duration.seconds(6),
  rebalanceTimeout: Duration.decode(rebalanceTimeout)
})

const driverLayer = (proxy: Proxy) =>
  KafkaJs.layer({ brokers: [proxy.address], maxWaitTime: "100 millis", logLevel: "nothing", retry: { retries: 1 } })

if (brokers) {
  describe("connecting while the group's coordinator loads or moves", () => {
    it.scopedLive("connect waits for the coordinator: joins that fail with GROUP_LOAD_IN_PROGRESS, NOT_COORDINATOR and COORDINATOR_NOT_AVAILABLE, then one that works", () =>
      Effect.gen(function*() {
        const topic = unique("loading")
        yield* KafkaJs.createTopic(brokers, topic, 1)
        const injected = faults({ joinGroup: [GROUP_LOAD_IN_PROGRESS, NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE] })
        const proxy = yield* withProxy(injected)
        const connected = yield* Effect.either(
          Effect.flatMap(Driver, (driver) => driver.connect(sessionOptions(topic))).pipe(
            Effect.provide(driverLayer(proxy))
          )
        )
        if (Either.isLeft(connected)) return assert.fail(`connect gave up: ${connected.left.message}`)
        assert.strictEqual(injected.injected, 3, "the joins did not go through the proxy")
        const events = yield* connected.right.poll.pipe(
          Effect.repeat({ until: (events) => events.some((e) => e._tag === "Assigned"), times: 50 })
        )
        assert.deepInclude(events, { _tag: "Assigned", partitions: [{ topic, partition: 0 }] })
      }))

    it.scopedLive("kafkajs gives up finding the coordinator (not available): connect starts it again", () =>
      Effect.gen(function*() {
        const topic = unique("not-found")
        yield* KafkaJs.createTopic(brokers, topic, 1)
        // With one retry, kafkajs asks twice, then fails its join with KafkaJSGroupCoordinatorNotFound, from which
        // it does not restart by itself.
        const injected = faults({ findCoordinator: [COORDINATOR_NOT_AVAILABLE, COORDINATOR_NOT_AVAILABLE] })
        const proxy = yield* withProxy(injected)
        const connected = yield* Effect.either(
          Effect.flatMap(Driver, (driver) => driver.connect(sessionOptions(topic))).pipe(
            Effect.provide(driverLayer(proxy))
          )
        )
        if (Either.isLeft(connected)) return assert.fail(`connect gave up: ${connected.left.message}`)
        assert.strictEqual(injected.injected, 2, "the coordinator lookups did not go through the proxy")
      }))

    it.scopedLive("a coordinator that keeps loading fails connect within the rebalance timeout, with a retriable DriverError", () =>
      Effect.gen(function*() {
        const topic = unique("still-loading")
        yield* KafkaJs.createTopic(brokers, topic, 1)
        const injected = faults({ joinGroup: "always" })
        const proxy = yield* withProxy(injected)
        const started = Date.now()
        const connected = yield* Effect.either(
          Effect.flatMap(Driver, (driver) => driver.connect(sessionOptions(topic, "3 seconds"))).pipe(
            Effect.provide(driverLayer(proxy)),
            Effect.scoped
          )
        )
        const took = Date.now() - started
        if (Either.isRight(connected)) return assert.fail("connected to a group whose coordinator never answered")
        const error = connected.left
        assert.instanceOf(error, DriverError)
        assert.isTrue(error.retriable, error.message)
        assert.include(error.message, "GROUP_LOAD_IN_PROGRESS")
        assert.include(error.message, "rebalance timeout")
        assert.isAtLeast(injected.injected, 2, "kafkajs did not try again")
        assert.isAtLeast(took, 3000, "gave up before the rebalance timeout")
        assert.isBelow(took, 15_000, "waited far past the rebalance timeout")
      }))

    it.scopedLive("Consumer.run on a cluster whose coordinator is loading delivers every record", () =>
      Effect.gen(function*() {
        const topic = unique("run-loading")
        yield* KafkaJs.createTopic(brokers, topic, 1)
        yield* KafkaJs.produce(brokers, topic, Array.from({ length: 5 }, (_, i) => ({ partition: 0, value: `v${i}` })))
        const injected = faults({ joinGroup: [GROUP_LOAD_IN_PROGRESS, GROUP_LOAD_IN_PROGRESS] })
        const proxy = yield* withProxy(injected)
        const seen = yield* Ref.make<ReadonlyArray<string | null>>([])
        const fiber = yield* Consumer.runEach(
          { groupId: unique("group"), topics: [topic], sessionTimeout: "6 seconds" },
          (record) => Ref.update(seen, (all) => [...all, valueString(record)])
        ).pipe(
          Effect.provide(
            Layer.merge(CommitPolicy.commitAfter({ maxBatch: 5, maxInterval: "100 millis" }), driverLayer(proxy))
          ),
          Effect.fork
        )
        yield* Ref.get(seen).pipe(
          Effect.repeat({ schedule: Schedule.spaced("50 millis"), until: (all) => all.length >= 5 }),
          Effect.timeoutOption("30 seconds")
        )
        const exit = yield* Fiber.interrupt(fiber)
        assert.strictEqual(injected.injected, 2, "the joins did not go through the proxy")
        assert.deepStrictEqual(yield* Ref.get(seen), ["v0", "v1", "v2", "v3", "v4"], `the consumer ended: ${exit}`)
      }))
  })
} else {
  describe("connecting while the group's coordinator loads or moves", () => {
    it("needs a Kafka broker", () => {
      assert.fail(`No Kafka broker for this run: ${inject("kafkaSetupError") || "KAFKA_BROKERS is unset"}.`)
    })
  })
}
