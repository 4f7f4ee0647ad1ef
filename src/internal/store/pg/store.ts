/**
 * The offset store in Postgres: positions and owner epochs in one table, read and claimed in one statement each, and
 * stored by each unit in its own transaction (`./unit.ts`).
 */
import type * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Schedule from "effect/Schedule"
import type * as Scope from "effect/Scope"
import { InvalidConfig, type OffsetStoreError } from "../../../KafkaError.js"
import type { Claim, CommitUnit, OffsetStore } from "../../../OffsetStore.js"
import * as TopicPartition from "../../../TopicPartition.js"
import { claimOf, inLockOrder, positionsAmong, topicsOf } from "../claims.js"
import {
  connect,
  defaultRetry,
  ensureTable,
  ISOLATION_LEVELS,
  onPool,
  type Options,
  type Pg,
  retrying
} from "./client.js"
import { STORE, toStoreError } from "./errors.js"
import { arrayLiteral, decodeClaims, decodePositions, prepared } from "./sql.js"
import * as unit from "./unit.js"

const load = (
  pg: Pg,
  groupId: string,
  partitions: ReadonlyArray<TopicPartition.TopicPartition>
): Effect.Effect<ReadonlyMap<string, bigint>, OffsetStoreError> => {
  if (partitions.length === 0) return Effect.succeed(new Map())
  const topics = topicsOf(partitions)
  return retrying(
    pg,
    "load",
    Effect.tryPromise({
      try: async () =>
        decodePositions(
          await pg.client.sql.unsafe(
            `select topic, partition::text, next_offset::text from ${pg.client.table}
             where group_id = $1 and topic = any($2::text[]) and next_offset is not null`,
            [groupId, arrayLiteral(topics)],
            prepared
          ).values()
        ),
      catch: onPool(pg, "load")
    })
  ).pipe(Effect.map((rows) => positionsAmong(partitions, rows)))
}

// One statement for all the partitions, in a fixed order so that two claims of overlapping partitions lock rows
// in the same order. The upsert waits for a unit holding a row (one that has stored its position and not yet
// committed) and then updates the newest version, so the position it returns includes that unit if it committed.
// Retrying is safe: a claim whose answer was lost only makes the epoch skip a number.
const claim = (
  pg: Pg,
  groupId: string,
  partitions: ReadonlyArray<TopicPartition.TopicPartition>
): Effect.Effect<ReadonlyMap<string, Claim>, OffsetStoreError> => {
  const unique = inLockOrder(partitions)
  if (unique.length === 0) return Effect.succeed(new Map())
  return retrying(
    pg,
    "claim",
    Effect.tryPromise({
      try: async () =>
        decodeClaims(
          await pg.client.sql.unsafe(
            `insert into ${pg.client.table} as offsets (group_id, topic, partition, next_offset, epoch, updated_at)
             select $1, claimed.topic, claimed.partition, null, 1, now()
             from unnest($2::text[], $3::int[]) with ordinality as claimed(topic, partition, n)
             order by claimed.n
             on conflict (group_id, topic, partition)
             do update set epoch = offsets.epoch + 1, updated_at = now()
             returning topic, partition::text, next_offset::text, epoch::text, finished`,
            [groupId, arrayLiteral(unique.map((tp) => tp.topic)), arrayLiteral(unique.map((tp) => tp.partition))],
            prepared
          ).values()
        ),
      catch: onPool(pg, "claim")
    })
  ).pipe(Effect.map((rows) => {
    const claims = new Map<string, Claim>()
    for (const [topic, partition, next, epoch, finishedText] of rows) {
      claims.set(TopicPartition.key(TopicPartition.make(topic, Number(partition))), claimOf(next, epoch, finishedText))
    }
    return claims
  }))
}

/** @internal */
export const make = (
  options: Options
): Effect.Effect<Context.Tag.Service<OffsetStore>, InvalidConfig | OffsetStoreError, Scope.Scope> =>
  Effect.gen(function*() {
    const isolationLevel = options.isolationLevel ?? "read committed"
    if (!ISOLATION_LEVELS.includes(isolationLevel)) {
      return yield* new InvalidConfig({
        field: "isolationLevel",
        reason: `${JSON.stringify(isolationLevel)} is not one of ${ISOLATION_LEVELS.map((l) => `"${l}"`).join(", ")}`
      })
    }
    const retryFor = Duration.decodeUnknown(options.retryFor ?? "60 seconds")
    if (retryFor._tag === "None") {
      return yield* new InvalidConfig({ field: "retryFor", reason: "is not a duration, such as \"60 seconds\"" })
    }
    const schedule = Schedule.upTo(options.retry ?? defaultRetry, retryFor.value)
    const client = yield* connect(options)
    yield* Effect.tryPromise({
      try: () => client.sql.unsafe("select 1"),
      catch: toStoreError("connect", client.target)
    })
    if (options.migrate === true) yield* ensureTable(client, options.schema)
    const pg: Pg = { client, isolationLevel, schedule }
    return {
      name: STORE,
      load: (groupId, partitions) => load(pg, groupId, partitions),
      claim: (groupId, partitions) => claim(pg, groupId, partitions),
      commit: <A, E, R>(commitUnit: CommitUnit, work: Effect.Effect<A, E, R>) => unit.commit(pg, commitUnit, work)
    }
  })
