// Sharing the job's engines among its rollout instances. A topology may run several rollout actors
// (a `count`, or one per host so that the controller's work is spread over processes); each takes
// prompt groups from the one PROMPTS work queue, and each routes its groups' generations over its own
// share of the engines: its router then sees every request its engines run (cache-aware routing and
// the load it balances stay right), and no process health-checks the whole fleet.
//
// Membership: every instance beats an entry into the job's actors KV bucket (names.kvActors, entries
// expire after MEMBER_TTL_MS without a beat, so a SIGKILLed instance drops out on its own; a stopped one
// leaves a tombstone and removes its entry, which the others believe at once). A reader lists the
// members from the bucket's subjects alone (one stream info, whatever the number of instances): the
// key is the member's name, and whether it left is the tombstone's key, not a value to fetch — a get
// per member on every pass of every instance made membership K² requests a pass at K instances. The beats go out from the bus's
// heartbeat worker (src/transport/heartbeats.ts), so an instance whose event loop stalls keeps its
// entry for up to the stall limit (a minute): at 1,024 engines (Dec 1) stalls of 10–57 s expired the
// entries beaten from the event loop, and the shares changed 12 times in an hour. A reader counts a member it has seen
// until the member has been missing from the bucket for MEMBER_GRACE_MS and for MEMBER_MISSED_READS
// reads in a row: when the machine stalled every process at once (two cores at 1,024 simulated
// engines, Dec 1), every entry expired, each instance read the others as gone and took every engine,
// and the hand-overs that followed failed thousands of episodes.
// Shares: rendezvous (highest-random-weight) hashing of engine URL against member, so that a member
// joining or leaving moves only the engines it gains or loses; an instance left without an engine
// (more instances than engines) takes the one it scores highest, shared.
import { createHash } from "node:crypto";
import type { KV } from "@nats-io/kv";
import { toTransportError, type Bus } from "../../src/transport/bus.ts";
import { defaultStallLimitMs } from "../../src/transport/heartbeats.ts";
import { jobNames } from "../../src/transport/names.ts";
import { kvKeys } from "../../src/transport/stored.ts";

/** An entry unrenewed for this long expires (the bucket's max age). */
export const MEMBER_TTL_MS = 10_000;
/** A member seen before is still counted until it has been missing from the bucket this long (this reader's clock)… */
export const MEMBER_GRACE_MS = 10_000;
/** …and for this many reads in a row (a reader that itself stalled past the grace reads again before it believes). */
export const MEMBER_MISSED_READS = 3;
const PREFIX = "rollout.";
/** A member that left: `rollout.left.<name>` beside its (removed) `rollout.<name>` (names are base64url, without dots). */
const LEFT = "left.";

/** Membership timings (the defaults above; tests shorten them). */
export interface MembershipOptions {
  ttlMs?: number;
  graceMs?: number;
  missedReads?: number;
  /** How long the heartbeat worker renews the entry while the event loop does not run (default: defaultStallLimitMs of the TTL, a minute). */
  stallLimitMs?: number;
}

/** Rendezvous score of an engine for a member (the first 48 bits of SHA-1 of both). */
function score(member: string, url: string): number {
  return createHash("sha1").update(member).update("\n").update(url).digest().readUIntBE(0, 6);
}

/**
 * The engines of `urls` that member `self` routes over, given every live member (self included or
 * not): those it scores highest among the members, or, where that leaves none, its best one.
 */
export function engineShare(urls: readonly string[], members: readonly string[], self: string): string[] {
  const all = members.includes(self) ? members : [...members, self];
  if (all.length === 1) return [...urls];
  const mine: string[] = [];
  let best: { url: string; s: number } | null = null;
  for (const url of urls) {
    const own = score(self, url);
    if (!best || own > best.s) best = { url, s: own };
    if (all.every((m) => m === self || score(m, url) < own)) mine.push(url);
  }
  return mine.length > 0 || !best ? mine : [best.url];
}

const text = new TextEncoder();

/** A rollout instance's membership: beat() lists it, keep() keeps it listed, members() lists the live ones. */
export class RolloutMembers {
  /** Members this reader has seen: when it last saw each, and the reads in a row that missed it since. */
  private readonly seen = new Map<string, { at: number; missed: number }>();
  private kept = false;

  private constructor(
    private readonly kv: KV,
    private readonly bus: Bus,
    private readonly bucket: string,
    readonly self: string,
    private readonly graceMs: number,
    private readonly missedReads: number,
    private readonly stallLimitMs: number,
  ) {}

  /** Opens (creating if needed) the job's actors bucket for member `self` (the actor's path). */
  static async open(bus: Bus, job: string, self: string, opts: MembershipOptions = {}): Promise<RolloutMembers> {
    const bucket = jobNames(job).kvActors;
    const ttlMs = opts.ttlMs ?? MEMBER_TTL_MS;
    const kv = await bus.kv(bucket, { history: 1, ttl: ttlMs });
    return new RolloutMembers(kv, bus, bucket, self, opts.graceMs ?? MEMBER_GRACE_MS, opts.missedReads ?? MEMBER_MISSED_READS, opts.stallLimitMs ?? defaultStallLimitMs(ttlMs));
  }

  private key(member: string): string {
    return PREFIX + tokenOf(member);
  }

  private leftKey(member: string): string {
    return PREFIX + LEFT + tokenOf(member);
  }

  /** Removes every message of `key` from the bucket's stream (its subject then lists nothing). */
  private async purge(key: string): Promise<void> {
    const jsm = await this.bus.jsm();
    await jsm.streams.purge(`KV_${this.bucket}`, { filter: `$KV.${this.bucket}.${key}` });
  }

  /** The subject a put of this member's entry is published to (the KV bucket's stream takes $KV.<bucket>.<key>). */
  private get subject(): string {
    return `$KV.${this.bucket}.${this.key(this.self)}`;
  }

  private entry(): Uint8Array {
    return text.encode(JSON.stringify({ member: this.self }));
  }

  /**
   * Renews this member's entry every `everyMs` from the bus's heartbeat worker, until leave(); the
   * worker's failures to renew go to `log`.
   */
  keep(everyMs: number, log: (line: string) => void): void {
    this.kept = true;
    this.bus.heartbeats().keep(this.subject, this.entry(), everyMs, this.stallLimitMs, (m) => log(`rollout member ${this.self}: ${m}`));
  }

  /** Writes this member's entry once (and takes away a tombstone of an earlier incarnation's leave first). */
  async beat(): Promise<void> {
    try {
      await this.purge(this.leftKey(this.self));
      await this.kv.put(this.key(this.self), this.entry());
    } catch (e) {
      throw toTransportError(e, `writing rollout member ${this.self} to KV bucket '${this.bucket}'`);
    }
  }

  /**
   * Every live member: those with an entry in the bucket and no tombstone (from the stream's subjects:
   * one request, src/transport/stored.ts), and those this reader saw that have been missing for less
   * than the grace period or fewer reads than `missedReads`; a member with a tombstone is gone at once.
   */
  async members(): Promise<string[]> {
    let keys: string[];
    try {
      keys = await kvKeys(this.bus, this.bucket, PREFIX);
    } catch (e) {
      throw toTransportError(e, `reading rollout members from KV bucket '${this.bucket}'`);
    }
    const entries = new Set<string>();
    const left = new Set<string>();
    for (const k of keys) {
      const name = k.slice(PREFIX.length);
      if (name.startsWith(LEFT)) left.add(memberOf(name.slice(LEFT.length)));
      else if (!name.includes(".")) entries.add(memberOf(name));
    }
    const now = performance.now();
    const listed = new Set<string>();
    for (const m of left) this.seen.delete(m);
    for (const m of entries) if (!left.has(m)) listed.add(m);
    for (const m of listed) this.seen.set(m, { at: now, missed: 0 });
    for (const [m, s] of this.seen) {
      if (listed.has(m)) continue;
      s.missed++;
      if (s.missed >= this.missedReads && now - s.at >= this.graceMs) this.seen.delete(m);
    }
    return [...this.seen.keys()].sort();
  }

  /**
   * Leaves a tombstone (it expires like an entry) and removes this member's entry, so the others take
   * over its engines at their next pass. The tombstone first: a reader between the two sees both, and
   * a tombstone wins.
   */
  async leave(): Promise<void> {
    // the worker's renewals stop first, and one in flight is answered before the entry goes
    if (this.kept) await this.bus.heartbeats().unkeep(this.subject);
    this.kept = false;
    try {
      await this.kv.put(this.leftKey(this.self), this.entry());
      await this.purge(this.key(this.self));
    } catch (e) {
      throw toTransportError(e, `marking rollout member ${this.self} as left in KV bucket '${this.bucket}'`);
    }
  }
}

/** A member's name as its keys' last token (base64url: no dots), and back. */
function tokenOf(member: string): string {
  return Buffer.from(member, "utf8").toString("base64url");
}

function memberOf(token: string): string {
  return Buffer.from(token, "base64url").toString("utf8");
}
