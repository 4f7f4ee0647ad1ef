/**
 * The states of the kafkajs adapter, and what moves it between them. kafkajs tells its user little of what it does:
 * the adapter follows kafkajs through its events, one log line, one field its types leave out, and the requests its
 * sockets write; it acts on kafkajs through `pause`, `resume` and `seek`, through its batch calls, and through those
 * requests.
 *
 * The member's states (`member.ts`, `session.ts`) are carried by flags of the session, and read by `memberState`:
 *
 * state      flags of `Session` (`member.ts`)
 * ---------  ----------------------------------------------------------------------------------------------------------
 * Joining    `joined` false: `connect` has not seen the member join yet (`crash`, `settled` and `waitedForRestart`
 *            follow the attempts)
 * Member     `joined`; no `revoke`, no `failure`: the member owns `owned` (maybe none)
 * Holding    `revoke` set, not `released`: kafkajs's JoinGroup is held, the adapter heartbeats
 * Released   `revoke` set and `released`: the JoinGroup went out, the next assignment is awaited
 * Failed     `joined` and `failure` set, no `revoke`: kafkajs crashed and does not restart
 * Closed     `closed`, whatever else holds
 *
 * state      event                                 next       what the adapter does
 * ---------  ------------------------------------  ---------  ---------------------------------------------------------
 * (none)     `connect`                             Joining    admin and reader connect (a `Partitions` subscription's
 *                                                             partitions are checked), kafkajs connects, subscribes and
 *                                                             `run`s; `connect` waits for the join, at most the
 *                                                             rebalance timeout
 * Joining    kafkajs CRASH with `restart`          Joining    `crash` kept, logged once at info; `connect` waits for
 *            (GROUP_LOAD_IN_PROGRESS, the                     kafkajs's restart
 *            coordinator moving)
 * Joining    kafkajs CRASH without `restart`       Joining    `failure` kept, `settled`; `connect` clears both and runs
 *                                                             kafkajs again after a backoff when the error is retriable
 *                                                             and time is left, else fails with a `DriverError`
 * Joining    kafkajs GROUP_JOIN                    Member     `memberId`, `joined`, `settled`; the assignment is owned,
 *                                                             each partition waits for its seek (`fetcher.assign`);
 *                                                             `Assigned`
 * Member,    kafkajs REBALANCING; a batch call's   Holding    `beginRevoke`: records not yet returned dropped, a
 * Failed     heartbeat fails with a rebalance                 heartbeat every `heartbeatInterval` (`wire.heartbeat`), a
 *            error; kafkajs writes a JoinGroup                deadline `holdLimit` away; `Revoked`, with its `release`
 *            with its member id while partitions
 *            are owned
 * Member,    the same with no partition owned      Released   nothing to hold: the JoinGroup goes out at once
 * Failed     (REBALANCING, a heartbeat)
 * Holding    kafkajs writes its JoinGroup          Holding    the request is held in the socket layer (`onJoinGroup`
 *                                                             answers true)
 * Holding    the runloop's `release`; the hold's   Released   `releaseRevoke`: the revoked partitions are no longer
 *            deadline (with a warning); kafkajs               owned (their commits fail `NotOwned`), the timers stop,
 *            writes a JoinGroup without member id             the held JoinGroup is written
 * Holding    an own heartbeat is answered          Holding    the held JoinGroup is written: the group went on without
 *            ILLEGAL_GENERATION,                              the member
 *            UNKNOWN_MEMBER_ID or
 *            FENCED_INSTANCE_ID
 * Holding,   kafkajs GROUP_JOIN                    Member     the hold released; the new assignment replaces the owned
 * Released                                                    partitions and their committed positions; `Assigned`
 * Member     kafkajs GROUP_JOIN without a revoke   Member     `lose` (`Lost`), then the new assignment
 * Member,    kafkajs writes a JoinGroup without    the same   `lose`: `Lost`, nothing owned
 * Failed     member id (the coordinator forgot
 *            the member)
 * Member,    kafkajs CRASH with `restart`          Member     batches dropped, the hold released, `revoke` cleared,
 * Holding,                                                    `lose` (`Lost`); kafkajs rejoins as above
 * Released
 * Member,    kafkajs CRASH without `restart`       Failed     the same, and `failure` kept: `poll` fails with it, a
 * Holding,                                                    `Wake` ends a `poll` that waits
 * Released
 * any        the session's scope closes            Closed     batches dropped, the hold released (kafkajs leaves the
 *                                                             group once it rejoined), kafkajs and the admin clients
 *                                                             disconnect, the queue shuts down
 *
 * A `Partitions` subscription (`isStatic`) never holds: its assignor gives every member what it asked for, so a
 * rejoin keeps the partitions (`fetcher.restore`), and a crash loses nothing. The runloop's calls by state: `commit`
 * fails `UnknownMember` once `closed`, `Other` once `failure` is set, `NotOwned` for a partition not owned (Released:
 * the revoked ones), else kafkajs commits (see OffsetCommit below); `poll` fails once `failure` is set; a batch call
 * returns at once, resolving nothing, when Closed, Holding or Released.
 *
 * The phases of a partition's fetch (`fetch.ts`, `partitions.ts`) are carried by flags of its `PartitionState`, and
 * read by `partitionPhase`; `syncFetching` has kafkajs fetch the partition (`resume`) in the phases Fetching and
 * Parking, and not (`pause`) in the others:
 *
 * phase          flags of `PartitionState` (`partitions.ts`)
 * -------------  ------------------------------------------------------------------------------------------------------
 * AwaitingSeek   `position` undefined: assigned, not sought yet
 * Verifying      `suspended`: the cluster is asked whether kafkajs's position is in the log
 * OutOfRange     `outOfRange`: an `OutOfRange` is queued, the runloop's seek is awaited
 * Parked         `paused`, and `held` or `PARKED_BATCHES` batches kept
 * Parking        `paused`, fewer batches kept
 * Fetching       none of the above
 *
 * phase          event                               next           what the adapter does
 * -------------  ----------------------------------  -------------  ---------------------------------------------------
 * (none)         the member is assigned the          AwaitingSeek   kafkajs paused: it would start at the group's
 *                partition                                          committed offset on its own
 * any            the runloop's `seek`                Fetching       `epoch` counts it; `reset`, `suspended`,
 *                                                    (Parking,      `outOfRange` cleared; kafkajs `seek`s there
 *                                                    Parked)        (`moves` counts it), unless the position is in the
 *                                                                   batch in hand
 * Fetching,      a batch whose `fetchedOffset` is    Verifying      `verify` asks the cluster for the log's bounds
 * Parking        not `fetchPosition`
 * Fetching,      kafkajs logs "Offset out of range,  Verifying      `reset`; kafkajs paused before it fetches from its
 * Parking        resetting to default offset"                       default offset; `verify`
 * Verifying      the position is in the log          Fetching       ahead of it, the offsets in between hold nothing to
 *                                                                   read; behind it, or after a reset, kafkajs `seek`s
 *                                                                   back
 * Verifying      the position is outside the log     OutOfRange     an `OutOfRange` queued, after the partition's
 *                                                                   records
 * Fetching       the runloop's `pause`               Parking        batch calls return at once (`pause`), their records
 *                                                    (Parked with   kept
 *                                                    `hold`)
 * Parking        `poll` meets a kept batch with      Parked         kafkajs paused
 *                `PARKED_BATCHES` kept
 * Parking,       the runloop's `resume`              Fetching       kept records are returned first (a `Wake` ends a
 * Parked                                                            `poll` that waits)
 * any            the member rejoins with the same    the same       batches dropped, `epoch` counted, kafkajs `seek`s
 *                partitions (`Partitions`)                          back to the runloop's position (an OutOfRange
 *                                                                   stands)
 * any            the partition is revoked            the same       batches dropped (`revoke`); the next assignment
 *                                                                   replaces the state
 * any            the partition is lost, or the       (none)         batches dropped; the state goes
 *                session closes
 *
 * A batch call of kafkajs's `eachBatch` waits for its `Outcome` (`partitions.ts`): `taken`, `ahead` and `pause`
 * resolve the batch (kafkajs moves past it and fetches the next); `seek`, `stale`, `revoke` and `close` do not
 * (kafkajs fetches it again, or the next owner does). A batch that filtering emptied is announced only by
 * START_BATCH_PROCESS, with a `batchSize` of 0; when it starts at `fetchPosition` it is followed, and handed over as
 * an empty `Records`.
 *
 * What of kafkajs the adapter reads or rewrites, where, and why: kafkajs 2.2.4 has no public API for any of it.
 *
 * what                                        where                 why
 * ------------------------------------------  --------------------  ---------------------------------------------------
 * `Batch.fetchedOffset`, a field kafkajs's    `fetchedOffsetOf`     where kafkajs fetched from: a batch from elsewhere
 * types leave out                             (`fetch.ts`)          than `fetchPosition` means kafkajs moved on its own
 *                                                                   (filtering, an unnoticed reset)
 * the log line "Offset out of range,          `resetOf`             kafkajs resets an out-of-range partition to its
 * resetting to default offset"                (`session.ts`)        default offset, and commits that offset, without an
 * (ConsumerGroup, with `topic` and                                  event; the session receives error lines whatever
 * `partition`)                                                      `logLevel` says
 * log lines "Response ..." of the Connection  `makeLogCreator`      kafkajs logs every error answer at error level,
 * namespace                                   (`driver.ts`)         those a rebalance expects too: they are logged at
 *                                                                   debug
 * JoinGroup requests: the member id read,     `makeWire`            kafkajs has no revoke callback and rejoins at once:
 * the request held                            (`wire.ts`)           its held JoinGroup holds the group until the
 *                                                                   runloop released the partitions
 * SyncGroup and Heartbeat requests: group,    `makeWire`            what the adapter's own heartbeats carry during a
 * generation, member id, group instance id    (`wire.ts`)           hold: kafkajs sends none while its JoinGroup waits
 * and version read
 * own Heartbeat requests (negative            `makeWire`,           keep the member in the group during a hold; kafkajs
 * correlation ids); their answers taken out   `ResponseTap`         never sees them
 * of the stream                               (`socket.ts`)
 * OffsetCommit v1 to v5: negative offsets     `rewriteResetCommit`  kafkajs commits its default offset (-2) for a
 * replaced                                    (`wire.ts`)           partition it resets; the group's committed position
 *                                                                   is written instead, while the partition is reset
 * OffsetFetch v4 sent as v7 with              `makeReadWire`        kafkajs implements OffsetFetch up to v4, which
 * `require_stable`; the answer turned back    (`readWire.ts`)       cannot ask for stable offsets (KIP-447)
 * into v4
 * ApiVersions answers: the OffsetFetch        `makeReadWire`        whether the cluster takes v7
 * version listed                              (`readWire.ts`)
 * ListOffsets v2 to v5 sent read-uncommitted  `makeReadWire`        kafkajs's admin reads the last stable offset only;
 *                                             (`readWire.ts`)       the reader's ListOffsets give the high watermark
 */
import type { DriverError } from "../../KafkaError.js"
import type { TopicPartition } from "../../TopicPartition.js"

/** A revoke in progress: the partitions revoked, and whether the runloop (or the hold's end) let them go. @internal */
export interface Revoke {
  readonly partitions: ReadonlyArray<TopicPartition>
  released: boolean
  readonly timers: Array<ReturnType<typeof setTimeout>>
}

/**
 * The member's state (see the table above).
 *
 * @internal
 */
export type MemberState = "Joining" | "Member" | "Holding" | "Released" | "Failed" | "Closed"

/**
 * The session's flags that carry the member's state.
 *
 * @internal
 */
export interface MemberFlags {
  /** The member joined its group once (`connect` returned, or is about to). */
  readonly joined: boolean
  /** The session's scope closed. */
  readonly closed: boolean
  /** The revoke of the rebalance in progress, from when it was noticed to the next assignment. */
  readonly revoke: Revoke | undefined
  /** kafkajs crashed and does not restart: what `poll` fails with. */
  readonly failure: DriverError | undefined
}

/**
 * The member's state, read from the session's flags. A closed session is Closed whatever else holds; a revoke counts
 * before the rest, then whether the member ever joined.
 *
 * @internal
 */
export const memberState = (flags: MemberFlags): MemberState =>
  flags.closed
    ? "Closed"
    : flags.revoke !== undefined
    ? (flags.revoke.released ? "Released" : "Holding")
    : !flags.joined
    ? "Joining"
    : flags.failure !== undefined
    ? "Failed"
    : "Member"

/**
 * A paused partition keeps up to this many fetched batches before kafkajs is told to stop fetching it. Pausing
 * kafkajs at once would be costly: once every partition is paused, its fetch loop sleeps `maxWaitTime` before it
 * looks again, even if a partition resumes a millisecond later.
 *
 * @internal
 */
export const PARKED_BATCHES = 2

/**
 * A partition's fetch phase (see the table above).
 *
 * @internal
 */
export type PartitionPhase = "AwaitingSeek" | "Verifying" | "OutOfRange" | "Parked" | "Parking" | "Fetching"

/**
 * The flags of a partition's fetch state (`PartitionState`) that carry its phase.
 *
 * @internal
 */
export interface PartitionFlags {
  readonly position: bigint | undefined
  readonly suspended: boolean
  readonly outOfRange: boolean
  readonly paused: boolean
  readonly held: boolean
  readonly entries: { readonly size: number }
}

/** @internal */
export const partitionPhase = (state: PartitionFlags): PartitionPhase =>
  state.position === undefined
    ? "AwaitingSeek"
    : state.suspended
    ? "Verifying"
    : state.outOfRange
    ? "OutOfRange"
    : state.paused && (state.held || state.entries.size >= PARKED_BATCHES)
    ? "Parked"
    : state.paused
    ? "Parking"
    : "Fetching"

/** Whether kafkajs fetches a partition in this phase. @internal */
export const fetchesIn = (phase: PartitionPhase): boolean => phase === "Fetching" || phase === "Parking"
