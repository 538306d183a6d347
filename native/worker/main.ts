// The trainer worker process (node --import tsx native/worker/main.ts; the compiled main.js with plain
// node in an installed package): hosts the native addon and the policy's Trainer (and, for PPO with a
// separate value model, the critic's), serves protocol.ts requests from stdin and replies on stdout,
// so a native crash kills this process and not the runtime. Exits when stdin closes (its parent is
// gone).
import { OozeError, toOozeError } from "../../src/errors.ts";
import { Trainer, type TrainerSource } from "../trainer.ts";
import { encodeFrame, FrameDecoder, type WorkerReply, type WorkerRequest } from "./protocol.ts";

// stdout carries frames only: anything logged goes to stderr.
console.log = console.error;
console.info = console.error;

const trainers: { policy: Trainer | null; critic: Trainer | null } = { policy: null, critic: null };

// Arguments are passed through as they came; the native layer validates them.
async function handle(op: WorkerRequest["op"], a: any[], target: "policy" | "critic"): Promise<unknown> {
  const need = (): Trainer => {
    const t = trainers[target];
    if (!t) throw new OozeError("NATIVE_FAILED", `trainer worker: no ${target} trainer yet; send init${target === "critic" ? " with target critic" : ""} first`);
    return t;
  };
  switch (op) {
    case "init": {
      const t = (trainers[target] = await Trainer.create(a[0] as TrainerSource));
      return t.info();
    }
    case "ping":
      return { pid: process.pid };
    case "logprobs":
      return need().logprobs(a[0], a[1]);
    case "backward":
      return need().backward(a[0], a[1], a[2], a[3], a[4] ?? null);
    case "accumulate":
      return need().accumulate(a[0], a[1]);
    case "applyGrads":
      return need().applyGrads(a[0]);
    case "trainStep":
      return need().trainStep(a[0], a[1], a[2], a[3] ?? undefined);
    case "zeroGrads":
      return need().zeroGrads();
    case "getParams":
      return need().getParams();
    case "setParams":
      return need().setParams(a[0]);
    case "getGrads":
      return need().getGrads();
    case "resetOptimizer":
      return need().resetOptimizer();
    case "save":
      return need().save(a[0], a[1], a[2]);
    case "saveOptimizer":
      return need().saveOptimizer(a[0]);
    case "loadOptimizer":
      return need().loadOptimizer(a[0]);
    case "load":
      return need().load(a[0]);
    case "info":
      return need().info();
    case "ensureValueHead":
      return need().ensureValueHead();
    case "setValueHead":
      return need().setValueHead(a[0]);
    case "getValueHead":
      return need().getValueHead();
    case "setLora":
      return need().setLora(a[0]);
    case "getLora":
      return need().getLora();
    case "saveLora":
      return need().saveLora(a[0], a[1], a[2]);
    case "loadLora":
      return need().loadLora(a[0]);
    case "hang": // fault injection for tests: a call that never completes
      return new Promise(() => undefined);
  }
}

function reply(msg: WorkerReply): void {
  process.stdout.write(encodeFrame(msg));
}

const decoder = new FrameDecoder();
process.stdin.on("data", (chunk: Buffer) => {
  let msgs: unknown[];
  try {
    msgs = decoder.push(chunk);
  } catch (e) {
    console.error(`trainer worker: ${(e as Error).message}; exiting`);
    process.exit(2);
  }
  for (const m of msgs) {
    const req = m as WorkerRequest;
    handle(req.op, Array.isArray(req.args) ? req.args : [], req.target === "critic" ? "critic" : "policy")
      .then((result) => reply({ id: req.id, ok: true, result: result ?? null }))
      .catch((e: unknown) => reply({ id: req.id, ok: false, error: toOozeError(e, "NATIVE_FAILED").toWire() }));
  }
});
process.stdin.on("end", () => process.exit(0));
