// The PyTorch worker's own Python tests (python/tests: the golden vectors in-process, bf16 and
// gradient checkpointing against fp32, LoRA, the wire format) run by the suite, in the worker's venv.
import { spawnSync } from "node:child_process";
import { describe, expect, it } from "vitest";
import { torchPackageDir } from "../../native/worker/torch-env.ts";
import { torchPython } from "../harness/torch.ts";

describe("python/tests", () => {
  it("pass under the worker's interpreter", async () => {
    const python = await torchPython();
    const r = spawnSync(python, ["-m", "unittest", "discover", "-s", "tests", "-v"], {
      // one torch thread: these models are tiny, and on a busy two-core machine two threads took 2–3× as long
      cwd: torchPackageDir(), encoding: "utf8", env: { ...process.env, OOZE_TEST_DEVICE: "cpu", OMP_NUM_THREADS: "1", PYTHONPATH: torchPackageDir() }, timeout: 240_000,
    });
    if (r.status !== 0) console.error(r.stderr);
    expect(r.status).toBe(0);
    expect(r.stderr).toMatch(/Ran [1-9]\d* tests/);
    expect(r.stderr).not.toMatch(/skipped/);
  }, 240_000);
});
