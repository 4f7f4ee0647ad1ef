/**
 * One transactional producer with its transactional id, from the layer of a driver's transactional producers.
 */
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import type { DriverError, InvalidConfig, TransactionFailed } from "../../KafkaError.js"
import { TransactionalProducer, TransactionalProducers } from "../../Producer.js"
import { checkTransactionalId } from "./settings.js"

/** @internal */
export const singleTransactional = <C extends { readonly transactionalId: string }, E>(
  config: C,
  producers: (rest: Omit<C, "transactionalId">) => Layer.Layer<TransactionalProducers, E>
): Layer.Layer<TransactionalProducer, E | InvalidConfig | DriverError | TransactionFailed> =>
  Layer.scoped(
    TransactionalProducer,
    Effect.gen(function*() {
      const transactionalId = yield* checkTransactionalId(config.transactionalId)
      const { transactionalId: _, ...rest } = config
      const built = yield* Layer.build(producers(rest))
      return yield* Context.get(built, TransactionalProducers).make(transactionalId)
    })
  )
