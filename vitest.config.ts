import { fileURLToPath } from "node:url"
import { defineConfig } from "vitest/config"

export default defineConfig({
  resolve: {
    // The examples import the package by its name, as an application would; here that name is the source.
    alias: [
      { find: /^effect-kafka-delivery$/, replacement: fileURLToPath(new URL("./src/index.ts", import.meta.url)) },
      { find: /^effect-kafka-delivery\/(\w+)$/, replacement: fileURLToPath(new URL("./src/$1.ts", import.meta.url)) }
    ]
  },
  test: {
    include: ["test/**/*.test.ts", "examples/**/*.test.ts"],
    globalSetup: ["test/setup/kafkaGlobalSetup.ts"],
    testTimeout: 60_000,
    hookTimeout: 120_000
  }
})
