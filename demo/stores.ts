/**
 * One lab run on the in-memory broker, with the offset store chosen for `transactional`: memory, a directory,
 * Postgres, or MySQL or SQLite through `SqlOffsetStore` (the database stores load only when asked for).
 */
import type * as FileSystem from "@effect/platform/FileSystem"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as InMemoryKafka from "../src/InMemoryKafka.js"
import * as OffsetStore from "../src/OffsetStore.js"
import {
  appendSink,
  kafkaTransactionalPlan,
  type Outcome,
  runWorkload,
  transactionalPlan,
  type Workload
} from "./lab.js"

/** Where `transactional` keeps positions and results. */
export type Store =
  | { readonly _tag: "Memory" }
  | { readonly _tag: "File"; readonly directory: string }
  | { readonly _tag: "Postgres"; readonly url: string }
  | { readonly _tag: "Mysql"; readonly url: string }
  | { readonly _tag: "Sqlite"; readonly file: string }

/** The store as the report names it. */
export const describeStore = (store: Store): string => {
  switch (store._tag) {
    case "Memory":
      return "memory store"
    case "File":
      return `file store in ${store.directory}`
    case "Postgres":
      return "Postgres store"
    case "Mysql":
      return "MySQL store (SqlOffsetStore)"
    case "Sqlite":
      return `SQLite store in ${store.file} (SqlOffsetStore)`
  }
}

/** Runs one policy's workload on a broker of its own. */
export const runInMemory = (
  workload: Workload,
  store: Store
): Effect.Effect<Outcome, unknown, FileSystem.FileSystem> => {
  const broker = InMemoryKafka.layer({ rebalance: workload.rebalance ?? "eager" })
  if (workload.policy === "kafkaTransactional") {
    return runWorkload(workload, kafkaTransactionalPlan).pipe(Effect.provide(broker))
  }
  if (workload.policy !== "transactional") {
    return runWorkload(workload).pipe(Effect.provide(broker))
  }
  switch (store._tag) {
    case "Memory":
      return runWorkload(workload, transactionalPlan(appendSink)).pipe(
        Effect.provide(Layer.merge(broker, OffsetStore.layerMemory))
      )
    case "File":
      return runWorkload(workload, transactionalPlan(appendSink)).pipe(
        Effect.provide(Layer.merge(broker, OffsetStore.layerFileSystem(store.directory)))
      )
    case "Postgres":
      return Effect.flatMap(
        Effect.tryPromise(() => import("./postgres.js")),
        (pg) => pg.runTransactional(workload, store.url)
      )
    case "Mysql":
    case "Sqlite":
      return Effect.flatMap(
        Effect.tryPromise(() => import("./sql.js")),
        (sql) => sql.runTransactional(workload, store)
      )
  }
}
