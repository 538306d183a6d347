// Membership benchmark: what one rollout instance's listing of the job's rollout members costs as the
// instances grow. Every instance lists the members at each registry pass (every 2 s), so a job of K
// instances lists K times a pass: a listing's cost that grows with K makes the job's grow as K².
// Measures, on an embedded nats-server, RolloutMembers.members() (one stream info of the actors
// bucket's subjects: actors/rollout/shard.ts) against the same bucket read with a get per key
// (src/transport/stored.ts's kvJsonValues, as members() read it until Dec 3), at K = 4, 16 and 64
// members: this process's CPU and wall time a listing (medians of rounds after a warm-up; the
// nats-server's own work is not counted). Progress on stderr; one JSON line last.
// Usage: npm run bench -- membership [--rounds R] [--sizes 4,16,64]
import { RolloutMembers } from "../actors/rollout/shard.ts";
import { connectBus } from "../src/transport/bus.ts";
import { jobNames } from "../src/transport/names.ts";
import { startNatsServer } from "../src/transport/nats-server.ts";
import { kvJsonValues } from "../src/transport/stored.ts";

const args = process.argv.slice(2);
const arg = (name: string, dflt: string) => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 && args[i + 1] !== undefined ? args[i + 1]! : dflt;
};
const rounds = Number(arg("rounds", "7"));
const sizes = arg("sizes", "4,16,64").split(",").map(Number);
const CALLS = 100;
const log = (m: string) => process.stderr.write(`[bench membership] ${m}\n`);

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

/** CPU (this process) and wall ms a call of f, over CALLS calls. */
async function measure(f: () => Promise<unknown>): Promise<{ cpu: number; wall: number }> {
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  for (let i = 0; i < CALLS; i++) await f();
  const c = process.cpuUsage(c0);
  return { cpu: (c.user + c.system) / 1000 / CALLS, wall: (performance.now() - t0) / CALLS };
}

const server = await startNatsServer({});
const bus = await connectBus({ url: server.url, token: server.token });
const out: Record<string, number> = {};
try {
  for (const k of sizes) {
    const job = `bench-members-${k}`;
    const members: RolloutMembers[] = [];
    for (let i = 0; i < k; i++) {
      const m = await RolloutMembers.open(bus, job, `rollout-${i}`);
      await m.beat();
      members.push(m);
    }
    const reader = members[0]!;
    const bucket = jobNames(job).kvActors;
    const kv = await bus.kv(bucket);
    const listed = (await reader.members()).length;
    if (listed !== k) throw new Error(`${k} members beat, ${listed} listed`);
    const oneRequest = () => reader.members();
    const getEach = () => kvJsonValues(bus, kv, bucket, "rollout.");
    if ((await getEach()).length !== k) throw new Error(`a get each read other than ${k} members`);
    await measure(oneRequest);
    await measure(getEach); // (warm-up)
    const a = { cpu: [] as number[], wall: [] as number[] };
    const b = { cpu: [] as number[], wall: [] as number[] };
    for (let r = 0; r < rounds; r++) {
      // alternating, so that a drift of the machine's speed falls on both
      const x = await measure(oneRequest);
      const y = await measure(getEach);
      a.cpu.push(x.cpu), a.wall.push(x.wall), b.cpu.push(y.cpu), b.wall.push(y.wall);
    }
    out[`k${k}_one_request_cpu_ms`] = median(a.cpu);
    out[`k${k}_get_each_cpu_ms`] = median(b.cpu);
    out[`k${k}_get_each_vs_one_request_cpu`] = median(b.cpu) / median(a.cpu);
    out[`k${k}_get_each_vs_one_request_wall`] = median(b.wall) / median(a.wall);
    log(
      `K=${k}: a listing ${median(a.cpu).toFixed(3)} ms CPU (${median(a.wall).toFixed(3)} ms wall) in one request, ` +
        `${median(b.cpu).toFixed(3)} ms (${median(b.wall).toFixed(3)} ms) with a get each: ${out[`k${k}_get_each_vs_one_request_cpu`]!.toFixed(1)}× the CPU; ` +
        `a job of ${k} instances listing every 2 s: ${((k * median(a.cpu)) / 2).toFixed(1)} against ${((k * median(b.cpu)) / 2).toFixed(1)} ms CPU a second`,
    );
    for (const m of members) await m.leave();
  }
} finally {
  await bus.close();
  await server.stop();
}
console.log(JSON.stringify({ bench: "membership", rounds, ...out }));
