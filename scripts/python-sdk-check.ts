// Launcher of scripts/python-sdk-check.py (the official Python `openai` and `anthropic` SDKs against
// the gateway; not part of `npm test`): starts the recording fake SGLang server of the tests
// (test/fixtures/hostile-sglang.ts) with the answers the Python script expects queued in its order,
// a Fleet and a Gateway on 127.0.0.1, opens one session, runs the script with the session's URLs and
// key, then closes the session and checks its samples (each token-exact: sampleProblem null).
//
//     node --import tsx scripts/python-sdk-check.ts [--python .venv/bin/python]
//
// Needs `pip install openai anthropic` in that Python (default .venv/bin/python, then python3).
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { Fleet } from "../src/engine/fleet/fleet.ts";
import { EOS_ID, encodeBytes } from "../src/engine/tokenizer.ts";
import { Gateway } from "../src/gateway/index.ts";
import { sampleProblem } from "../src/sample.ts";
import { startHostileSglang } from "../test/fixtures/hostile-sglang.ts";

const at = process.argv.indexOf("--python");
const python = at >= 0 ? process.argv[at + 1]! : existsSync(".venv/bin/python") ? ".venv/bin/python" : "python3";
const CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>';
// The engine's answers, in the order the script asks (a refused request reaches no engine).
const answers = [
  "Hi there.", // chat plain
  "1 2 3.", // chat stream
  CALL, // chat tools
  "It is sunny in Paris.", // chat tool result
  "Hi.", // responses plain
  "1 2 3.", // responses stream
  "4 5 6.", // responses.stream helper
  `Let me look.${CALL}`, // responses tools
  "Sunny in Paris.", // responses previous_response_id + function_call_output
  "Hello.", // anthropic plain
  "1 2 3.", // anthropic stream
  CALL, // anthropic tools
  "Sunny.", // anthropic tool_result
];

const fake = await startHostileSglang();
const fleet = new Fleet({ healthIntervalMs: 0, requestTimeoutMs: 10_000 });
let code = 1;
try {
  await fleet.attach(fake.url);
  const gw = await Gateway.start({ fleet, contextLength: 4096 });
  try {
    fake.script("/generate", ...answers.map((t) => ({ kind: "tokens" as const, ids: [...encodeBytes(t), EOS_ID] })));
    const s = gw.openSession({ episodeId: "python-sdk-check", groupIndex: 0 });
    const env = { ...process.env, OPENAI_BASE_URL: s.openaiBaseUrl, ANTHROPIC_BASE_URL: s.anthropicBaseUrl, OOZE_API_KEY: s.apiKey, OOZE_MODEL: "ooze" };
    code = await new Promise<number>((resolve, reject) => {
      const child = spawn(python, ["scripts/python-sdk-check.py", "--scripted"], { env, stdio: "inherit" });
      child.on("error", (e) => reject(new Error(`cannot run ${python}: ${e.message} (give --python PATH)`)));
      child.on("exit", (c, sig) => resolve(c ?? (sig ? 128 : 1)));
    });
    const rep = gw.closeSession(s.id);
    const problems = rep.samples.map(sampleProblem).filter((p) => p !== null);
    console.log(
      `gateway: ${rep.requests} requests, ${fake.count("/generate")} generations, ${rep.samples.length} samples (segments), ${problems.length} with problems${problems.length ? `: ${problems.join("; ")}` : ""}; error ${rep.error ?? "none"}`,
    );
    // Each of the three tool round trips continues its conversation (one segment); every other request starts one.
    const expected = answers.length - 3;
    if (code === 0 && rep.samples.length !== expected) console.log(`FAIL expected ${expected} segments: a tool round trip did not extend its conversation`);
    if (problems.length > 0 || (code === 0 && rep.samples.length !== expected)) code = 1;
  } finally {
    await gw.close();
  }
} finally {
  await fleet.close();
  await fake.close();
}
process.exit(code);
