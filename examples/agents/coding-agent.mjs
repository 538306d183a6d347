#!/usr/bin/env node
// Example coding agent (official `openai` SDK): the task on stdin names a file in the working
// directory and what it must do; the agent shows the model the task and the file, offers an `edit`
// tool (replace a string in that file), applies the edits the model asks for, and stops when the
// model answers without a tool call. It never runs the tests: the task's reward command does.
import { readFileSync, writeFileSync } from "node:fs";
import OpenAI from "openai";
import { readStdin } from "./calc-tool.mjs";

const task = (await readStdin()).trim();
const file = task.split(":")[0]; // 'lib.mjs: f(x) must return:"x*7"'
const client = new OpenAI();
const tools = [{
  type: "function",
  function: { name: "edit", description: "replace text", parameters: { type: "object", properties: { find: { type: "string" }, replace: { type: "string" } } } },
}];
const messages = [{ role: "user", content: `${task}\n${readFileSync(file, "utf8")}` }];
let edits = 0;
for (let turn = 0; turn < 3; turn++) {
  const r = await client.chat.completions.create({ model: "ooze", messages, tools, max_tokens: 96 });
  const msg = r.choices[0].message;
  messages.push(msg);
  if (!msg.tool_calls?.length) break;
  for (const call of msg.tool_calls) {
    let result = "error: unknown tool";
    if (call.function.name === "edit") {
      try {
        const { find, replace } = JSON.parse(call.function.arguments);
        const text = readFileSync(file, "utf8");
        if (typeof find !== "string" || typeof replace !== "string" || !text.includes(find)) result = "error: text not found";
        else {
          writeFileSync(file, text.replace(find, replace));
          edits++;
          result = "ok";
        }
      } catch {
        result = "error: bad arguments";
      }
    }
    messages.push({ role: "tool", tool_call_id: call.id, content: result });
  }
}
console.log(JSON.stringify({ edits }));
