/**
 * The connection settings the adapter reads, as `KafkaJs` declares and documents them. Imported for their types only:
 * erased at run time, so the adapter's modules do not load the public module.
 */
export type { ConnectionConfig, LogLevel, RetryOptions, SaslOptions, TlsOptions } from "../../KafkaJs.js"
