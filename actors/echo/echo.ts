// The echo topology's actors: `echo.server` answers every ask with what it was sent;
// `echo.pinger` asks a (usually remote) echo actor `count` times and logs each round trip and a
// summary. A minimal example of a topology spanning processes.
import { z } from "zod";
import { defineActor, remoteRef, type ActorSystem } from "../../src/actor/index.ts";

const echoMsg = z.object({ seq: z.number().int(), sentAt: z.number() });
type EchoMsg = z.infer<typeof echoMsg>;

export const echoServer = defineActor<{ served: number }, EchoMsg>({
  name: "echo-server",
  messages: echoMsg,
  init: () => ({ served: 0 }),
  handle(state, msg, ctx) {
    ctx.reply(msg);
    return { served: state.served + 1 };
  },
});

type PingMsg = { tick: true };
interface PingState {
  sent: number;
  rtts: number[];
}

/** Config: `target` (actor path, default "echo"), `count` (default 10), `intervalMs` (default 100). */
export function echoPinger(system: ActorSystem) {
  return defineActor<PingState, PingMsg>({
    name: "echo-pinger",
    init(ctx) {
      ctx.self.tell({ tick: true });
      return { sent: 0, rtts: [] };
    },
    async handle(state, _msg, ctx) {
      const target = String(ctx.config.target ?? "echo");
      const count = Number(ctx.config.count ?? 10);
      const intervalMs = Number(ctx.config.intervalMs ?? 100);
      const t0 = performance.now();
      await remoteRef<EchoMsg>(system, target).ask({ seq: state.sent, sentAt: Date.now() }, { timeoutMs: 5_000 });
      const rtt = performance.now() - t0;
      const rtts = [...state.rtts, rtt];
      ctx.log.info(`ping ${state.sent + 1}/${count} → ${target}: ${rtt.toFixed(2)} ms`);
      if (rtts.length < count) setTimeout(() => ctx.self.tell({ tick: true }), intervalMs);
      else {
        const sorted = [...rtts].sort((a, b) => a - b);
        ctx.log.info(`done: ${count} round trips, p50 ${sorted[Math.floor(count / 2)]!.toFixed(2)} ms, max ${sorted[count - 1]!.toFixed(2)} ms`);
      }
      return { sent: state.sent + 1, rtts };
    },
  });
}
