#!/usr/bin/env bash
# The PyTorch worker's checks on a GPU machine, in one go (docs/torch-worker.md, "On a GPU machine"):
#   1. the worker's Python tests on the GPU (python/tests, OOZE_TEST_DEVICE=cuda);
#   2. training-step throughput of a random Qwen3-0.6B-shaped model (python/gpu_check.py): bf16,
#      fp32, bf16 with gradient checkpointing on longer sequences, and a rank-8 LoRA adapter;
#   3. when node is on the PATH and the checkout is built (npm install or a copied dist/ and
#      node_modules/): `ooze train` end to end with the torch trainer on the GPU — the quickstart
#      (full model) and the referential game (two LoRA policies) — native engines on the CPUs.
# Uses the interpreter in OOZE_TORCH_PYTHON (default: python3), which must hold torch's CUDA build,
# transformers, safetensors, msgpack, numpy and peft. Writes everything under OUT_DIR (default
# runs/gpu-check): gpu.jsonl (one JSON line per throughput run) and each training run's directory.
#   OOZE_TORCH_PYTHON=~/ooze-torch/bin/python bash scripts/gpu-check.sh
set -u
cd "$(dirname "$0")/.."
PY="${OOZE_TORCH_PYTHON:-python3}"
OUT_DIR="${OUT_DIR:-runs/gpu-check}"
QUICKSTART_SECONDS="${QUICKSTART_SECONDS:-120}"
GAME_SECONDS="${GAME_SECONDS:-60}"
# DEVICE=cpu runs the same steps on a CPU with a tiny model shape (to try the script anywhere)
DEVICE="${DEVICE:-cuda}"
SHAPE=qwen3-0.6b; [ "$DEVICE" = cpu ] && SHAPE=tiny
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
export OOZE_TORCH_PYTHON="$(command -v "$PY")"

echo "== machine"
nvidia-smi -L || true
"$PY" -c 'import torch, transformers, peft; print("torch", torch.__version__, "cuda", torch.version.cuda, "| transformers", transformers.__version__, "| peft", peft.__version__, "|", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")'

echo "== python tests and throughput"
(
  cd python
  "$PY" gpu_check.py --device "$DEVICE" --shape $SHAPE --steps 5
  "$PY" gpu_check.py --device "$DEVICE" --shape $SHAPE --steps 5 --skip-tests --lora 8
  "$PY" gpu_check.py --device "$DEVICE" --shape $SHAPE --steps 5 --skip-tests --lora 8 --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj
  "$PY" gpu_check.py --device "$DEVICE" --shape $SHAPE --steps 5 --skip-tests --dtype fp32
  "$PY" gpu_check.py --device "$DEVICE" --shape $SHAPE --steps 3 --skip-tests --gc --seqs 16 --len 4096
) | tee "$OUT_DIR/gpu.jsonl"

if command -v node >/dev/null && [ -e dist/app/cli/main.js ]; then
  echo "== ooze train, torch trainer on the GPU: quickstart (${QUICKSTART_SECONDS} s)"
  node bin/ooze.mjs train topologies/quickstart.yaml --trainer torch --set train.trainer.device=$DEVICE \
    --max-seconds "$QUICKSTART_SECONDS" --quiet --out "$OUT_DIR/quickstart"
  echo "quickstart exit $?"
  tail -n 1 "$OUT_DIR/quickstart/metrics.jsonl" 2>/dev/null
  echo "== ooze train, torch trainer on the GPU: referential game, two LoRA policies (${GAME_SECONDS} s)"
  node bin/ooze.mjs train topologies/referential-game.yaml --trainer torch --set train.trainer.device=$DEVICE \
    --max-seconds "$GAME_SECONDS" --quiet --out "$OUT_DIR/referential"
  echo "referential exit $?"
  tail -n 1 "$OUT_DIR/referential/metrics.jsonl" 2>/dev/null
else
  echo "== no node or no built checkout here: ooze train skipped"
fi
