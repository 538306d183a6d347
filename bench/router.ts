// Router benchmark (`npm run bench -- router [--sizes 32,256,1024] [--routes N] [--policy cache_aware]`):
// the CPU time of one routing decision as the engines behind one router grow, on a rollout's traffic —
// prompt groups of 8 episodes that share a prompt (a system prefix common to all, then the task),
// multi-turn episodes (each turn's sampled and tool tokens appended, the episode's id as routing key),
// 16 episodes in flight an engine, each turn released when the next is routed. A rollout instance's
// router holds its share of the fleet (256 engines an instance at 1,024 engines and four instances),
// and routes every request of it: a decision that grows with the engines is controller work a sample
// that grows with the fleet. Progress on stderr; one JSON line last: µs a route at each size and
// each size's ratio against the smallest, measured in the same run.
import { Router, type RoutingPolicy } from "../src/engine/fleet/router.ts";
import { mulberry32 } from "../src/random.ts";

const flag = (name: string, fallback: string) => {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && process.argv[i + 1] !== undefined ? process.argv[i + 1]! : fallback;
};
const sizes = flag("sizes", "32,256,1024").split(",").map(Number);
const routes = Number(flag("routes", "200000"));
const policy = flag("policy", "cache_aware") as RoutingPolicy;
/** Episodes in flight: 16 an engine by default; a fixed number (`--episodes N`) keeps the working set the same at every size. */
const episodesFlag = flag("episodes", "");

const GROUP = 8, SYSTEM = 64, TASK = 64, SAMPLED = 32, TOOL = 16, MAX_TURNS = 8, PER_ENGINE = 16;

interface Episode {
  key: string;
  ids: number[];
  turnsLeft: number;
  engine: string | null;
}

/** Routes `routes` requests over `engines` engines; returns µs of CPU a route (after a warm-up of the same length). */
function run(engines: number): number {
  const rand = mulberry32(engines);
  const r = new Router({ policy });
  for (let e = 0; e < engines; e++) r.addEngine(`engine-${e}`);
  const system = Array.from({ length: SYSTEM }, (_, i) => 1_000 + i);
  let groups = 0, episodes = 0;
  let group: { prompt: number[]; left: number } | null = null;
  const fresh = (): Episode => {
    if (group === null || group.left === 0) {
      const g = groups++;
      group = { prompt: [...system, ...Array.from({ length: TASK }, (_, i) => 100_000 + ((g * TASK + i) % 1_000_000))], left: GROUP };
    }
    group.left--;
    return { key: `ep-${episodes++}`, ids: [...group.prompt], turnsLeft: 1 + Math.floor(rand() * MAX_TURNS), engine: null };
  };
  const active = Array.from({ length: episodesFlag === "" ? engines * PER_ENGINE : Number(episodesFlag) }, fresh);
  const step = () => {
    const i = Math.floor(rand() * active.length);
    let ep = active[i]!;
    if (ep.engine !== null) r.release(ep.engine);
    if (ep.turnsLeft === 0) {
      r.endSession(ep.key);
      ep = active[i] = fresh();
    }
    ep.engine = r.route({ inputIds: ep.ids, routingKey: ep.key });
    ep.turnsLeft--;
    for (let t = 0; t < SAMPLED + TOOL; t++) ep.ids.push(Math.floor(rand() * 50_000));
  };
  for (let n = 0; n < routes; n++) step(); // warm-up: trees and sessions filled
  const t0 = process.cpuUsage();
  for (let n = 0; n < routes; n++) step();
  const t = process.cpuUsage(t0);
  return (t.user + t.system) / routes;
}

const figures: Record<string, number> = {};
let base: number | null = null;
for (const n of sizes) {
  const us = run(n);
  base ??= us;
  figures[`route_us_${n}`] = Number(us.toFixed(3));
  if (n !== sizes[0]) figures[`route_${n}_vs_${sizes[0]}`] = Number((us / base).toFixed(3));
  console.error(`[bench router] ${policy}, ${n} engines: ${us.toFixed(2)} µs of CPU a route`);
}
console.log(JSON.stringify({ bench: "router", policy, routes, ...figures }));
