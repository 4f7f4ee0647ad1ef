/**
 * The two writes of the file store, each a segment linked on top of the newest one: a claim, and a committed unit.
 */
import * as Effect from "effect/Effect"
import type { Claim, CommitUnit } from "../../../OffsetStore.js"
import * as TopicPartition from "../../../TopicPartition.js"
import { advance } from "../../consumer/progress.js"
import { fencedUnit } from "../unitBuffer.js"
import { linkAfter, scanHead } from "./chain.js"
import { compact } from "./compaction.js"
import { cacheKey, type Files, lockOf } from "./directory.js"
import { claimedEpoch, claimOrUnit } from "./format.js"
import type { Fenced, OffsetStoreError } from "../../../KafkaError.js"

/**
 * The newest segment this store linked is where its next unit goes. Whenever that is not so (another store linked
 * after it, or it is gone), the partition is listed again rather than followed segment by segment: a segment
 * followed from one that was deleted could be a zombie's, below the newest checkpoint, while the listing always
 * holds the newest segment.
 *
 * @internal
 */
export const storeUnit = (
  files: Files,
  unit: CommitUnit,
  entries: ReadonlyArray<string>
): Effect.Effect<void, OffsetStoreError | Fenced> =>
  Effect.gen(function*() {
    const { groupId, partition: tp } = unit
    const key = cacheKey(groupId, tp)
    const cached = files.heads.get(key)
    let head = cached ?? (yield* scanHead(files, "commit", groupId, tp))
    let fresh = cached === undefined
    const results = entries.map((text): unknown => JSON.parse(text))
    while (true) {
      if (head.epoch !== unit.epoch) {
        if (!fresh) head = yield* scanHead(files, "commit", groupId, tp)
        files.heads.set(key, head)
        if (head.epoch !== unit.epoch) return yield* fencedUnit(unit, claimedEpoch(head))
      }
      const stored = advance({ position: head.next, finished: head.finished }, unit)
      const linked = yield* linkAfter(
        files,
        "commit",
        groupId,
        tp,
        head,
        claimOrUnit("unit", groupId, tp, head, unit.epoch, stored.position, stored.finished, results)
      )
      if (linked._tag === "Linked") {
        head = linked.head
        files.heads.set(key, head)
        if (head.sequence - head.checkpoint >= files.unitsPerCompaction) {
          files.heads.set(key, yield* compact(files, groupId, tp, head))
        }
        return
      }
      // Another store linked this sequence, or the name was free only because compaction had freed it: the loop
      // checks the epoch of the newest segment.
      head = yield* scanHead(files, "commit", groupId, tp)
      fresh = true
      files.heads.set(key, head)
    }
  }).pipe(Effect.uninterruptible, lockOf(files, cacheKey(unit.groupId, unit.partition)).withPermits(1))

/**
 * A claim links on top of whatever segment is the newest, of any epoch, so it starts from a listing of the
 * partition, never from what this store last saw (see `storeUnit`).
 *
 * @internal
 */
export const claimPartition = (
  files: Files,
  groupId: string,
  tp: TopicPartition.TopicPartition
): Effect.Effect<Claim, OffsetStoreError> =>
  Effect.gen(function*() {
    while (true) {
      const head = yield* scanHead(files, "claim", groupId, tp)
      const epoch = head.epoch + 1n
      const linked = yield* linkAfter(
        files,
        "claim",
        groupId,
        tp,
        head,
        claimOrUnit("claim", groupId, tp, head, epoch, head.next, head.finished, [])
      )
      if (linked._tag === "Linked") {
        files.heads.set(cacheKey(groupId, tp), linked.head)
        return {
          epoch,
          position: head.next,
          ...(head.finished.length === 0 ? {} : { finished: head.finished })
        }
      }
    }
  }).pipe(Effect.uninterruptible, lockOf(files, cacheKey(groupId, tp)).withPermits(1))
