// The weight-sync actor (kind `train.weight-sync`, one per job): consumes WEIGHTS in order and, for
// each version above the engines' one, has the fleet actor walk every engine through pause →
// update_weights_from_disk → continue (FullWeightSync over an ask to the fleet, which checks each
// engine's reported version), then records {version, modelDir, step} in the job's versions KV bucket
// (compare-and-set, never backwards). The buffer feeds the next step once that record is there.
import { z } from "zod";
import { defineActor, remoteRef, type ActorSystem } from "../../src/actor/index.ts";
import { OozeError } from "../../src/errors.ts";
import type { Topology } from "../../src/topology/schema.ts";
import { askFleet, type FleetMsg, type FleetReply } from "../fleet/messages.ts";
import { actorConfig, trainOf, loopControl, loopEnv, type LoopControl } from "../loop-actors/context.ts";
import { weightsRegistry } from "../loop-actors/messages.ts";
import { consumeStream, ensureTrainStreams, VersionsKv, type StreamConsumer } from "../loop-actors/streams.ts";
import type { Generator } from "../loop/engines.ts";
import { FullWeightSync } from "./full.ts";

/** The weight-sync actor's `config`. */
export const weightSyncActorConfig = z.object({
  /** Path of the fleet actor that owns the engines. */
  fleet: z.string().min(1).default("fleet"),
  /** Deadline of one fleet update (all engines). */
  updateTimeoutMs: z.number().int().min(1000).default(120_000),
  ackWaitMs: z.number().int().min(500).default(60_000),
});

interface WeightSyncState {
  consumer: StreamConsumer;
}

/**
 * A Generator whose only ability is updating weights, through the fleet actor. An update that failed
 * after the fleet applied it (e.g. recording it in KV while NATS restarted: the fleet then refuses
 * the same version again) counts as done when the fleet and its healthy engines report the version.
 */
function fleetUpdater(ask: (msg: FleetMsg) => Promise<Extract<FleetReply, { ok: true }>>): Generator {
  const no = (): never => {
    throw new OozeError("INTERNAL", "weight-sync: only updates weights");
  };
  return {
    generate: no,
    replace: no,
    takeCacheStats: () => ({ promptTokens: 0, cachedTokens: 0 }),
    async updateWeights(modelDir, version) {
      try {
        await ask({ op: "updateWeights", modelDir, version });
      } catch (e) {
        const r = await ask({ op: "list" });
        const healthy = r.engines.filter((x) => x.healthy);
        if (r.weightVersion === version && healthy.length > 0 && healthy.every((x) => x.weightVersion === version)) return;
        throw e;
      }
    },
  };
}

/** The weight-sync actor definition for a node's system and topology. */
export function weightSyncActor(system: ActorSystem, topology: Topology) {
  trainOf(topology); // a bad train: section fails the node at start, not at every restart
  return defineActor<WeightSyncState, LoopControl>({
    name: "train-weight-sync",
    messages: loopControl,
    async init(ctx) {
      const env = loopEnv(system, topology, ctx as never);
      const cfg = actorConfig(weightSyncActorConfig, ctx as never);
      await ensureTrainStreams(env.bus, env.names, env.train);
      const versions = await VersionsKv.open(env.bus, env.names);
      const fleet = remoteRef<FleetMsg>(system, cfg.fleet);
      const start = (await versions.get())?.version ?? -1;
      const sync = new FullWeightSync(fleetUpdater((m) => askFleet(fleet, m, cfg.updateTimeoutMs)), start, (l) => ctx.log.warn(l));
      const consumer = consumeStream({
        bus: env.bus, names: env.names, stream: env.names.streamWeights, subject: env.names.trainWeights, durable: env.names.consumer("train_weight_sync"),
        registry: weightsRegistry, actor: ctx.path, ackWaitMs: cfg.ackWaitMs, log: (l) => ctx.log.warn(l),
        async handle(msg) {
          const w = msg.body;
          if (w.version > sync.version) {
            await sync.push(w.modelDir, w.version);
            ctx.log.info(`weight-sync: engines serve version ${w.version} (step ${w.step})`);
          }
          if (w.version >= sync.version) await versions.advance({ version: w.version, modelDir: w.modelDir, step: w.step, at: Date.now() });
        },
      });
      return { consumer };
    },
    handle(_state, msg) {
      throw new OozeError("ACTOR_CRASHED", `weight-sync: ${msg.error}`, { retryable: true });
    },
    async onStop(state) {
      await state.consumer.stop();
    },
  });
}
