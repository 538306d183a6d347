#!/usr/bin/env node
// Example agent written with the official `openai` npm SDK, as anyone would write it: it knows
// nothing of ooze. It reads a question on stdin, offers the model one tool (`calc`, which evaluates
// an arithmetic expression), runs the tool calls the model makes, and prints the model's final
// answer as JSON ({answer, toolCalls}) on stdout. ooze points it at the gateway with OPENAI_BASE_URL
// and OPENAI_API_KEY. Plain .mjs so each episode's process starts fast.
import OpenAI from "openai";
import { calcTool, readStdin, TOOL } from "./calc-tool.mjs";

const question = (await readStdin()).trim();
const client = new OpenAI(); // OPENAI_BASE_URL and OPENAI_API_KEY from the environment
const tools = [{ type: "function", function: { name: TOOL.name, description: TOOL.description, parameters: TOOL.parameters } }];
const messages = [{ role: "user", content: question }];
let toolCalls = 0;
for (let turn = 0; turn < 4; turn++) {
  const r = await client.chat.completions.create({ model: "ooze", messages, tools, max_tokens: 96 });
  const msg = r.choices[0].message;
  messages.push(msg);
  if (!msg.tool_calls || msg.tool_calls.length === 0) {
    console.log(JSON.stringify({ answer: (msg.content ?? "").trim(), toolCalls }));
    process.exit(0);
  }
  for (const call of msg.tool_calls) {
    toolCalls++;
    let args = {};
    try {
      args = JSON.parse(call.function.arguments);
    } catch {
      // the model wrote arguments that are not JSON: the tool says so
    }
    messages.push({ role: "tool", tool_call_id: call.id, content: call.function.name === TOOL.name ? calcTool(args.expression) : `unknown tool ${call.function.name}` });
  }
}
console.log(JSON.stringify({ answer: "", toolCalls }));
