/**
 * The shape of `src/`: the largest files and functions, and the import graph's circles.
 *
 *   npx tsx scripts/house.ts            prints the ten largest files and functions, and every circle
 *   npx tsx scripts/house.ts --json     the same as JSON (test/House.test.ts reads `measure()`)
 *
 * A function's size is the lines from its first to its last line, nested functions included, as a reader meets it.
 */
import * as Fs from "node:fs"
import * as Path from "node:path"
import { fileURLToPath } from "node:url"
import ts from "typescript"

export interface FileSize {
  readonly file: string
  readonly lines: number
}

export interface FunctionSize {
  readonly file: string
  readonly name: string
  readonly line: number
  readonly lines: number
}

export interface House {
  readonly files: ReadonlyArray<FileSize>
  readonly functions: ReadonlyArray<FunctionSize>
  /** Circles of imports that load modules at run time: a module that runs before the one it needs is loaded. */
  readonly circles: ReadonlyArray<ReadonlyArray<string>>
  /** Circles only through imports of types, which are erased: two modules that name each other's types. */
  readonly typeCircles: ReadonlyArray<ReadonlyArray<string>>
}

const root = Path.resolve(Path.dirname(fileURLToPath(import.meta.url)), "..")

const sourcesUnder = (dir: string): Array<string> =>
  Fs.readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = Path.join(dir, entry.name)
    if (entry.isDirectory()) return sourcesUnder(path)
    return entry.name.endsWith(".ts") ? [path] : []
  })

const nameOf = (node: ts.Node, source: ts.SourceFile): string => {
  if ((ts.isFunctionDeclaration(node) || ts.isMethodDeclaration(node)) && node.name) return node.name.getText(source)
  let parent = node.parent
  while (parent && (ts.isCallExpression(parent) || ts.isParenthesizedExpression(parent) || ts.isAsExpression(parent))) {
    parent = parent.parent
  }
  if (
    parent && (ts.isVariableDeclaration(parent) || ts.isPropertyAssignment(parent) || ts.isPropertyDeclaration(parent))
  ) {
    return parent.name.getText(source)
  }
  return "(anonymous)"
}

const isFunction = (node: ts.Node): node is ts.FunctionLikeDeclaration =>
  ts.isFunctionDeclaration(node) || ts.isFunctionExpression(node) || ts.isArrowFunction(node) ||
  ts.isMethodDeclaration(node) || ts.isGetAccessorDeclaration(node) || ts.isConstructorDeclaration(node)

/** Whether an import or export declaration names types only (erased at run time). */
const typeOnly = (node: ts.ImportDeclaration | ts.ExportDeclaration): boolean => {
  if (ts.isExportDeclaration(node)) {
    return node.isTypeOnly ||
      (node.exportClause !== undefined && ts.isNamedExports(node.exportClause) &&
        node.exportClause.elements.every((e) => e.isTypeOnly))
  }
  const clause = node.importClause
  if (clause === undefined) return false
  if (clause.isTypeOnly) return true
  if (clause.name !== undefined) return false
  const bindings = clause.namedBindings
  return bindings !== undefined && ts.isNamedImports(bindings) && bindings.elements.every((e) => e.isTypeOnly)
}

const importsOf = (source: ts.SourceFile, file: string): Array<{ readonly to: string; readonly types: boolean }> => {
  const found: Array<{ to: string; types: boolean }> = []
  const visit = (node: ts.Node) => {
    if (
      (ts.isImportDeclaration(node) || ts.isExportDeclaration(node)) && node.moduleSpecifier &&
      ts.isStringLiteral(node.moduleSpecifier)
    ) {
      const spec = node.moduleSpecifier.text
      if (spec.startsWith(".")) {
        const to = Path.relative(root, Path.resolve(Path.dirname(file), spec.replace(/\.js$/, ".ts")))
        found.push({ to, types: typeOnly(node) })
      }
    }
  }
  ts.forEachChild(source, visit)
  return found
}

/** Tarjan's strongly connected components: every component of more than one module is a circle. */
const circlesOf = (graph: ReadonlyMap<string, ReadonlyArray<string>>): Array<Array<string>> => {
  const index = new Map<string, number>()
  const low = new Map<string, number>()
  const stack: Array<string> = []
  const onStack = new Set<string>()
  const out: Array<Array<string>> = []
  let next = 0
  const connect = (v: string) => {
    index.set(v, next)
    low.set(v, next)
    next++
    stack.push(v)
    onStack.add(v)
    for (const w of graph.get(v) ?? []) {
      if (!graph.has(w)) continue
      if (!index.has(w)) {
        connect(w)
        low.set(v, Math.min(low.get(v)!, low.get(w)!))
      } else if (onStack.has(w)) {
        low.set(v, Math.min(low.get(v)!, index.get(w)!))
      }
    }
    if (low.get(v) === index.get(v)) {
      const component: Array<string> = []
      let w: string
      do {
        w = stack.pop()!
        onStack.delete(w)
        component.push(w)
      } while (w !== v)
      if (component.length > 1 || (graph.get(v) ?? []).includes(v)) out.push(component.sort())
    }
  }
  for (const v of [...graph.keys()].sort()) if (!index.has(v)) connect(v)
  return out
}

/** Measures `src/`. */
export const measure = (dir = Path.join(root, "src")): House => {
  const files: Array<FileSize> = []
  const functions: Array<FunctionSize> = []
  const runtime = new Map<string, Array<string>>()
  const all = new Map<string, Array<string>>()
  for (const file of sourcesUnder(dir)) {
    const text = Fs.readFileSync(file, "utf8")
    const source = ts.createSourceFile(file, text, ts.ScriptTarget.ES2022, true)
    const relative = Path.relative(root, file)
    files.push({ file: relative, lines: source.getLineAndCharacterOfPosition(source.getEnd()).line + 1 })
    const imports = importsOf(source, file)
    runtime.set(relative, imports.filter((i) => !i.types).map((i) => i.to))
    all.set(relative, imports.map((i) => i.to))
    const visit = (node: ts.Node) => {
      if (isFunction(node)) {
        const start = source.getLineAndCharacterOfPosition(node.getStart(source)).line
        const end = source.getLineAndCharacterOfPosition(node.getEnd()).line
        functions.push({ file: relative, name: nameOf(node, source), line: start + 1, lines: end - start + 1 })
      }
      ts.forEachChild(node, visit)
    }
    visit(source)
  }
  files.sort((a, b) => b.lines - a.lines)
  functions.sort((a, b) => b.lines - a.lines)
  const circles = circlesOf(runtime)
  const known = new Set(circles.map((c) => c.join(" ")))
  const typeCircles = circlesOf(all).filter((c) => !known.has(c.join(" ")))
  return { files, functions, circles, typeCircles }
}

if (process.argv[1] && fileURLToPath(import.meta.url) === Path.resolve(process.argv[1])) {
  const house = measure()
  if (process.argv.includes("--json")) {
    console.log(JSON.stringify(house, null, 2))
  } else {
    const total = house.files.reduce((n, f) => n + f.lines, 0)
    console.log(`src/: ${house.files.length} files, ${total} lines`)
    console.log("largest files:")
    for (const f of house.files.slice(0, 10)) console.log(`  ${String(f.lines).padStart(5)}  ${f.file}`)
    console.log("largest functions:")
    for (const f of house.functions.slice(0, 10)) {
      console.log(`  ${String(f.lines).padStart(5)}  ${f.name} (${f.file}:${f.line})`)
    }
    console.log(`import circles at run time: ${house.circles.length}`)
    for (const c of house.circles) console.log(`  ${c.join(" <-> ")}`)
    console.log(`circles through type imports only: ${house.typeCircles.length}`)
    for (const c of house.typeCircles) console.log(`  ${c.join(" <-> ")}`)
  }
}
