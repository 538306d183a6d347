// Writes the warm-up data of the agent examples: chat transcripts in OpenAI format, as the example
// agents would send them, of the behaviour each task rewards (call the tool with the numbers of the
// question, answer with its result; edit TODO into the asked expression, then say done). Prompt
// indices start at 1,000,000, away from the ones training draws (0, 1, 2, …). Also copy drills, for
// every fourth prompt: its assistant turns with only the line or two before them as the prompt, so a
// fresh model learns to copy at short range first (examples/agents/README.md says why).
//   node --import tsx examples/agents/make-sft-data.ts [N] [DIR]   → DIR/{calculator,coding,drills}.jsonl
//   (N transcripts per task, 3N/4 drills; defaults: 400, examples/agents/sft — the shipped files)
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
const drills: string[] = [];
const drill = (prompt: string, completion: string) => drills.push(JSON.stringify({ prompt, completion }));
/** A call as the built-in template writes one back (`tojson`'s spacing), so the drills teach what the gateway renders. */
const toolCall = (name: string, args: Record<string, string>) =>
  `<tool_call>{"name": ${JSON.stringify(name)}, "arguments": {${Object.entries(args).map(([k, v]) => `${JSON.stringify(k)}: ${JSON.stringify(v)}`).join(", ")}}}</tool_call>`;
/** Drills (in the built-in template's markers, src/gateway/template.ts) for every fourth prompt. */
const drilled = (i: number) => (i - FIRST) % 4 === 0;
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
  if (!drilled(i)) continue;
  drill(`<|user|>${question}\n<|assistant|>`, toolCall("calc", { expression }));
  drill(`</tool_call>\n<|tool|>result=${answer}\n<|assistant|>`, `result=${answer}`);
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
  const file = "export const f = (x) => TODO;\n";
  codeLines.push(JSON.stringify({
    messages: [
      { role: "user", content: `lib.mjs: f(x) must return:"${expr}"\n${file}` },
      { role: "assistant", content: "", tool_calls: [{ id: "c1", type: "function", function: { name: "edit", arguments: JSON.stringify({ find: "TODO", replace: expr }) } }] },
      { role: "tool", tool_call_id: "c1", content: "ok" },
      { role: "assistant", content: "done" },
    ],
    tools: editTools,
  }));
  if (drilled(i)) drill(`<|user|>lib.mjs: f(x) must return:"${expr}"\n${file}\n<|assistant|>`, toolCall("edit", { find: "TODO", replace: expr }));
}
writeFileSync(join(out, "coding.jsonl"), codeLines.join("\n") + "\n");
writeFileSync(join(out, "drills.jsonl"), drills.join("\n") + "\n");
console.log(`wrote ${N} calculator and ${N} coding transcripts and ${drills.length} copy drills to ${out}`);
