import * as PlatformError from "@effect/platform/Error"
import * as FileSystem from "@effect/platform/FileSystem"
import { assert, describe, it } from "@effect/vitest"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Logger from "effect/Logger"
import * as LogLevel from "effect/LogLevel"
import * as fileStore from "../src/internal/store/file.js"
import { unitRunner } from "../src/internal/store/unitBuffer.js"
import { advance, type Range } from "../src/internal/consumer/progress.js"
import * as OffsetStore from "../src/OffsetStore.js"
import * as TopicPartition from "../src/TopicPartition.js"
import { type Crash, CrashDisk, type Entries, type Tear, tearsOf } from "./support/crashFileSystem.js"

const text = (bytes: Uint8Array) => new TextDecoder().decode(bytes)

/** Writes `content` to `path` through a handle, syncing it or not. */
const write = (path: string, content: string, sync: boolean) =>
  Effect.scoped(Effect.gen(function*() {
    const fs = yield* FileSystem.FileSystem
    const file = yield* fs.open(path, { flag: "w" })
    yield* file.writeAll(new TextEncoder().encode(content))
    if (sync) yield* file.sync
  }))

const syncDirectory = (path: string) =>
  Effect.scoped(Effect.flatMap(FileSystem.FileSystem, (fs) => Effect.flatMap(fs.open(path), (file) => file.sync)))

const readOrMissing = (path: string) =>
  Effect.flatMap(FileSystem.FileSystem, (fs) =>
    fs.readFileString(path).pipe(
      Effect.catchIf((error) => error._tag === "SystemError" && error.reason === "NotFound", () => Effect.succeed(null))
    ))

const kept = (tear: Tear): Crash => ({ entries: "kept", tear: () => tear })

describe("CrashDisk", () => {
  it.effect("keeps what was synced, and leaves what was not as it was or cut short", () =>
    Effect.gen(function*() {
      const disk = CrashDisk.empty()
      const onDisk = Effect.provideService(FileSystem.FileSystem, disk.fileSystem)
      yield* onDisk(write("/synced", "synced content", true))
      yield* onDisk(write("/unsynced", "new content", false))
      // Synced once, then written again without a sync.
      yield* onDisk(write("/rewritten", "first", true))
      yield* onDisk(write("/rewritten", "second version", false))
      assert.deepStrictEqual(
        disk.unsynced("kept").map((file) => [file.paths, text(file.old), text(file.written)]),
        [[["/unsynced"], "", "new content"], [["/rewritten"], "first", "second version"]]
      )
      assert.deepStrictEqual(
        tearsOf(disk.unsynced("kept")[0]).map((tear) => tear._tag === "Old" ? "old" : tear.length),
        ["old", 0, 1, 5, 10]
      )

      const reads = (rebooted: CrashDisk) =>
        Effect.all([readOrMissing("/synced"), readOrMissing("/unsynced"), readOrMissing("/rewritten")]).pipe(
          Effect.provideService(FileSystem.FileSystem, rebooted.fileSystem)
        )
      const cut = kept({ _tag: "Cut", length: 3 })
      assert.deepStrictEqual(yield* reads(disk.reboot(kept({ _tag: "Old" }))), ["synced content", "", "first"])
      assert.deepStrictEqual(yield* reads(disk.reboot(cut)), ["synced content", "new", "sec"])
      // A rebooted disk holds all of it for sure: a second crash keeps it.
      const rebooted = disk.reboot(cut)
      assert.deepStrictEqual(rebooted.unsynced("kept"), [])
      assert.deepStrictEqual(yield* reads(rebooted.reboot(kept({ _tag: "Old" }))), ["synced content", "new", "sec"])
    }))

  it.effect("fails every operation after the one it crashes after, reads included", () =>
    Effect.gen(function*() {
      const disk = CrashDisk.empty()
      const fs = disk.fileSystem
      disk.crashAfter(2)
      yield* fs.makeDirectory("/a")
      assert.isFalse(disk.crashed)
      yield* fs.makeDirectory("/b")
      assert.isTrue(disk.crashed)
      assert.strictEqual(disk.operations, 2)
      for (const after of [fs.makeDirectory("/c"), fs.readDirectory("/"), fs.exists("/a")]) {
        const error = yield* Effect.flip(after)
        assert.instanceOf(error, PlatformError.SystemError)
        assert.include(error.message, "crashed")
      }
      // What completed before the crash is there after it; nothing after it is.
      const rebooted = disk.reboot(kept({ _tag: "Old" }))
      assert.deepStrictEqual((yield* rebooted.fileSystem.readDirectory("/")).sort(), ["a", "b"])
    }))

  it.effect("keeps links and renames, or, of directories, only what a directory sync made sure of", () =>
    Effect.gen(function*() {
      const disk = CrashDisk.empty()
      const fs = disk.fileSystem
      const onDisk = Effect.provideService(FileSystem.FileSystem, fs)
      yield* fs.makeDirectory("/d")
      yield* onDisk(syncDirectory("/"))
      yield* onDisk(write("/d/.tmp", "segment", true))
      yield* fs.link("/d/.tmp", "/d/linked")
      yield* fs.remove("/d/.tmp")
      yield* onDisk(write("/d/other", "other", true))
      yield* fs.rename("/d/other", "/d/renamed")

      const names = (entries: Entries) =>
        Effect.map(
          disk.reboot({ entries, tear: () => ({ _tag: "Old" }) }).fileSystem.readDirectory("/d"),
          (found) => found.sort()
        )
      assert.deepStrictEqual(yield* names("kept"), ["linked", "renamed"])
      // Nothing synced /d since it was made: none of its entries is sure.
      assert.deepStrictEqual(yield* names("synced"), [])
      yield* onDisk(syncDirectory("/d"))
      assert.deepStrictEqual(yield* names("synced"), ["linked", "renamed"])
      yield* fs.remove("/d/linked")
      assert.deepStrictEqual(yield* names("kept"), ["renamed"])
      assert.deepStrictEqual(yield* names("synced"), ["linked", "renamed"], "a removal not synced may be undone")

      // A directory whose own entry was never synced is lost with everything in it, synced or not.
      yield* fs.makeDirectory("/e/f", { recursive: true })
      yield* onDisk(syncDirectory("/e/f"))
      yield* onDisk(syncDirectory("/e"))
      const rebooted = disk.reboot({ entries: "synced", tear: () => ({ _tag: "Old" }) })
      assert.isFalse(yield* rebooted.fileSystem.exists("/e"))
    }))
})

// --- The property: a scripted run of claims and units, crashed after every operation, recovers a prefix of it. ---

const GROUP = "g"
const ROOT = "/store"
/** Small, so that the script goes through several compactions. */
const COMPACT_EVERY = 3

const orders0 = TopicPartition.make("orders", 0)
const orders1 = TopicPartition.make("orders", 1)
const partitions = [orders0, orders1]

type Step =
  | { readonly _tag: "Claim"; readonly partition: TopicPartition.TopicPartition }
  | {
    readonly _tag: "Unit"
    readonly partition: TopicPartition.TopicPartition
    /** A zombie's unit: of the owner before the newest claim. */
    readonly zombie: boolean
    readonly next: bigint
    readonly finished: ReadonlyArray<Range>
    readonly results: ReadonlyArray<string>
  }

const claimStep = (partition: TopicPartition.TopicPartition): Step => ({ _tag: "Claim", partition })
const unitStep = (
  partition: TopicPartition.TopicPartition,
  next: bigint,
  results: ReadonlyArray<string>,
  options: { readonly finished?: ReadonlyArray<Range>; readonly zombie?: boolean } = {}
): Step => ({
  _tag: "Unit",
  partition,
  zombie: options.zombie ?? false,
  next,
  finished: options.finished ?? [],
  results
})

const script: ReadonlyArray<Step> = [
  claimStep(orders0),
  unitStep(orders0, 2n, ["o0-0", "o0-1"]),
  unitStep(orders0, 3n, []),
  claimStep(orders1),
  unitStep(orders1, 10n, ["o1-9"]),
  // Records 5 and 6 finished before 3 and 4: the position stays at 3, the range is kept above it.
  unitStep(orders0, 3n, ["o0-5", "o0-6"], { finished: [[5n, 7n]] }),
  unitStep(orders0, 5n, ["o0-3", "o0-4"]),
  claimStep(orders0),
  unitStep(orders0, 9n, ["zombie"], { zombie: true }),
  unitStep(orders0, 8n, ["o0-7"]),
  unitStep(orders1, 12n, ["o1-10", "o1-11"]),
  unitStep(orders0, 9n, ["o0-8"], { finished: [[10n, 11n]] }),
  unitStep(orders0, 10n, ["o0-9"]),
  claimStep(orders1),
  unitStep(orders1, 13n, ["o1-12"]),
  unitStep(orders0, 12n, ["o0-11"]),
  unitStep(orders0, 13n, ["o0-12", "o0-13"], { finished: [[13n, 14n]] }),
  unitStep(orders0, 15n, ["o0-14"]),
  claimStep(orders0)
]

interface PartitionState {
  readonly epoch: bigint
  readonly position: bigint | null
  readonly finished: ReadonlyArray<Range>
  readonly results: ReadonlyArray<string>
}

type State = ReadonlyMap<string, PartitionState>

/** What the store must hold after each prefix of the script, and what each step must do when nothing crashes. */
const plan = (() => {
  let state: State = new Map(
    partitions.map((tp) => [TopicPartition.key(tp), { epoch: 0n, position: null, finished: [], results: [] }])
  )
  const states: Array<State> = [state]
  const steps = script.map((step) => {
    const key = TopicPartition.key(step.partition)
    const before = state.get(key)!
    const next = new Map(state)
    let epoch: bigint
    let expected: "landed" | "fenced"
    if (step._tag === "Claim") {
      epoch = before.epoch + 1n
      expected = "landed"
      next.set(key, { ...before, epoch })
    } else {
      epoch = step.zombie ? before.epoch - 1n : before.epoch
      expected = epoch === before.epoch && epoch > 0n ? "landed" : "fenced"
      if (expected === "landed") {
        const stored = advance(before, step)
        next.set(key, { ...before, ...stored, results: [...before.results, ...step.results] })
      }
    }
    state = next
    states.push(state)
    return { step, epoch, expected }
  })
  return { steps, states }
})()

const show = (state: State) =>
  JSON.stringify(
    [...state].sort(([a], [b]) => a.localeCompare(b)),
    (_, value) => typeof value === "bigint" ? `${value}n` : value
  )

const quiet = Logger.withMinimumLogLevel(LogLevel.None)

const openStore = (disk: CrashDisk) =>
  fileStore.make(ROOT, unitRunner(OffsetStore.Transaction), { compactEvery: COMPACT_EVERY }).pipe(
    Effect.provideService(FileSystem.FileSystem, disk.fileSystem)
  )

interface Run {
  /** Steps that returned (landed or fenced, as planned) before the crash. */
  readonly returned: number
  /** Whether a step was under way when the crash came (its outcome unknown). */
  readonly interrupted: boolean
  /** The epoch each partition's claims returned. */
  readonly claimed: ReadonlyMap<string, bigint>
}

/** Runs the script on `disk` until it ends or the crash stops it; anything but a crash stopping it fails the test. */
const runScript = (disk: CrashDisk, label: string) =>
  Effect.gen(function*() {
    const claimed = new Map<string, bigint>()
    const opened = yield* Effect.either(openStore(disk))
    if (Either.isLeft(opened)) {
      assert.isTrue(disk.crashed, `${label}: the store did not open, though nothing crashed: ${opened.left.message}`)
      assert.instanceOf(opened.left, OffsetStore.OffsetStoreError, label)
      return { returned: 0, interrupted: false, claimed }
    }
    const { store } = opened.right
    for (const [index, { epoch, expected, step }] of plan.steps.entries()) {
      const key = TopicPartition.key(step.partition)
      const attempt: Effect.Effect<bigint | undefined, OffsetStore.OffsetStoreError | OffsetStore.Fenced> =
        step._tag === "Claim"
          ? Effect.map(store.claim(GROUP, [step.partition]), (claims) => claims.get(key)?.epoch)
          : Effect.as(
            store.commit(
              { groupId: GROUP, partition: step.partition, epoch, next: step.next, finished: step.finished },
              OffsetStore.append(step.results)
            ),
            undefined
          )
      const outcome = yield* Effect.either(attempt)
      const where = `${label}, step ${index} (${step._tag} of ${key})`
      if (Either.isRight(outcome)) {
        assert.strictEqual(expected, "landed", `${where}: a unit the store had to fence landed`)
        if (step._tag === "Claim") {
          assert.strictEqual(outcome.right, epoch, `${where}: the claim's epoch`)
          claimed.set(key, epoch)
        }
        continue
      }
      const error = outcome.left
      if (error instanceof OffsetStore.Fenced && !disk.crashed) {
        assert.strictEqual(expected, "fenced", `${where}: the store fenced the owner's unit`)
        continue
      }
      assert.isTrue(disk.crashed, `${where} failed, and the disk did not crash: ${error.message}`)
      assert.instanceOf(error, OffsetStore.OffsetStoreError, `${where}: what a crash makes of a step`)
      return { returned: index, interrupted: true, claimed }
    }
    return { returned: plan.steps.length, interrupted: false, claimed }
  })

/** The state a store on the rebooted disk holds; a claim of each partition reveals its epoch and finished ranges. */
const observe = (label: string, store: OffsetStore.OffsetStore["Type"], results: OffsetStore.Results["Type"]) =>
  Effect.gen(function*() {
    const positions = yield* store.load(GROUP, partitions).pipe(
      Effect.tapError((error) => Effect.sync(() => assert.fail(`${label}: load failed: ${error.message}`)))
    )
    const state = new Map<string, PartitionState>()
    const claims = new Map<string, bigint>()
    for (const tp of partitions) {
      const key = TopicPartition.key(tp)
      const read = yield* results.read(GROUP, tp).pipe(
        Effect.tapError((error) => Effect.sync(() => assert.fail(`${label}: read of ${key} failed: ${error.message}`)))
      )
      const claim = (yield* store.claim(GROUP, [tp]).pipe(
        Effect.tapError((error) => Effect.sync(() => assert.fail(`${label}: claim of ${key} failed: ${error.message}`)))
      )).get(key)!
      const position = positions.get(key) ?? null
      assert.strictEqual(claim.position, position, `${label}: the claim of ${key} returns the position a load reads`)
      claims.set(key, claim.epoch)
      state.set(key, {
        epoch: claim.epoch - 1n,
        position,
        finished: claim.finished ?? [],
        results: read.map((value) => String(value))
      })
    }
    return { state, claims }
  })

/** Reboots the crashed disk as `crash` says, and checks what the file store finds there. */
const recover = (disk: CrashDisk, crash: Crash, run: Run, label: string) =>
  Effect.gen(function*() {
    const rebooted = disk.reboot(crash)
    const opened = yield* Effect.either(openStore(rebooted))
    if (Either.isLeft(opened)) return assert.fail(`${label}: the store does not open: ${opened.left.message}`)
    const { results, store } = opened.right
    const { claims, state } = yield* observe(label, store, results)

    // Never torn, never a mix: the state of one prefix of the script, which holds every step that returned.
    const observed = show(state)
    const prefixes = plan.states.flatMap((expected, length) => show(expected) === observed ? [length] : [])
    const candidates = plan.states.slice(run.returned, run.returned + (run.interrupted ? 2 : 1)).map(show)
    assert.isNotEmpty(
      prefixes,
      `${label}: the store holds what no prefix of the script made:\n  ${observed}\nexpected one of\n  ` +
        candidates.join("\n  ")
    )
    assert.isAtLeast(
      Math.max(...prefixes),
      run.returned,
      `${label}: a step that returned is missing (${run.returned} returned):\n  ${observed}\nexpected one of\n  ` +
        candidates.join("\n  ")
    )
    assert.isAtMost(
      Math.min(...prefixes),
      run.returned + (run.interrupted ? 1 : 0),
      `${label}: a step that never ran is there:\n  ${observed}`
    )

    // Fencing: every claim returns a higher epoch than any claim before the crash, and their units are fenced.
    for (const [key, epoch] of claims) {
      const before = run.claimed.get(key)
      if (before !== undefined) assert.isAbove(Number(epoch), Number(before), `${label}: the epoch of ${key} went down`)
    }
    const owner = claims.get(TopicPartition.key(orders0))!
    const next = (state.get(TopicPartition.key(orders0))!.position ?? 0n) + 1n
    const unitOf = (epoch: bigint, value: string) =>
      Effect.either(store.commit({ groupId: GROUP, partition: orders0, epoch, next }, OffsetStore.append([value])))
    const zombie = yield* unitOf(owner - 1n, "zombie")
    assert.isTrue(
      Either.isLeft(zombie) && zombie.left instanceof OffsetStore.Fenced,
      `${label}: a unit of the owner before the recovery was not fenced: ` +
        (Either.isLeft(zombie) ? zombie.left.message : "it landed")
    )

    // The store goes on from there, and another store opened on the disk reads it.
    const continued = yield* unitOf(owner, "after")
    if (Either.isLeft(continued)) {
      return assert.fail(`${label}: a unit after the recovery failed: ${continued.left.message}`)
    }
    const reader = yield* Effect.orDie(openStore(rebooted))
    assert.deepStrictEqual(
      yield* Effect.orDie(reader.results.read(GROUP, orders0)),
      [...state.get(TopicPartition.key(orders0))!.results, "after"],
      label
    )
  })

/** The crashes worth trying on `disk`: every unsynced file whole, and each one torn every way with the others old. */
const crashesOf = (disk: CrashDisk, entries: Entries): Array<{ readonly label: string; readonly crash: Crash }> => {
  const files = disk.unsynced(entries)
  const whole = {
    label: "unsynced files whole",
    crash: { entries, tear: (): Tear => ({ _tag: "Cut", length: Number.POSITIVE_INFINITY }) }
  }
  return [
    whole,
    ...files.flatMap((file) =>
      tearsOf(file).map((tear) => ({
        label: `${file.paths.join(" = ")} ${tear._tag === "Old" ? "as it was" : `cut at ${tear.length}`}`,
        crash: {
          entries,
          tear: (other: { readonly paths: ReadonlyArray<string> }): Tear =>
            other.paths[0] === file.paths[0] ? tear : { _tag: "Old" }
        }
      }))
    )
  ]
}

const property = (entries: Entries) =>
  Effect.gen(function*() {
    // The run without a crash: it does what the plan says, and counts the operations to crash after.
    const clean = CrashDisk.empty()
    const full = yield* runScript(clean, "without a crash")
    assert.deepStrictEqual([full.returned, full.interrupted], [plan.steps.length, false])
    const total = clean.operations
    // The script went through compactions of orders-0, so crashes land inside them too.
    const archives = yield* clean.fileSystem.readDirectory(`${ROOT}/${GROUP}/orders/0/archive`)
    assert.isAtLeast(archives.length, 3, "compactions of orders-0")
    let recoveries = 0
    for (let crashAt = 0; crashAt <= total; crashAt++) {
      const disk = CrashDisk.empty()
      disk.crashAfter(crashAt)
      const run = yield* runScript(disk, `crash after operation ${crashAt}`)
      for (const { crash, label } of crashesOf(disk, entries)) {
        yield* recover(disk, crash, run, `crash after operation ${crashAt} of ${total} (${entries} entries, ${label})`)
        recoveries++
      }
    }
    return { total, recoveries }
  }).pipe(quiet)

describe("OffsetStore.layerFileSystem after a crash", () => {
  it.effect("recovers a prefix of the commits after a crash at any operation (directory changes kept)", () =>
    Effect.gen(function*() {
      const { recoveries, total } = yield* property("kept")
      assert.isAbove(total, 100)
      // Crashes between a write and its sync tear the file: those points are recovered once per tear.
      assert.isAbove(recoveries, total + 100)
    }))

  it.effect("recovers a prefix of the commits after a crash at any operation (directories keep what was synced)", () =>
    Effect.gen(function*() {
      const { total } = yield* property("synced")
      assert.isAbove(total, 100)
    }))
})
