/**
 * One worker per partition, started when the partition is assigned and stopped when it is revoked. `onAssign` runs
 * in the partition's scope, so the worker acquired there is released on revoke, after the partition's final commit:
 * no worker outlives its partition. The handler hands each chunk to its partition's worker and waits for the answer;
 * only then does the policy commit, so commits follow what the workers finished.
 *
 *   npx tsx examples/08-worker-per-partition.ts
 */
import { NodeRuntime } from "@effect/platform-node"
import { CommitPolicy, Consumer, type ConsumerRecord, TopicPartition } from "effect-kafka-delivery"
import type * as Chunk from "effect/Chunk"
import * as Console from "effect/Console"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Queue from "effect/Queue"
import * as Broker from "./broker.js"

type Job = readonly [Chunk.Chunk<ConsumerRecord.ConsumerRecord>, Deferred.Deferred<void>]

const program = Effect.gen(function*() {
  const topics = yield* Broker.Topics
  const [topic, groupId] = [Broker.unique("thumbnails"), Broker.unique("thumbnailer")]
  yield* topics.create(topic, 4)
  yield* topics.produce(topic, Array.from({ length: 80 }, (_, i) => ({ partition: i % 4, value: `image-${i}` })))

  const inboxes = new Map<string, Queue.Queue<Job>>()
  let handled = 0
  const [halfway, allHandled, bAssigned] = [yield* Deferred.make(), yield* Deferred.make(), yield* Deferred.make()]
  const worker = (name: string, inbox: Queue.Queue<Job>) =>
    Effect.gen(function*() {
      const [records, done] = yield* Queue.take(inbox)
      yield* Effect.sleep("20 millis") // resizing images, say
      handled += records.length
      if (handled >= 40) yield* Deferred.succeed(halfway, undefined)
      if (handled >= 80) yield* Deferred.succeed(allHandled, undefined)
      yield* Deferred.succeed(done, undefined) // the handler returns, and the policy may commit these records
    }).pipe(Effect.forever, Effect.onInterrupt(() => Console.log(`${name}: worker stopped`)))

  const member = (member: string) =>
    Consumer.run({ groupId, topics: [topic], maxPollRecords: 5 }, (records, tp) =>
      Effect.gen(function*() {
        const done = yield* Deferred.make<void>()
        yield* Queue.offer(inboxes.get(TopicPartition.key(tp))!, [records, done])
        yield* Deferred.await(done)
      }), {
      onAssign: (tp) =>
        Effect.gen(function*() {
          const name = `${member} ${TopicPartition.key(tp)}`
          inboxes.set(TopicPartition.key(tp), yield* Queue.bounded<Job>(1))
          yield* Effect.forkScoped(worker(name, inboxes.get(TopicPartition.key(tp))!))
          yield* Console.log(`${name}: worker started`)
          if (member === "member B") yield* Deferred.succeed(bAssigned, undefined)
        })
    })

  const first = yield* Effect.fork(member("member A"))
  yield* Deferred.await(halfway)
  yield* Console.log("member B joins: the group rebalances")
  // Stop once every image is done and B has had partitions (on a real broker, joining takes a few seconds).
  const finished = Effect.zipRight(Deferred.await(allHandled), Deferred.await(bAssigned))
  yield* member("member B").pipe(Effect.raceFirst(finished))
  yield* Fiber.interrupt(first)
  yield* Console.log(`one worker per partition on ${topics.where}: ${handled} images`)
}).pipe(Effect.provide(CommitPolicy.commitAfter({ maxBatch: 10, maxInterval: "1 second" })))

program.pipe(Effect.provide(Broker.layer), NodeRuntime.runMain)
