/** What Node's `inspect` calls to print an object. @internal */
export const inspectSymbol = Symbol.for("nodejs.util.inspect.custom")
