/**
 * The offset store in a directory. How a partition's files are laid out, fenced, compacted and kept whole through a
 * crash is told at the top of `file/chain.ts`.
 */
import type * as FileSystem from "@effect/platform/FileSystem"
import * as Effect from "effect/Effect"
import type { Fenced, InvalidConfig, OffsetStoreError } from "../../KafkaError.js"
import type { Claim, CommitUnit, Transaction } from "../../OffsetStore.js"
import * as TopicPartition from "../../TopicPartition.js"
import { scanHead } from "./file/chain.js"
import { open, validate } from "./file/directory.js"
import { compactEvery, STORE } from "./file/format.js"
import { partitionsOf, readPartition } from "./file/results.js"
import { claimPartition, storeUnit } from "./file/writes.js"
import type { StoreParts, UnitRunner } from "./unitBuffer.js"

export { compactEvery } from "./file/format.js"

/**
 * `compactEvery` is for tests, which go through many compactions in a few units.
 *
 * @internal
 */
export const make = (
  directory: string,
  runUnit: UnitRunner,
  options?: { readonly compactEvery?: number }
): Effect.Effect<StoreParts, InvalidConfig | OffsetStoreError, FileSystem.FileSystem> =>
  Effect.map(open(directory, options?.compactEvery ?? compactEvery), (files) => {
    const commit = <A, E, R>(
      unit: CommitUnit,
      work: Effect.Effect<A, E, R>
    ): Effect.Effect<A, E | OffsetStoreError | Fenced, Exclude<R, Transaction>> =>
      validate("commit", unit.groupId, unit.partition).pipe(
        Effect.zipRight(runUnit(STORE, work)),
        Effect.flatMap(([value, entries]) => Effect.as(storeUnit(files, unit, entries), value))
      )

    const claim = (
      groupId: string,
      partitions: ReadonlyArray<TopicPartition.TopicPartition>
    ): Effect.Effect<ReadonlyMap<string, Claim>, OffsetStoreError> =>
      Effect.forEach(
        partitions,
        (tp) =>
          validate("claim", groupId, tp).pipe(
            Effect.zipRight(claimPartition(files, groupId, tp)),
            Effect.map((claimed) => [TopicPartition.key(tp), claimed] as const)
          ),
        { concurrency: 8 }
      ).pipe(Effect.map((entries) => new Map(entries)))

    const load = (
      groupId: string,
      partitions: ReadonlyArray<TopicPartition.TopicPartition>
    ): Effect.Effect<ReadonlyMap<string, bigint>, OffsetStoreError> =>
      Effect.forEach(
        partitions,
        (tp) =>
          validate("load", groupId, tp).pipe(
            Effect.zipRight(scanHead(files, "load", groupId, tp)),
            Effect.map((head) => [TopicPartition.key(tp), head.next] as const)
          ),
        { concurrency: 8 }
      ).pipe(
        Effect.map((entries) => {
          const positions = new Map<string, bigint>()
          for (const [key, next] of entries) {
            if (next !== null) positions.set(key, next)
          }
          return positions
        })
      )

    const read = (
      groupId: string,
      partition?: TopicPartition.TopicPartition
    ): Effect.Effect<ReadonlyArray<unknown>, OffsetStoreError> =>
      validate("read", groupId, partition).pipe(
        Effect.zipRight(partition === undefined ? partitionsOf(files, groupId) : Effect.succeed([partition])),
        Effect.flatMap((partitions) => Effect.forEach(partitions, (tp) => readPartition(files, groupId, tp))),
        Effect.map((results) => results.flat())
      )

    return { store: { name: STORE, load, claim, commit }, results: { read } }
  })
