// Agent task of the calculator examples (topologies/agent-calculator-*.yaml): prompt i asks for the
// sum or difference of a 3-digit and a 2-digit number (`expression:"808-70" = ?`), which the byte-level model cannot work out alone
// but can with the `calc` tool. The agent prints {answer, toolCalls} on stdout; success is the right
// answer after at least one tool call (reward 1); a tool call with a wrong answer earns partial
// credit (up to 0.5 for copying the expression into the call, 0.3 for answering what the tool said).
import type { AgentTask } from "../../actors/environment/agent/task.ts";
import { episodeSeed, prng } from "../../actors/environment/task.ts";
// @ts-expect-error the example agents are plain JavaScript (no types)
import { calc } from "./calc-tool.mjs";

/** The question and answer of prompt `index`. */
export function calculatorQuestion(index: number, seed: number): { question: string; expression: string; answer: string } {
  const r = prng(episodeSeed(index, seed));
  // always three digits ± two, with a three-digit answer: every question, call and answer has the
  // same length, so where to copy from is always the same distance back
  const a = 200 + Math.floor(r() * 700), b = 10 + Math.floor(r() * 90);
  const op = r() < 0.5 ? "+" : "-";
  // the expression is quoted as the tool call will quote it (`:"…"`): a byte-level model copies it
  // by matching the two bytes before it (an induction pattern), which it learns far sooner than to
  // find digits after an arbitrary marker
  return { question: `expression:"${a}${op}${b}" = ?`, expression: `${a}${op}${b}`, answer: String(op === "+" ? a + b : a - b) };
}

/** How many positions of `want` hold the same character in `got`. */
function sameBytes(want: string, got: string): number {
  let n = 0;
  for (let i = 0; i < want.length; i++) if (got[i] === want[i]) n++;
  return n;
}

export default function createCalculatorTask(): AgentTask {
  return {
    name: "calculator",
    prompt(index, seed) {
      const q = calculatorQuestion(index, seed);
      return { task: q.question, data: q.answer };
    },
    reward({ prompt, transcript }) {
      let out: { answer?: unknown; toolCalls?: unknown } = {};
      try {
        out = JSON.parse(transcript.stdout.trim().split("\n").at(-1) ?? "{}") as typeof out;
      } catch {
        return { reward: 0, success: false };
      }
      const used = typeof out.toolCalls === "number" && out.toolCalls > 0;
      // the number of the answer (`result=938`, as the tool says it, or a bare `938`)
      const answer = typeof out.answer === "string" ? out.answer.trim().replace(/^result=/, "") : "";
      if (used && answer === prompt.data) return { reward: 1, success: true };
      if (!used) return { reward: 0, success: false };
      // partial credit, so that a group whose episodes all fail still ranks them: the share of the
      // question's expression the first call reproduced (byte by byte), and the share of the
      // answer that passes on what the tool returned for that call
      const expression = prompt.task.match(/"([^"]*)"/)?.[1] ?? "";
      const called = transcript.text.join("\n").match(/"expression":\s*"([^"]*)"/)?.[1] ?? "";
      const said = called !== "" ? (calc as (e: string) => string)(called) : "";
      const copied = sameBytes(expression, called) / Math.max(1, expression.length);
      const relayed = sameBytes(said, answer) / Math.max(1, said.length, answer.length);
      return { reward: 0.5 * copied + 0.3 * relayed, success: false };
    },
  };
}
