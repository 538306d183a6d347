"""The worker process: reads protocol frames from stdin, runs each request on the trainer it targets
(the policy, or with target "critic" the separate value model), and writes the reply frame to stdout.
Anything printed goes to stderr. Exits when stdin closes. With --gpus N > 1, rank 0 reads and replies
and broadcasts each request to the other ranks, which run it too.
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback

from .wire import MalformedFrame, encode_frame, read_frame


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m ooze_torch")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--gpus", type=int, default=1, help="ranks of the FSDP2 group (1: one process)")
    ap.add_argument("--attn", default="sdpa", help="transformers attn_implementation (sdpa, eager, flash_attention_2)")
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads per rank (0: torch's default)")
    ap.add_argument("--check-model", metavar="DIR", help="check that transformers can build DIR's model, print its class, and exit")
    args = ap.parse_args()
    if args.check_model:
        sys.exit(check_model(args.check_model))

    # stdout carries frames only
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr

    import torch

    from .group import STOPPING, Group, launch, pick_device
    from .trainer import TorchTrainer, WorkerError

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.gpus > 1:
        group = launch(sys.argv[1:], args.gpus, args.device)
    else:
        group = Group(0, 1, pick_device(args.device, 0))
    trainers: dict[str, TorchTrainer] = {}

    def trainer(target: str, create: bool = False) -> TorchTrainer:
        if create:
            trainers[target] = TorchTrainer(group, args.dtype, args.attn, args.gradient_checkpointing)
        t = trainers.get(target)
        if t is None:
            raise WorkerError("TORCH_FAILED", f"torch trainer worker: no {target} trainer yet; send init{' with target critic' if target == 'critic' else ''} first")
        return t

    def run(op: str, a: list, target: str):
        arg = lambda i, d=None: a[i] if len(a) > i else d  # noqa: E731
        if op == "init":
            return trainer(target, create=True).init(arg(0) or {})
        if op == "ping":
            return {"pid": os.getpid()}
        t = trainer(target)
        table = {
            "logprobs": lambda: t.logprobs(arg(0), arg(1, 1.0)),
            "backward": lambda: t.backward(arg(0), arg(1, 1.0), arg(2), arg(3), arg(4)),
            "accumulate": lambda: t.accumulate(arg(0), arg(1)),
            "applyGrads": lambda: t.apply_grads(arg(0) or {}),
            "trainStep": lambda: t.train_step(arg(0), arg(1), arg(2) or {}, arg(3)),
            "zeroGrads": lambda: t.zero_grads(),
            "getParams": lambda: t.get_params(),
            "setParams": lambda: t.set_params(arg(0)),
            "getGrads": lambda: t.get_grads(),
            "resetOptimizer": lambda: t.reset_optimizer(),
            "save": lambda: t.save(arg(0), arg(1, "") or "", arg(2)),
            "load": lambda: t.load(arg(0)),
            "saveOptimizer": lambda: t.save_optimizer(arg(0)),
            "loadOptimizer": lambda: t.load_optimizer(arg(0)),
            "info": lambda: t.info(),
            "ensureValueHead": lambda: t.ensure_value_head(),
            "setValueHead": lambda: t.set_value_head(arg(0)),
            "getValueHead": lambda: t.get_value_head(),
            "setLora": lambda: t.set_lora(arg(0)),
            "getLora": lambda: t.get_lora(),
            "saveLora": lambda: t.save_lora(arg(0), arg(1, "") or "", arg(2, "") or ""),
            "loadLora": lambda: t.load_lora(arg(0)),
        }
        if op not in table:
            raise WorkerError("CONFIG_INVALID", f"torch trainer worker: unknown op {op!r}")
        return table[op]()

    def error_of(e: BaseException) -> dict:
        if isinstance(e, WorkerError):
            code = e.code
        elif isinstance(e, (ValueError, TypeError, KeyError)):
            code = "CONFIG_INVALID"
        else:
            code = "TORCH_FAILED"
            traceback.print_exc(file=sys.stderr)
        return {"code": code, "message": f"{type(e).__name__}: {e}" if code == "TORCH_FAILED" else str(e), "retryable": False, "actor": None}

    stdin = sys.stdin.buffer
    while True:
        if group.rank == 0:
            try:
                req = read_frame(stdin)
            except MalformedFrame as e:
                print(f"torch trainer worker: {e}; exiting", file=sys.stderr, flush=True)
                STOPPING.set()
                group.broadcast(None)
                sys.exit(2)
            if req is None:  # the parent closed stdin
                STOPPING.set()
                group.broadcast(None)
                break
            if req.get("op") == "hang":  # fault injection for tests: a call that is never answered
                continue
            group.broadcast(req)
        else:
            req = group.broadcast(None)
            if req is None:
                break
        target = "critic" if req.get("target") == "critic" else "policy"
        args_ = req.get("args") if isinstance(req.get("args"), list) else []
        try:
            result = run(str(req.get("op")), args_, target)
            reply = {"id": req.get("id"), "ok": True, "result": result}
        except Exception as e:  # noqa: BLE001 - every failure becomes an error reply
            reply = {"id": req.get("id"), "ok": False, "error": error_of(e)}
        if group.rank == 0:
            out.write(encode_frame(reply))
            out.flush()
    if group.distributed:
        import torch.distributed as dist

        dist.destroy_process_group()


def check_model(d: str) -> int:
    """Exit status 0 and the model class when transformers knows d's architecture and d has weights;
    else 1 and why on stderr (before a job starts any rollout)."""
    import glob

    from .model import hf_config, read_config

    try:
        cfg = read_config(d)
        from transformers import AutoModelForCausalLM

        cls = AutoModelForCausalLM._model_mapping[type(hf_config(cfg))]
        if not glob.glob(os.path.join(d, "*.safetensors")) and not glob.glob(os.path.join(d, "*.bin")):
            raise ValueError(f"{d}: no weights (*.safetensors or *.bin)")
    except Exception as e:  # noqa: BLE001
        print(f"{d}: transformers cannot load this model: {e}", file=sys.stderr)
        return 1
    print(cls.__name__)
    return 0


if __name__ == "__main__":
    main()
