// The training loop's Prometheus metrics, named once here and recorded into the process registry
// (src/metrics.ts) that each node serves at /metrics: the trainer's steps, the buffer's batches, the
// fleet's engines and requests. Every metric carries the job and the actor that recorded it.
import { counter, gauge, histogram, processMetrics } from "../../src/metrics.ts";
import type { StepMetrics } from "./metrics.ts";

const L = ["job", "actor"] as const;

/** A trainer step: its time, the weight version it made, its reward, tokens, worker restarts and staleness. */
export function recordTrainerStep(job: string, actor: string, m: StepMetrics): void {
  const r = processMetrics(), l = { job, actor };
  counter(r, "ooze_trainer_steps_total", "Training steps taken.", L).inc(l);
  histogram(r, "ooze_trainer_step_seconds", "Wall time of a training step (rollout, train and sync).", L).observe(l, m.step_seconds);
  histogram(r, "ooze_trainer_train_seconds", "Time the trainer worker took for a step's update.", L).observe(l, m.train_seconds);
  counter(r, "ooze_trainer_samples_total", "Samples trained.", L).inc(l, m.samples);
  counter(r, "ooze_trainer_tokens_total", "Tokens of the samples trained (prompt and response).", L).inc(l, m.tokens);
  counter(r, "ooze_trainer_worker_restarts_total", "Restarts of the trainer worker process.", L).inc(l, m.trainer_restarts);
  if (m.explorer_seconds !== undefined) counter(r, "ooze_trainer_explorer_seconds_total", "Time the trajectory explorer's files took to write (train.explorer).", L).inc(l, m.explorer_seconds);
  counter(r, "ooze_trainer_failed_samples_total", "Samples whose episode failed (not trained).", L).inc(l, m.failed);
  gauge(r, "ooze_trainer_weight_version", "The weight version the trainer last produced.", L).set(l, m.weight_version);
  gauge(r, "ooze_trainer_reward_mean", "Mean reward of the last step's samples.", L).set(l, m.reward_mean);
  gauge(r, "ooze_trainer_staleness_max", "Most versions behind the trainer among the last step's samples.", L).set(l, m.staleness_max);
  gauge(r, "ooze_trainer_cache_hit_rate", "Share of the last step's prompt tokens served from the engines' prefix caches.", L).set(l, m.cache_hit_rate);
}

/** A batch the buffer published: samples generated, trained and dropped, groups. */
export function recordBufferBatch(job: string, actor: string, b: { generated: number; trained: number; dropped: number; groups: number }): void {
  const r = processMetrics(), l = { job, actor };
  counter(r, "ooze_buffer_batches_total", "Batches published.", L).inc(l);
  counter(r, "ooze_buffer_samples_generated_total", "Samples that reached the buffer.", L).inc(l, b.generated);
  counter(r, "ooze_buffer_samples_trained_total", "Samples put into batches.", L).inc(l, b.trained);
  counter(r, "ooze_buffer_samples_dropped_total", "Samples left out of batches (failed, zero-variance groups, over the staleness bound).", L).inc(l, b.dropped);
  counter(r, "ooze_buffer_groups_total", "Prompt groups put into batches.", L).inc(l, b.groups);
}

type FleetRead = () => { healthy: number; total: number; requests: number };
const fleets = new Map<string, { job: string; actor: string; read: FleetRead }>();

/** The fleet's engines by health and its requests in flight, read at each scrape; returns the unwatch. */
export function watchFleet(job: string, actor: string, read: FleetRead): () => void {
  const r = processMetrics(), key = `${job}/${actor}`;
  fleets.set(key, { job, actor, read });
  gauge(r, "ooze_fleet_engines", "Engines in the fleet, by health.", [...L, "state"], (g) => {
    g.reset();
    for (const f of fleets.values()) {
      const s = f.read();
      g.set({ job: f.job, actor: f.actor, state: "healthy" }, s.healthy);
      g.set({ job: f.job, actor: f.actor, state: "unhealthy" }, s.total - s.healthy);
    }
  });
  gauge(r, "ooze_fleet_requests_in_flight", "Generation requests the fleet has in flight.", L, (g) => {
    g.reset();
    for (const f of fleets.values()) g.set({ job: f.job, actor: f.actor }, f.read().requests);
  });
  return () => void fleets.delete(key);
}
