// Writes the warm-up data of the agent examples: chat transcripts in OpenAI format, as the example
// agents would send them, of the behaviour each task rewards (call the tool with the numbers of the
// question, answer with its result; edit TODO into the asked expression, then say done). Prompt
// indices start at 1,000,000, away from the ones training draws (0, 1, 2, …). Also copy drills, for
// every fourth prompt: its assistant turns with only the line or two before them as the prompt, so a
// fresh model learns to copy at short range first (examples/agents/README.md says why).
//   node --import tsx examples/agents/make-sft-data.ts [N] [DIR] [--template MODEL_DIR] [--drill-lines K]
//     → DIR/{calculator,coding,drills}.jsonl
//   (N transcripts per task, 3N/4 drills; defaults: 400, examples/agents/sft — the shipped files)
// The drills are written in the byte-level built-in template's markers. With --template MODEL_DIR
// (a directory with tokenizer.json and tokenizer_config.json: a model made by `ooze model init
// --tokenizer`, or the tokenizer's own directory) they are cut from that model's chat template
// instead, as `ooze sft` renders the transcripts for it (actors/trainer/sft.ts, chatRenderer): the
// completion is the assistant turn exactly as the template writes it after its prompt (Qwen3:
// `<think>\n\n</think>\n\n<tool_call>\n{"name": "calc", …}\n</tool_call>`), the prompt the
// rendered prompt from K lines (default 3) before the line where the turn's last user or tool
// message begins (Qwen3, K = 3: `</tool_call><|im_end|>` `<|im_start|>user` `<tool_response>` before
// `result=870`; for the question, the system prompt's last lines).
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { calculatorQuestion } from "./calculator-task.ts";
import { codingGoal } from "./coding-task.ts";
import { JinjaChatTemplate, loadHfChatModel, parseOpenAIRequest } from "../../src/gateway/index.ts";
// @ts-expect-error the example agents are plain JavaScript (no types)
import { calc, TOOL } from "./calc-tool.mjs";

const { values: flags, positionals } = parseArgs({ allowPositionals: true, options: { template: { type: "string" }, "drill-lines": { type: "string" } } });
const N = Number(positionals[0] ?? 400);
if (!Number.isInteger(N) || N < 1) throw new Error(`make-sft-data: N must be a positive integer (got '${positionals[0]}')`);
const drillLines = Number(flags["drill-lines"] ?? 3);
if (!Number.isInteger(drillLines) || drillLines < 0) throw new Error(`make-sft-data: --drill-lines must be a non-negative integer (got '${flags["drill-lines"]}')`);
const FIRST = 1_000_000;
const out = positionals[1] ?? join(import.meta.dirname, "sft");
mkdirSync(out, { recursive: true });

/** With --template: the drills of a transcript cut from the model's own rendering of it (one per assistant turn). */
const templateDrills = (() => {
  if (flags.template === undefined) return null;
  const hf = loadHfChatModel(flags.template);
  const template = new JinjaChatTemplate(hf.chatTemplate, hf.tokenizer);
  const eos = hf.tokenizer.stopIds[0];
  const eosText = eos === undefined ? undefined : hf.tokenizer.specialText.get(eos);
  if (eosText === undefined) throw new Error(`make-sft-data: ${flags.template}: the tokenizer has no end-of-turn text`);
  return (messages: { role: string; content: string }[], tools: unknown[]): { prompt: string; completion: string }[] => {
    const req = parseOpenAIRequest({ messages, tools });
    const drills: { prompt: string; completion: string }[] = [];
    req.messages.forEach((m, i) => {
      if (m.role !== "assistant" || i === 0) return;
      // the turn as chatRenderer trains it: what the template writes after the prompt, up to the end-of-turn text
      const prompt = template.render(req.messages.slice(0, i), req.tools);
      const through = template.render(req.messages.slice(0, i + 1), req.tools);
      const end = through.indexOf(eosText, prompt.length);
      if (!through.startsWith(prompt) || end < 0) throw new Error(`make-sft-data: the template does not write assistant message ${i} after its prompt`);
      // the prompt from drillLines lines before the line where the message before the turn begins
      const before = messages[i - 1]!.content;
      let at = prompt.lastIndexOf(before);
      if (before === "" || at < 0) throw new Error(`make-sft-data: message ${i - 1}'s content is not in the rendering`);
      at = prompt.lastIndexOf("\n", at - 1) + 1;
      for (let k = 0; k < drillLines && at > 0; k++) at = prompt.lastIndexOf("\n", at - 2) + 1;
      drills.push({ prompt: prompt.slice(at), completion: through.slice(prompt.length, end) });
    });
    return drills;
  };
})();

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
  const messages = [
    { role: "user", content: question },
    { role: "assistant", content: "", tool_calls: [{ id: "c1", type: "function", function: { name: "calc", arguments: JSON.stringify({ expression }) } }] },
    { role: "tool", tool_call_id: "c1", content: `result=${answer}` },
    { role: "assistant", content: `result=${answer}` },
  ];
  calcLines.push(JSON.stringify({ messages, tools: calcTools }));
  if (!drilled(i)) continue;
  if (templateDrills) {
    for (const d of templateDrills(messages, calcTools)) drill(d.prompt, d.completion);
    continue;
  }
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
  const messages = [
    { role: "user", content: `lib.mjs: f(x) must return:"${expr}"\n${file}` },
    { role: "assistant", content: "", tool_calls: [{ id: "c1", type: "function", function: { name: "edit", arguments: JSON.stringify({ find: "TODO", replace: expr }) } }] },
    { role: "tool", tool_call_id: "c1", content: "ok" },
    { role: "assistant", content: "done" },
  ];
  codeLines.push(JSON.stringify({ messages, tools: editTools }));
  // with --template only the call is drilled (as without: "done" needs no copy)
  if (drilled(i) && templateDrills) {
    const call = templateDrills(messages, editTools)[0]!;
    drill(call.prompt, call.completion);
  } else if (drilled(i)) drill(`<|user|>lib.mjs: f(x) must return:"${expr}"\n${file}\n<|assistant|>`, toolCall("edit", { find: "TODO", replace: expr }));
}
writeFileSync(join(out, "coding.jsonl"), codeLines.join("\n") + "\n");
writeFileSync(join(out, "drills.jsonl"), drills.join("\n") + "\n");
console.log(`wrote ${N} calculator and ${N} coding transcripts and ${drills.length} copy drills${flags.template !== undefined ? ` (cut from ${flags.template}'s chat template, ${drillLines} lines before each turn's input)` : ""} to ${out}`);
