"""The PyTorch worker's check on a GPU machine (its image needs torch, transformers, safetensors,
msgpack, numpy; no Node): the worker's own tests on the device, then the training step of a random
Qwen3-0.6B-shaped model in bf16 — step time, tokens/s, and MFU against the card's dense bf16 peak.
One JSON line last.

    cd python && python gpu_check.py                       # cuda, qwen3-0.6b shape
    cd python && python gpu_check.py --device cpu --shape tiny   # the same path on a CPU, small
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
import torch

from ooze_torch.group import Group, pick_device
from ooze_torch.trainer import TorchTrainer

# Qwen3-0.6B's shape (config.json of Qwen/Qwen3-0.6B), and a tiny one for trying the script on a CPU.
SHAPES = {
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, vocab_size=151936, tie_word_embeddings=True),
    "tiny": dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=16, vocab_size=1000, tie_word_embeddings=True),
}
# Dense bf16 tensor-core peaks (TFLOP/s, without sparsity) from the vendors' data sheets.
PEAK_BF16 = {"H100 SXM": 989.0, "H100 PCIe": 756.0, "H100 NVL": 835.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0, "L4": 121.0}


def peak_of(name: str) -> tuple[str, float | None]:
    if "H200" in name:
        return "H200", PEAK_BF16["H200"]
    if "H100" in name:
        kind = "H100 PCIe" if "PCIe" in name else "H100 NVL" if "NVL" in name else "H100 SXM"
        return kind, PEAK_BF16[kind]
    for k, v in PEAK_BF16.items():
        if k in name:
            return k, v
    return name, None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shape", default="qwen3-0.6b", choices=list(SHAPES))
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--attn", default="sdpa", help="transformers attn_implementation")
    ap.add_argument("--gc", action="store_true", help="gradient checkpointing")
    ap.add_argument("--lora", type=int, default=0, metavar="RANK", help="train a LoRA adapter of this rank (alpha 2·rank) instead of the whole model")
    ap.add_argument("--lora-targets", default="q_proj,v_proj")
    ap.add_argument("--profile", metavar="FILE", help="after timing, profile two steps with torch.profiler and write its table of kernels to FILE")
    a = ap.parse_args()

    tests = None
    if not a.skip_tests:
        here = os.path.dirname(os.path.abspath(__file__))
        r = subprocess.run([sys.executable, "-m", "unittest", "discover", "-s", "tests", "-v"], cwd=here,
                           env={**os.environ, "OOZE_TEST_DEVICE": a.device}, capture_output=True, text=True)
        sys.stderr.write(r.stderr)
        tests = "passed" if r.returncode == 0 else "FAILED"

    dev = pick_device(a.device, 0)
    cfg = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
           "max_position_embeddings": 40960, "bos_token_id": 151643, "eos_token_id": 151645, **SHAPES[a.shape]}
    t = TorchTrainer(Group(0, 1, dev), a.dtype, a.attn, a.gc)
    info = t.init({"config": cfg, "params": None, "seed": 0})
    n_params = info["numParams"]
    trained = n_params
    if a.lora:
        t.set_lora({"rank": a.lora, "alpha": 2 * a.lora, "targets": a.lora_targets.split(","), "seed": 0})
        trained = t.info()["lora"]["numParams"]
    rng = np.random.default_rng(0)
    T = a.seqs * a.len
    half = a.len // 2
    mask = np.tile(np.r_[np.zeros(half, np.uint8), np.ones(a.len - half, np.uint8)], a.seqs)
    batch = {"tokens": rng.integers(0, cfg["vocab_size"], T).astype(np.int32), "cuSeqlens": (np.arange(a.seqs + 1) * a.len).astype(np.int32),
             "lossMask": mask, "advantages": np.where(mask > 0, rng.standard_normal(T), 0).astype(np.float32), "oldLogprobs": np.zeros(T, np.float32)}
    batch["oldLogprobs"] = t.logprobs(batch, 1.0)["logprobs"]
    times = []
    for s in range(a.steps + 1):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        m = t.train_step(batch, {"epsClip": 0.2}, {"lr": 1e-6})
        if dev.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        print(f"step {s}{' (warm-up)' if s == 0 else ''}: {dt * 1000:.0f} ms, loss {m['loss']:.4f}", file=sys.stderr, flush=True)
        if s > 0:
            times.append(dt)
    step = float(np.median(times))
    gpu_busy = None
    if a.profile:
        gpu_busy = profile(t, batch, dev, a.profile)
    tokens_per_s = T / step
    # training FLOPs per token: 6 per parameter (forward + backward) + attention's 12·layers·hidden_q·context/2 (causal).
    # With LoRA the base's weight gradients are not computed: 4 per base parameter (forward, and the
    # backward's input gradients), 6 per adapter parameter. Recomputation (--gc) is not counted.
    c = SHAPES[a.shape]
    attn = 12 * c["num_hidden_layers"] * c["num_attention_heads"] * c["head_dim"] * (a.len / 2)
    flops_per_token = (4 * n_params + 6 * trained if a.lora else 6 * n_params) + attn
    card, peak = (peak_of(torch.cuda.get_device_name(dev)) if dev.type == "cuda" else ("cpu", None))
    achieved = flops_per_token * tokens_per_s / 1e12
    out = {"check": "torch-worker-gpu", "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "card": card,
           "torch": torch.__version__, "tests": tests, "shape": a.shape, "params": n_params,
           "trained_params": trained, "lora_rank": a.lora or None, "lora_targets": a.lora_targets if a.lora else None,
           "gradient_checkpointing": a.gc, "attn": a.attn, "dtype": a.dtype, "seqs": a.seqs, "len": a.len, "tokens_per_step": T,
           "step_s": round(step, 4), "tokens_per_s": round(tokens_per_s, 1), "tflops": round(achieved, 2),
           "mfu": round(achieved / peak, 4) if peak else None,
           "peak_bf16_tflops": peak, "profile_gpu_busy": gpu_busy, "max_memory_gb": round(torch.cuda.max_memory_allocated(dev) / 2**30, 2) if dev.type == "cuda" else None}
    print(json.dumps(out))


def profile(t: TorchTrainer, batch: dict, dev: torch.device, path: str) -> float | None:
    """Two steps under torch.profiler: the table of operators and kernels by their own device time
    goes to path; returns the share of the steps' wall time the device spent in kernels."""
    from torch.profiler import ProfilerActivity, profile as prof_

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with prof_(activities=acts) as p:
        t0 = time.perf_counter()
        for _ in range(2):
            t.train_step(batch, {"epsClip": 0.2}, {"lr": 1e-6})
        if dev.type == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    ev = p.key_averages()
    key = "self_device_time_total" if hasattr(ev[0], "self_device_time_total") else "self_cuda_time_total"
    busy = sum(getattr(e, key) for e in ev if e.device_type == torch.autograd.DeviceType.CUDA) / 1e6
    sort = key if dev.type == "cuda" else "self_cpu_time_total"
    with open(path, "w") as f:
        f.write(f"two steps, wall {wall * 1000:.1f} ms (profiler on), kernels {busy * 1000:.1f} ms\n")
        f.write(ev.table(sort_by=sort, row_limit=40, max_name_column_width=70))
    return round(busy / wall, 3) if dev.type == "cuda" else None


if __name__ == "__main__":
    main()
