// Disk full on demand (ooze/testing's `disk-full` fault): a ballast file fills the filesystem under
// a directory until writes fail with ENOSPC, and is removed to free it again. Filling a real disk
// would hurt the machine, so the filler refuses a filesystem with more free space than `maxBytes`
// (default 64 MiB); `mountTmpfs` gives a small one of its own (root only, Linux), and
// `tmpfsUnavailable()` says why not where it cannot (a test skips with that reason).
import { execFileSync } from "node:child_process";
import { mkdirSync, promises as fsp, statfsSync } from "node:fs";
import { join } from "node:path";
import { OozeError } from "../errors.ts";

/** A directory whose filesystem a fault can fill. */
export interface DiskFiller {
  readonly dir: string;
  /** Writes the ballast until the filesystem has no space left. */
  fill(): Promise<void>;
  /** Removes the ballast. */
  free(): Promise<void>;
  /** Bytes free on the filesystem now. */
  freeBytes(): number;
}

/** A filler for the filesystem holding `dir`; refuses (CONFIG_INVALID) one with more than `maxBytes` free. */
export function createDiskFiller(dir: string, opts: { maxBytes?: number } = {}): DiskFiller {
  const maxBytes = opts.maxBytes ?? 64 << 20;
  const ballast = join(dir, ".ooze-disk-full-ballast");
  const freeBytes = () => {
    const s = statfsSync(dir);
    return Number(s.bavail) * Number(s.bsize);
  };
  return {
    dir,
    freeBytes,
    async fill() {
      const free = freeBytes();
      if (free > maxBytes)
        throw new OozeError("CONFIG_INVALID", `disk-full: ${dir} has ${free} bytes free, more than maxBytes ${maxBytes}; refusing to fill a real disk (use mountTmpfs for a small one)`);
      const fh = await fsp.open(ballast, "a");
      try {
        for (const size of [1 << 20, 1 << 16, 1 << 12, 512, 1]) {
          const buf = Buffer.alloc(size);
          for (;;) {
            try {
              await fh.write(buf);
            } catch (e) {
              if ((e as NodeJS.ErrnoException).code === "ENOSPC") break;
              throw e;
            }
          }
        }
      } finally {
        await fh.close().catch(() => {});
      }
    },
    async free() {
      await fsp.rm(ballast, { force: true });
    },
  };
}

/** Why a small tmpfs cannot be mounted here, or null when it can (root on Linux). */
export function tmpfsUnavailable(): string | null {
  if (process.platform !== "linux") return `mounting a tmpfs needs Linux (this is ${process.platform})`;
  if (process.getuid?.() !== 0) return "mounting a tmpfs needs root (run as root, or in a container that allows mount)";
  return null;
}

/** Mounts a tmpfs of `bytes` at `dir` (created); `unmount()` removes it. Throws naming the reason when it cannot. */
export function mountTmpfs(dir: string, bytes: number): { dir: string; unmount(): void } {
  const why = tmpfsUnavailable();
  if (why) throw new OozeError("CONFIG_INVALID", `cannot mount a tmpfs at ${dir}: ${why}`);
  mkdirSync(dir, { recursive: true });
  try {
    execFileSync("mount", ["-t", "tmpfs", "-o", `size=${bytes}`, "tmpfs", dir], { stdio: "pipe" });
  } catch (e) {
    throw new OozeError("CONFIG_INVALID", `cannot mount a tmpfs at ${dir}: ${String((e as { stderr?: Buffer }).stderr ?? (e as Error).message).trim()}`);
  }
  return {
    dir,
    unmount: () => void execFileSync("umount", ["-l", dir], { stdio: "pipe" }),
  };
}
