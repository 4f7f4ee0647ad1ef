/**
 * The file store's directory: opening it, where each group's, topic's and partition's files go, and the one way a
 * file is written (synced, then linked under its name).
 */
import * as FileSystem from "@effect/platform/FileSystem"
import * as Effect from "effect/Effect"
import { InvalidConfig, type OffsetStoreError } from "../../../KafkaError.js"
import type * as TopicPartition from "../../../TopicPartition.js"
import { encodeName, type Head, ioError, isAlreadyExists, isNotFound, join, parentOf, storeError } from "./format.js"

/**
 * An open file store: its file system and directory, and what it keeps between calls (the newest segment it knows
 * of each partition, and a lock per partition).
 *
 * @internal
 */
export interface Files {
  readonly fs: FileSystem.FileSystem
  readonly root: string
  readonly unitsPerCompaction: number
  readonly heads: Map<string, Head>
  readonly locks: Map<string, Effect.Semaphore>
}

/**
 * A name in a directory (a new file's, a new directory's) is durable only once that directory is synced. This is
 * done on a best-effort basis: not every platform lets a directory be opened and synced, and a file's own content
 * is synced before it gets its name.
 *
 * @internal
 */
export const syncDirectory = (fs: FileSystem.FileSystem, directory: string) =>
  Effect.scoped(Effect.flatMap(fs.open(directory, { flag: "r" }), (file) => file.sync)).pipe(Effect.ignore)

/**
 * Opens the store's directory, creating it when it does not exist.
 *
 * @internal
 */
export const open = (
  directory: string,
  unitsPerCompaction: number
): Effect.Effect<Files, InvalidConfig | OffsetStoreError, FileSystem.FileSystem> =>
  Effect.gen(function*() {
    if (directory.trim() === "" || directory.includes("\u0000")) {
      return yield* new InvalidConfig({
        field: "directory",
        reason: "the offset store needs a directory path (non-empty, without NUL characters)"
      })
    }
    const fs = yield* FileSystem.FileSystem
    const root = directory.length > 1 ? directory.replace(/\/+$/, "") || "/" : directory

    // The levels of the root that do not exist yet, the deepest first: each one made is synced into its parent, or a
    // crash could take the whole store with it.
    const missing: Array<string> = []
    let level = root
    while (!(yield* fs.exists(level).pipe(Effect.orElseSucceed(() => true)))) {
      missing.push(level)
      const parent = parentOf(level)
      if (parent === level) break
      level = parent
    }
    yield* fs.makeDirectory(root, { recursive: true }).pipe(
      Effect.mapError((error) => storeError("open", `cannot create the directory ${root}: ${error.message}`, error))
    )
    for (const made of missing) yield* syncDirectory(fs, parentOf(made))
    const info = yield* fs.stat(root).pipe(Effect.mapError(ioError("open", root)))
    if (info.type !== "Directory") {
      return yield* storeError("open", `${root} is a ${info.type}, not a directory; give the store a directory`)
    }
    return { fs, root, unitsPerCompaction, heads: new Map(), locks: new Map() }
  })

/** @internal */
export const lockOf = (files: Files, key: string): Effect.Semaphore => {
  let lock = files.locks.get(key)
  if (lock === undefined) {
    lock = Effect.unsafeMakeSemaphore(1)
    files.locks.set(key, lock)
  }
  return lock
}

/** @internal */
export const groupDirectory = (files: Files, groupId: string) => join(files.root, encodeName(groupId))

/** @internal */
export const topicDirectory = (files: Files, groupId: string, topic: string) =>
  join(groupDirectory(files, groupId), encodeName(topic))

/** @internal */
export const partitionDirectory = (files: Files, groupId: string, tp: TopicPartition.TopicPartition) =>
  join(topicDirectory(files, groupId, tp.topic), String(tp.partition))

/** @internal */
export const cacheKey = (groupId: string, tp: TopicPartition.TopicPartition) =>
  `${encodeName(groupId)}/${encodeName(tp.topic)}/${tp.partition}`

/** @internal */
export const validate = (operation: string, groupId: string, tp?: TopicPartition.TopicPartition) => {
  if (groupId === "") return Effect.fail(storeError(operation, "the group id is empty"))
  if (tp !== undefined) {
    if (tp.topic === "") return Effect.fail(storeError(operation, "the topic name is empty"))
    if (!Number.isSafeInteger(tp.partition) || tp.partition < 0) {
      return Effect.fail(storeError(operation, `${tp.partition} is not a partition number (topic ${tp.topic})`))
    }
  }
  return Effect.void
}

/**
 * Writes `text` under `name` in `directory`, all or nothing; `false` when the name was taken already.
 *
 * @internal
 */
export const createFile = (
  files: Files,
  operation: string,
  directory: string,
  name: string,
  text: string
): Effect.Effect<boolean, OffsetStoreError> => {
  const { fs } = files
  const temporary = join(directory, `.tmp-${crypto.randomUUID()}.json`)
  const path = join(directory, name)
  return Effect.gen(function*() {
    yield* Effect.scoped(Effect.gen(function*() {
      const file = yield* fs.open(temporary, { flag: "wx" })
      yield* file.writeAll(new TextEncoder().encode(text))
      yield* file.sync
    })).pipe(Effect.mapError(ioError(operation, temporary)))
    const created = yield* fs.link(temporary, path).pipe(
      Effect.as(true),
      Effect.catchIf(isAlreadyExists, () => Effect.succeed(false)),
      Effect.mapError((error) =>
        storeError(
          operation,
          `cannot link ${temporary} to ${path}: ${error.message}. The store needs a file system with hard links`,
          error
        )
      )
    )
    if (created) yield* syncDirectory(fs, directory)
    return created
  }).pipe(Effect.ensuring(fs.remove(temporary).pipe(Effect.ignore)))
}

/** @internal */
export const removeIfPresent = (files: Files, operation: string, path: string) =>
  files.fs.remove(path).pipe(
    Effect.catchIf(isNotFound, () => Effect.void),
    Effect.mapError(ioError(operation, path))
  )
