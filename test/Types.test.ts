/**
 * What the signatures promise is what happens at run time: the handler's error reaches the caller typed, a handler
 * that needs the store's transaction compiles only under the policy that provides one, and the policy's own errors are
 * told from the handler's by where they come from, never by a tag a user type could share. The type-level lines are
 * checked by `tsc` (part of `npm test`): an `@ts-expect-error` that stops being an error fails the type check.
 */
import { assert, describe, expectTypeOf, it } from "@effect/vitest"
import * as Data from "effect/Data"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Schedule from "effect/Schedule"
import { execFile } from "node:child_process"
import { mkdtemp, readdir, readFile, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import * as path from "node:path"
import { promisify } from "node:util"
import * as CommitPolicy from "../src/CommitPolicy.js"
import * as Consumer from "../src/Consumer.js"
import type { Driver } from "../src/Driver.js"
import * as InMemoryKafka from "../src/InMemoryKafka.js"
import * as KafkaJs from "../src/KafkaJs.js"
import * as Platformatic from "../src/Platformatic.js"
import {
  type InvalidConfig,
  type DriverError as KafkaDriverError,
  HandlerFailed,
  ProduceFailed,
  TransactionFailed
} from "../src/KafkaError.js"
import * as OffsetStore from "../src/OffsetStore.js"
import * as SqlClient from "@effect/sql/SqlClient"
import * as PgOffsetStore from "../src/PgOffsetStore.js"
import * as SqlOffsetStore from "../src/SqlOffsetStore.js"
import * as Producer from "../src/Producer.js"
import { settled } from "./support/kit.js"

class Invalid extends Data.TaggedError("Invalid")<{ readonly reason: string }> {}

/** A user's own error that happens to share the tag of one of the library's. */
class DriverError extends Data.TaggedError("DriverError")<{ readonly attempt: number }> {}

const config = { groupId: "g", topics: ["t"], retry: Schedule.recurs(0) } as const

describe("the handler's own error", () => {
  it("is in the signature as HandlerFailed<E>, and only there", () => {
    const program = Consumer.run(config, () => Effect.fail(new Invalid({ reason: "bad" })))
    expectTypeOf(program).toEqualTypeOf<
      Effect.Effect<never, Consumer.ConsumerError | HandlerFailed<Invalid>, Driver | CommitPolicy.CommitPolicy>
    >()
    // The handler's error arrives wrapped, with where it happened: catching it by its own tag does not compile.
    // @ts-expect-error "Invalid" is not an error of the consumer
    program.pipe(Effect.catchTag("Invalid", () => Effect.void))
    program.pipe(Effect.catchTag("HandlerFailed", (failed) => {
      expectTypeOf(failed.cause).toEqualTypeOf<Invalid>()
      return Effect.void
    }))
    const each = Consumer.runEach(config, () => Effect.fail(new Invalid({ reason: "bad" })))
    expectTypeOf(each).toEqualTypeOf<
      Effect.Effect<never, Consumer.ConsumerError | HandlerFailed<Invalid>, Driver | CommitPolicy.CommitPolicy>
    >()
  })

  it.effect("arrives typed at run time, with the record it failed on", () =>
    Effect.gen(function*() {
      yield* InMemoryKafka.createTopic("t", 1)
      yield* InMemoryKafka.produce("t", [{ value: "ok" }, { value: "bad" }])
      const caught = yield* Consumer.runEach(
        config,
        (record) => record.offset === 1n ? Effect.fail(new Invalid({ reason: "bad value" })) : Effect.void
      ).pipe(
        Effect.provide(CommitPolicy.commitAfter({ maxBatch: 10, maxInterval: "1 second" })),
        Effect.catchTag("HandlerFailed", (failed) => Effect.succeed(failed))
      )
      assert.instanceOf(caught, HandlerFailed)
      assert.instanceOf(caught.cause, Invalid)
      assert.strictEqual(caught.cause.reason, "bad value")
      assert.strictEqual(caught.offset, 1n)
      assert.include(caught.message, "t-0 at offset 1")
    }).pipe(Effect.provide(InMemoryKafka.layer())))

  it.effect("is retried and wrapped even when its tag is one of the library's", () =>
    Effect.gen(function*() {
      yield* InMemoryKafka.createTopic("t", 1)
      yield* InMemoryKafka.produce("t", [{ value: "a" }])
      let attempts = 0
      // Fails twice, then succeeds: the retries are the handler's, whatever its error is called.
      const fiber = yield* Consumer.run({ ...config, retry: Schedule.recurs(3) }, () =>
        Effect.suspend(() => ++attempts <= 2 ? Effect.fail(new DriverError({ attempt: attempts })) : Effect.void)).pipe(
          Effect.provide(CommitPolicy.commitAfter({ maxBatch: 1, maxInterval: "1 second" })),
          Effect.fork
        )
      yield* settled(
        "committed",
        Effect.map(InMemoryKafka.committed("g"), (c) =>
          c.positions.get("t-0") === 1n)
      )
      yield* Fiber.interrupt(fiber)
      assert.strictEqual(attempts, 3)
      // And when it keeps failing, it ends the consumer as the handler's error, not as the library's.
      const exit = yield* Consumer.run({ ...config, groupId: "h" }, () => Effect.fail(new DriverError({ attempt: 0 })))
        .pipe(
          Effect.provide(CommitPolicy.commitAfter({ maxBatch: 1, maxInterval: "1 second" })),
          Effect.exit
        )
      const error = Exit.isFailure(exit) && exit.cause._tag === "Fail" ? exit.cause.error : undefined
      assert.instanceOf(error, HandlerFailed)
      if (error instanceof HandlerFailed) assert.instanceOf(error.cause, DriverError)
    }).pipe(Effect.provide(InMemoryKafka.layer())))
})

describe("a handler that writes with the application's own SqlClient (SqlOffsetStore)", () => {
  const writingWithSql = Consumer.run(
    config,
    (records) => Effect.flatMap(SqlClient.SqlClient, (sql) => sql`insert into results (n) values (${records.length})`)
  )

  it("needs no Transaction of the library: only the application's SqlClient, which the store needs too", () => {
    expectTypeOf(SqlOffsetStore.layer()).toEqualTypeOf<
      Layer.Layer<OffsetStore.OffsetStore, InvalidConfig | OffsetStore.OffsetStoreError, SqlClient.SqlClient>
    >()
    const program = writingWithSql.pipe(
      Effect.provide(CommitPolicy.transactional().pipe(Layer.provideMerge(SqlOffsetStore.layer()))),
      Effect.provide(InMemoryKafka.layer())
    )
    expectTypeOf<Effect.Effect.Context<typeof program>>().toEqualTypeOf<SqlClient.SqlClient>()
    // Without the application's client it does not compile.
    // @ts-expect-error SqlClient is not provided
    const run = () => Effect.runFork(program)
    assert.isFunction(run)
  })
})

describe("a handler that writes through the store's transaction", () => {
  const appending = Consumer.run(config, (records) => OffsetStore.append([records.length]))
  const writingSql = Consumer.run(config, () => PgOffsetStore.sql)

  it("needs the transactional policy: under any other, Transaction is left unprovided", () => {
    const underCommitAfter = appending.pipe(
      Effect.provide(CommitPolicy.commitAfter({ maxBatch: 10, maxInterval: "1 second" })),
      Effect.provide(InMemoryKafka.layer())
    )
    expectTypeOf<Effect.Effect.Context<typeof underCommitAfter>>().toEqualTypeOf<OffsetStore.Transaction>()
    const underAtMostOnce = writingSql.pipe(
      Effect.provide(CommitPolicy.atMostOnce()),
      Effect.provide(InMemoryKafka.layer())
    )
    expectTypeOf<Effect.Effect.Context<typeof underAtMostOnce>>().toEqualTypeOf<OffsetStore.Transaction>()
    // Running it does not compile.
    // @ts-expect-error Transaction is not provided
    const run = () => Effect.runFork(underCommitAfter)
    assert.isFunction(run)

    const underTransactional = appending.pipe(
      Effect.provide(CommitPolicy.transactional()),
      Effect.provide(Layer.merge(OffsetStore.layerMemory, InMemoryKafka.layer()))
    )
    expectTypeOf<Effect.Effect.Context<typeof underTransactional>>().toEqualTypeOf<never>()
  })

  it.effect("fails typed, not with a missing service, when a hook uses the transaction outside a unit of work", () =>
    Effect.gen(function*() {
      yield* InMemoryKafka.createTopic("t", 1)
      const exit = yield* Consumer.run(config, () => Effect.void, {
        onAssign: () => OffsetStore.append(["from a hook"])
      }).pipe(Effect.provide(CommitPolicy.transactional()), Effect.exit)
      const error = Exit.isFailure(exit) && exit.cause._tag === "Fail" ? exit.cause.error : undefined
      assert.instanceOf(error, OffsetStore.OffsetStoreError)
      if (error instanceof OffsetStore.OffsetStoreError) assert.include(error.message, "no unit of work is open")
    }).pipe(Effect.provide(Layer.merge(OffsetStore.layerMemory, InMemoryKafka.layer()))))
})

describe("public signatures", () => {
  it("validate says what it checks, not how the consumer keeps it", () => {
    expectTypeOf(Consumer.validate).returns.toEqualTypeOf<Effect.Effect<void, InvalidConfig>>()
  })

  it("the declarations of the public modules name no internal type", async () => {
    const out = await mkdtemp(path.join(tmpdir(), "declarations-"))
    try {
      await promisify(execFile)(
        "node_modules/.bin/tsc",
        ["-p", "tsconfig.build.json", "--emitDeclarationOnly", "--declarationMap", "false", "--outDir", out],
        { timeout: 120_000 }
      )
      const leaks: Array<string> = []
      const files = (await readdir(out)).filter((f) => f.endsWith(".d.ts"))
      assert.include(files, "Consumer.d.ts")
      for (const file of files) {
        const lines = (await readFile(path.join(out, file), "utf8")).split("\n")
        // The names a declaration file binds to internal modules: a namespace, or named imports.
        const internal = lines.flatMap((line) => {
          const from = /^import .* from "\.\/internal\//.test(line)
          if (!from) return []
          const namespace = /import (?:type )?\* as (\w+)/.exec(line)
          if (namespace !== null) return [namespace[1]!]
          const named = /import (?:type )?\{([^}]*)\}/.exec(line)
          return named === null
            ? []
            : named[1]!.split(",").map((n) => n.trim().split(/\s+as\s+/).at(-1)!).filter(Boolean)
        })
        for (const line of lines) {
          if (/^import /.test(line)) continue
          const used = internal.filter((name) => new RegExp(`\\b${name}\\b`).test(line))
          if (used.length > 0 || /import\("\.\/internal\//.test(line)) leaks.push(`${file}: ${line.trim()}`)
        }
      }
      assert.deepStrictEqual(leaks, [])
    } finally {
      await rm(out, { recursive: true, force: true })
    }
  }, 150_000)
})

describe("the producer's signatures", () => {
  it("send and sendAll fail with ProduceFailed only, and need only the Producer", () => {
    expectTypeOf(Producer.send({ topic: "t", value: "v" })).toEqualTypeOf<
      Effect.Effect<Producer.RecordMetadata, ProduceFailed, Producer.Producer>
    >()
    expectTypeOf(Producer.sendAll([{ topic: "t", value: "v" }])).toEqualTypeOf<
      Effect.Effect<ReadonlyArray<Producer.RecordMetadata>, ProduceFailed, Producer.Producer>
    >()
    expectTypeOf(Producer.flush).toEqualTypeOf<Effect.Effect<void, never, Producer.Producer>>()
    // @ts-expect-error a record needs a value (null for a tombstone)
    Producer.send({ topic: "t" })
    // @ts-expect-error acks is 0, 1 or "all"
    InMemoryKafka.layerProducer({ acks: 2 })
  })

  it("a transaction's positions may come from an effect that fails with TransactionFailed only and needs nothing", () => {
    const offsets: Producer.TransactionOffsets = { groupId: "g", positions: [{ topic: "t", partition: 0, next: 1n }] }
    const body = Producer.send({ topic: "t", value: "v" })
    expectTypeOf(Producer.transaction(body, { offsets: Effect.succeed(offsets) })).toEqualTypeOf<
      Effect.Effect<Producer.RecordMetadata, ProduceFailed | TransactionFailed, Producer.TransactionalProducer>
    >()
    // @ts-expect-error the effect's failure is the transaction's, so it must be a TransactionFailed
    Producer.transaction(body, { offsets: Effect.fail("no") as Effect.Effect<Producer.TransactionOffsets, string> })
    // @ts-expect-error the effect runs inside the transaction, with nothing more provided
    Producer.transaction(body, { offsets: Effect.as(Producer.Producer, offsets) })
    // The group metadata goes with the positions; the producers are a member's or a partition's, by name.
    Producer.transaction(body, {
      offsets: { ...offsets, member: { groupId: "g", generationId: 3, memberId: "m-1", groupInstanceId: "host-1" } }
    })
    CommitPolicy.kafkaTransactional({ instanceId: "host-1", producers: "partition" })
    // @ts-expect-error producers are per member or per partition
    CommitPolicy.kafkaTransactional({ producers: "chunk" })
  })

  it("the layers say what they need and how they can fail", () => {
    expectTypeOf(InMemoryKafka.layerProducer()).toEqualTypeOf<
      Layer.Layer<Producer.Producer, InvalidConfig, InMemoryKafka.InMemoryKafka>
    >()
    expectTypeOf(KafkaJs.layerProducer({ brokers: ["localhost:9092"] })).toEqualTypeOf<
      Layer.Layer<Producer.Producer, InvalidConfig | KafkaDriverError, never>
    >()
    // Both drivers promise the same: a bad setting fails the layer with InvalidConfig, nothing more.
    expectTypeOf(Platformatic.layer({ brokers: ["localhost:9092"] })).toEqualTypeOf<
      Layer.Layer<Driver, InvalidConfig, never>
    >()
    expectTypeOf(KafkaJs.layer({ brokers: ["localhost:9092"] })).toEqualTypeOf<
      Layer.Layer<Driver, InvalidConfig, never>
    >()
    expectTypeOf(Platformatic.layerProducer({ brokers: ["localhost:9092"] })).toEqualTypeOf<
      Layer.Layer<Producer.Producer, InvalidConfig | KafkaDriverError, never>
    >()
    expectTypeOf(Platformatic.layerTransactionalProducers({ brokers: ["localhost:9092"] })).toEqualTypeOf<
      Layer.Layer<Producer.TransactionalProducers, InvalidConfig | KafkaDriverError, never>
    >()
    // @ts-expect-error the SASL password is a Redacted value, never a plain string
    Platformatic.layer({ brokers: ["h:1"], sasl: { mechanism: "plain", username: "u", password: "p" } })
    // @ts-expect-error a session's settings belong to the consumer, not to the driver
    Platformatic.layer({ brokers: ["h:1"], sessionTimeout: "10 seconds" })
    // The rebalance protocols each driver can keep the library's promises with, and no other.
    Platformatic.layer({ brokers: ["h:1"], rebalance: "cooperative" })
    Platformatic.layer({ brokers: ["h:1"], rebalance: "consumer" })
    // @ts-expect-error no such protocol
    Platformatic.layer({ brokers: ["h:1"], rebalance: "sticky" })
    KafkaJs.layer({ brokers: ["h:1"], rebalance: "eager" })
    // @ts-expect-error kafkajs rebalances eagerly only
    KafkaJs.layer({ brokers: ["h:1"], rebalance: "cooperative" })
    InMemoryKafka.layer({ rebalance: "consumer" })
  })

  it.effect("a failed send is a ProduceFailed at run time, as the type says", () =>
    Effect.gen(function*() {
      const error = yield* Effect.flip(Producer.send({ topic: "missing", value: "v" }))
      assert.instanceOf(error, ProduceFailed)
      assert.strictEqual(error.reason, "UnknownTopic")
    }).pipe(Effect.provide(Layer.provide(InMemoryKafka.layerProducer({ linger: 0 }), InMemoryKafka.layer()))))
})
