import * as NodeContext from "@effect/platform-node/NodeContext"
import * as FileSystem from "@effect/platform/FileSystem"
import { assert, describe, it } from "@effect/vitest"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Layer from "effect/Layer"
import * as Ref from "effect/Ref"
import { ConfigError } from "../src/KafkaError.js"
import * as OffsetStore from "../src/OffsetStore.js"
import * as TopicPartition from "../src/TopicPartition.js"

const orders0 = TopicPartition.make("orders", 0)
const orders1 = TopicPartition.make("orders", 1)

const segment = (sequence: number) => `${String(sequence).padStart(20, "0")}.json`

/** A file store on `directory`, as one process of several sharing it would open it. */
const open = (directory: string) =>
  Effect.map(Layer.build(OffsetStore.layerFileSystem(directory)), (context) => ({
    store: Context.get(context, OffsetStore.OffsetStore),
    results: Context.get(context, OffsetStore.Results)
  }))

/** Commits a unit of group `g` whose work appends `values`. */
const commitValues = (
  store: OffsetStore.OffsetStore["Type"],
  partition: TopicPartition.TopicPartition,
  expected: bigint | null,
  next: bigint,
  values: ReadonlyArray<string>
) => store.commit({ groupId: "g", partition, expected, next }, OffsetStore.append(values))

const tempDirectory = Effect.flatMap(
  FileSystem.FileSystem,
  (fs) => fs.makeTempDirectoryScoped({ prefix: "file-offset-store-" })
)

describe("OffsetStore.layerFileSystem", () => {
  it.scoped("writes each committed unit as a JSON file a person can read", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const directory = yield* tempDirectory
      const { store } = yield* open(directory)
      const partition = TopicPartition.make("orders", 3)
      yield* store.commit(
        { groupId: "payments-eu", partition, expected: null, next: 2n },
        OffsetStore.append([{ orderId: "o-1", offset: "0" }, { orderId: "o-2", offset: "1" }])
      )
      yield* store.commit(
        { groupId: "payments-eu", partition, expected: 2n, next: 3n },
        OffsetStore.append([{ orderId: "o-3", offset: "2" }])
      )

      const partitionDirectory = `${directory}/payments-eu/orders/3`
      assert.deepStrictEqual((yield* fs.readDirectory(partitionDirectory)).sort(), [segment(1), segment(2)])
      const text = yield* fs.readFileString(`${partitionDirectory}/${segment(2)}`)
      assert.include(text, "\n  \"groupId\": \"payments-eu\",\n")
      const parsed: unknown = JSON.parse(text)
      assert.deepInclude(parsed, {
        format: "effect-kafka-delivery/offset-segment/1",
        groupId: "payments-eu",
        topic: "orders",
        partition: 3,
        sequence: 2,
        from: "2",
        next: "3",
        results: [{ orderId: "o-3", offset: "2" }]
      })
      const first: unknown = JSON.parse(yield* fs.readFileString(`${partitionDirectory}/${segment(1)}`))
      assert.deepInclude(first, { sequence: 1, from: null, next: "2" })
    }).pipe(Effect.provide(NodeContext.layer)))

  it.scoped("keeps odd group and topic names inside its directory", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const parent = yield* tempDirectory
      const directory = `${parent}/store`
      const { results, store } = yield* open(directory)
      const partition = TopicPartition.make("a/b", 0)
      yield* store.commit({ groupId: "../..", partition, expected: null, next: 1n }, OffsetStore.append(["x"]))
      assert.deepStrictEqual(yield* fs.readDirectory(parent), ["store"])
      assert.isTrue(yield* fs.exists(`${directory}/%2E%2E%2F%2E%2E/a%2Fb/0/${segment(1)}`))
      assert.strictEqual((yield* store.load("../..", [partition])).get("a/b-0"), 1n)
      assert.deepStrictEqual(yield* results.read("../.."), ["x"])
    }).pipe(Effect.provide(NodeContext.layer)))

  it.scoped("reads what another store wrote to the directory, as after a restart", () =>
    Effect.gen(function*() {
      const directory = yield* tempDirectory
      const first = yield* open(directory)
      yield* commitValues(first.store, orders0, null, 4n, ["a"])
      yield* commitValues(first.store, orders1, null, 7n, ["b"])

      const second = yield* open(directory)
      const positions = yield* second.store.load("g", [orders0, orders1])
      assert.deepStrictEqual([...positions].sort(), [["orders-0", 4n], ["orders-1", 7n]])
      assert.deepStrictEqual(yield* second.results.read("g"), ["a", "b"])

      // Each store sees the other's commits when it commits, without loading first.
      yield* commitValues(second.store, orders0, 4n, 5n, ["c"])
      yield* commitValues(first.store, orders0, 5n, 6n, ["d"])
      const stale = yield* second.store.commit(
        { groupId: "g", partition: orders0, expected: 5n, next: 9n },
        OffsetStore.append(["zombie"])
      ).pipe(Effect.flip)
      assert.instanceOf(stale, OffsetStore.Fenced)
      assert.strictEqual(stale._tag === "Fenced" ? stale.actual : undefined, 6n)
      assert.deepStrictEqual(yield* first.results.read("g", orders0), ["a", "c", "d"])
    }).pipe(Effect.provide(NodeContext.layer)))

  it.live("fences between two stores sharing the directory: one of two units from the same position commits", () =>
    Effect.scoped(Effect.gen(function*() {
      const directory = yield* tempDirectory
      const stores = [yield* open(directory), yield* open(directory)]
      let position: bigint | null = null
      const winners: Array<string> = []
      for (let attempt = 0; attempt < 10; attempt++) {
        const from: bigint | null = position
        const arrived = yield* Ref.make(0)
        const bothRunning = yield* Effect.makeLatch(false)
        const barrier = Ref.updateAndGet(arrived, (n) => n + 1).pipe(
          Effect.flatMap((n) => n === stores.length ? bothRunning.open : Effect.void),
          Effect.zipRight(bothRunning.await)
        )
        const outcomes = yield* Effect.all(
          stores.map(({ store }, i) =>
            store.commit(
              { groupId: "g", partition: orders0, expected: from, next: (from ?? 0n) + BigInt(i + 1) },
              OffsetStore.append([`attempt-${attempt}-store-${i}`]).pipe(Effect.zipRight(barrier), Effect.as(i))
            ).pipe(Effect.either)
          ),
          { concurrency: "unbounded" }
        )
        const won = outcomes.flatMap((outcome) => Either.isRight(outcome) ? [outcome.right] : [])
        assert.strictEqual(won.length, 1, `attempt ${attempt}`)
        const next: bigint = (from ?? 0n) + BigInt(won[0] + 1)
        for (const outcome of outcomes) {
          if (Either.isLeft(outcome)) {
            assert.instanceOf(outcome.left, OffsetStore.Fenced)
            assert.strictEqual(outcome.left._tag === "Fenced" ? outcome.left.actual : undefined, next)
          }
        }
        winners.push(`attempt-${attempt}-store-${won[0]}`)
        position = next
      }
      const reader = yield* open(directory)
      assert.strictEqual((yield* reader.store.load("g", [orders0])).get("orders-0"), position)
      assert.deepStrictEqual(yield* reader.results.read("g", orders0), winners)
    })).pipe(Effect.provide(NodeContext.layer)))

  it.scoped("ignores a temporary file left by a crash in the middle of a write", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const directory = yield* tempDirectory
      const first = yield* open(directory)
      yield* commitValues(first.store, orders0, null, 5n, ["a"])
      const partitionDirectory = `${directory}/g/orders/0`
      yield* fs.writeFileString(`${partitionDirectory}/.tmp-crashed.json`, "{\n  \"format\": \"effect-kafka-deliv")
      yield* fs.writeFileString(`${partitionDirectory}/.tmp-empty.json`, "")

      const restarted = yield* open(directory)
      assert.strictEqual((yield* restarted.store.load("g", [orders0])).get("orders-0"), 5n)
      yield* restarted.store.commit(
        { groupId: "g", partition: orders0, expected: 5n, next: 8n },
        OffsetStore.append(["b"])
      )
      assert.strictEqual((yield* restarted.store.load("g", [orders0])).get("orders-0"), 8n)
      assert.deepStrictEqual(yield* restarted.results.read("g"), ["a", "b"])
    }).pipe(Effect.provide(NodeContext.layer)))

  it.scoped("reports a damaged segment with its path, and changes nothing", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const directory = yield* tempDirectory
      const first = yield* open(directory)
      yield* commitValues(first.store, orders0, null, 2n, ["a"])
      yield* commitValues(first.store, orders0, 2n, 4n, ["b"])
      yield* commitValues(first.store, orders1, null, 9n, ["c"])

      const partitionDirectory = `${directory}/g/orders/0`
      const damaged = `${partitionDirectory}/${segment(2)}`
      const garbage = "{\n  \"format\": \"effect-kafka-delivery/offset-segment/1\",\n  \"next\": "
      yield* fs.writeFileString(damaged, garbage)
      const intact = yield* fs.readFileString(`${partitionDirectory}/${segment(1)}`)

      const restarted = yield* open(directory)
      const loadError = yield* restarted.store.load("g", [orders0, orders1]).pipe(Effect.flip)
      assert.instanceOf(loadError, OffsetStore.OffsetStoreError)
      assert.include(loadError.message, damaged)
      assert.include(loadError.message, "move it out of the directory")
      const commitError = yield* restarted.store.commit(
        { groupId: "g", partition: orders0, expected: 4n, next: 6n },
        OffsetStore.append(["d"])
      ).pipe(Effect.flip)
      assert.instanceOf(commitError, OffsetStore.OffsetStoreError)
      assert.include(commitError.message, damaged)
      const readError = yield* restarted.results.read("g", orders0).pipe(Effect.flip)
      assert.include(readError.message, damaged)

      // Other partitions still work, and nothing on disk was touched.
      assert.strictEqual((yield* restarted.store.load("g", [orders1])).get("orders-1"), 9n)
      assert.deepStrictEqual(yield* restarted.results.read("g", orders1), ["c"])
      assert.strictEqual(yield* fs.readFileString(damaged), garbage)
      assert.strictEqual(yield* fs.readFileString(`${partitionDirectory}/${segment(1)}`), intact)
      assert.deepStrictEqual((yield* fs.readDirectory(partitionDirectory)).sort(), [segment(1), segment(2)])

      // Following the message: moving the damaged newest segment away rolls the partition back, results included.
      yield* fs.rename(damaged, `${directory}/damaged.json`)
      assert.strictEqual((yield* restarted.store.load("g", [orders0])).get("orders-0"), 2n)
      assert.deepStrictEqual(yield* restarted.results.read("g", orders0), ["a"])
      yield* commitValues(restarted.store, orders0, 2n, 4n, ["b"])
      assert.deepStrictEqual(yield* restarted.results.read("g", orders0), ["a", "b"])
    }).pipe(Effect.provide(NodeContext.layer)))

  it.scoped("reports a segment stored where it does not belong", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const directory = yield* tempDirectory
      const { store } = yield* open(directory)
      yield* store.commit({ groupId: "g", partition: orders0, expected: null, next: 2n }, OffsetStore.append(["a"]))
      yield* store.commit({ groupId: "g", partition: orders1, expected: null, next: 3n }, OffsetStore.append(["b"]))
      const misplaced = `${directory}/g/orders/0/${segment(2)}`
      yield* fs.copyFile(`${directory}/g/orders/1/${segment(1)}`, misplaced)
      const error = yield* Effect.flatMap(open(directory), ({ store }) => store.load("g", [orders0])).pipe(Effect.flip)
      assert.instanceOf(error, OffsetStore.OffsetStoreError)
      assert.include(error.message, misplaced)
      assert.include(error.message, "not where it is stored")
    }).pipe(Effect.provide(NodeContext.layer)))

  it.scoped("refuses an empty directory name before touching the file system", () =>
    Effect.gen(function*() {
      for (const directory of ["", "   "]) {
        const error = yield* open(directory).pipe(Effect.flip)
        assert.instanceOf(error, ConfigError)
        assert.strictEqual(error._tag === "ConfigError" ? error.field : undefined, "directory")
      }
    }).pipe(Effect.provide(FileSystem.layerNoop({}))))

  it.scoped("refuses a directory that is a file", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const directory = yield* tempDirectory
      const file = `${directory}/not-a-directory`
      yield* fs.writeFileString(file, "x")
      const error = yield* open(file).pipe(Effect.flip)
      assert.instanceOf(error, OffsetStore.OffsetStoreError)
      assert.include(error.message, file)
    }).pipe(Effect.provide(NodeContext.layer)))
})
