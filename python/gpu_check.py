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
    t = TorchTrainer(Group(0, 1, dev), a.dtype, "sdpa", False)
    info = t.init({"config": cfg, "params": None, "seed": 0})
    n_params = info["numParams"]
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
    tokens_per_s = T / step
    # training FLOPs per token: 6 per parameter (forward + backward) + attention's 12·layers·hidden_q·context/2 (causal)
    c = SHAPES[a.shape]
    attn = 12 * c["num_hidden_layers"] * c["num_attention_heads"] * c["head_dim"] * (a.len / 2)
    flops_per_token = 6 * n_params + attn
    card, peak = (peak_of(torch.cuda.get_device_name(dev)) if dev.type == "cuda" else ("cpu", None))
    achieved = flops_per_token * tokens_per_s / 1e12
    out = {"check": "torch-worker-gpu", "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "card": card,
           "torch": torch.__version__, "tests": tests, "shape": a.shape, "params": n_params, "dtype": a.dtype, "tokens_per_step": T,
           "step_s": round(step, 4), "tokens_per_s": round(tokens_per_s, 1), "tflops": round(achieved, 2),
           "mfu": round(achieved / peak, 4) if peak else None,
           "peak_bf16_tflops": peak, "max_memory_gb": round(torch.cuda.max_memory_allocated(dev) / 2**30, 2) if dev.type == "cuda" else None}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
