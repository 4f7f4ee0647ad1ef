import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import type { CommitUnit } from "../OffsetStore.js"
import { type Fenced, OffsetStore, Results, type Transaction } from "../OffsetStore.js"
import * as TopicPartition from "../TopicPartition.js"
import { fencedUnit, runUnit } from "./unitBuffer.js"

const STORE = "memory"

interface PartitionState {
  readonly partition: TopicPartition.TopicPartition
  readonly position: bigint
  readonly results: ReadonlyArray<string>
}

/** @internal */
export const make: Effect.Effect<Context.Context<OffsetStore | Results>> = Effect.sync(() => {
  const groups = new Map<string, Map<string, PartitionState>>()
  const partitionsOf = (groupId: string): Map<string, PartitionState> => {
    let partitions = groups.get(groupId)
    if (partitions === undefined) {
      partitions = new Map()
      groups.set(groupId, partitions)
    }
    return partitions
  }

  const load = (groupId: string, partitions: ReadonlyArray<TopicPartition.TopicPartition>) =>
    Effect.sync(() => {
      const stored = groups.get(groupId)
      const positions = new Map<string, bigint>()
      for (const partition of partitions) {
        const key = TopicPartition.key(partition)
        const state = stored?.get(key)
        if (state !== undefined) positions.set(key, state.position)
      }
      return positions
    })

  // The check and the write run in one synchronous step, so that of two units started from the same position only
  // the first to finish its work can commit; the work itself runs outside any lock.
  const commit = <A, E, R>(
    unit: CommitUnit,
    work: Effect.Effect<A, E, R>
  ): Effect.Effect<A, E | Fenced, Exclude<R, Transaction>> =>
    Effect.flatMap(runUnit(STORE, work), ([value, entries]) =>
      Effect.suspend(() => {
        const partitions = partitionsOf(unit.groupId)
        const key = TopicPartition.key(unit.partition)
        const state = partitions.get(key)
        const actual = state?.position ?? null
        if (actual !== unit.expected) {
          return Effect.fail(fencedUnit(unit, actual))
        }
        partitions.set(key, {
          partition: unit.partition,
          position: unit.next,
          results: state === undefined ? entries : [...state.results, ...entries]
        })
        return Effect.succeed(value)
      })
    )

  const read = (groupId: string, partition?: TopicPartition.TopicPartition) =>
    Effect.sync((): ReadonlyArray<unknown> => {
      const stored = groups.get(groupId)
      if (stored === undefined) return []
      const states = partition === undefined
        ? [...stored.values()].sort((a, b) => TopicPartition.compare(a.partition, b.partition))
        : [stored.get(TopicPartition.key(partition))].filter((state) => state !== undefined)
      return states.flatMap((state) => state.results.map((text): unknown => JSON.parse(text)))
    })

  return Context.make(OffsetStore, { name: STORE, load, commit }).pipe(Context.add(Results, { read }))
})
