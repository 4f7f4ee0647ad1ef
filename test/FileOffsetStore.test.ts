import * as NodeContext from "@effect/platform-node/NodeContext"
import * as PlatformError from "@effect/platform/Error"
import * as FileSystem from "@effect/platform/FileSystem"
import { assert, describe, it } from "@effect/vitest"
import * as Context from "effect/Context"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Layer from "effect/Layer"
import * as NFS from "node:fs"
import { compactEvery } from "../src/internal/store/file.js"
import { InvalidConfig } from "../src/KafkaError.js"
import * as OffsetStore from "../src/OffsetStore.js"
import * as TopicPartition from "../src/TopicPartition.js"
import { refusal } from "./offsetStoreSuite.js"

const orders0 = TopicPartition.make("orders", 0)
const orders1 = TopicPartition.make("orders", 1)

const segment = (sequence: number) => `${String(sequence).padStart(20, "0")}.json`

/** A file store on `directory`, as one process of several sharing it would open it. */
const open = (directory: string) =>
  Effect.map(Layer.build(OffsetStore.layerFileSystem(directory)), (context) => ({
    store: Context.get(context, OffsetStore.OffsetStore),
    results: Context.get(context, OffsetStore.Results)
  }))

type Store = OffsetStore.OffsetStore["Type"]

/** Claims a partition of group `g` and returns its claim. */
const claimOf = (store: Store, partition: TopicPartition.TopicPartition) =>
  Effect.map(store.claim("g", [partition]), (claims) => claims.get(TopicPartition.key(partition)))

const epochOf = (store: Store, partition: TopicPartition.TopicPartition) =>
  Effect.map(claimOf(store, partition), (claimed) => claimed?.epoch ?? -1n)

/** Commits a unit of group `g` whose work appends `values`. */
const commitValues = (
  store: Store,
  partition: TopicPartition.TopicPartition,
  epoch: bigint,
  next: bigint,
  values: ReadonlyArray<string>
) => store.commit({ groupId: "g", partition, epoch, next }, OffsetStore.append(values))

/** A temporary directory, on a memory file system when there is one: some tests commit a great many units. */
const tempDirectory = Effect.flatMap(FileSystem.FileSystem, (fs) =>
  Effect.flatMap(
    fs.exists("/dev/shm").pipe(Effect.orElseSucceed(() => false)),
    (shm) => fs.makeTempDirectoryScoped({ prefix: "file-offset-store-", ...(shm ? { directory: "/dev/shm" } : {}) })
  ))

/** The text the previous version of the store wrote for a committed unit (format 1). */
const formatOneSegment = (sequence: number, from: bigint | null, next: bigint, results: ReadonlyArray<unknown>) =>
  `${
    JSON.stringify(
      {
        format: "effect-kafka-delivery/offset-segment/1",
        groupId: "g",
        topic: "orders",
        partition: 0,
        sequence,
        from: from === null ? null : String(from),
        next: String(next),
        committedAt: "2025-01-01T12:00:00.000Z",
        results
      },
      null,
      2
    )
  }\n`

/** A segment of the current format, as another store (a zombie, say) would write it. */
const foreignSegment = (sequence: number, epoch: bigint, next: bigint, results: ReadonlyArray<unknown>) =>
  JSON.stringify({
    format: "effect-kafka-delivery/offset-segment/2",
    id: crypto.randomUUID(),
    groupId: "g",
    topic: "orders",
    partition: 0,
    sequence,
    epoch: String(epoch),
    next: String(next),
    kind: "unit",
    writtenAt: "2025-01-01T12:00:00.000Z",
    results
  })

const segmentNames = (directory: string) =>
  Effect.flatMap(FileSystem.FileSystem, (fs) => fs.readDirectory(directory)).pipe(
    Effect.map((names) => names.filter((name) => /^\d{20}\.json$/.test(name)).sort())
  )

/** Commits `count` units of `epoch`, each moving the position by one and appending `value-<position>`. */
const commitRun = (store: Store, epoch: bigint, from: number, count: number) =>
  Effect.forEach(
    Array.from({ length: count }, (_, i) => from + i),
    (offset) => commitValues(store, orders0, epoch, BigInt(offset + 1), [`value-${offset}`]),
    { discard: true }
  )

const values = (from: number, count: number) => Array.from({ length: count }, (_, i) => `value-${from + i}`)

/**
 * Node's file system, with the calls the store makes done by Node's synchronous calls and counted: the same files and
 * the same atomic `link`, without a round trip to libuv's threads per call (which would make 40,000 units take
 * minutes here).
 */
const countingFileSystem = (counts: Map<string, number>) =>
  Layer.effect(
    FileSystem.FileSystem,
    Effect.map(FileSystem.FileSystem, (fs): FileSystem.FileSystem => {
      const call = <A>(method: string, path: string, f: () => A) => {
        counts.set(method, (counts.get(method) ?? 0) + 1)
        return Effect.try({
          try: f,
          catch: (error) => {
            const code = typeof error === "object" && error !== null && "code" in error ? error.code : undefined
            return new PlatformError.SystemError({
              reason: code === "ENOENT" ? "NotFound" : code === "EEXIST" ? "AlreadyExists" : "Unknown",
              module: "FileSystem",
              method,
              pathOrDescriptor: path,
              description: error instanceof Error ? error.message : String(error)
            })
          }
        })
      }
      const unused = Effect.dieMessage("not used by the store")
      const file = (fd: number, path: string): FileSystem.File => ({
        [FileSystem.FileTypeId]: FileSystem.FileTypeId,
        fd: FileSystem.FileDescriptor(fd),
        stat: unused,
        seek: () => unused,
        sync: call("sync", path, () => NFS.fsyncSync(fd)),
        read: () => unused,
        readAlloc: () => unused,
        truncate: () => unused,
        write: () => unused,
        writeAll: (bytes) => call("write", path, () => void NFS.writeSync(fd, bytes))
      })
      return {
        ...fs,
        open: (path, options) =>
          Effect.acquireRelease(
            call("open", path, () => file(NFS.openSync(path, options?.flag ?? "r"), path)),
            (opened) => Effect.sync(() => NFS.closeSync(opened.fd))
          ),
        link: (from, to) => call("link", to, () => NFS.linkSync(from, to)),
        remove: (path) => call("remove", path, () => NFS.rmSync(path)),
        exists: (path) => call("exists", path, () => NFS.existsSync(path)),
        stat: (path) => Effect.zipRight(call("stat", path, () => undefined), fs.stat(path)),
        readFileString: (path) => call("readFile", path, () => NFS.readFileSync(path, "utf8")),
        readDirectory: (path) => call("readDirectory", path, () => NFS.readdirSync(path)),
        makeDirectory: (path, options) =>
          call("makeDirectory", path, () => void NFS.mkdirSync(path, { recursive: options?.recursive ?? false }))
      }
    })
  ).pipe(Layer.provide(NodeContext.layer))

const total = (counts: Map<string, number>) => [...counts.values()].reduce((sum, n) => sum + n, 0)

describe("OffsetStore.layerFileSystem", () => {
  it.scoped("writes each claim and unit as a JSON file a person can read", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const directory = yield* tempDirectory
      const { store } = yield* open(directory)
      const partition = TopicPartition.make("orders", 3)
      const claims = yield* store.claim("payments-eu", [partition])
      const epoch = claims.get("orders-3")?.epoch ?? 0n
      yield* store.commit(
        { groupId: "payments-eu", partition, epoch, next: 2n },
        OffsetStore.append([{ orderId: "o-1", offset: "0" }, { orderId: "o-2", offset: "1" }])
      )
      yield* store.commit(
        { groupId: "payments-eu", partition, epoch, next: 3n },
        OffsetStore.append([{ orderId: "o-3", offset: "2" }])
      )

      const partitionDirectory = `${directory}/payments-eu/orders/3`
      assert.deepStrictEqual(yield* segmentNames(partitionDirectory), [segment(1), segment(2), segment(3)])
      const text = yield* fs.readFileString(`${partitionDirectory}/${segment(3)}`)
      assert.include(text, "\n  \"groupId\": \"payments-eu\",\n")
      const parsed: unknown = JSON.parse(text)
      assert.deepInclude(parsed, {
        format: "effect-kafka-delivery/offset-segment/2",
        kind: "unit",
        groupId: "payments-eu",
        topic: "orders",
        partition: 3,
        sequence: 3,
        epoch: "1",
        next: "3",
        results: [{ orderId: "o-3", offset: "2" }]
      })
      const first: unknown = JSON.parse(yield* fs.readFileString(`${partitionDirectory}/${segment(1)}`))
      assert.deepInclude(first, { kind: "claim", sequence: 1, epoch: "1", next: null, results: [] })
    }).pipe(Effect.provide(NodeContext.layer)))

  it.scoped("keeps odd group and topic names inside its directory", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const parent = yield* tempDirectory
      const directory = `${parent}/store`
      const { results, store } = yield* open(directory)
      const partition = TopicPartition.make("a/b", 0)
      const claims = yield* store.claim("../..", [partition])
      const epoch = claims.get("a/b-0")?.epoch ?? 0n
      yield* store.commit({ groupId: "../..", partition, epoch, next: 1n }, OffsetStore.append(["x"]))
      assert.deepStrictEqual(yield* fs.readDirectory(parent), ["store"])
      assert.isTrue(yield* fs.exists(`${directory}/%2E%2E%2F%2E%2E/a%2Fb/0/${segment(2)}`))
      assert.strictEqual((yield* store.load("../..", [partition])).get("a/b-0"), 1n)
      assert.deepStrictEqual(yield* results.read("../.."), ["x"])
    }).pipe(Effect.provide(NodeContext.layer)))

  it.scoped("reads what another store wrote to the directory, and fences it after claiming", () =>
    Effect.gen(function*() {
      const directory = yield* tempDirectory
      const first = yield* open(directory)
      const firstEpoch = yield* epochOf(first.store, orders0)
      yield* commitValues(first.store, orders0, firstEpoch, 4n, ["a"])
      yield* commitValues(first.store, orders1, yield* epochOf(first.store, orders1), 7n, ["b"])

      const second = yield* open(directory)
      const positions = yield* second.store.load("g", [orders0, orders1])
      assert.deepStrictEqual([...positions].sort(), [["orders-0", 4n], ["orders-1", 7n]])
      assert.deepStrictEqual(yield* second.results.read("g"), ["a", "b"])

      // The second store claims without having loaded; the first store's next unit finds the claim and is fenced.
      assert.deepStrictEqual(yield* claimOf(second.store, orders0), { epoch: 2n, position: 4n })
      const stale = yield* refusal(
        "the first store's unit",
        commitValues(first.store, orders0, firstEpoch, 9n, ["zombie"])
      )
      assert.instanceOf(stale, OffsetStore.Fenced)
      assert.deepInclude(stale, { epoch: 1n, currentEpoch: 2n })
      yield* commitValues(second.store, orders0, 2n, 5n, ["c"])
      assert.deepStrictEqual(yield* first.results.read("g", orders0), ["a", "c"])
      assert.strictEqual((yield* first.store.load("g", [orders0])).get("orders-0"), 5n)
    }).pipe(Effect.provide(NodeContext.layer)))

  it.live("fences between two stores sharing the directory: of a claim and a unit, the first one wins", () =>
    Effect.scoped(Effect.gen(function*() {
      const directory = yield* tempDirectory
      const stores = [yield* open(directory), yield* open(directory)]
      let owner = 0
      let epoch = yield* epochOf(stores[owner].store, orders0)
      let stored: bigint | null = null
      const expected: Array<string> = []
      const outcomes = { landed: 0, fenced: 0 }
      for (let round = 0; round < 40; round++) {
        const next = BigInt(round + 1)
        const value = `round-${round}`
        const claimer = 1 - owner
        const started = yield* Effect.makeLatch(false)
        const claimed = yield* Deferred.make<void>()
        // In odd rounds the claim starts as the unit's work starts, and the two links race; in even rounds the work
        // ends only once the other store has claimed.
        const work = OffsetStore.append([value]).pipe(
          Effect.zipRight(started.open),
          Effect.zipRight(round % 2 === 0 ? Deferred.await(claimed) : Effect.void)
        )
        const [committed, claim] = yield* Effect.all([
          stores[owner].store.commit({ groupId: "g", partition: orders0, epoch, next }, work).pipe(Effect.either),
          started.await.pipe(
            Effect.zipRight(claimOf(stores[claimer].store, orders0)),
            Effect.tap(() => Deferred.succeed(claimed, undefined))
          )
        ], { concurrency: "unbounded" })
        assert.strictEqual(claim?.epoch, epoch + 1n)
        if (Either.isRight(committed)) {
          outcomes.landed++
          assert.strictEqual(claim?.position, next, `round ${round}: the unit landed, so the claim includes it`)
          expected.push(value)
          stored = next
        } else {
          outcomes.fenced++
          assert.instanceOf(committed.left, OffsetStore.Fenced)
          assert.deepInclude(committed.left, { epoch, currentEpoch: epoch + 1n })
          assert.strictEqual(claim?.position, stored, `round ${round}: the claim came first`)
        }
        owner = claimer
        epoch = claim?.epoch ?? -1n
      }
      assert.isAtLeast(outcomes.fenced, 20, "every even round fences the unit")
      const reader = yield* open(directory)
      assert.strictEqual((yield* reader.store.load("g", [orders0])).get("orders-0") ?? null, stored)
      assert.deepStrictEqual(yield* reader.results.read("g", orders0), expected)
    })).pipe(Effect.provide(NodeContext.layer)))

  it.scoped("ignores a temporary file left by a crash in the middle of a write", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const directory = yield* tempDirectory
      const first = yield* open(directory)
      const epoch = yield* epochOf(first.store, orders0)
      yield* commitValues(first.store, orders0, epoch, 5n, ["a"])
      const partitionDirectory = `${directory}/g/orders/0`
      yield* fs.writeFileString(`${partitionDirectory}/.tmp-crashed.json`, "{\n  \"format\": \"effect-kafka-deliv")
      yield* fs.writeFileString(`${partitionDirectory}/.tmp-empty.json`, "")

      const restarted = yield* open(directory)
      assert.strictEqual((yield* restarted.store.load("g", [orders0])).get("orders-0"), 5n)
      const next = yield* epochOf(restarted.store, orders0)
      yield* commitValues(restarted.store, orders0, next, 8n, ["b"])
      assert.strictEqual((yield* restarted.store.load("g", [orders0])).get("orders-0"), 8n)
      assert.deepStrictEqual(yield* restarted.results.read("g"), ["a", "b"])
    }).pipe(Effect.provide(NodeContext.layer)))

  it.scoped("reports a damaged segment with its path, and changes nothing", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const directory = yield* tempDirectory
      const first = yield* open(directory)
      const epoch = yield* epochOf(first.store, orders0)
      yield* commitValues(first.store, orders0, epoch, 2n, ["a"])
      yield* commitValues(first.store, orders0, epoch, 4n, ["b"])
      yield* commitValues(first.store, orders1, yield* epochOf(first.store, orders1), 9n, ["c"])

      const partitionDirectory = `${directory}/g/orders/0`
      const damaged = `${partitionDirectory}/${segment(3)}`
      const garbage = "{\n  \"format\": \"effect-kafka-delivery/offset-segment/2\",\n  \"next\": "
      yield* fs.writeFileString(damaged, garbage)
      const intact = yield* fs.readFileString(`${partitionDirectory}/${segment(2)}`)

      const restarted = yield* open(directory)
      const loadError = yield* restarted.store.load("g", [orders0, orders1]).pipe(Effect.flip)
      assert.instanceOf(loadError, OffsetStore.OffsetStoreError)
      assert.include(loadError.message, damaged)
      assert.include(loadError.message, "move it out of the directory")
      const commitError = yield* commitValues(restarted.store, orders0, epoch, 6n, ["d"]).pipe(Effect.flip)
      assert.instanceOf(commitError, OffsetStore.OffsetStoreError)
      assert.include(commitError.message, damaged)
      const claimError = yield* restarted.store.claim("g", [orders0]).pipe(Effect.flip)
      assert.include(claimError.message, damaged)
      const readError = yield* restarted.results.read("g", orders0).pipe(Effect.flip)
      assert.include(readError.message, damaged)

      // Other partitions still work, and nothing on disk was touched.
      assert.strictEqual((yield* restarted.store.load("g", [orders1])).get("orders-1"), 9n)
      assert.deepStrictEqual(yield* restarted.results.read("g", orders1), ["c"])
      assert.strictEqual(yield* fs.readFileString(damaged), garbage)
      assert.strictEqual(yield* fs.readFileString(`${partitionDirectory}/${segment(2)}`), intact)
      assert.deepStrictEqual(yield* segmentNames(partitionDirectory), [segment(1), segment(2), segment(3)])

      // Following the message: moving the damaged newest segment away rolls the partition back, results included.
      yield* fs.rename(damaged, `${directory}/damaged.json`)
      assert.strictEqual((yield* restarted.store.load("g", [orders0])).get("orders-0"), 2n)
      assert.deepStrictEqual(yield* restarted.results.read("g", orders0), ["a"])
      yield* commitValues(restarted.store, orders0, epoch, 4n, ["b"])
      assert.deepStrictEqual(yield* restarted.results.read("g", orders0), ["a", "b"])
    }).pipe(Effect.provide(NodeContext.layer)))

  it.scoped("reports a segment stored where it does not belong", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const directory = yield* tempDirectory
      const { store } = yield* open(directory)
      yield* commitValues(store, orders0, yield* epochOf(store, orders0), 2n, ["a"])
      yield* commitValues(store, orders1, yield* epochOf(store, orders1), 3n, ["b"])
      const misplaced = `${directory}/g/orders/0/${segment(3)}`
      yield* fs.copyFile(`${directory}/g/orders/1/${segment(2)}`, misplaced)
      const error = yield* Effect.flatMap(open(directory), ({ store }) => store.load("g", [orders0])).pipe(Effect.flip)
      assert.instanceOf(error, OffsetStore.OffsetStoreError)
      assert.include(error.message, misplaced)
      assert.include(error.message, "not where it is stored")
    }).pipe(Effect.provide(NodeContext.layer)))

  it.scoped("reads and continues a directory written by the previous version (format 1)", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const directory = yield* tempDirectory
      const partitionDirectory = `${directory}/g/orders/0`
      yield* fs.makeDirectory(partitionDirectory, { recursive: true })
      yield* fs.writeFileString(`${partitionDirectory}/${segment(1)}`, formatOneSegment(1, null, 3n, ["a", "b", "c"]))
      yield* fs.writeFileString(`${partitionDirectory}/${segment(2)}`, formatOneSegment(2, 3n, 5n, [{ d: 1 }]))

      const { results, store } = yield* open(directory)
      assert.strictEqual((yield* store.load("g", [orders0])).get("orders-0"), 5n)
      assert.deepStrictEqual(yield* results.read("g", orders0), ["a", "b", "c", { d: 1 }])
      // Nobody claimed the partition under format 1: a unit of any epoch is fenced, and says so.
      const unclaimed = yield* refusal("a unit before any claim", commitValues(store, orders0, 1n, 6n, ["x"]))
      assert.deepInclude(unclaimed, { epoch: 1n, currentEpoch: null })

      assert.deepStrictEqual(yield* claimOf(store, orders0), { epoch: 1n, position: 5n })
      yield* commitValues(store, orders0, 1n, 6n, ["e"])
      assert.deepStrictEqual(yield* segmentNames(partitionDirectory), [segment(1), segment(2), segment(3), segment(4)])
      assert.deepStrictEqual(yield* results.read("g", orders0), ["a", "b", "c", { d: 1 }, "e"])

      // A compaction archives the old segments with the new ones.
      yield* commitRun(store, 1n, 6, compactEvery)
      const restarted = yield* open(directory)
      assert.deepStrictEqual(yield* claimOf(restarted.store, orders0), {
        epoch: 2n,
        position: BigInt(6 + compactEvery)
      })
      assert.deepStrictEqual(
        yield* restarted.results.read("g", orders0),
        ["a", "b", "c", { d: 1 }, "e", ...values(6, compactEvery)]
      )
      assert.isAtMost((yield* segmentNames(partitionDirectory)).length, 10)
    }).pipe(Effect.provide(NodeContext.layer)))

  it.scoped("compacts a partition: its files stay few, and every result is read once, in order", () =>
    Effect.gen(function*() {
      const directory = yield* tempDirectory
      const partitionDirectory = `${directory}/g/orders/0`
      const { results, store } = yield* open(directory)
      const epoch = yield* epochOf(store, orders0)
      const units = 3 * compactEvery + 10
      for (let batch = 0; batch < units; batch += 100) {
        yield* commitRun(store, epoch, batch, Math.min(100, units - batch))
        assert.isAtMost((yield* segmentNames(partitionDirectory)).length, compactEvery + 2)
      }
      const archives = yield* Effect.flatMap(
        FileSystem.FileSystem,
        (fs) => fs.readDirectory(`${partitionDirectory}/archive`)
      )
      assert.strictEqual(archives.length, 3)
      assert.deepStrictEqual(yield* results.read("g", orders0), values(0, units))

      const restarted = yield* open(directory)
      assert.strictEqual((yield* restarted.store.load("g", [orders0])).get("orders-0"), BigInt(units))
      assert.deepStrictEqual(yield* restarted.results.read("g"), values(0, units))
      assert.deepStrictEqual(yield* claimOf(restarted.store, orders0), { epoch: epoch + 1n, position: BigInt(units) })
      yield* commitValues(restarted.store, orders0, epoch + 1n, BigInt(units + 1), ["last"])
      assert.deepStrictEqual(yield* restarted.results.read("g", orders0), [...values(0, units), "last"])
    }).pipe(Effect.provide(NodeContext.layer)))

  it.scoped("fences a zombie whose newest segment was compacted away, though the name after it is free again", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const directory = yield* tempDirectory
      const partitionDirectory = `${directory}/g/orders/0`
      const zombie = yield* open(directory)
      const zombieEpoch = yield* epochOf(zombie.store, orders0)
      yield* commitValues(zombie.store, orders0, zombieEpoch, 1n, ["z-1"])
      // The zombie takes segment 2 for the newest. Another member claims (3) and commits past a compaction, which
      // deletes segments 1 to 3 and more: the name 3 is free again.
      const owner = yield* open(directory)
      const ownerEpoch = yield* epochOf(owner.store, orders0)
      yield* commitRun(owner.store, ownerEpoch, 1, compactEvery + 5)
      assert.isFalse(yield* fs.exists(`${partitionDirectory}/${segment(3)}`))

      const fenced = yield* refusal(
        "the zombie's unit",
        commitValues(zombie.store, orders0, zombieEpoch, 2n, ["zombie"])
      )
      assert.instanceOf(fenced, OffsetStore.Fenced)
      assert.deepInclude(fenced, { epoch: zombieEpoch, currentEpoch: ownerEpoch })
      // The zombie took its segment back.
      assert.isFalse(yield* fs.exists(`${partitionDirectory}/${segment(3)}`))
      assert.strictEqual((yield* owner.store.load("g", [orders0])).get("orders-0"), BigInt(compactEvery + 6))
      assert.deepStrictEqual(yield* owner.results.read("g", orders0), ["z-1", ...values(1, compactEvery + 5)])
    }).pipe(Effect.provide(NodeContext.layer)))

  it.scoped("fences a zombie whose newest segment was compacted away and written again by another zombie", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const directory = yield* tempDirectory
      const partitionDirectory = `${directory}/g/orders/0`
      const zombie = yield* open(directory)
      const zombieEpoch = yield* epochOf(zombie.store, orders0)
      yield* commitValues(zombie.store, orders0, zombieEpoch, 1n, ["z-1"])
      const owner = yield* open(directory)
      const ownerEpoch = yield* epochOf(owner.store, orders0)
      yield* commitRun(owner.store, ownerEpoch, 1, compactEvery + 5)
      // Another zombie, which took segment 1 for the newest, has just linked a segment 2 of its own: the name the
      // first zombie checks after its link is there, but it is not the segment it knows.
      yield* fs.writeFileString(`${partitionDirectory}/${segment(2)}`, foreignSegment(2, zombieEpoch, 2n, ["other"]))

      const fenced = yield* refusal(
        "the zombie's unit",
        commitValues(zombie.store, orders0, zombieEpoch, 2n, ["zombie"])
      )
      assert.instanceOf(fenced, OffsetStore.Fenced)
      assert.deepInclude(fenced, { epoch: zombieEpoch, currentEpoch: ownerEpoch })
      assert.isFalse(yield* fs.exists(`${partitionDirectory}/${segment(3)}`))
      // What a zombie leaves below the checkpoint is never read, and the next compaction deletes it.
      const reader = yield* open(directory)
      assert.strictEqual((yield* reader.store.load("g", [orders0])).get("orders-0"), BigInt(compactEvery + 6))
      assert.deepStrictEqual(yield* reader.results.read("g", orders0), ["z-1", ...values(1, compactEvery + 5)])
      yield* commitRun(owner.store, ownerEpoch, compactEvery + 6, compactEvery)
      assert.isFalse(yield* fs.exists(`${partitionDirectory}/${segment(2)}`))
      assert.deepStrictEqual(yield* reader.results.read("g", orders0), ["z-1", ...values(1, 2 * compactEvery + 5)])
    }).pipe(Effect.provide(NodeContext.layer)))

  it.scoped("claims on top of the newest segment, though a zombie's segment lies just past where it last looked", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const directory = yield* tempDirectory
      const partitionDirectory = `${directory}/g/orders/0`
      // This store last saw segment 2 (its claim and one unit); another member then claims and compacts segment 2
      // away; a zombie of the first epoch has just linked a segment 3 of its own, below the checkpoint.
      const stale = yield* open(directory)
      const staleEpoch = yield* epochOf(stale.store, orders0)
      yield* commitValues(stale.store, orders0, staleEpoch, 1n, ["a"])
      const owner = yield* open(directory)
      const ownerEpoch = yield* epochOf(owner.store, orders0)
      yield* commitRun(owner.store, ownerEpoch, 1, compactEvery + 5)
      yield* fs.writeFileString(`${partitionDirectory}/${segment(3)}`, foreignSegment(3, staleEpoch, 2n, ["ghost"]))

      const claimed = yield* claimOf(stale.store, orders0)
      assert.deepStrictEqual(claimed, { epoch: ownerEpoch + 1n, position: BigInt(compactEvery + 6) })
      yield* commitValues(stale.store, orders0, ownerEpoch + 1n, BigInt(compactEvery + 7), ["after the claim"])
      const reader = yield* open(directory)
      assert.strictEqual((yield* reader.store.load("g", [orders0])).get("orders-0"), BigInt(compactEvery + 7))
      assert.deepStrictEqual(
        yield* reader.results.read("g", orders0),
        ["a", ...values(1, compactEvery + 5), "after the claim"]
      )
      const fenced = yield* refusal(
        "the old owner's unit",
        commitValues(owner.store, orders0, ownerEpoch, 1000n, ["x"])
      )
      assert.deepInclude(fenced, { epoch: ownerEpoch, currentEpoch: ownerEpoch + 1n })
    }).pipe(Effect.provide(NodeContext.layer)))

  it.scoped("never reads an archive whose compaction did not link its checkpoint", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const directory = yield* tempDirectory
      const partitionDirectory = `${directory}/g/orders/0`
      const { results, store } = yield* open(directory)
      const epoch = yield* epochOf(store, orders0)
      yield* commitRun(store, epoch, 0, 100)
      // A compaction that crashed after writing its archive (of segments 1 to 101), before linking its checkpoint;
      // and one of a range no checkpoint will ever name.
      const orphan = (name: string, first: number, last: number, previous: unknown) =>
        fs.writeFileString(
          `${partitionDirectory}/archive/${name}`,
          JSON.stringify({
            format: "effect-kafka-delivery/offset-archive/1",
            groupId: "g",
            topic: "orders",
            partition: 0,
            first,
            last,
            previous,
            results: ["orphan"]
          })
        )
      yield* fs.makeDirectory(`${partitionDirectory}/archive`)
      const pad = (n: number) => String(n).padStart(20, "0")
      yield* orphan(`${pad(1)}-${pad(101)}.json`, 1, 101, null)
      yield* orphan(`${pad(50)}-${pad(60)}.json`, 50, 60, { first: 1, last: 49 })

      yield* commitRun(store, epoch, 100, 2 * compactEvery)
      assert.deepStrictEqual(yield* results.read("g", orders0), values(0, 100 + 2 * compactEvery))
      // The orphan of the range the compaction archived is gone.
      assert.isFalse(yield* fs.exists(`${partitionDirectory}/archive/${pad(1)}-${pad(101)}.json`))
    }).pipe(Effect.provide(NodeContext.layer)))

  it.scoped("ignores segments a crashed compaction left below its checkpoint", () =>
    Effect.gen(function*() {
      const fs = yield* FileSystem.FileSystem
      const directory = yield* tempDirectory
      const partitionDirectory = `${directory}/g/orders/0`
      const { store } = yield* open(directory)
      const epoch = yield* epochOf(store, orders0)
      yield* commitRun(store, epoch, 0, compactEvery + 1)
      yield* fs.writeFileString(`${partitionDirectory}/${segment(7)}`, foreignSegment(7, epoch, 999n, ["left over"]))

      const reader = yield* open(directory)
      assert.strictEqual((yield* reader.store.load("g", [orders0])).get("orders-0"), BigInt(compactEvery + 1))
      assert.deepStrictEqual(yield* reader.results.read("g", orders0), values(0, compactEvery + 1))
      yield* commitRun(store, epoch, compactEvery + 1, compactEvery)
      assert.isFalse(yield* fs.exists(`${partitionDirectory}/${segment(7)}`))
      assert.deepStrictEqual(yield* reader.results.read("g", orders0), values(0, 2 * compactEvery + 1))
    }).pipe(Effect.provide(NodeContext.layer)))

  const counts = new Map<string, number>()
  // 40,000 units: some 150 compactions, and well under a minute on a slow machine (a test that keeps the worker busy
  // for a minute outlasts vitest's own 60 s timeout on its messages to the runner, which then fails the run).
  it.live(
    "keeps a partition's files, and what a fresh load or claim reads, bounded over 40,000 units",
    () =>
      Effect.gen(function*() {
        const units = 40_000
        const fs = yield* FileSystem.FileSystem
        const directory = yield* tempDirectory
        const partitionDirectory = `${directory}/g/orders/0`
        const { store } = yield* open(directory)
        const epoch = yield* epochOf(store, orders0)

        /** A fresh store's load: how many file system calls it makes, and how long it takes. */
        const freshLoad = Effect.scoped(Effect.gen(function*() {
          const reader = yield* open(directory)
          counts.clear()
          const started = performance.now()
          const positions = yield* reader.store.load("g", [orders0])
          return { position: positions.get("orders-0"), calls: total(counts), ms: performance.now() - started }
        }))

        let mostEntries = 0
        let atThousand = { position: undefined as bigint | undefined, calls: 0, ms: 0 }
        const started = performance.now()
        for (let offset = 0; offset < units; offset++) {
          yield* commitValues(store, orders0, epoch, BigInt(offset + 1), [`value-${offset}`])
          // Every 97 units, to see the directory at every point between two compactions.
          if ((offset + 1) % 97 === 0) {
            mostEntries = Math.max(mostEntries, (yield* fs.readDirectory(partitionDirectory)).length)
          }
          if (offset + 1 === 1000) atThousand = yield* freshLoad
          // Synchronous file calls: let the event loop turn now and then, so the test worker answers its runner.
          if ((offset + 1) % 1000 === 0) {
            yield* Effect.promise(() => new Promise<void>((resolve) => setImmediate(resolve)))
          }
        }
        const committing = performance.now() - started
        const atEnd = yield* freshLoad

        // Directory entries: the segments since the last checkpoint, the checkpoint, the archive directory.
        assert.isAtMost(mostEntries, compactEvery + 3)
        assert.strictEqual(atThousand.position, 1000n)
        assert.strictEqual(atEnd.position, BigInt(units))
        assert.strictEqual(atEnd.calls, atThousand.calls, "a fresh load makes the same calls at 40,000 units as 1,000")
        assert.isAtMost(atEnd.calls, 2)

        const claimer = yield* open(directory)
        counts.clear()
        assert.deepStrictEqual(yield* claimOf(claimer.store, orders0), { epoch: epoch + 1n, position: BigInt(units) })
        const claimCalls = total(counts)
        assert.isAtMost(claimCalls, 12)

        const sizes = (names: ReadonlyArray<string>, under: string) =>
          Effect.forEach(names, (name) => Effect.map(fs.stat(`${under}/${name}`), (info) => Number(info.size)))
        const segments = yield* segmentNames(partitionDirectory)
        const segmentBytes = (yield* sizes(segments, partitionDirectory)).reduce((a, b) => a + b, 0)
        const archives = yield* fs.readDirectory(`${partitionDirectory}/archive`)
        const archiveBytes = (yield* sizes(archives, `${partitionDirectory}/archive`)).reduce((a, b) => a + b, 0)
        const results = yield* claimer.results.read("g", orders0)
        assert.strictEqual(results.length, units)
        assert.deepStrictEqual([results[0], results[units - 1]], ["value-0", `value-${units - 1}`])
        yield* Effect.logInfo(
          `${units} units in ${(committing / 1000).toFixed(1)} s (${(committing / units).toFixed(3)} ms a unit); ` +
            `at most ${mostEntries} entries in the partition directory; now ${segments.length} segments ` +
            `(${segmentBytes} bytes) and ${archives.length} archives (${archiveBytes} bytes of results); fresh load: ` +
            `${atThousand.calls} calls, ${atThousand.ms.toFixed(2)} ms at 1,000 units, ${atEnd.calls} calls, ` +
            `${atEnd.ms.toFixed(2)} ms at ${units}; fresh claim at ${units}: ${claimCalls} calls`
        )
      }).pipe(Effect.scoped, Effect.provide(countingFileSystem(counts))),
    240_000
  )

  it.scoped("refuses an empty directory name before touching the file system", () =>
    Effect.gen(function*() {
      for (const directory of ["", "   "]) {
        const error = yield* open(directory).pipe(Effect.flip)
        assert.instanceOf(error, InvalidConfig)
        assert.strictEqual(error._tag === "InvalidConfig" ? error.field : undefined, "directory")
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
