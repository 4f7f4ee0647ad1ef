import * as PlatformError from "@effect/platform/Error"
import * as FileSystem from "@effect/platform/FileSystem"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"

// A disk in memory that remembers, next to what every file and directory holds, what it holds for sure: a file's
// content as of its last `sync`, a directory's entries as of its last `sync` (a directory is synced by opening it and
// syncing the handle, as on POSIX). A test lets code run on it, crashes the machine after any chosen operation (every
// later call fails), then reboots: the new disk keeps what a crash may keep, chosen by the test.

class FileNode {
  /** What reads see. */
  data: Uint8Array = new Uint8Array(0)
  /** What the disk holds for sure: the content as of the last sync. */
  synced: Uint8Array = new Uint8Array(0)
}

class DirectoryNode {
  readonly entries = new Map<string, Node>()
  /** The entries as of the last sync; a new directory has none for sure. */
  synced = new Map<string, Node>()
}

type Node = FileNode | DirectoryNode

/**
 * What a crash keeps of the names in directories (files and directories made, linked, renamed or removed):
 * - `"kept"`: every change, synced or not, as a journaling file system (ext4, XFS) keeps its metadata in order;
 * - `"synced"`: a directory holds only the entries it held when it was last synced, which is all POSIX promises.
 */
export type Entries = "kept" | "synced"

/** What a crash leaves of a file whose content was changed since its last sync. */
export type Tear =
  /** The content as of its last sync (empty if it never was). */
  | { readonly _tag: "Old" }
  /** The new content, cut after `length` bytes: a write the crash interrupted. */
  | { readonly _tag: "Cut"; readonly length: number }

/** A file whose content is not all synced, with every name it has in the chosen view of the directories. */
export interface Unsynced {
  readonly paths: ReadonlyArray<string>
  readonly old: Uint8Array
  readonly written: Uint8Array
}

/** How a crash went: what it kept of directories, and what of each unsynced file. */
export interface Crash {
  readonly entries: Entries
  readonly tear: (file: Unsynced) => Tear
}

const sameBytes = (a: Uint8Array, b: Uint8Array) => a.length === b.length && a.every((byte, i) => byte === b[i])

/** The tears worth trying for a file: its old content, its new content cut at 0, 1, half and all but one byte. */
export const tearsOf = (file: Unsynced): ReadonlyArray<Tear> => {
  const n = file.written.length
  const lengths = [...new Set([0, 1, Math.floor(n / 2), n - 1])].filter((length) => length >= 0 && length < n)
  return [{ _tag: "Old" }, ...lengths.map((length): Tear => ({ _tag: "Cut", length }))]
}

class Failure {
  constructor(readonly error: PlatformError.SystemError) {}
}

const systemError = (reason: PlatformError.SystemErrorReason, method: string, path: string, description: string) =>
  new Failure(
    new PlatformError.SystemError({ reason, module: "FileSystem", method, pathOrDescriptor: path, description })
  )

/** The names of an absolute path, with `.` and `..` resolved. */
const namesOf = (method: string, path: string): Array<string> => {
  if (!path.startsWith("/")) throw systemError("BadResource", method, path, "the crash disk takes absolute paths")
  const names: Array<string> = []
  for (const name of path.split("/")) {
    if (name === "" || name === ".") continue
    if (name === "..") names.pop()
    else names.push(name)
  }
  return names
}

const notModelled = (method: string) => Effect.dieMessage(`the crash disk does not model FileSystem.${method}`)

/**
 * A disk in memory for one boot: `fileSystem` is what the code under test gets; `crashAfter` arms the crash;
 * `reboot` gives the disk the crash leaves.
 */
export class CrashDisk {
  private count = 0
  private limit = Number.POSITIVE_INFINITY
  private down = false
  private nextFd = 3

  private constructor(private readonly root: DirectoryNode) {}

  /** An empty disk: only `/`. */
  static empty(): CrashDisk {
    return new CrashDisk(new DirectoryNode())
  }

  /** Completed operations that change the disk (what a read does cannot change what a crash keeps). */
  get operations(): number {
    return this.count
  }

  get crashed(): boolean {
    return this.down
  }

  /** The machine crashes once `count` operations that change the disk have completed (at once if they have). */
  crashAfter(count: number): void {
    this.limit = count
    if (this.count >= count) this.down = true
  }

  /** Files whose content is not all synced, reachable in the view of the directories a crash keeps. */
  unsynced(entries: Entries): ReadonlyArray<Unsynced> {
    return [...this.unsyncedNodes(entries).values()]
  }

  private unsyncedNodes(entries: Entries): Map<FileNode, Unsynced> {
    const found = new Map<FileNode, Unsynced>()
    const seen = new Set<DirectoryNode>()
    const walk = (directory: DirectoryNode, path: string) => {
      if (seen.has(directory)) return
      seen.add(directory)
      for (const [name, node] of entries === "kept" ? directory.entries : directory.synced) {
        const child = `${path}/${name}`
        if (node instanceof DirectoryNode) walk(node, child)
        else if (!sameBytes(node.data, node.synced)) {
          found.set(node, { paths: [...(found.get(node)?.paths ?? []), child], old: node.synced, written: node.data })
        }
      }
    }
    walk(this.root, "")
    return found
  }

  /** The disk as the crash leaves it, everything on it synced: the machine after a reboot. */
  reboot(crash: Crash): CrashDisk {
    const unsynced = this.unsyncedNodes(crash.entries)
    const copies = new Map<Node, Node>()
    const copy = (node: Node): Node => {
      const known = copies.get(node)
      if (known !== undefined) return known
      if (node instanceof FileNode) {
        const file = new FileNode()
        const described = unsynced.get(node)
        const tear = described === undefined ? undefined : crash.tear(described)
        file.data = tear === undefined
          ? node.data.slice()
          : tear._tag === "Old"
          ? node.synced.slice()
          : node.data.slice(0, Math.max(0, Math.min(tear.length, node.data.length)))
        file.synced = file.data
        copies.set(node, file)
        return file
      }
      const directory = new DirectoryNode()
      copies.set(node, directory)
      for (const [name, child] of crash.entries === "kept" ? node.entries : node.synced) {
        directory.entries.set(name, copy(child))
      }
      directory.synced = new Map(directory.entries)
      return directory
    }
    const root = copy(this.root)
    return new CrashDisk(root instanceof DirectoryNode ? root : new DirectoryNode())
  }

  // --- the file system ---

  /** A read: fails once the machine is down. */
  private read<A>(method: string, path: string, f: () => A): Effect.Effect<A, PlatformError.PlatformError> {
    return Effect.suspend(() => {
      if (this.down) return Effect.fail(systemError("Unknown", method, path, "the machine crashed").error)
      try {
        return Effect.succeed(f())
      } catch (error) {
        if (error instanceof Failure) return Effect.fail(error.error)
        throw error
      }
    })
  }

  /** An operation that changes the disk: counted once it completed, and the machine goes down at the limit. */
  private change<A>(method: string, path: string, f: () => A): Effect.Effect<A, PlatformError.PlatformError> {
    return Effect.tap(this.read(method, path, f), () => {
      this.count++
      if (this.count >= this.limit) this.down = true
    })
  }

  private lookup(method: string, path: string): Node | undefined {
    let node: Node = this.root
    for (const name of namesOf(method, path)) {
      if (!(node instanceof DirectoryNode)) throw systemError("BadResource", method, path, "not a directory")
      const child: Node | undefined = node.entries.get(name)
      if (child === undefined) return undefined
      node = child
    }
    return node
  }

  private existing(method: string, path: string): Node {
    const node = this.lookup(method, path)
    if (node === undefined) throw systemError("NotFound", method, path, "no such file or directory")
    return node
  }

  /** The directory that holds `path`, and its name there. */
  private place(method: string, path: string): { readonly directory: DirectoryNode; readonly name: string } {
    const names = namesOf(method, path)
    const name = names.pop()
    if (name === undefined) throw systemError("BadResource", method, path, "the root has no name")
    const directory = this.lookup(method, `/${names.join("/")}`)
    if (directory === undefined) throw systemError("NotFound", method, path, "no such directory")
    if (!(directory instanceof DirectoryNode)) throw systemError("BadResource", method, path, "not a directory")
    return { directory, name }
  }

  private info(node: Node): FileSystem.File.Info {
    return {
      type: node instanceof DirectoryNode ? "Directory" : "File",
      mtime: Option.none(),
      atime: Option.none(),
      birthtime: Option.none(),
      dev: 0,
      ino: Option.none(),
      mode: 0o644,
      nlink: Option.none(),
      uid: Option.none(),
      gid: Option.none(),
      rdev: Option.none(),
      size: FileSystem.Size(node instanceof DirectoryNode ? 0 : node.data.length),
      blksize: Option.none(),
      blocks: Option.none()
    }
  }

  private handle(
    node: Node,
    path: string,
    append: boolean
  ): { readonly file: FileSystem.File; readonly close: () => void } {
    const fd = this.nextFd++
    let position = 0
    let closed = false
    const usable = (method: string) => {
      if (closed) throw systemError("BadResource", method, path, "the file is closed")
      return node
    }
    const writable = (method: string) => {
      const file = usable(method)
      if (!(file instanceof FileNode)) throw systemError("BadResource", method, path, "a directory")
      return file
    }
    const write = (method: string, bytes: Uint8Array) =>
      this.change(method, path, () => {
        const file = writable(method)
        const at = append ? file.data.length : position
        const data = new Uint8Array(Math.max(file.data.length, at + bytes.length))
        data.set(file.data)
        data.set(bytes, at)
        file.data = data
        position = at + bytes.length
        return FileSystem.Size(bytes.length)
      })
    const file: FileSystem.File = {
      [FileSystem.FileTypeId]: FileSystem.FileTypeId,
      fd: FileSystem.FileDescriptor(fd),
      stat: this.read("stat", path, () => this.info(usable("stat"))),
      seek: (offset, from) =>
        Effect.sync(() => {
          position = (from === "start" ? 0 : position) + Number(offset)
        }),
      sync: this.change("sync", path, () => {
        const synced = usable("sync")
        if (synced instanceof FileNode) synced.synced = synced.data.slice()
        else synced.synced = new Map(synced.entries)
      }),
      read: (buffer) =>
        this.read("read", path, () => {
          const source = writable("read")
          const bytes = source.data.subarray(position, position + buffer.length)
          buffer.set(bytes)
          position += bytes.length
          return FileSystem.Size(bytes.length)
        }),
      readAlloc: (size) =>
        this.read("readAlloc", path, () => {
          const source = writable("readAlloc")
          const bytes = source.data.slice(position, position + Number(size))
          position += bytes.length
          return bytes.length === 0 ? Option.none() : Option.some(bytes)
        }),
      truncate: (length) =>
        this.change("truncate", path, () => {
          const target = writable("truncate")
          const data = new Uint8Array(Number(length ?? 0))
          data.set(target.data.subarray(0, data.length))
          target.data = data
        }),
      write: (bytes) => write("write", bytes),
      writeAll: (bytes) => Effect.asVoid(write("writeAll", bytes))
    }
    return {
      file,
      close: () => {
        closed = true
      }
    }
  }

  private openNode(path: string, flag: FileSystem.OpenFlag): Node {
    const method = "open"
    const creates = flag !== "r" && flag !== "r+"
    const exclusive = flag.includes("x")
    const node = this.lookup(method, path)
    if (node !== undefined) {
      if (exclusive) throw systemError("AlreadyExists", method, path, "the file exists")
      if (node instanceof DirectoryNode && flag !== "r") throw systemError("BadResource", method, path, "a directory")
      if (node instanceof FileNode && flag.startsWith("w")) node.data = new Uint8Array(0)
      return node
    }
    if (!creates) throw systemError("NotFound", method, path, "no such file or directory")
    const { directory, name } = this.place(method, path)
    const file = new FileNode()
    directory.entries.set(name, file)
    return file
  }

  /** The file system of this boot, for the code under test. */
  readonly fileSystem: FileSystem.FileSystem = FileSystem.make({
    access: (path) => this.read("access", path, () => void this.existing("access", path)),
    chmod: () => notModelled("chmod"),
    chown: () => notModelled("chown"),
    copy: () => notModelled("copy"),
    copyFile: (from, to) =>
      this.change("copyFile", to, () => {
        const source = this.existing("copyFile", from)
        if (!(source instanceof FileNode)) throw systemError("BadResource", "copyFile", from, "a directory")
        const { directory, name } = this.place("copyFile", to)
        const file = new FileNode()
        file.data = source.data.slice()
        directory.entries.set(name, file)
      }),
    link: (from, to) =>
      this.change("link", to, () => {
        const source = this.existing("link", from)
        if (!(source instanceof FileNode)) throw systemError("PermissionDenied", "link", from, "a directory")
        const { directory, name } = this.place("link", to)
        if (directory.entries.has(name)) throw systemError("AlreadyExists", "link", to, "the name is taken")
        directory.entries.set(name, source)
      }),
    makeDirectory: (path, options) =>
      this.change("makeDirectory", path, () => {
        if (options?.recursive !== true) {
          const { directory, name } = this.place("makeDirectory", path)
          if (directory.entries.has(name)) throw systemError("AlreadyExists", "makeDirectory", path, "it exists")
          directory.entries.set(name, new DirectoryNode())
          return
        }
        let directory = this.root
        for (const name of namesOf("makeDirectory", path)) {
          let child = directory.entries.get(name)
          if (child === undefined) {
            child = new DirectoryNode()
            directory.entries.set(name, child)
          }
          if (!(child instanceof DirectoryNode)) {
            throw systemError("AlreadyExists", "makeDirectory", path, `${name} is a file`)
          }
          directory = child
        }
      }),
    makeTempDirectory: () => notModelled("makeTempDirectory"),
    makeTempDirectoryScoped: () => notModelled("makeTempDirectoryScoped"),
    makeTempFile: () => notModelled("makeTempFile"),
    makeTempFileScoped: () => notModelled("makeTempFileScoped"),
    open: (path, options) => {
      const flag = options?.flag ?? "r"
      const opened = flag === "r" || flag === "r+"
        ? this.read("open", path, () => this.openNode(path, flag))
        : this.change("open", path, () => this.openNode(path, flag))
      return Effect.acquireRelease(
        Effect.map(opened, (node) => this.handle(node, path, flag.startsWith("a"))),
        (handle) => Effect.sync(handle.close)
      ).pipe(Effect.map((handle) => handle.file))
    },
    readDirectory: (path, options) =>
      options?.recursive === true ? notModelled("readDirectory (recursive)") : this.read("readDirectory", path, () => {
        const node = this.existing("readDirectory", path)
        if (!(node instanceof DirectoryNode)) throw systemError("BadResource", "readDirectory", path, "not a directory")
        return [...node.entries.keys()]
      }),
    readFile: (path) =>
      this.read("readFile", path, () => {
        const node = this.existing("readFile", path)
        if (!(node instanceof FileNode)) throw systemError("BadResource", "readFile", path, "a directory")
        return node.data.slice()
      }),
    readLink: () => notModelled("readLink"),
    realPath: () => notModelled("realPath"),
    remove: (path, options) =>
      this.change("remove", path, () => {
        const node = this.lookup("remove", path)
        if (node === undefined) {
          if (options?.force === true) return
          throw systemError("NotFound", "remove", path, "no such file or directory")
        }
        if (node instanceof DirectoryNode && node.entries.size > 0 && options?.recursive !== true) {
          throw systemError("BadResource", "remove", path, "the directory is not empty")
        }
        const { directory, name } = this.place("remove", path)
        directory.entries.delete(name)
      }),
    rename: (from, to) =>
      this.change("rename", to, () => {
        const node = this.existing("rename", from)
        const source = this.place("rename", from)
        const target = this.place("rename", to)
        const replaced = target.directory.entries.get(target.name)
        if (replaced instanceof DirectoryNode) throw systemError("BadResource", "rename", to, "a directory")
        source.directory.entries.delete(source.name)
        target.directory.entries.set(target.name, node)
      }),
    stat: (path) => this.read("stat", path, () => this.info(this.existing("stat", path))),
    symlink: () => notModelled("symlink"),
    truncate: (path, length) =>
      this.change("truncate", path, () => {
        const node = this.existing("truncate", path)
        if (!(node instanceof FileNode)) throw systemError("BadResource", "truncate", path, "a directory")
        const data = new Uint8Array(Number(length ?? 0))
        data.set(node.data.subarray(0, data.length))
        node.data = data
      }),
    utimes: () => notModelled("utimes"),
    watch: () => {
      throw new Error("the crash disk does not model FileSystem.watch")
    },
    writeFile: (path, data, options) =>
      this.change("writeFile", path, () => {
        const node = this.openNode(path, options?.flag ?? "w")
        if (!(node instanceof FileNode)) throw systemError("BadResource", "writeFile", path, "a directory")
        const written = new Uint8Array(node.data.length + data.length)
        written.set(node.data)
        written.set(data, node.data.length)
        node.data = written
      })
  })
}
