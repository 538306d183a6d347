#!/usr/bin/env node
// Example agent written with the official `@anthropic-ai/sdk`: the same calculator agent as
// calculator-openai.mjs, through the Messages API (tool_use blocks in, tool_result blocks out).
// ooze points it at the gateway with ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY.
import Anthropic from "@anthropic-ai/sdk";
import { calcTool, readStdin, TOOL } from "./calc-tool.mjs";

const question = (await readStdin()).trim();
const client = new Anthropic(); // ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY from the environment
const tools = [{ name: TOOL.name, description: TOOL.description, input_schema: TOOL.parameters }];
const messages = [{ role: "user", content: question }];
let toolCalls = 0;
for (let turn = 0; turn < 4; turn++) {
  const r = await client.messages.create({ model: "ooze", max_tokens: 96, messages, tools });
  messages.push({ role: "assistant", content: r.content });
  const uses = r.content.filter((b) => b.type === "tool_use");
  if (uses.length === 0) {
    const text = r.content.filter((b) => b.type === "text").map((b) => b.text).join("");
    console.log(JSON.stringify({ answer: text.trim(), toolCalls }));
    process.exit(0);
  }
  messages.push({
    role: "user",
    content: uses.map((u) => {
      toolCalls++;
      return { type: "tool_result", tool_use_id: u.id, content: u.name === TOOL.name ? calcTool(u.input?.expression) : `unknown tool ${u.name}` };
    }),
  });
}
console.log(JSON.stringify({ answer: "", toolCalls }));
