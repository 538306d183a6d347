// Agent task of the coding example (topologies/agent-coding.yaml): the workdir holds lib.mjs, whose
// function f returns TODO, and the task's own test, test.mjs; prompt i says what f must compute
// (x+k, x-k or x*k: `lib.mjs: f(x) must return:"x*7"`). The agent edits lib.mjs; the reward is the topology's reward command,
// `node test.mjs` in the workdir (exit 0: reward 1).
import type { AgentTask } from "../../actors/environment/agent/task.ts";
import { episodeSeed, prng } from "../../actors/environment/task.ts";

/** The expression prompt `index` asks for. */
export function codingGoal(index: number, seed: number): { op: "+" | "-" | "*"; k: number } {
  const r = prng(episodeSeed(index, seed));
  const op = (["+", "-", "*"] as const)[Math.floor(r() * 3)]!;
  return { op, k: 2 + Math.floor(r() * 8) };
}

export default function createCodingTask(): AgentTask {
  return {
    name: "coding",
    prompt(index, seed) {
      const { op, k } = codingGoal(index, seed);
      const want = (x: number) => (op === "+" ? x + k : op === "-" ? x - k : x * k);
      const cases = [0, 3, 11].map((x) => `[${x}, ${want(x)}]`).join(", ");
      return {
        // quoted as the edit tool's argument will be (`:"x*7"`), so a byte-level model can copy it
        task: `lib.mjs: f(x) must return:"x${op}${k}"`,
        files: {
          "lib.mjs": "export const f = (x) => TODO;\n",
          "test.mjs": `import { f } from "./lib.mjs";\nfor (const [x, y] of [${cases}]) if (f(x) !== y) process.exit(1);\n`,
        },
      };
    },
  };
}
