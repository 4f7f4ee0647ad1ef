/**
 * Where a failed record goes: the route's settings, and the retry topics (`<source>-retry-<step>`) before its
 * dead-letter topic.
 *
 * @internal
 */

/** The failure route after validation. */
export interface RouteSettings {
  /** The dead-letter topic. */
  readonly topic: string
  readonly maxInARow: number
  /** The waits of the retry topics before it, in milliseconds; none for a plain dead-letter route. */
  readonly delays: ReadonlyArray<number>
}

/** The retry step a topic is for (`<source>-retry-<step>`), when it is one of the route's retry topics. */
export const retryStepOf = (settings: RouteSettings, topic: string): number | undefined => {
  if (settings.delays.length === 0) return undefined
  const match = /-retry-(\d+)$/.exec(topic)
  if (match === null) return undefined
  const step = Number(match[1])
  return step < settings.delays.length ? step : undefined
}

/** Where a record of `topic` that failed goes: the next retry topic and when it is due, or the dead-letter topic. */
export const targetOf = (settings: RouteSettings, topic: string, now: number) => {
  const step = retryStepOf(settings, topic)
  const next = step === undefined ? 0 : step + 1
  if (next >= settings.delays.length) return { topic: settings.topic, due: undefined }
  const source = step === undefined ? topic : topic.slice(0, topic.lastIndexOf("-retry-"))
  return { topic: `${source}-retry-${next}`, due: now + settings.delays[next]! }
}
