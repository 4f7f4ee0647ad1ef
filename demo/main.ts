/**
 * The semantics lab (`npm run demo`). The platform is chosen here, at the edge: `NodeContext` runs on Node, Deno and
 * Bun alike.
 */
import * as ValidationError from "@effect/cli/ValidationError"
import { NodeContext, NodeRuntime } from "@effect/platform-node"
import * as Cause from "effect/Cause"
import * as Console from "effect/Console"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Logger from "effect/Logger"
import * as process from "node:process"
import { cli } from "./cli.js"

const program = cli(process.argv).pipe(
  // A bad option value was already reported by the CLI with its help; anything else is said here, in one line.
  Effect.tapErrorCause((cause) => {
    const error = Cause.failureOption(cause)
    if (error._tag === "Some" && typeof error.value === "object" && error.value !== null) {
      if (ValidationError.isValidationError(error.value)) return Effect.void
      if ("message" in error.value) return Console.error(`error: ${String(error.value.message)}`)
    }
    return Cause.isInterruptedOnly(cause) ? Effect.void : Console.error(Cause.pretty(cause))
  }),
  Effect.provide(NodeContext.layer),
  // Logs go to stderr, so that stdout holds the report (or, with --json, nothing but the JSON).
  Effect.provide(Logger.replace(Logger.defaultLogger, Logger.prettyLogger({ stderr: true })))
)

NodeRuntime.runMain(program, {
  disableErrorReporting: true,
  disablePrettyLogger: true,
  // The report is complete once the program ends. A member told to leave may still be winding down on a broker that
  // no longer matters; the process ends with the report, as a command line should.
  teardown: (exit, onExit) => {
    const code = Exit.isSuccess(exit) ? 0 : 1
    onExit(code)
    process.exit(code)
  }
})
