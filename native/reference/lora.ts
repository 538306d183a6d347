// TypeScript reference of LoRA training (float64): an adapter's layout in PEFT's names, its merge into
// the base (W' = W + s·B·A, the form PEFT's merge_and_unload computes), and its gradients from the
// merged model's by the chain rule (dA = s·Bᵀ·dW', dB = s·dW'·Aᵀ). Independent of the native kernels'
// unmerged path (x·Wᵀ + s·(x·Aᵀ)·Bᵀ), which is what makes it a check of them.
import type { LlamaHfConfig, LoraConfig, LoraTargetModule, TensorLayout } from "../index.d.ts";
import { referenceArch } from "./model.ts";
import { referenceForwardBackward, tensorLayout, type PackedTokens, type ReferenceResult, type TrainModelConfig } from "./train.ts";

/** The seven targets in layout order within a layer. */
export const LORA_TARGETS: readonly LoraTargetModule[] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];

/** The base tensor a target adapts in layer l (HF name). */
function baseName(l: number, t: LoraTargetModule): string {
  return `model.layers.${l}.${t === "gate_proj" || t === "up_proj" || t === "down_proj" ? "mlp" : "self_attn"}.${t}.weight`;
}

/** One targeted weight: the adapter's A and B tensors and the base tensor they adapt. */
export interface LoraSlot {
  base: string;
  A: TensorLayout;
  B: TensorLayout;
  /** in_features, out_features of the base weight. */
  nIn: number;
  nOut: number;
}

/** The adapter's layout (per layer, per target in order, A then B, PEFT names) and total size. */
export function referenceLoraLayout(cfg: TrainModelConfig, lora: Pick<LoraConfig, "rank" | "targets">): { slots: LoraSlot[]; numel: number } {
  const arch = referenceArch(cfg as unknown as LlamaHfConfig);
  const H = cfg.hidden_size, I = cfg.intermediate_size, Q = cfg.num_attention_heads * arch.hd, KV = cfg.num_key_value_heads * arch.hd;
  const dims: Record<LoraTargetModule, [number, number]> = {
    q_proj: [H, Q], k_proj: [H, KV], v_proj: [H, KV], o_proj: [Q, H], gate_proj: [H, I], up_proj: [H, I], down_proj: [I, H],
  };
  const slots: LoraSlot[] = [];
  let off = 0;
  for (let l = 0; l < cfg.num_hidden_layers; l++)
    for (const t of LORA_TARGETS) {
      if (!lora.targets.includes(t)) continue;
      const [nIn, nOut] = dims[t];
      const module = `base_model.model.model.layers.${l}.${t === "gate_proj" || t === "up_proj" || t === "down_proj" ? "mlp" : "self_attn"}.${t}`;
      const A = { name: `${module}.lora_A.weight`, offset: off, shape: [lora.rank, nIn] };
      off += lora.rank * nIn;
      const B = { name: `${module}.lora_B.weight`, offset: off, shape: [nOut, lora.rank] };
      off += nOut * lora.rank;
      slots.push({ base: baseName(l, t), A, B, nIn, nOut });
    }
  return { slots, numel: off };
}

/** s = alpha / rank, or alpha / √rank with rsLoRA. */
export function loraScaling(lora: Pick<LoraConfig, "rank" | "alpha" | "rslora">): number {
  return lora.rslora ? lora.alpha / Math.sqrt(lora.rank) : lora.alpha / lora.rank;
}

function baseOffsets(cfg: TrainModelConfig): Map<string, number> {
  return new Map(tensorLayout(cfg).tensors.map((t) => [t.name, t.offset]));
}

/** The base params with the adapter merged in: W' = W + s·B·A for every targeted weight (float64). */
export function mergeLora(cfg: TrainModelConfig, params: ArrayLike<number>, lora: LoraConfig, adapter: ArrayLike<number>): Float64Array {
  const out = Float64Array.from(params);
  const at = baseOffsets(cfg), s = loraScaling(lora), r = lora.rank;
  for (const slot of referenceLoraLayout(cfg, lora).slots) {
    const w = at.get(slot.base)!;
    for (let o = 0; o < slot.nOut; o++)
      for (let i = 0; i < slot.nIn; i++) {
        let acc = 0;
        for (let k = 0; k < r; k++) acc += adapter[slot.B.offset + o * r + k]! * adapter[slot.A.offset + k * slot.nIn + i]!;
        out[w + o * slot.nIn + i]! += s * acc;
      }
  }
  return out;
}

/** The reference forward (and backward) of base + adapter; `grads` become the adapter's gradients (its layout). */
export function referenceLoraForwardBackward(
  cfg: TrainModelConfig,
  params: ArrayLike<number>,
  lora: LoraConfig,
  adapter: ArrayLike<number>,
  batch: PackedTokens,
  temperature: number,
  upstream: { dLogprobs: ArrayLike<number>; dEntropy: ArrayLike<number>; dUniform?: ArrayLike<number> } | null,
): ReferenceResult {
  const merged = mergeLora(cfg, params, lora, adapter);
  const ref = referenceForwardBackward(cfg, merged, batch, temperature, upstream);
  if (!ref.grads) return ref;
  const at = baseOffsets(cfg), s = loraScaling(lora), r = lora.rank;
  const { slots, numel } = referenceLoraLayout(cfg, lora);
  const g = new Float64Array(numel);
  for (const slot of slots) {
    const w = at.get(slot.base)!;
    const dW = (o: number, i: number) => ref.grads![w + o * slot.nIn + i]!;
    // dA[k, i] = s Σ_o B[o, k] dW[o, i];  dB[o, k] = s Σ_i dW[o, i] A[k, i]
    for (let k = 0; k < r; k++)
      for (let i = 0; i < slot.nIn; i++) {
        let acc = 0;
        for (let o = 0; o < slot.nOut; o++) acc += adapter[slot.B.offset + o * r + k]! * dW(o, i);
        g[slot.A.offset + k * slot.nIn + i] = s * acc;
      }
    for (let o = 0; o < slot.nOut; o++)
      for (let k = 0; k < r; k++) {
        let acc = 0;
        for (let i = 0; i < slot.nIn; i++) acc += dW(o, i) * adapter[slot.A.offset + k * slot.nIn + i]!;
        g[slot.B.offset + o * r + k] = s * acc;
      }
  }
  return { ...ref, grads: g };
}
