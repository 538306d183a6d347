// The control plane of a node process over NATS (`names.control(node)`): `ps` lists the node's actors
// with status, restarts and mailbox depth; `down` drains the mailboxes and stops the system; `crash`
// crashes one actor as if its handler threw (fault injection, ooze/testing's `actor` fault). What
// `ooze ps` / `ooze down` talk to.
import { z } from "zod";
import { encode, makeEnvelope } from "../codec/index.ts";
import { OozeError, type WireError } from "../errors.ts";
import type { Bus } from "../transport/bus.ts";
import { jobNames } from "../transport/names.ts";
import { decodeEnvelope, remoteLayer } from "./remote.ts";
import type { ActorSystem } from "./system.ts";
import type { ActorInfo } from "./types.ts";

export const CONTROL_KIND = "ooze.control";
export const CONTROL_REPLY_KIND = "ooze.control.reply";

/** A control request. */
export type ControlRequest = { op: "ps" } | { op: "down"; drainMs?: number } | { op: "crash"; actor: string; reason?: string };

/** Answer to `crash`: whether the actor was running (and so crashed). */
export interface CrashReply {
  node: string;
  actor: string;
  crashed: boolean;
}

/** Answer to `ps`. */
export interface PsReply {
  node: string;
  system: string;
  pid: number;
  actors: ActorInfo[];
  failure: WireError | null;
  /** The node process's Prometheus endpoint (http://host:port/metrics), or null when it serves none. */
  metrics: string | null;
}

/** Answer to `down`. */
export interface DownReply {
  node: string;
  drained: boolean;
}

const requestSchema = z.discriminatedUnion("op", [
  z.object({ op: z.literal("ps") }),
  z.object({ op: z.literal("down"), drainMs: z.number().int().min(0).optional() }),
  z.object({ op: z.literal("crash"), actor: z.string().min(1), reason: z.string().optional() }),
]);

/**
 * Serves the control subject of `node` for a system with a bus attached; resolves with the
 * unsubscribe once the server has the subscription (a request from another connection sent after
 * that finds a responder).
 */
export async function serveControl(
  system: ActorSystem, node: string, opts: { onDown?: () => void | Promise<void>; metricsUrl?: () => string | null } = {},
): Promise<() => void> {
  const { bus, names } = remoteLayer(system);
  const sub = bus.subscribe(names.control(node), {
    handler: async (m) => {
      if (!m.reply) return;
      let reply: unknown;
      try {
        const env = decodeEnvelope(m.data, CONTROL_KIND);
        const req = requestSchema.parse(env.body);
        if (req.op === "ps") {
          reply = { ok: true, value: { node, system: system.name, pid: process.pid, actors: system.list(), failure: system.failure?.toWire() ?? null, metrics: opts.metricsUrl?.() ?? null } satisfies PsReply };
        } else if (req.op === "crash") {
          const crashed = system.crash(req.actor, req.reason ?? `crashed by a control request to node '${node}'`);
          reply = { ok: true, value: { node, actor: req.actor, crashed } satisfies CrashReply };
        } else {
          // Answer after draining, then stop serving and let the process exit.
          const drained = await system.drain({ timeoutMs: req.drainMs ?? 10_000 });
          reply = { ok: true, value: { node, drained } satisfies DownReply };
          setImmediate(() => void opts.onDown?.());
        }
      } catch (e) {
        const err = e instanceof OozeError ? e : new OozeError("BAD_REQUEST", `control request to node '${node}' is invalid: ${(e as Error).message}`);
        reply = { ok: false, error: err.toWire() };
      }
      await m.respond(encode(makeEnvelope(CONTROL_REPLY_KIND, 1, reply))).catch(() => {});
    },
  });
  await bus.flush();
  return () => sub.unsubscribe();
}

/** Sends a control request to a node of a job; rejects with the node's error, TimeoutError or ACTOR_NOT_FOUND. */
export async function controlRequest<R = PsReply | DownReply | CrashReply>(bus: Bus, job: string, node: string, req: ControlRequest, timeoutMs = 5_000): Promise<R> {
  const names = jobNames(job);
  // `ps` only reads and a second `down` of a draining node drains on: both are sent again when the
  // connection comes back meanwhile (a job whose one `down` was lost so never exited). A `crash` is not.
  const msg = await bus.request(names.control(node), encode(makeEnvelope(CONTROL_KIND, 1, req)), { timeoutMs, resendOnReconnect: req.op !== "crash" });
  const env = decodeEnvelope(msg.data, CONTROL_REPLY_KIND);
  const body = env.body as { ok: boolean; value?: unknown; error?: WireError };
  if (!body.ok) throw OozeError.fromWire(body.error as WireError);
  return body.value as R;
}
