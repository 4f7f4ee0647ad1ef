/**
 * The 32-bit murmur2 hash the Java client's default partitioner applies to a record's serialized key (seed
 * 0x9747b28c, little-endian 4-byte blocks), and the partition it picks from it: the hash with its sign bit cleared,
 * modulo the partition count. A key written by a Java producer and by this library lands on the same partition.
 *
 * @internal
 */
export const murmur2 = (data: Uint8Array): number => {
  const length = data.length
  const m = 0x5bd1e995
  const r = 24
  let h = (0x9747b28c ^ length) | 0
  const blocks = length >>> 2
  for (let i = 0; i < blocks; i++) {
    const at = i << 2
    let k = (data[at]! & 0xff) | ((data[at + 1]! & 0xff) << 8) | ((data[at + 2]! & 0xff) << 16) |
      ((data[at + 3]! & 0xff) << 24)
    k = Math.imul(k, m)
    k ^= k >>> r
    k = Math.imul(k, m)
    h = Math.imul(h, m)
    h ^= k
  }
  const tail = blocks << 2
  const left = length & 3
  if (left > 0) {
    if (left === 3) h ^= (data[tail + 2]! & 0xff) << 16
    if (left >= 2) h ^= (data[tail + 1]! & 0xff) << 8
    h ^= data[tail]! & 0xff
    h = Math.imul(h, m)
  }
  h ^= h >>> 13
  h = Math.imul(h, m)
  h ^= h >>> 15
  return h | 0
}

/**
 * The partition of a key among `partitions`, as the Java client's default partitioner picks it.
 *
 * @internal
 */
export const partitionOfKey = (key: Uint8Array, partitions: number): number => (murmur2(key) & 0x7fffffff) % partitions
