import * as NodeContext from "@effect/platform-node/NodeContext"
import * as FileSystem from "@effect/platform/FileSystem"
import { assert, describe, it } from "@effect/vitest"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import { OutsideUnit } from "../src/internal/store/unitBuffer.js"
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

describe("OffsetStore.layerMemory", () => {
  const orders0 = TopicPartition.make("orders", 0)
  const orders1 = TopicPartition.make("orders", 1)

  const claimOf = (partition: TopicPartition.TopicPartition) =>
    Effect.flatMap(OffsetStore.OffsetStore, (store) => store.claim("g", [partition])).pipe(
      Effect.map((claims) => claims.get(TopicPartition.key(partition))?.epoch ?? 0n)
    )

  const commitValues = (
    partition: TopicPartition.TopicPartition,
    epoch: bigint,
    next: bigint,
    values: ReadonlyArray<string>
  ) =>
    Effect.flatMap(
      OffsetStore.OffsetStore,
      (store) => store.commit({ groupId: "g", partition, epoch, next }, OffsetStore.append(values))
    )

  it.effect("keeps each unit's results together, in commit order, when units of one owner commit side by side", () =>
    Effect.gen(function*() {
      const store = yield* OffsetStore.OffsetStore
      const epoch = yield* claimOf(orders0)
      yield* commitValues(orders0, epoch, 1n, ["first"])
      const gates = [yield* Deferred.make<void>(), yield* Deferred.make<void>(), yield* Deferred.make<void>()]
      const appending = yield* Deferred.make<void>()
      // Each unit appends twice, and their appends interleave; they commit in the order their gates open.
      const fibers = yield* Effect.forEach([0, 1, 2], (i) =>
        Effect.fork(store.commit(
          { groupId: "g", partition: orders0, epoch, next: BigInt(i + 2) },
          OffsetStore.append([`u${i}-a`]).pipe(
            Effect.zipRight(Effect.yieldNow()),
            Effect.zipRight(OffsetStore.append([`u${i}-b`, `u${i}-c`])),
            Effect.zipRight(i === 2 ? Deferred.succeed(appending, undefined) : Effect.void),
            Effect.zipRight(Deferred.await(gates[i]))
          )
        )))
      // A unit whose work fails after appending, among them: nothing of it lands.
      const failed = yield* store.commit(
        { groupId: "g", partition: orders0, epoch, next: 9n },
        OffsetStore.append(["failed-a", "failed-b"]).pipe(Effect.zipRight(Effect.fail("handler failed")))
      ).pipe(Effect.exit)
      assert.isTrue(Exit.isFailure(failed))
      yield* Deferred.await(appending)
      for (const i of [2, 0, 1]) {
        yield* Deferred.succeed(gates[i], undefined)
        yield* Fiber.join(fibers[i])
      }
      assert.deepStrictEqual(yield* OffsetStore.results("g", orders0), [
        "first",
        "u2-a",
        "u2-b",
        "u2-c",
        "u0-a",
        "u0-b",
        "u0-c",
        "u1-a",
        "u1-b",
        "u1-c"
      ])
      assert.strictEqual((yield* store.load("g", [orders0])).get("orders-0"), 4n)
    }).pipe(Effect.provide(OffsetStore.layerMemory)))

  it.effect("gives a read what had committed when it ran: later units do not change it", () =>
    Effect.gen(function*() {
      const epoch0 = yield* claimOf(orders0)
      const epoch1 = yield* claimOf(orders1)
      yield* commitValues(orders0, epoch0, 1n, ["a"])
      yield* commitValues(orders1, epoch1, 1n, ["x"])
      const partition = yield* OffsetStore.results("g", orders0)
      const group = yield* OffsetStore.results("g")
      yield* commitValues(orders0, epoch0, 2n, ["b"])
      // A claim and a fenced unit of the earlier owner change nothing read before either.
      const owner = yield* claimOf(orders0)
      const fenced = yield* commitValues(orders0, epoch0, 3n, ["zombie"]).pipe(Effect.flip)
      assert.instanceOf(fenced, OffsetStore.Fenced)
      yield* commitValues(orders0, owner, 3n, ["c"])
      assert.deepStrictEqual(partition, ["a"])
      assert.deepStrictEqual(group, ["a", "x"])
      assert.deepStrictEqual(yield* OffsetStore.results("g", orders0), ["a", "b", "c"])
      assert.deepStrictEqual(yield* OffsetStore.results("g"), ["a", "b", "c", "x"])
    }).pipe(Effect.provide(OffsetStore.layerMemory)))

  it.effect("lands a unit of 200,000 results whole", () =>
    Effect.gen(function*() {
      const store = yield* OffsetStore.OffsetStore
      const epoch = yield* claimOf(orders0)
      const count = 200_000
      const values = Array.from({ length: count }, (_, i) => `r-${i}`)
      // 180,000 in one call (a batch that large once overflowed the stack), the rest in batches of 10,000.
      const chunks = [values.slice(0, 180_000), values.slice(180_000, 190_000), values.slice(190_000)]
      const exit = yield* store.commit(
        { groupId: "g", partition: orders0, epoch, next: BigInt(count) },
        Effect.forEach(chunks, OffsetStore.append, { discard: true })
      ).pipe(Effect.exit)
      assert.isTrue(Exit.isSuccess(exit), `the unit failed: ${Exit.isFailure(exit) ? String(exit.cause) : ""}`)
      const results = yield* OffsetStore.results("g", orders0)
      assert.strictEqual(results.length, count)
      assert.deepStrictEqual([results[0], results[count - 1]], ["r-0", `r-${count - 1}`])
    }).pipe(Effect.provide(OffsetStore.layerMemory)))

  // A store that copied a partition's results on every unit would make a long run quadratic: on a partition holding
  // 500,000 results, each unit would copy them all (tens of milliseconds here), and the 2,000 units below would take
  // minutes. Appending, they take what they take on an empty partition (about 100 ms). The loop stops at the bound, so
  // a copying store fails in as long as the bound.
  it.live("makes a unit cost what it adds, however many results its partition holds", () =>
    Effect.gen(function*() {
      const epoch0 = yield* claimOf(orders0)
      const epoch1 = yield* claimOf(orders1)
      const held = 500_000
      for (let unit = 0; unit < held / 10_000; unit++) {
        const values = Array.from({ length: 10_000 }, (_, i) => `held-${unit * 10_000 + i}`)
        yield* commitValues(orders0, epoch0, BigInt((unit + 1) * 10_000), values)
      }
      const units = 2_000
      const boundMs = 2_000
      /** Commits up to `units` units of one result each, for at most `boundMs`; how many, in how long. */
      const run = (partition: TopicPartition.TopicPartition, epoch: bigint, from: number) =>
        Effect.gen(function*() {
          const started = performance.now()
          let done = 0
          while (done < units && performance.now() - started < boundMs) {
            yield* commitValues(partition, epoch, BigInt(from + done + 1), [`unit-${from + done}`])
            done++
          }
          return { done, ms: performance.now() - started }
        })
      const onEmpty = yield* run(orders1, epoch1, 0)
      const onFull = yield* run(orders0, epoch0, held)
      assert.strictEqual(onEmpty.done, units, `on an empty partition, in ${boundMs} ms`)
      assert.strictEqual(
        onFull.done,
        units,
        `units committed in ${boundMs} ms on a partition holding ${held} results (an empty one took ` +
          `${onEmpty.ms.toFixed(0)} ms for all ${units})`
      )
      const results = yield* OffsetStore.results("g", orders0)
      assert.strictEqual(results.length, held + units)
      assert.deepStrictEqual(results.slice(held - 1, held + 1), [`held-${held - 1}`, `unit-${held}`])
    }).pipe(Effect.provide(OffsetStore.layerMemory)))
})
