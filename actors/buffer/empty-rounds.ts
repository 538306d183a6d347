// Rounds that yield nothing to train (every episode failed, every group filtered), in both buffers:
// why (the episodes' most frequent errors), and the error that stops the job after
// `maxEmptyRounds` of them in a row (AGENTS_UNPRODUCTIVE, escalated at once: no restart cures an
// agent that fails the same way every time). Sync and async count step rounds (actors/buffer/
// buffer-actor.ts); fully_async counts batches cut with no sample (./continuous.ts).
import { OozeError } from "../../src/errors.ts";
import type { Sample } from "../../src/sample.ts";

/**
 * Why a round produced nothing to train: its episodes' errors, most frequent first (with counts),
 * and how many groups the filter dropped.
 */
export function emptyRoundReason(samples: Iterable<Sample>, filtered: number): string {
  const errors = new Map<string, number>();
  let failed = 0;
  let total = 0;
  for (const s of samples) {
    total++;
    if (s.status !== "failed") continue;
    failed++;
    const e = typeof s.metadata.error === "string" ? s.metadata.error : "failed (no reason recorded)";
    errors.set(e, (errors.get(e) ?? 0) + 1);
  }
  const top = [...errors].sort((a, b) => b[1] - a[1]).slice(0, 3).map(([e, n]) => `"${e.slice(0, 240)}" (×${n})`);
  const parts = [`${failed} of ${total} samples failed${top.length ? `: ${top.join("; ")}` : ""}`];
  if (filtered > 0 && failed < total) parts.push(`${filtered} group(s) dropped by the filter (all rewards equal)`);
  return parts.join("; ");
}

/** The error that stops the job after `rounds` empty rounds in a row. */
export function agentsUnproductive(rounds: number, why: string): OozeError {
  return new OozeError(
    "AGENTS_UNPRODUCTIVE",
    `${rounds} rounds in a row produced no trainable sample (every episode failed or every group was filtered): ${why}. ` +
      "Run the agent command by hand in an episode's setting (train.agent.keepWorkdirs: true keeps its workdir), fix it, and start again; " +
      "the buffer's config.maxEmptyRounds sets how many such rounds are allowed",
    { retryable: false },
  );
}
