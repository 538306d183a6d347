// Sharing the job's engines among its rollout instances. A topology may run several rollout actors
// (a `count`, or one per host so that the controller's work is spread over processes); each takes
// prompt groups from the one PROMPTS work queue, and each routes its groups' generations over its own
// share of the engines: its router then sees every request its engines run (cache-aware routing and
// the load it balances stay right), and no process health-checks the whole fleet.
//
// Membership: every instance beats an entry into the job's actors KV bucket (names.kvActors, entries
// expire after MEMBER_TTL_MS without a beat, so a SIGKILLed instance drops out on its own; a stopped one
// deletes its entry). Shares: rendezvous (highest-random-weight) hashing of engine URL against member,
// so that a member joining or leaving moves only the engines it gains or loses; an instance left
// without an engine (more instances than engines) takes the one it scores highest, shared.
import { createHash } from "node:crypto";
import type { KV } from "@nats-io/kv";
import { toTransportError, type Bus } from "../../src/transport/bus.ts";
import { jobNames } from "../../src/transport/names.ts";
import { kvJsonValues } from "../../src/transport/stored.ts";

/** An entry unrenewed for this long expires (the bucket's max age). */
export const MEMBER_TTL_MS = 10_000;
const PREFIX = "rollout.";

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

/** A rollout instance's membership: beat() keeps it listed, members() lists the live ones. */
export class RolloutMembers {
  private constructor(
    private readonly kv: KV,
    private readonly bus: Bus,
    private readonly bucket: string,
    readonly self: string,
  ) {}

  /** Opens (creating if needed) the job's actors bucket for member `self` (the actor's path). */
  static async open(bus: Bus, job: string, self: string): Promise<RolloutMembers> {
    const bucket = jobNames(job).kvActors;
    return new RolloutMembers(await bus.kv(bucket, { history: 1, ttl: MEMBER_TTL_MS }), bus, bucket, self);
  }

  private key(member: string): string {
    return PREFIX + Buffer.from(member, "utf8").toString("base64url");
  }

  /** Renews this member's entry. */
  async beat(): Promise<void> {
    try {
      await this.kv.put(this.key(this.self), text.encode(JSON.stringify({ member: this.self, at: Date.now() })));
    } catch (e) {
      throw toTransportError(e, `writing rollout member ${this.self} to KV bucket '${this.bucket}'`);
    }
  }

  /** Every live member (from the bucket's stream info and one get each: no consumer, src/transport/stored.ts). */
  async members(): Promise<string[]> {
    try {
      const values = (await kvJsonValues(this.bus, this.kv, this.bucket, PREFIX)) as ({ member?: unknown } | null)[];
      return values.flatMap((v) => (typeof v?.member === "string" ? [v.member] : [])).sort();
    } catch (e) {
      throw toTransportError(e, `reading rollout members from KV bucket '${this.bucket}'`);
    }
  }

  /** Removes this member's entry, so the others take over its engines at their next pass. */
  async leave(): Promise<void> {
    try {
      await this.kv.delete(this.key(this.self));
    } catch (e) {
      throw toTransportError(e, `deleting rollout member ${this.self} from KV bucket '${this.bucket}'`);
    }
  }
}
