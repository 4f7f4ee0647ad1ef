/**
 * What the drivers on Kafka share about topics and partitions: a new topic's checks and the wait for its leaders, the
 * partitions of a request by topic, committed positions without their metadata.
 */
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import type { CommittedPosition } from "../../Driver.js"
import { DriverError } from "../../KafkaError.js"
import type { TopicPartition } from "../../TopicPartition.js"

/** A topic name and partition count `createTopic` can ask for. @internal */
export const checkNewTopic = (topic: string, partitions: number): Effect.Effect<void, DriverError> =>
  topic.length === 0
    ? new DriverError({ operation: "createTopic", reason: "empty topic name" })
    : !Number.isInteger(partitions) || partitions < 1
    ? new DriverError({ operation: "createTopic", reason: `invalid partition count ${partitions}` })
    : Effect.void

/**
 * Repeats `ready` (every partition of the new topic has a leader that answers for it) until it holds, for at most 30
 * seconds.
 *
 * @internal
 */
export const awaitLeaders = (topic: string, ready: Effect.Effect<boolean>): Effect.Effect<void, DriverError> =>
  ready.pipe(
    Effect.repeat({ schedule: Schedule.spaced("100 millis"), until: (ok) => ok }),
    Effect.timeoutOption("30 seconds"),
    Effect.flatMap((led) =>
      Option.isNone(led)
        ? new DriverError({
          operation: "createTopic",
          reason: `${topic} was created but its partitions had no leaders within 30 seconds`
        })
        : Effect.void
    )
  )

/** Each topic's partitions, in the order given, once each. @internal */
export const byTopic = (partitions: Iterable<TopicPartition>): Map<string, Array<number>> => {
  const out = new Map<string, Array<number>>()
  for (const { partition, topic } of partitions) {
    const list = out.get(topic)
    if (list === undefined) out.set(topic, [partition])
    else if (!list.includes(partition)) list.push(partition)
  }
  return out
}

/** Committed positions without their metadata. @internal */
export const positionsOnly = (found: ReadonlyMap<string, CommittedPosition>): ReadonlyMap<string, bigint> => {
  const out = new Map<string, bigint>()
  for (const [key, { position }] of found) out.set(key, position)
  return out
}
