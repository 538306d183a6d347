// Sharing the job's engines among its rollout instances. A topology may run several rollout actors
// (a `count`, or one per host so that the controller's work is spread over processes); each takes
// prompt groups from the one PROMPTS work queue, and each routes its groups' generations over its own
// share of the engines: its router then sees every request its engines run (cache-aware routing and
// the load it balances stay right), and no process health-checks the whole fleet.
//
// Membership: every instance beats an entry into the job's actors KV bucket (names.kvActors, entries
// expire after MEMBER_TTL_MS without a beat, so a SIGKILLed instance drops out on its own; a stopped one
// marks its entry as left, which the others believe at once). The beats go out from the bus's
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
import { kvJsonValues } from "../../src/transport/stored.ts";

/** An entry unrenewed for this long expires (the bucket's max age). */
export const MEMBER_TTL_MS = 10_000;
/** A member seen before is still counted until it has been missing from the bucket this long (this reader's clock)… */
export const MEMBER_GRACE_MS = 10_000;
/** …and for this many reads in a row (a reader that itself stalled past the grace reads again before it believes). */
export const MEMBER_MISSED_READS = 3;
const PREFIX = "rollout.";

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
    return PREFIX + Buffer.from(member, "utf8").toString("base64url");
  }

  /** The subject a put of this member's entry is published to (the KV bucket's stream takes $KV.<bucket>.<key>). */
  private get subject(): string {
    return `$KV.${this.bucket}.${this.key(this.self)}`;
  }

  private entry(left: boolean): Uint8Array {
    return text.encode(JSON.stringify({ member: this.self, ...(left ? { left: true } : {}) }));
  }

  private async put(left: boolean): Promise<void> {
    await this.kv.put(this.key(this.self), this.entry(left));
  }

  /**
   * Renews this member's entry every `everyMs` from the bus's heartbeat worker, until leave(); the
   * worker's failures to renew go to `log`.
   */
  keep(everyMs: number, log: (line: string) => void): void {
    this.kept = true;
    this.bus.heartbeats().keep(this.subject, this.entry(false), everyMs, this.stallLimitMs, (m) => log(`rollout member ${this.self}: ${m}`));
  }

  /** Writes this member's entry once. */
  async beat(): Promise<void> {
    try {
      await this.put(false);
    } catch (e) {
      throw toTransportError(e, `writing rollout member ${this.self} to KV bucket '${this.bucket}'`);
    }
  }

  /**
   * Every live member: those in the bucket (from its stream info and one get each: no consumer,
   * src/transport/stored.ts), and those this reader saw that have been missing for less than the
   * grace period or fewer reads than `missedReads`; a member whose entry says it left is gone at once.
   */
  async members(): Promise<string[]> {
    let values: ({ member?: unknown; left?: unknown } | null)[];
    try {
      values = (await kvJsonValues(this.bus, this.kv, this.bucket, PREFIX)) as typeof values;
    } catch (e) {
      throw toTransportError(e, `reading rollout members from KV bucket '${this.bucket}'`);
    }
    const now = performance.now();
    const listed = new Set<string>();
    for (const v of values) {
      if (typeof v?.member !== "string") continue;
      if (v.left === true) this.seen.delete(v.member);
      else listed.add(v.member);
    }
    for (const m of listed) this.seen.set(m, { at: now, missed: 0 });
    for (const [m, s] of this.seen) {
      if (listed.has(m)) continue;
      s.missed++;
      if (s.missed >= this.missedReads && now - s.at >= this.graceMs) this.seen.delete(m);
    }
    return [...this.seen.keys()].sort();
  }

  /** Marks this member's entry as left (it expires like any other), so the others take over its engines at their next pass. */
  async leave(): Promise<void> {
    // the worker's renewals stop first, and one in flight is answered before the entry says left
    if (this.kept) await this.bus.heartbeats().unkeep(this.subject);
    this.kept = false;
    try {
      await this.put(true);
    } catch (e) {
      throw toTransportError(e, `marking rollout member ${this.self} as left in KV bucket '${this.bucket}'`);
    }
  }
}
