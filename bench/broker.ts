/**
 * The broker the benchmarks run against: `KAFKA_BROKERS` when set, otherwise one of our own started with
 * scripts/kafka.sh on a free port and stopped at the end, on failure and on Ctrl-C too.
 */
import * as Broker from "../scripts/broker.js"

/** Runs `body` with a broker address; a broker started here is stopped however `body` ends. */
export const withBroker = async <A>(
  log: (line: string) => void,
  body: (brokers: string) => Promise<A>
): Promise<A> => {
  const existing = process.env.KAFKA_BROKERS?.trim()
  if (existing !== undefined && existing.length > 0) {
    log(`broker: KAFKA_BROKERS=${existing} (not started here)`)
    return body(existing)
  }
  const port = await Broker.choosePort()
  const started = Date.now()
  let stopped = false
  const stopSync = () => {
    if (stopped) return
    stopped = true
    Broker.stopSync(port)
  }
  const onSignal = (signal: NodeJS.Signals) => {
    stopSync()
    process.exit(signal === "SIGINT" ? 130 : 143)
  }
  process.once("exit", stopSync)
  process.once("SIGINT", onSignal)
  process.once("SIGTERM", onSignal)
  try {
    const result = await Broker.start(port)
    if ("failure" in result) throw new Error(`scripts/kafka.sh start failed: ${result.failure}`)
    const brokers = result.brokers
    await Broker.warmGroupCoordinator(brokers)
    log(`broker: started on ${brokers} in ${((Date.now() - started) / 1000).toFixed(1)} s`)
    return await body(brokers)
  } finally {
    if (!stopped) {
      stopped = true
      const result = await Broker.kafkaSh("stop", port)
      log(result.ok ? "broker: stopped" : `broker: stop failed: ${result.stderr.trim()}`)
    }
    process.removeListener("exit", stopSync)
    process.removeListener("SIGINT", onSignal)
    process.removeListener("SIGTERM", onSignal)
  }
}
