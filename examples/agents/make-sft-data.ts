// Writes the warm-up data of the agent examples: chat transcripts in OpenAI format, as the example
// agents would send them, of the behaviour each task rewards (call the tool with the numbers of the
// question, answer with its result; edit TODO into the asked expression, then say done). Prompt
// indices start at 1,000,000, away from the ones training draws (0, 1, 2, …).
//   node --import tsx examples/agents/make-sft-data.ts [N] [DIR]   → DIR/{calculator,coding}.jsonl, N each
//   (defaults: 400, examples/agents/sft — the shipped files)
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { calculatorQuestion } from "./calculator-task.ts";
import { codingGoal } from "./coding-task.ts";
// @ts-expect-error the example agents are plain JavaScript (no types)
import { calc, TOOL } from "./calc-tool.mjs";

const N = Number(process.argv[2] ?? 400);
if (!Number.isInteger(N) || N < 1) throw new Error(`make-sft-data: N must be a positive integer (got '${process.argv[2]}')`);
const FIRST = 1_000_000;
const out = process.argv[3] ?? join(import.meta.dirname, "sft");
mkdirSync(out, { recursive: true });

const calcTools = [{ type: "function", function: { name: TOOL.name, description: TOOL.description, parameters: TOOL.parameters } }];
const calcLines: string[] = [];
for (let i = FIRST; i < FIRST + N; i++) {
  const { question, expression, answer } = calculatorQuestion(i, 0);
  if ((calc as (e: string) => string)(expression) !== answer) throw new Error(`calc disagrees on ${expression}`);
  calcLines.push(JSON.stringify({
    messages: [
      { role: "user", content: question },
      { role: "assistant", content: "", tool_calls: [{ id: "c1", type: "function", function: { name: "calc", arguments: JSON.stringify({ expression }) } }] },
      { role: "tool", tool_call_id: "c1", content: `result=${answer}` },
      { role: "assistant", content: `result=${answer}` },
    ],
    tools: calcTools,
  }));
}
writeFileSync(join(out, "calculator.jsonl"), calcLines.join("\n") + "\n");

const editTools = [{
  type: "function",
  function: { name: "edit", description: "replace text", parameters: { type: "object", properties: { find: { type: "string" }, replace: { type: "string" } } } },
}];
const codeLines: string[] = [];
for (let i = FIRST; i < FIRST + N; i++) {
  const { op, k } = codingGoal(i, 0);
  const expr = `x${op}${k}`;
  codeLines.push(JSON.stringify({
    messages: [
      { role: "user", content: `lib.mjs: f(x) must return:"${expr}"\nexport const f = (x) => TODO;\n` },
      { role: "assistant", content: "", tool_calls: [{ id: "c1", type: "function", function: { name: "edit", arguments: JSON.stringify({ find: "TODO", replace: expr }) } }] },
      { role: "tool", tool_call_id: "c1", content: "ok" },
      { role: "assistant", content: "done" },
    ],
    tools: editTools,
  }));
}
writeFileSync(join(out, "coding.jsonl"), codeLines.join("\n") + "\n");
console.log(`wrote ${N} calculator and ${N} coding transcripts to ${out}`);
