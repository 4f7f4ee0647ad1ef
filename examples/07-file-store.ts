/**
 * Exactly-once with the file store: each committed unit of work is one JSON file holding the partition's new position
 * together with the results the handler appended, written to a temporary file, synced, then linked into place.
 * The offset is stored with the data: there is no moment at which one exists without the other.
 * Files go through @effect/platform's FileSystem; the platform layer (NodeContext) is chosen here, at the edge.
 *
 *   npx tsx examples/07-file-store.ts
 */
import { NodeContext, NodeRuntime } from "@effect/platform-node"
import * as FileSystem from "@effect/platform/FileSystem"
import { CommitPolicy, Consumer, ConsumerRecord, OffsetStore } from "effect-kafka-delivery"
import * as Chunk from "effect/Chunk"
import * as Console from "effect/Console"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Broker from "./broker.js"

const program = (directory: string) =>
  Effect.gen(function*() {
    const topics = yield* Broker.Topics
    const topic = Broker.unique("signups")
    const groupId = Broker.unique("welcome-mailer")
    yield* topics.create(topic, 2)
    yield* topics.produce(topic, Array.from({ length: 12 }, (_, i) => ({ value: `user${i}@example.com` })))

    let handled = 0
    const done = yield* Deferred.make<void>()
    yield* Consumer.run({ groupId, topics: [topic], maxPollRecords: 4 }, (records) =>
      Effect.gen(function*() {
        // Results land in the same file as the position, or not at all.
        yield* OffsetStore.append(Chunk.toReadonlyArray(Chunk.map(records, (r) => ({
          offset: String(r.offset),
          mailTo: ConsumerRecord.valueString(r)
        }))))
        if ((handled += records.length) === 12) yield* Deferred.succeed(done, undefined)
      })).pipe(Effect.raceFirst(Deferred.await(done)))

    const fs = yield* FileSystem.FileSystem
    const partitionDir = `${directory}/${groupId}/${topic}/0`
    const files = (yield* fs.readDirectory(partitionDir)).filter((f) => f.endsWith(".json")).sort()
    yield* Console.log(`exactly-once on ${topics.where}, ${handled} records; partition 0 has ${files.length} units:`)
    yield* Console.log(yield* fs.readFileString(`${partitionDir}/${files.at(-1)}`))
  }).pipe(Effect.provide(CommitPolicy.transactional()), Effect.provide(OffsetStore.layerFileSystem(directory)))

Effect.gen(function*() {
  const fs = yield* FileSystem.FileSystem
  yield* program(yield* fs.makeTempDirectoryScoped({ prefix: "offsets-" }))
}).pipe(Effect.scoped, Effect.provide(Broker.layer), Effect.provide(NodeContext.layer), NodeRuntime.runMain)
