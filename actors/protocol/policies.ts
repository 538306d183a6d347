// The `policies:` of a topology's `train:` section: what trains over the job's one base model. A
// policy is a LoRA adapter (rank, alpha, target modules; the base stays frozen) or the full model.
// Absent, the job trains one full policy. Each policy's name is what engines serve its adapter (or,
// beside other policies, its own full model) under (SGLang's lora_path) and what the gateway's
// `model` field picks.
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { z } from "zod";
import { OozeError } from "../../src/errors.ts";
import type { LoraConfig, LoraTargetModule } from "../../native/index.d.ts";

/** The Linear layers an adapter can target (PEFT's module names), in layout order. */
export const LORA_TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"] as const satisfies readonly LoraTargetModule[];

/** A LoRA policy's adapter: y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ with s = alpha / rank (alpha / √rank with rslora). */
export const loraPolicySchema = z
  .object({
    rank: z.number().int().min(1).default(8),
    /** null: 2 × rank (s = 2). */
    alpha: z.number().positive().nullable().default(null),
    /** PEFT's default for Llama-architecture models: q_proj and v_proj. */
    targets: z.array(z.enum(LORA_TARGET_MODULES)).min(1).default(["q_proj", "v_proj"]),
    rslora: z.boolean().default(false),
  })
  .strict();

/** One policy: `{lora: {...}}` or `{full: true}`. */
export const policySchema = z.union([
  z.object({ lora: loraPolicySchema.prefault({}) }).strict(),
  z.object({ full: z.literal(true) }).strict(),
]);

/** A policy's name: it travels as an adapter name in requests and as the gateway's model name. */
export const policyName = z.string().regex(/^[a-z][a-z0-9_-]{0,63}$/, "a policy name is 1-64 of a-z, 0-9, _ and -, starting with a letter");

/** A role's policy in `train.roles`: its name, or `{policy, contexts}` (contexts it plays per opening, default 1). */
export const roleSchema = z.union([policyName, z.object({ policy: policyName, contexts: z.number().int().min(1).max(64).default(1) }).strict()]);

/** A role as configured. */
export type RoleConfig = z.output<typeof roleSchema>;

/** A role's policy name and its contexts per opening. */
export function roleOf(r: RoleConfig): { policy: string; contexts: number } {
  return typeof r === "string" ? { policy: r, contexts: 1 } : r;
}

/** `policies:`, null when absent (one full policy). */
export const policiesSchema = z.record(policyName, policySchema).nullable().default(null);

/** A policy as configured. */
export type PolicyConfig = z.output<typeof policySchema>;

/** The adapter config a LoRA policy trains (alpha filled in), or null for a full policy. */
export function loraOf(p: PolicyConfig): LoraConfig | null {
  if (!("lora" in p)) return null;
  const l = p.lora;
  return { rank: l.rank, alpha: l.alpha ?? 2 * l.rank, targets: [...l.targets], rslora: l.rslora };
}

/** A policy by name, with its adapter config (null: the full model). */
export interface PolicySpec {
  name: string;
  lora: LoraConfig | null;
  /**
   * The name engines serve it under, which its requests give as `lora_path`: a LoRA policy's adapter,
   * or, beside other policies, a full policy's own model; null: the engine's model itself (one full policy).
   */
  served: string | null;
}

/** The job's policies in configuration order; without `policies:`, the full model as policy `default`. */
export function policySpecs(policies: Record<string, PolicyConfig> | null): PolicySpec[] {
  if (!policies || Object.keys(policies).length === 0) return [{ name: "default", lora: null, served: null }];
  const several = Object.keys(policies).length > 1;
  return Object.entries(policies).map(([name, p]) => {
    const lora = loraOf(p);
    return { name, lora, served: lora || several ? name : null };
  });
}

/** The job's policy when it has one (the first one otherwise: callers with several use rolePolicies). */
export function singlePolicy(policies: Record<string, PolicyConfig> | null): PolicySpec {
  return policySpecs(policies)[0]!;
}

/** Each role's policy (`train.roles`) and contexts per opening, or null for a task of one role. */
export function rolePolicies(train: { policies: Record<string, PolicyConfig> | null; roles: Record<string, RoleConfig> | null }): Map<string, PolicySpec & { contexts: number }> | null {
  if (!train.roles) return null;
  const specs = new Map(policySpecs(train.policies).map((p) => [p.name, p]));
  return new Map(
    Object.entries(train.roles).map(([role, r]) => {
      const { policy, contexts } = roleOf(r);
      return [role, { ...(specs.get(policy) ?? { name: policy, lora: null, served: null }), contexts }];
    }),
  );
}

/**
 * The file in a policy's version directory (a LoRA policy's PEFT adapter directory, or a full
 * policy's model directory beside other policies) that names the policy: engines load it under that
 * name (SGLang's lora_name), which requests then ask for.
 */
export const POLICY_FILE = "ooze-policy.json";

/** Writes POLICY_FILE into a policy's directory. */
export function writePolicyFile(dir: string, policy: string): void {
  writeFileSync(join(dir, POLICY_FILE), `${JSON.stringify({ policy })}\n`);
}

/** The policy a directory's POLICY_FILE names, or null when it has none; throws CHECKPOINT_INVALID when it is malformed. */
export function readPolicyFile(dir: string): string | null {
  const file = join(dir, POLICY_FILE);
  if (!existsSync(file)) return null;
  let policy: unknown;
  try {
    policy = (JSON.parse(readFileSync(file, "utf8")) as { policy?: unknown }).policy;
  } catch (e) {
    throw new OozeError("CHECKPOINT_INVALID", `${file}: cannot read (${(e as Error).message})`, { cause: e });
  }
  const ok = policyName.safeParse(policy);
  if (!ok.success) throw new OozeError("CHECKPOINT_INVALID", `${file}: policy must be a policy name, got ${JSON.stringify(policy)}`);
  return ok.data;
}
