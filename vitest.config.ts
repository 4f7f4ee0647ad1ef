import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts", "examples/**/*.test.ts"],
    globalSetup: ["test/setup/kafkaGlobalSetup.ts"],
    testTimeout: 60_000,
    hookTimeout: 120_000
  }
})
