// Agent task of the calculator examples (topologies/agent-calculator-*.yaml): prompt i asks for the
// sum or difference of two numbers of 2–3 digits (`expression:"808-88" = ?`), which the byte-level model cannot work out alone
// but can with the `calc` tool. The agent prints {answer, toolCalls} on stdout; success is the right
// answer after at least one tool call (reward 1); a tool call with a wrong answer earns 0.25.
import type { AgentTask } from "../../actors/environment/agent/task.ts";
import { episodeSeed, prng } from "../../actors/environment/task.ts";

/** The question and answer of prompt `index`. */
export function calculatorQuestion(index: number, seed: number): { question: string; expression: string; answer: string } {
  const r = prng(episodeSeed(index, seed));
  const a = 10 + Math.floor(r() * 990), b = 10 + Math.floor(r() * 90);
  const op = r() < 0.5 ? "+" : "-";
  // the expression is quoted as the tool call will quote it (`:"…"`): a byte-level model copies it
  // by matching the two bytes before it (an induction pattern), which it learns far sooner than to
  // find digits after an arbitrary marker
  return { question: `expression:"${a}${op}${b}" = ?`, expression: `${a}${op}${b}`, answer: String(op === "+" ? a + b : a - b) };
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
      const right = typeof out.answer === "string" && out.answer.trim() === prompt.data;
      return { reward: used && right ? 1 : used ? 0.25 : 0, success: used && right };
    },
  };
}
