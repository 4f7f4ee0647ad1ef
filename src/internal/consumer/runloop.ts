/**
 * A consumer's run: sessions one after another. A session (one membership of the group, `session.ts`) polls the
 * driver; when the cluster cannot be reached, or a fenced unit shows that a partition moved on, it ends and a new one
 * begins, for as long as `reconnectTimeout` allows.
 *
 * The parts: `session.ts` (the poll loop and its events), `partitions.ts` (assign, the bounded revoke protocol,
 * release), `flow.ts` (pause and resume), `chunks.ts` (chunks as units, in order), `pipeline.ts` and `lanes.ts`
 * (records finishing out of order, by key or unordered), `lag.ts`; the failure route is in `../route/`, the commit
 * policies and their committer in `../policy/`.
 *
 * @internal
 */
import type * as Context from "effect/Context"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import type * as Scope from "effect/Scope"
import { CommitPolicy } from "../../CommitPolicy.js"
import { Driver } from "../../Driver.js"
import { Faults } from "../../Faults.js"
import type { DriverError, HandlerFailed } from "../../KafkaError.js"
import { Observability } from "../../Observability.js"
import type { Work } from "../route/router.js"
import { type Hooks, Reconnect, Rejoin, type Resolved, type RouteError, type RunError } from "./context.js"
import * as Permits from "./permits.js"
import { runSession } from "./session.js"
import * as StuckWorkers from "./stuckWorkers.js"

export type { Hooks, OffsetReset, Resolved, RouteError, RunError } from "./context.js"
export { HandlerFailure, type Work } from "../route/router.js"

/**
 * Runs a consumer until it fails or is interrupted. A session (one membership of the group) has one fiber that polls
 * the driver and owns assignment; each partition has a worker fiber in a scope of its own that ends on revoke; the
 * policy decides the commits. When the cluster cannot be reached, or a fenced unit shows that a partition moved on,
 * the session ends and a new one begins, for as long as `reconnectTimeout` allows.
 */
export const run = <E, R, EH, RH>(
  config: Resolved,
  work: Work<E, R>,
  hooks: Hooks<EH, RH>
): Effect.Effect<
  never,
  RunError | HandlerFailed<E> | RouteError<E> | EH,
  Driver | CommitPolicy | R | Exclude<RH, Scope.Scope>
> =>
  Effect.flatMap(Effect.serviceOption(Observability), (observability) => {
    const body = consume(config, work, hooks, observability)
    if (Option.isNone(observability) || !observability.value.spans) return body
    return Effect.withSpan(body, "kafka.consumer", {
      attributes: {
        "messaging.system": "kafka",
        "messaging.consumer.group.name": config.session.groupId,
        "messaging.client.id": config.session.clientId
      },
      captureStackTrace: false
    })
  })

const consume = <E, R, EH, RH>(
  config: Resolved,
  work: Work<E, R>,
  hooks: Hooks<EH, RH>,
  observability: Option.Option<Context.Tag.Service<typeof Observability>>
): Effect.Effect<
  never,
  RunError | HandlerFailed<E> | RouteError<E> | EH,
  Driver | CommitPolicy | R | Exclude<RH, Scope.Scope>
> =>
  Effect.gen(function*() {
    const driver = yield* Driver
    const commitPolicy = yield* CommitPolicy
    const faults = yield* Effect.serviceOption(Faults)
    /** Workers of revoked partitions that did not stop when interrupted, by partition. */
    const abandoned = StuckWorkers.make()
    const reconnectSchedule = Schedule.exponential(Duration.millis(100)).pipe(
      Schedule.union(Schedule.spaced(Duration.seconds(5))),
      Schedule.upTo(config.reconnectTimeout)
    )
    // One backoff per run of failed sessions; a session that polls starts the next run afresh.
    let backoff: Schedule.ScheduleDriver<unknown, unknown> | undefined

    const session = runSession(config, work, hooks, {
      driver,
      commitPolicy,
      faults,
      abandoned,
      observability,
      permits: Permits.make(config.concurrency),
      connected: () => {
        backoff = undefined
      }
    })

    const reconnect = (error: Reconnect): Effect.Effect<void, DriverError> =>
      Effect.gen(function*() {
        const current = backoff ?? (yield* Schedule.driver(reconnectSchedule))
        backoff = current
        yield* Effect.logWarning(`${error.cause.message}; reconnecting`)
        yield* Effect.mapError(current.next(error), () => error.cause)
      })

    while (true) {
      const failed = yield* Effect.flip(session)
      if (failed instanceof Rejoin) {
        yield* Effect.logWarning(`${failed.cause.message}: giving up every partition and rejoining the group`)
        continue
      }
      if (failed instanceof Reconnect) {
        yield* reconnect(failed)
        continue
      }
      return yield* Effect.fail(failed)
    }
  })
