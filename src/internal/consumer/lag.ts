/**
 * The consumer's lag, with observability: the owned partitions' latest offsets against the positions committed or
 * stored.
 *
 * @internal
 */
import * as Effect from "effect/Effect"
import * as Schedule from "effect/Schedule"
import * as Scope from "effect/Scope"
import type { DriverSession, PartitionOffsets } from "../../Driver.js"
import { metrics, type PartitionLag } from "../../Observability.js"
import type { ConsumerTelemetry } from "../telemetry/telemetry.js"
import { type PartitionState, paused, stopping } from "./context.js"

/**
 * With observability: at once and then every `lagInterval`, on a fiber of its own (off the poll loop), the owned
 * partitions' latest offsets against the positions committed or stored, as the lag gauges and a snapshot; the
 * buffered records and paused partitions are sampled with them. When the session ends, a snapshot that owns nothing.
 */
export const lagReports = (
  telemetry: ConsumerTelemetry,
  session: DriverSession,
  owned: ReadonlyMap<string, PartitionState>,
  scope: Scope.Scope,
  reachable: (offsets: PartitionOffsets) => bigint
): Effect.Effect<void> => {
  const { settings } = telemetry
  const snapshot = (partitions: ReadonlyArray<PartitionLag>) =>
    settings.report({
      groupId: telemetry.groupId,
      memberId: session.memberId,
      at: telemetry.clock.unsafeCurrentTimeMillis(),
      partitions
    })
  const report = Effect.suspend(() => {
    const states = Array.from(owned.values()).filter((s) => !stopping(s))
    if (states.length === 0) return snapshot([])
    return Effect.flatMap(session.offsets(states.map((s) => s.tp)), (read) => {
      const partitions: Array<PartitionLag> = []
      let pausedCount = 0
      for (const state of states) {
        if (paused(state)) pausedCount++
        const offsets = read.get(state.key)
        if (offsets === undefined) continue
        const latest = reachable(offsets)
        const position = telemetry.positions.get(state.key) ?? latest
        const lag = latest > position ? latest - position : 0n
        partitions.push({ ...state.tp, position, latest, lag })
        if (settings.metrics) {
          const { labels } = telemetry.partition(state.tp).set
          metrics.lag.unsafeUpdate(Number(lag), labels)
          metrics.bufferedRecords.unsafeUpdate(state.outstanding, labels)
        }
      }
      if (settings.metrics) metrics.pausedPartitions.unsafeUpdate(pausedCount, telemetry.group.labels)
      return snapshot(partitions)
    })
  }).pipe(
    Effect.catchAll((error) => Effect.logDebug("the partitions' latest offsets could not be read for the lag", error))
  )
  return Effect.zipRight(
    Scope.addFinalizer(scope, snapshot([])),
    Effect.asVoid(Effect.forkIn(Effect.repeat(report, Schedule.spaced(settings.lagInterval)), scope))
  )
}
