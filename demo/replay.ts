/**
 * Writes the records of a dead-letter topic back to their source topics (`FailureRoute.replay`), on Kafka:
 *
 *   npm run replay -- --topic orders-dlq --group orders-replay --brokers localhost:9092 [--error-tag Refused]
 *
 * `--group` keeps the replay's position: run again, it replays only what was dead-lettered since.
 */
import * as Command from "@effect/cli/Command"
import * as Options from "@effect/cli/Options"
import { NodeContext, NodeRuntime } from "@effect/platform-node"
import * as Console from "effect/Console"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as process from "node:process"
import * as FailureRoute from "../src/FailureRoute.js"
import * as KafkaJs from "../src/KafkaJs.js"

const topic = Options.text("topic").pipe(Options.withDescription("The dead-letter topic to replay."))
const group = Options.text("group").pipe(
  Options.withDescription("The consumer group that keeps the replay's position in the dead-letter topic.")
)
const brokers = Options.text("brokers").pipe(
  Options.optional,
  Options.withDescription("Kafka's bootstrap servers, host:port[,host:port...]. Default: KAFKA_BROKERS.")
)
const errorTag = Options.text("error-tag").pipe(
  Options.optional,
  Options.withDescription(
    "Replays only the records that failed with this error tag (the dead-letter-error-tag header)."
  )
)

const command = Command.make("replay", { topic, group, brokers, errorTag }, (args) =>
  Effect.gen(function*() {
    const given = Option.orElse(args.brokers, () => Option.fromNullable(process.env.KAFKA_BROKERS))
    if (Option.isNone(given)) return yield* Effect.fail(new Error("give --brokers (or set KAFKA_BROKERS)"))
    const list = yield* KafkaJs.parseBrokers(given.value)
    const tag = Option.getOrUndefined(args.errorTag)
    const result = yield* FailureRoute.replay({
      topic: args.topic,
      groupId: args.group,
      filter: tag === undefined ? undefined : (letter) => letter.errorTag === tag
    }).pipe(
      Effect.provide(Layer.merge(
        KafkaJs.layer({ brokers: list, clientId: "replay", logLevel: "error" }),
        KafkaJs.layerProducer({ brokers: list, logLevel: "error" })
      ))
    )
    yield* Console.log(
      `${result.replayed} record(s) of ${args.topic} written back to their source topics` +
        (result.foreign > 0 ? `; ${result.foreign} without dead-letter headers left where they are` : "") +
        (result.removed > 0 ? `; ${result.removed} removed from the topic before they could be replayed` : "")
    )
  }))

Command.run(command, { name: "replay", version: "0.1.0" })(process.argv).pipe(
  Effect.tapErrorCause((cause) => Console.error(`error: ${String(cause)}`)),
  Effect.provide(NodeContext.layer),
  NodeRuntime.runMain({ disableErrorReporting: true })
)
