import postgres from "postgres"
import { afterAll } from "vitest"

/**
 * Offset tables a test file creates: each name it returns is dropped when the file is done. Call at the top level of
 * the file.
 */
export const droppedAfterAll = (url: string) => {
  const tables: Array<string> = []
  afterAll(async () => {
    const sql = postgres(url, { onnotice: () => {}, max: 1 })
    for (const table of tables) await sql.unsafe(`drop table if exists "${table}"`)
    await sql.end({ timeout: 5 })
  })
  return (prefix: string) => {
    const table = `${prefix}_${crypto.randomUUID().slice(0, 8)}`
    tables.push(table)
    return table
  }
}
