import * as effectPlugin from "@effect/eslint-plugin"
import { builtinModules } from "node:module"
import tseslint from "typescript-eslint"

// Every Node built-in, by its bare name and under `node:`.
const nodeBuiltins = builtinModules
  .filter((name) => !name.startsWith("_"))
  .flatMap((name) => name.startsWith("node:") ? [name] : [name, `node:${name}`])

// The Node adapters: kafkajs and postgres run on Node, so these are the only modules of the library that may import
// Node built-ins or those drivers. The rest runs wherever Effect runs (Deno and Bun as well).
const nodeAdapters = [
  "src/KafkaJs.ts",
  "src/internal/kafkajs/**",
  "src/Platformatic.ts",
  "src/internal/platformatic/**",
  "src/PgOffsetStore.ts",
  "src/internal/store/pg/**"
]

export default tseslint.config(
  {
    ignores: ["**/node_modules/**", "**/dist/**", "api-docs/**", ".cache/**", ".kafka/**"]
  },
  ...effectPlugin.configs.dprint,
  {
    files: ["**/*.ts", "**/*.mjs"],
    languageOptions: {
      parser: tseslint.parser,
      ecmaVersion: 2022,
      sourceType: "module"
    },
    plugins: {
      "@typescript-eslint": tseslint.plugin
    },
    linterOptions: {
      reportUnusedDisableDirectives: "error"
    },
    rules: {
      // The layout is dprint's, as in Effect's own repositories; imports keep the order they are written in.
      "@effect/dprint": ["error", {
        config: {
          indentWidth: 2,
          lineWidth: 120,
          semiColons: "asi",
          quoteStyle: "alwaysDouble",
          trailingCommas: "never",
          operatorPosition: "maintain",
          "arrowFunction.useParentheses": "force",
          "importDeclaration.sortNamedImports": "maintain",
          "exportDeclaration.sortNamedExports": "maintain",
          "module.sortImportDeclarations": "maintain",
          "module.sortExportDeclarations": "maintain"
        }
      }]
    }
  },
  {
    files: ["{src,test,examples,bench,demo,scripts}/**/*.ts"],
    rules: {
      // Mistakes the type checker lets through. Unused names are left to tsc (noUnusedLocals, noUnusedParameters).
      // Rules that need type information are left out: they make linting several times slower than tsc itself.
      "no-constant-binary-expression": "error",
      "no-debugger": "error",
      "no-loss-of-precision": "error",
      "no-self-compare": "error",
      "no-template-curly-in-string": "error",
      "no-unreachable": "error",
      "no-unsafe-finally": "error",
      "no-unsafe-optional-chaining": "error",
      "@typescript-eslint/no-extra-non-null-assertion": "error",
      "@typescript-eslint/no-non-null-asserted-optional-chain": "error",
      "@typescript-eslint/no-unsafe-declaration-merging": "error"
    }
  },
  {
    files: ["src/**/*.ts"],
    rules: {
      // effect and @effect/platform are imported a module at a time, so that a bundle holds only what is used.
      "@effect/no-import-from-barrel-package": ["error", { packageNames: ["effect", "@effect/platform"] }],
      "no-restricted-imports": ["error", {
        paths: [...nodeBuiltins, "kafkajs", "@platformatic/kafka", "postgres"].map((name) => ({
          name,
          message: "Only the adapters (KafkaJs, Platformatic, PgOffsetStore and their internal modules) import it."
        }))
      }]
    }
  },
  {
    files: nodeAdapters,
    rules: {
      "no-restricted-imports": "off"
    }
  }
)
