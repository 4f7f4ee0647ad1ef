/**
 * UTF-8 lengths and bytes of strings, as `TextEncoder` gives them (a lone surrogate is U+FFFD, three bytes), without
 * a call into the runtime: for the short strings of record keys and sizes this is several times faster.
 *
 * @internal
 */
export const utf8Length = (text: string): number => {
  let bytes = text.length
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i)
    if (c < 0x80) continue
    if (c < 0x800) {
      bytes += 1
    } else if (c >= 0xd800 && c < 0xdc00 && i + 1 < text.length && (text.charCodeAt(i + 1) & 0xfc00) === 0xdc00) {
      // A surrogate pair: two code units, four bytes.
      bytes += 2
      i++
    } else {
      bytes += 2
    }
  }
  return bytes
}

/** @internal */
export const utf8Encode = (text: string): Uint8Array => {
  const out = new Uint8Array(utf8Length(text))
  utf8EncodeInto(text, out, 0)
  return out
}

/**
 * Writes the UTF-8 bytes of `text` into `out` from `at` (which has room for `utf8Length(text)` of them); returns
 * where they end.
 *
 * @internal
 */
export const utf8EncodeInto = (text: string, out: Uint8Array, from: number): number => {
  let at = from
  for (let i = 0; i < text.length; i++) {
    let c = text.charCodeAt(i)
    if (c < 0x80) {
      out[at++] = c
      continue
    }
    if (c < 0x800) {
      out[at++] = 0xc0 | (c >> 6)
      out[at++] = 0x80 | (c & 0x3f)
      continue
    }
    if (c >= 0xd800 && c < 0xe000) {
      const next = i + 1 < text.length ? text.charCodeAt(i + 1) : 0
      if (c < 0xdc00 && (next & 0xfc00) === 0xdc00) {
        c = 0x10000 + ((c - 0xd800) << 10) + (next - 0xdc00)
        i++
        out[at++] = 0xf0 | (c >> 18)
        out[at++] = 0x80 | ((c >> 12) & 0x3f)
        out[at++] = 0x80 | ((c >> 6) & 0x3f)
        out[at++] = 0x80 | (c & 0x3f)
        continue
      }
      c = 0xfffd
    }
    out[at++] = 0xe0 | (c >> 12)
    out[at++] = 0x80 | ((c >> 6) & 0x3f)
    out[at++] = 0x80 | (c & 0x3f)
  }
  return at
}
