// Success rate of an agent topology's agent on a model directory, outside training: an engine server
// in this process, the topology's gateway and agent (actors/environment/agent), N episodes of
// prompts FIRST, FIRST+1, … (one episode each; FIRST 0 unless given — training draws 0, 1, 2, …, so
// give e.g. 500000 for prompts it has not seen) at the topology's temperature. Prints one JSON line
// (success rate, reward, and per episode the mean number of chat requests and of trajectory segments).
//   node --import tsx examples/agents/evaluate.ts topologies/agent-calculator-openai.yaml [MODEL_DIR] [EPISODES] [FIRST]
import { dirname, resolve } from "node:path";
import { startAgentRollout } from "../../actors/environment/agent/rollout-hook.ts";
import { trainConfigOf } from "../../actors/protocol/config.ts";
import { createNativeBackend } from "../../native/engine.ts";
import { initModelDir } from "../../native/model-dir.ts";
import { Fleet } from "../../src/engine/fleet/fleet.ts";
import { startEngineServer } from "../../src/engine/server.ts";
import { loadTopology } from "../../src/topology/load.ts";

const [file, modelArg, episodesArg = "32", firstArg = "0"] = process.argv.slice(2);
if (!file) throw new Error("usage: evaluate.ts TOPOLOGY [MODEL_DIR | preset:NAME] [EPISODES] [FIRST_PROMPT]");
const firstPrompt = Number(firstArg);
if (!Number.isInteger(firstPrompt) || firstPrompt < 0) throw new Error(`evaluate.ts: FIRST_PROMPT must be a non-negative integer (got '${firstArg}')`);
const topo = loadTopology(file);
const { train } = trainConfigOf(topo);
if (!train.agent) throw new Error(`${file}: train.agent is not set`);
let modelDir = modelArg !== undefined ? resolve(modelArg) : train.model !== undefined ? resolve(dirname(file), train.model) : undefined;
if (modelArg?.startsWith("preset:")) {
  const dir = `/tmp/ooze-eval-${process.pid}`;
  await initModelDir(modelArg.slice(7), dir, train.seed);
  modelDir = dir;
}
if (!modelDir) throw new Error("no model directory: give one, or preset:NAME");
const backend = createNativeBackend({ modelDir });
const server = await startEngineServer({ backend, weightVersion: "eval" });
const fleet = new Fleet({ healthIntervalMs: 0 });
await fleet.attach(server.url);
const { model: _m, ...rest } = train;
const agents = await startAgentRollout({ ...rest, model: modelDir, agent: train.agent }, dirname(file), fleet);
const t0 = performance.now();
const n = Number(episodesArg);
const episodes = await Promise.all(
  Array.from({ length: n }, (_, i) => agents.group({ groupIndex: firstPrompt + i, firstSample: i * train.agent!.maxSegments, samples: train.agent!.maxSegments })),
);
const first = episodes.map((e) => e[0]!);
if (process.env.OOZE_EVAL_SHOW) for (const s of first.slice(0, Number(process.env.OOZE_EVAL_SHOW))) console.error(JSON.stringify({ reward: s.reward, status: s.status, meta: s.metadata }));
const ok = first.filter((s) => s.metadata.success === true).length;
const failed = first.filter((s) => s.status === "failed").length;
if (failed > 0) console.error(`first failure: ${String(first.find((s) => s.status === "failed")!.metadata.error)}`);
console.log(JSON.stringify({
  topology: file, model: modelArg ?? train.model, episodes: n, first_prompt: firstPrompt, success_rate: ok / n, failed,
  reward_mean: first.reduce((a, s) => a + (s.reward ?? 0), 0) / n,
  // per episode: chat requests that reached the engine (the calculator agents ask again only after a
  // tool call that parsed), and trajectory segments (the gateway splits where a rendering does not extend the last)
  requests_mean: first.reduce((a, s) => a + Number(s.metadata.requests ?? 0), 0) / n,
  segments_mean: first.reduce((a, s) => a + Number(s.metadata.segments ?? 0), 0) / n,
  seconds: (performance.now() - t0) / 1000,
}));
await agents.close();
await fleet.close();
await server.close();
backend.close();
