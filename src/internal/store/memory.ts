import * as Effect from "effect/Effect"
import type { Fenced } from "../../KafkaError.js"
import type { Claim, CommitUnit, Transaction } from "../../OffsetStore.js"
import * as TopicPartition from "../../TopicPartition.js"
import { advance, type Range } from "../consumer/progress.js"
import { fencedUnit, type StoreParts, type UnitRunner } from "./unitBuffer.js"

const STORE = "memory"

interface PartitionState {
  readonly partition: TopicPartition.TopicPartition
  position: bigint | null
  epoch: bigint
  finished: ReadonlyArray<Range>
  /**
   * The results of the committed units, in commit order. Appended to in place, never copied, so that a unit costs
   * what it adds whatever the partition holds; reads copy it out.
   */
  readonly results: Array<string>
}

/** @internal */
export const make = (runUnit: UnitRunner): Effect.Effect<StoreParts> =>
  Effect.sync(() => {
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
          const position = stored?.get(key)?.position
          if (position !== undefined && position !== null) positions.set(key, position)
        }
        return positions
      })

    // A claim and a unit's check-and-write each run in one synchronous step: a unit of an earlier owner either wrote
    // before the claim (and the claim returns its position) or finds the epoch moved on.
    const claim = (groupId: string, partitions: ReadonlyArray<TopicPartition.TopicPartition>) =>
      Effect.sync(() => {
        const stored = partitionsOf(groupId)
        const claims = new Map<string, Claim>()
        for (const partition of partitions) {
          const key = TopicPartition.key(partition)
          let state = stored.get(key)
          if (state === undefined) {
            state = { partition, position: null, epoch: 0n, finished: [], results: [] }
            stored.set(key, state)
          }
          state.epoch += 1n
          claims.set(key, {
            epoch: state.epoch,
            position: state.position,
            ...(state.finished.length === 0 ? {} : { finished: state.finished })
          })
        }
        return claims
      })

    // The work itself runs outside any lock: units of one owner may run side by side, and only the epoch decides.
    const commit = <A, E, R>(
      unit: CommitUnit,
      work: Effect.Effect<A, E, R>
    ): Effect.Effect<A, E | Fenced, Exclude<R, Transaction>> =>
      Effect.flatMap(runUnit(STORE, work), ([value, entries]) =>
        Effect.suspend(() => {
          const partitions = partitionsOf(unit.groupId)
          const key = TopicPartition.key(unit.partition)
          const state = partitions.get(key)
          if (state === undefined || state.epoch !== unit.epoch) {
            return Effect.fail(fencedUnit(unit, state?.epoch ?? null))
          }
          const { finished, position } = advance(state, unit)
          state.position = position
          state.finished = finished
          // One by one: spreading a large unit into `push` would overflow the stack.
          for (const entry of entries) state.results.push(entry)
          return Effect.succeed(value)
        }))

    const read = (groupId: string, partition?: TopicPartition.TopicPartition) =>
      Effect.sync((): ReadonlyArray<unknown> => {
        const stored = groups.get(groupId)
        if (stored === undefined) return []
        const states = partition === undefined
          ? [...stored.values()].sort((a, b) => TopicPartition.compare(a.partition, b.partition))
          : [stored.get(TopicPartition.key(partition))].filter((state) => state !== undefined)
        return states.flatMap((state) => state.results.map((text): unknown => JSON.parse(text)))
      })

    return { store: { name: STORE, load, claim, commit }, results: { read } }
  })
