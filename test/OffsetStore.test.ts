import * as NodeContext from "@effect/platform-node/NodeContext"
import * as FileSystem from "@effect/platform/FileSystem"
import { assert, describe, it } from "@effect/vitest"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { OutsideUnit } from "../src/internal/unitBuffer.js"
import * as OffsetStore from "../src/OffsetStore.js"
import * as TopicPartition from "../src/TopicPartition.js"
import { offsetStoreSuite, SuiteResults } from "./offsetStoreSuite.js"

const strings = (values: ReadonlyArray<unknown>): Effect.Effect<ReadonlyArray<string>, Error> =>
  values.every((value) => typeof value === "string")
    ? Effect.succeed(values.filter((value) => typeof value === "string"))
    : Effect.fail(new Error(`results are not all strings: ${JSON.stringify(values)}`))

const appendedResults = Layer.effect(
  SuiteResults,
  Effect.map(OffsetStore.Results, (results) => ({
    write: (_groupId: string, _partition: TopicPartition.TopicPartition, values: ReadonlyArray<string>) =>
      OffsetStore.append(values),
    read: (groupId: string, partition: TopicPartition.TopicPartition) =>
      Effect.flatMap(results.read(groupId, partition), strings)
  }))
)

/** A file store in a temporary directory of its own, removed when the test ends. */
export const fileStoreInTempDirectory = Layer.unwrapScoped(
  Effect.map(
    Effect.flatMap(FileSystem.FileSystem, (fs) => fs.makeTempDirectoryScoped({ prefix: "offset-store-" })),
    (directory) => OffsetStore.layerFileSystem(directory)
  )
).pipe(Layer.provide(NodeContext.layer))

offsetStoreSuite("OffsetStore.layerMemory", appendedResults.pipe(Layer.provideMerge(OffsetStore.layerMemory)))
offsetStoreSuite("OffsetStore.layerFileSystem", appendedResults.pipe(Layer.provideMerge(fileStoreInTempDirectory)))

describe("OffsetStore.append", () => {
  const orders0 = TopicPartition.make("orders", 0)
  const orders1 = TopicPartition.make("orders", 1)
  const other0 = TopicPartition.make("audit", 0)

  /** Claims the partition for the group, then commits one unit of the new owner moving it to `next`. */
  const commitAsOwner = <A, E, R>(
    groupId: string,
    partition: TopicPartition.TopicPartition,
    next: bigint,
    work: Effect.Effect<A, E, R>
  ) =>
    Effect.flatMap(OffsetStore.OffsetStore, (store) =>
      store.claim(groupId, [partition]).pipe(
        Effect.map((claims) => claims.get(TopicPartition.key(partition))?.epoch ?? 0n),
        Effect.flatMap((epoch) => store.commit({ groupId, partition, epoch, next }, work))
      ))

  it.effect("keeps JSON values as JSON and reads a whole group in partition order", () =>
    Effect.gen(function*() {
      yield* commitAsOwner("g", orders1, 1n, OffsetStore.append([{ offset: "0", value: "b" }]))
      yield* commitAsOwner("g", orders0, 2n, OffsetStore.append([{ offset: "0", value: "a" }, [1, true, null]]))
      yield* commitAsOwner("g", other0, 1n, OffsetStore.append(["audit"]))
      yield* commitAsOwner("h", orders0, 1n, OffsetStore.append(["other group"]))
      assert.deepStrictEqual(yield* OffsetStore.results("g"), [
        "audit",
        { offset: "0", value: "a" },
        [1, true, null],
        { offset: "0", value: "b" }
      ])
      assert.deepStrictEqual(yield* OffsetStore.results("g", orders1), [{ offset: "0", value: "b" }])
      assert.deepStrictEqual(yield* OffsetStore.results("nobody"), [])
    }).pipe(Effect.provide(OffsetStore.layerMemory)))

  it.effect("copies entries when they are appended", () =>
    Effect.gen(function*() {
      const entry = { count: 1 }
      yield* commitAsOwner(
        "g",
        orders0,
        1n,
        OffsetStore.append([entry]).pipe(Effect.tap(() => Effect.sync(() => entry.count = 2)))
      )
      assert.deepStrictEqual(yield* OffsetStore.results("g", orders0), [{ count: 1 }])
    }).pipe(Effect.provide(OffsetStore.layerMemory)))

  it.effect("refuses what has no JSON form, and the unit does not commit", () =>
    Effect.gen(function*() {
      const store = yield* OffsetStore.OffsetStore
      const error = yield* commitAsOwner("g", orders0, 1n, OffsetStore.append([{ offset: 5n }])).pipe(Effect.flip)
      assert.instanceOf(error, OffsetStore.OffsetStoreError)
      assert.include(error.message, "JSON")
      assert.include(error.message, "bigint")
      assert.strictEqual((yield* store.load("g", [orders0])).size, 0)
      assert.deepStrictEqual(yield* OffsetStore.results("g"), [])
    }).pipe(Effect.provide(OffsetStore.layerMemory)))

  it.effect("refuses entries after the unit of work ended", () =>
    Effect.gen(function*() {
      const leaked = yield* commitAsOwner("g", orders0, 1n, Effect.context<OffsetStore.Transaction>())
      const error = yield* OffsetStore.append(["late"]).pipe(Effect.provide(leaked), Effect.flip)
      assert.include(error.message, "has ended")
      assert.deepStrictEqual(yield* OffsetStore.results("g"), [])
    }).pipe(Effect.provide(OffsetStore.layerMemory)))

  it.effect("refuses the transaction the policy provides outside any unit of work", () =>
    Effect.gen(function*() {
      const error = yield* OffsetStore.append(["x"]).pipe(
        Effect.provideService(OffsetStore.Transaction, { store: "memory", handle: new OutsideUnit("memory") }),
        Effect.flip
      )
      assert.instanceOf(error, OffsetStore.OffsetStoreError)
      assert.include(error.message, "no unit of work is open")
    }))

  it.effect("refuses a transaction of another store", () =>
    Effect.gen(function*() {
      const error = yield* OffsetStore.append(["x"]).pipe(
        Effect.provideService(OffsetStore.Transaction, { store: "postgres", handle: {} }),
        Effect.flip
      )
      assert.instanceOf(error, OffsetStore.OffsetStoreError)
      assert.include(error.message, "PgOffsetStore.sql")
    }))

  it.effect("keeps the stores of two memory layers apart", () =>
    Effect.gen(function*() {
      const claimFresh = Effect.flatMap(OffsetStore.OffsetStore, (store) => store.claim("g", [orders0]))
      yield* commitAsOwner("g", orders0, 1n, Effect.void).pipe(Effect.provide(OffsetStore.layerMemory))
      const claims = yield* claimFresh.pipe(Effect.provide(OffsetStore.layerMemory))
      assert.deepStrictEqual(claims.get("orders-0"), { epoch: 1n, position: null })
    }))
})
