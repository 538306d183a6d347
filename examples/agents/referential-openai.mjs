#!/usr/bin/env node
// Example multi-agent program on the official `openai` npm SDK, written as anyone would write it: it
// knows nothing of ooze. Two agents play a referential game: the describer (`model: "describer"`)
// sees a secret letter and writes a one-token message; the guesser (`model: "guesser"`) sees only the
// message and answers with one token, GUESSES times in one request (`n`). It reads one secret per
// line on stdin and plays a game for each, all at once (each game waits on its own two requests), and
// prints the games, in the order of the secrets, as JSON on stdout: {games: [{message, answers}, …]},
// each message and answer exactly as the model wrote it. ooze points it at the gateway with
// OPENAI_BASE_URL and OPENAI_API_KEY, and each model name trains its own policy.
import OpenAI from "openai";
import { readStdin } from "./calc-tool.mjs";

const GUESSES = 8;
const secrets = (await readStdin()).split("\n").map((l) => l.trim()).filter((l) => l !== "");
const client = new OpenAI(); // OPENAI_BASE_URL and OPENAI_API_KEY from the environment

async function play(secret) {
  const said = await client.chat.completions.create({ model: "describer", messages: [{ role: "user", content: secret }], max_tokens: 1 });
  // the message exactly as the describer wrote it (whitespace is a message too)
  const message = said.choices[0].message.content ?? "";
  const heard = await client.chat.completions.create({ model: "guesser", messages: [{ role: "user", content: message }], max_tokens: 1, n: GUESSES });
  return { message, answers: [...heard.choices].sort((a, b) => a.index - b.index).map((c) => c.message.content ?? "") };
}

console.log(JSON.stringify({ games: await Promise.all(secrets.map(play)) }));
