"""TorchTrainer: the native Trainer's operations (native/trainer.ts) on a transformers causal LM.

It holds the model (fp32 master weights; bf16 compute by autocast, or FSDP2's mixed precision across
ranks), its gradients, torch's AdamW (decoupled weight decay on tensors of 2+ dimensions only, as the
native optimizer), and optionally the critic's value head (hidden_size + 1 floats on the final
hidden state); with a LoRA adapter (lora.py) the base is frozen and AdamW holds the adapter alone.
Checkpoints are HF directories (config.json + model.safetensors, F32, the weight version in the
safetensors metadata), or with an adapter PEFT adapter directories naming the base's, with the
native worker's optimizer.bin and value_head.bin beside them, in the native binary formats, so a
checkpoint resumes under either worker.
"""
from __future__ import annotations

import json
import os
import struct

import numpy as np
import torch

from . import lora as L
from . import model as M
from .group import Group
from .losses import LossConfig, rl_loss

OPTIMIZER_FILE, VALUE_HEAD_FILE, BASE_DIR = "optimizer.bin", "value_head.bin", "base"
_ADAM_MAGIC, _HEAD_MAGIC = b"OOZEADAM", b"OOZEVHED"


class WorkerError(Exception):
    """An error with the ooze error code it travels with."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


class TorchTrainer:
    def __init__(self, group: Group, dtype: str, attn: str, grad_checkpointing: bool):
        if dtype not in ("fp32", "bf16"):
            raise WorkerError("CONFIG_INVALID", f"dtype must be fp32 or bf16, got {dtype!r}")
        self.g, self.dtype, self.attn, self.ckpt = group, dtype, attn, grad_checkpointing
        self.model: torch.nn.Module | None = None
        self.config: dict = {}
        self.head: torch.nn.Linear | None = None
        self.opt = self.head_opt = None
        self.step = 0
        self.head_step = 0
        # the LoRA adapter being trained (its tensors in layout order), and the base model's directory
        # its checkpoints name (None: built from a config, so a save writes the base beside them)
        self.spec: L.Spec | None = None
        self.adapter: list[tuple[L.Slot, torch.nn.Parameter]] = []
        self.base_dir: str | None = None

    # ---- building ----------------------------------------------------------------------------

    @property
    def autocast(self) -> torch.dtype | None:
        # across ranks FSDP2's mixed-precision policy casts the parameters instead
        return torch.bfloat16 if self.dtype == "bf16" and not self.g.distributed else None

    def init(self, source: dict) -> dict:
        if "modelDir" in source:  # with its optimizer.bin and value_head.bin when there are
            self.load(source["modelDir"])
        else:
            cfg = dict(source.get("config") or {})
            self._adopt(M.model_from_config(cfg, self.attn, source.get("seed")), cfg)
            self.base_dir = None
            if source.get("params") is not None:
                self.set_params(source["params"])
        return self.info()

    def _adopt(self, model: torch.nn.Module, config: dict, lora: tuple[L.Spec, int] | None = None) -> None:
        """Takes `model` as the one trained (sharded across ranks), with a LoRA adapter `lora` (spec,
        seed) put in first: FSDP2 takes no module added to a model it has sharded."""
        if self.ckpt:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.train()  # HF checkpoints only in training mode; these configs have no dropout
        self.names = [n for n, _ in M.ordered_params(model)]
        slots = [s for s, _ in L.attach(model, *lora)] if lora is not None else []
        net = M.PolicyNet(model)
        if self.g.distributed:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if self.dtype == "bf16" else MixedPrecisionPolicy()
            for layer in model.get_decoder().layers:
                fully_shard(layer, mesh=self.g.mesh, mp_policy=mp)
            fully_shard(net, mesh=self.g.mesh, mp_policy=mp)
        else:
            net.to(self.g.device)
        # a config.json that names its model (a config given without model_type is a Llama's)
        config = {"model_type": model.config.model_type, "architectures": [type(model).__name__], **config}
        self.model, self.net, self.config = model, net, config
        self.head, self.step, self.head_step = None, 0, 0
        self.spec, self.adapter = (lora[0], L.collect(model, slots)) if lora is not None else (None, [])
        self.reset_optimizer()

    def _reshard(self, lora: tuple[L.Spec, int] | None) -> None:
        """Across ranks, an adapter put in or taken out: the model is built again unsharded from its
        whole parameters, with the adapter (or without one), and sharded again. The value head and
        the base's directory stay; the optimizer state of what trains starts empty."""
        whole = [self._full(p, p) for _, p in self._params()]  # gathered on every rank
        keep = (self.head, self.head_opt, self.head_step, self.base_dir)
        model = M.model_like(self.model.config, self.attn)
        named = dict(M.ordered_params(model))
        with torch.no_grad():
            for n, t in zip(self.names, whole):
                named[n].copy_(t)
        self._adopt(model, self.config, lora)
        self.head, self.head_opt, self.head_step, self.base_dir = keep

    def _params(self) -> list[tuple[str, torch.nn.Parameter]]:
        """The model's parameters in layout order (an adapted Linear's weight is PEFT's base_layer's)."""
        named = {n.replace(".base_layer.", "."): p for n, p in self.model.named_parameters()}
        return [(n, named[n]) for n in self.names]

    def _trainable(self) -> list[tuple[str, torch.nn.Parameter]]:
        """What AdamW updates: the adapter's tensors while one trains, else the model's."""
        return [(s.name, p) for s, p in self.adapter] if self.spec else self._params()

    def reset_optimizer(self) -> None:
        self._new_optimizer()
        self.head_opt = None if self.head is None else self._head_optimizer()
        self.head_step = 0

    def _new_optimizer(self) -> None:
        """Fresh AdamW state for what trains (the value head's is its own)."""
        ps = [p for _, p in self._trainable()]
        self.opt = torch.optim.AdamW([{"params": [p for p in ps if p.ndim >= 2]}, {"params": [p for p in ps if p.ndim < 2], "weight_decay": 0.0}],
                                     lr=0.0, **self._adamw_impl())
        self.step = 0

    def _adamw_impl(self) -> dict:
        """AdamW's implementation: fused (one kernel for every tensor) on one GPU, where the foreach one
        launched a kernel group per tensor list (12 ms a step for Qwen3-0.6B on an H200); foreach on
        one CPU process (the golden tests' exact path); the per-tensor loop across FSDP2 ranks."""
        if self.g.distributed:
            return {"foreach": False}
        return {"fused": True} if self.g.device.type == "cuda" else {"foreach": True}

    def _head_optimizer(self):
        return torch.optim.AdamW([{"params": [self.head.weight]}, {"params": [self.head.bias], "weight_decay": 0.0}], lr=0.0)

    def info(self) -> dict:
        self._need()
        tensors, off = [], 0
        for n, p in self._params():
            tensors.append({"name": n, "offset": off, "shape": list(p.shape)})
            off += p.numel()
        lora = None if self.spec is None else {**self.spec.as_dict(), "numParams": sum(p.numel() for _, p in self.adapter)}
        return {"config": self.config, "numParams": off, "step": self.step, "valueHead": self.head is not None, "tensors": tensors, "lora": lora}

    def _need(self) -> None:
        if self.model is None:
            raise WorkerError("TORCH_FAILED", "torch trainer worker: no model yet; send init first")

    # ---- forward -----------------------------------------------------------------------------

    def _forward(self, tokens: np.ndarray, cu: np.ndarray, temperature: float, with_values: bool):
        vocab = int(self.model.get_input_embeddings().num_embeddings)
        p = M.unpack(tokens, cu, self.g.device, vocab)
        tok = torch.from_numpy(tokens.astype(np.int64)).to(self.g.device)
        lp, ent, uce, rows_h, target = self.net(p, tok, temperature, self.autocast)
        values = M.values_of(self.head, rows_h, target, p.T) if with_values and self.head is not None else None
        return p, lp, ent, uce, values

    def logprobs(self, batch: dict, temperature: float = 1.0) -> dict:
        """Every rank runs the whole batch (no gradient): the answer needs no gathering."""
        self._need()
        with torch.no_grad():
            _, lp, ent, _, v = self._forward(_i32(batch, "tokens"), _i32(batch, "cuSeqlens"), _temperature(temperature), True)
        f32 = lambda t: t.detach().float().cpu().numpy()  # noqa: E731
        return {"logprobs": f32(lp), "entropy": f32(ent), "values": None if v is None else f32(v)}

    # ---- gradients ---------------------------------------------------------------------------

    def _shard(self, batch: dict, keys: list[str]) -> tuple[dict, np.ndarray]:
        """This rank's sequences of a packed batch (per-token arrays in `keys` sliced along), and their
        global sequence ids; a rank without sequences gets a 2-token sequence whose mask is 0, so it
        still runs the forward and backward the group's collectives need."""
        cu = _i32(batch, "cuSeqlens")
        seqs = self.g.share(len(cu) - 1)
        if not seqs:
            out = {k: np.zeros(2, dtype=np.asarray(batch[k]).dtype) for k in keys if batch.get(k) is not None}
            out["tokens"], out["cuSeqlens"] = np.zeros(2, dtype=np.int32), np.array([0, 2], dtype=np.int32)
            return out, np.zeros(1, dtype=np.int64)
        idx = np.concatenate([np.arange(cu[s], cu[s + 1]) for s in seqs]) if seqs else np.zeros(0, dtype=np.int64)
        out = {k: np.asarray(batch[k])[idx] for k in ["tokens", *keys] if batch.get(k) is not None}
        out["cuSeqlens"] = np.concatenate([[0], np.cumsum([cu[s + 1] - cu[s] for s in seqs])]).astype(np.int32)
        return out, np.array(seqs, dtype=np.int64)

    def accumulate(self, batch: dict, loss_cfg: dict | None) -> dict:
        """Forward + loss + backward of one micro-batch; gradients add up until apply_grads."""
        self._need()
        c = LossConfig.parse(loss_cfg)
        _check_batch(batch)
        if c.normalizer == 0:  # the whole batch's count, so that the ranks' shares add up
            counts = _counts(batch)
            c.normalizer = (counts[0] if c.reduction == "token" else counts[1]) or 1.0
        part, _ = self._shard(batch, ["lossMask", "advantages", "oldLogprobs", "rolloutLogprobs", "refLogprobs", "oldValues", "returns"])
        _, lp, ent, uce, v = self._forward(part["tokens"], part["cuSeqlens"], c.temperature, c.value_coef > 0)
        cu = part["cuSeqlens"]
        seq_id = torch.from_numpy(np.repeat(np.arange(len(cu) - 1), np.diff(cu))).to(self.g.device)
        loss, m = rl_loss(c, part, lp, ent, v, seq_id, len(cu) - 1, uce)
        self._backward(loss)
        return self._merge_ranks(m)

    def backward(self, batch: dict, temperature: float, dl: np.ndarray, de: np.ndarray, dv: np.ndarray | None = None) -> None:
        """Adds the gradient of Σ dl·logprobs + de·entropy (+ dv·values) into the grads."""
        self._need()
        b = {**batch, "dl": np.asarray(dl, dtype=np.float32), "de": np.asarray(de, dtype=np.float32)}
        if dv is not None:
            if self.head is None:
                raise WorkerError("CONFIG_INVALID", "backward: dValues given, but the trainer has no value head")
            b["dv"] = np.asarray(dv, dtype=np.float32)
        T = len(_i32(batch, "tokens"))
        for k in ("dl", "de", "dv"):
            if k in b and len(b[k]) != T:
                raise WorkerError("CONFIG_INVALID", f"backward: {k} has {len(b[k])} entries, the batch has {T} tokens")
        part, _ = self._shard(b, ["dl", "de", "dv"])
        _, lp, ent, _, v = self._forward(part["tokens"], part["cuSeqlens"], _temperature(temperature), dv is not None)
        t = lambda k: torch.from_numpy(part[k]).to(self.g.device)  # noqa: E731
        obj = (lp * t("dl")).sum() + (ent * t("de")).sum()
        if v is not None:
            obj = obj + (v * t("dv")).sum()
        self._backward(obj)

    def _backward(self, objective: torch.Tensor) -> None:
        """Backward of this rank's share of a sum over the batch. FSDP2 averages gradients over ranks
        (a sum scaled on gloo, which has no pre-scaled sum): scaling by the world size makes that the
        sum. The value head is whole on every rank: its gradients are summed here."""
        (objective * self.g.world if self.g.distributed else objective).backward()
        if self.head is not None and self.g.distributed:
            for p in self.head.parameters():
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                self.g.all_reduce_(p.grad)
                p.grad.div_(self.g.world)

    def _merge_ranks(self, m: dict) -> dict:
        if not self.g.distributed:
            return m
        keys = [k for k in m if k not in ("ratioMin", "ratioMax")]
        summed = dict(zip(keys, self.g.sum([float(m[k]) for k in keys])))
        has = m["numTokens"] > 0
        summed["ratioMin"] = self.g.extreme(m["ratioMin"] if has else float("inf"), "min")
        summed["ratioMax"] = self.g.extreme(m["ratioMax"] if has else float("-inf"), "max")
        if summed["numTokens"] == 0:
            summed["ratioMin"] = summed["ratioMax"] = 0.0
        return summed

    def apply_grads(self, optim: dict) -> dict:
        """Global-norm clip + AdamW step with the accumulated grads, then zero them (native semantics:
        a non-finite norm skips the step and drops the grads)."""
        self._need()
        o = {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weightDecay": 0.0, "maxGradNorm": 1.0, **{k: v for k, v in optim.items() if v is not None}}
        if "lr" not in optim or not (float(optim["lr"]) >= 0):
            raise WorkerError("CONFIG_INVALID", "applyGrads: lr must be a finite number >= 0")
        params = [p for _, p in self._trainable()]
        head = list(self.head.parameters()) if self.head is not None else []
        sq = 0.0
        for p in params:
            if p.grad is not None:
                g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                sq += float(g.double().pow(2).sum())
        sq = self.g.sum([sq])[0]  # shards are disjoint; the head's grads are whole on every rank
        sq += sum(float(p.grad.double().pow(2).sum()) for p in head if p.grad is not None)
        norm = sq ** 0.5
        if not np.isfinite(norm):
            self.zero_grads()
            return {"gradNorm": norm, "clipCoef": 1.0, "skipped": True, "step": self.step}
        coef = min(1.0, o["maxGradNorm"] / (norm + 1e-6)) if o["maxGradNorm"] > 0 else 1.0
        for p in params + head:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            elif coef < 1.0:
                p.grad.mul_(coef)
        for opt in filter(None, (self.opt, self.head_opt)):
            for i, group in enumerate(opt.param_groups):
                group.update(lr=float(o["lr"]), betas=(float(o["beta1"]), float(o["beta2"])), eps=float(o["eps"]),
                             weight_decay=float(o["weightDecay"]) if i == 0 else 0.0)
            opt.step()
        self.step += 1
        if self.head is not None:
            self.head_step += 1
        self.zero_grads()
        return {"gradNorm": norm, "clipCoef": coef, "skipped": False, "step": self.step}

    def train_step(self, batch: dict, loss_cfg: dict | None, optim: dict, opts: dict | None = None) -> dict:
        """zero grads, accumulate (in micro-batches of at most microBatchTokens with the whole batch's
        normalizer), apply_grads."""
        c = LossConfig.parse(loss_cfg)
        _check_batch(batch)
        counts = _counts(batch)
        normalizer = c.normalizer or (counts[0] if c.reduction == "token" else counts[1]) or 1.0
        cfg = {**(loss_cfg or {}), "normalizer": normalizer}
        mbt = (opts or {}).get("microBatchTokens")
        parts = [batch] if mbt is None else _split(batch, int(mbt))
        self.zero_grads()
        ms = [self.accumulate(part, cfg) for part in parts]
        return {**_sum_metrics(ms), **self.apply_grads(optim)}

    def zero_grads(self) -> None:
        self._need()
        self.model.zero_grad(set_to_none=True)
        if self.head is not None:
            self.head.zero_grad(set_to_none=True)

    # ---- parameters --------------------------------------------------------------------------

    def _full(self, t: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
        """A whole tensor on this rank (DTensor shards gathered; a missing grad as zeros)."""
        if t is None:
            return torch.zeros(like.shape, dtype=torch.float32)
        return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().float().cpu()

    def get_params(self) -> np.ndarray:
        self._need()
        return _flat([self._full(p, p) for _, p in self._params()])

    def get_grads(self) -> np.ndarray:
        self._need()
        if self.spec:
            raise WorkerError("CONFIG_INVALID", "getGrads: the base is frozen while a LoRA adapter trains; its grads are getLora().grads")
        return _flat([self._full(p.grad, p) for _, p in self._params()])

    def set_params(self, flat: np.ndarray) -> None:
        self._need()
        params = self._params()
        n = sum(p.numel() for _, p in params)
        flat = np.asarray(flat, dtype=np.float32)
        if flat.size != n:
            raise WorkerError("CONFIG_INVALID", f"setParams: got {flat.size} floats, the model has {n}")
        off = 0
        with torch.no_grad():
            for _, p in params:
                whole = torch.from_numpy(flat[off:off + p.numel()].copy()).view(p.shape)
                _assign(p, whole)
                off += p.numel()

    # ---- value head --------------------------------------------------------------------------

    def ensure_value_head(self) -> bool:
        self._need()
        if self.head is not None:
            return False
        self.set_value_head(np.zeros(int(self.config["hidden_size"]) + 1, dtype=np.float32))
        return True

    def set_value_head(self, params: np.ndarray) -> None:
        self._need()
        H = int(self.config["hidden_size"])
        params = np.asarray(params, dtype=np.float32)
        if params.size != H + 1:
            raise WorkerError("CONFIG_INVALID", f"setValueHead: got {params.size} floats, the value head has hidden_size + 1 = {H + 1}")
        head = torch.nn.Linear(H, 1).to(self.g.device)
        with torch.no_grad():
            head.weight.copy_(torch.from_numpy(params[:H]).view(1, H))
            head.bias.copy_(torch.from_numpy(params[H:]))
        self.head, self.head_step = head, 0
        self.head_opt = self._head_optimizer()

    def get_value_head(self) -> dict | None:
        if self.head is None:
            return None
        w, b = self.head.weight, self.head.bias
        grads = [x.grad if x.grad is not None else torch.zeros_like(x) for x in (w, b)]
        return {"params": _flat([w.detach().cpu(), b.detach().cpu()]), "grads": _flat([g.cpu() for g in grads]), "step": self.head_step}

    # ---- LoRA ----------------------------------------------------------------------------------

    def set_lora(self, opts: dict | None) -> None:
        """Trains a new adapter over the frozen base from now on (PEFT's initialisation from opts.seed,
        or opts.params in the adapter's layout), or with None the whole model again; the optimizer
        state of what trains starts empty."""
        self._need()
        if opts is None:
            if self.g.distributed:
                self.zero_grads()
                self._reshard(None)
                return
            L.detach(self.model)
            self.spec, self.adapter = None, []
            self._new_optimizer()
            return
        if not isinstance(opts, dict):
            raise WorkerError("CONFIG_INVALID", "setLora({rank, alpha, targets, rslora?, seed?, params?} | null)")
        spec = L.Spec.parse(opts, "setLora")
        params = None if opts.get("params") is None else np.asarray(opts["params"], dtype=np.float32)
        n = sum(int(np.prod(s.shape)) for s in L.layout(self.model, spec))
        if params is not None and params.size != n:
            raise WorkerError("CONFIG_INVALID", f"setLora: params has {params.size} floats, this adapter has {n}")
        self._attach(spec, int(opts.get("seed") or 0))
        if params is not None:
            with torch.no_grad():
                for (_, p), t in zip(self.adapter, _unflat(params, [p for _, p in self.adapter])):
                    _assign(p, t)

    def _attach(self, spec: L.Spec, seed: int) -> None:
        self.zero_grads()
        if self.g.distributed:  # sharded with the model, each rank holding its share of every adapter tensor
            self._reshard((spec, seed))
            return
        self.adapter, self.spec = L.attach(self.model, spec, seed), spec  # PEFT puts them on the base's device
        self._new_optimizer()

    def get_lora(self) -> dict | None:
        """The adapter: config, params, accumulated grads, AdamW step and tensor layout (PEFT names); None without one."""
        if self.spec is None:
            return None
        tensors, off = [], 0
        for s, p in self.adapter:
            tensors.append({"name": s.name, "offset": off, "shape": s.shape})
            off += p.numel()
        return {"config": self.spec.as_dict(), "params": _flat([self._full(p, p) for _, p in self.adapter]),
                "grads": _flat([self._full(p.grad, p) for _, p in self.adapter]), "step": self.step, "tensors": tensors}

    def save_lora(self, d: str, weight_version: str = "", base_model: str = "") -> None:
        """The adapter in PEFT's format (adapter_config.json + adapter_model.safetensors, F32)."""
        if self.spec is None:
            raise WorkerError("CONFIG_INVALID", "saveLora: no adapter (setLora or loadLora first)")
        tensors = [(s.name, self._full(p, p)) for s, p in self.adapter]  # gathered on every rank
        if self.g.rank == 0:
            L.write_dir(d, self.spec, tensors, base_model or "", weight_version or "")

    def load_lora(self, d: str) -> dict:
        """Trains the PEFT adapter in `d` over the frozen base from now on (fresh optimizer state)."""
        self._need()
        try:
            spec = L.read_config(d)
            tensors, version = L.read_weights(d, spec, L.layout(self.model, spec))
        except L.AdapterError as e:
            raise WorkerError("CHECKPOINT_INVALID", str(e)) from e
        self._attach(spec, 0)
        with torch.no_grad():
            for s, p in self.adapter:
                _assign(p, tensors[s.name])
        return {"weightVersion": version}

    # ---- checkpoints -------------------------------------------------------------------------

    def save(self, d: str, weight_version: str = "", opts: dict | None = None) -> None:
        """Optimizer and value head first, the weights last: a directory with complete weights has them."""
        self._need()
        if self.g.rank == 0:
            os.makedirs(d, exist_ok=True)
        if (opts or {}).get("optimizer"):
            self.save_optimizer(os.path.join(d, OPTIMIZER_FILE))
        if self.head is not None and self.g.rank == 0:
            self._save_head(os.path.join(d, VALUE_HEAD_FILE))
        if self.spec:  # a PEFT adapter directory naming the base (written beside it when there is no directory to name)
            base = self.base_dir
            if base is None:
                base = os.path.join(os.path.abspath(d), BASE_DIR)
                self._save_model(base, "")
            return self.save_lora(d, weight_version, base)
        self._save_model(d, weight_version)

    def _save_model(self, d: str, weight_version: str) -> None:
        """An HF model directory of the current params (config.json + model.safetensors, F32)."""
        tensors = {n: self._full(p, p).contiguous() for n, p in self._params()}
        if self.g.rank != 0:
            return
        from safetensors.torch import save_file

        os.makedirs(d, exist_ok=True)
        meta = {"format": "pt", **({"weight_version": str(weight_version)} if weight_version else {})}
        tmp = os.path.join(d, "model.safetensors.tmp")
        save_file(tensors, tmp, metadata=meta)
        with open(os.path.join(d, "config.json"), "w", encoding="utf-8") as f:
            json.dump({**self.config, "torch_dtype": "float32"}, f, indent=2)
        os.replace(tmp, os.path.join(d, "model.safetensors"))

    def load(self, d: str) -> dict:
        """A model directory, or a PEFT adapter directory: its base model, then the adapter over it."""
        try:
            base = L.base_dir(d) if L.is_adapter_dir(d) else d
            self._adopt(M.load_model(base, self.attn), M.read_config(base))
            self.base_dir = os.path.abspath(base)
        except ValueError as e:
            raise WorkerError("CHECKPOINT_INVALID", str(e)) from e
        version = self.load_lora(d)["weightVersion"] if base != d else _weight_version(d)
        opt, head = os.path.join(d, OPTIMIZER_FILE), os.path.join(d, VALUE_HEAD_FILE)
        step = self.load_optimizer(opt)["step"] if os.path.exists(opt) else None
        if os.path.exists(head):
            self._load_head(head)
        return {"weightVersion": version or "", "optimizerStep": step, "valueHead": os.path.exists(head)}

    def save_optimizer(self, path: str) -> None:
        """The native optimizer.bin: magic, u32 format 1, u64 n, i64 step, m[n], v[n] (f32, layout order)."""
        params = self._trainable()
        m, v = [], []
        for _, p in params:
            st = self.opt.state.get(p, {})
            m.append(self._full(st.get("exp_avg"), p))
            v.append(self._full(st.get("exp_avg_sq"), p))
        if self.g.rank != 0:
            return
        n = sum(p.numel() for _, p in params)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(_ADAM_MAGIC + struct.pack("<IQq", 1, n, self.step))
            f.write(_flat(m).tobytes())
            f.write(_flat(v).tobytes())
        os.replace(tmp, path)

    def load_optimizer(self, path: str) -> dict:
        params = self._trainable()
        n = sum(p.numel() for _, p in params)
        with open(path, "rb") as f:
            head = f.read(28)
            if len(head) < 28 or head[:8] != _ADAM_MAGIC or struct.unpack("<I", head[8:12])[0] != 1:
                raise WorkerError("CHECKPOINT_INVALID", f"{path}: not an ooze optimizer state file (bad header)")
            count, step = struct.unpack("<Qq", head[12:28])
            if count != n:
                raise WorkerError("CHECKPOINT_INVALID", f"{path}: holds state for {count} parameters, the {'adapter' if self.spec else 'model'} has {n}")
            data = np.frombuffer(f.read(8 * n), dtype="<f4")
        if data.size != 2 * n:
            raise WorkerError("CHECKPOINT_INVALID", f"{path}: truncated (expected {n} floats of m and of v)")
        self._new_optimizer()
        off = 0
        for _, p in params:
            k = p.numel()
            st = self.opt.state[p]
            st["step"] = torch.tensor(float(step))
            st["exp_avg"] = _like(p, torch.from_numpy(data[off:off + k].copy()).view(p.shape))
            st["exp_avg_sq"] = _like(p, torch.from_numpy(data[n + off:n + off + k].copy()).view(p.shape))
            off += k
        self.step = int(step)
        return {"step": int(step)}

    def _save_head(self, path: str) -> None:
        h = self.get_value_head()
        st = [self.head_opt.state.get(x, {}) for x in (self.head.weight, self.head.bias)]
        m = _flat([s["exp_avg"].cpu() if "exp_avg" in s else torch.zeros_like(x).cpu() for s, x in zip(st, (self.head.weight, self.head.bias))])
        v = _flat([s["exp_avg_sq"].cpu() if "exp_avg_sq" in s else torch.zeros_like(x).cpu() for s, x in zip(st, (self.head.weight, self.head.bias))])
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(_HEAD_MAGIC + struct.pack("<IQ", 1, h["params"].size) + h["params"].tobytes() + struct.pack("<q", self.head_step) + m.tobytes() + v.tobytes())
        os.replace(tmp, path)

    def _load_head(self, path: str) -> None:
        H = int(self.config["hidden_size"])
        with open(path, "rb") as f:
            raw = f.read()
        if raw[:8] != _HEAD_MAGIC or len(raw) < 20 or struct.unpack("<I", raw[8:12])[0] != 1:
            raise WorkerError("CHECKPOINT_INVALID", f"{path} is not an ooze value head file (magic OOZEVHED, format 1)")
        (n,) = struct.unpack("<Q", raw[12:20])
        if n != H + 1:
            raise WorkerError("CHECKPOINT_INVALID", f"{path} holds a value head of {n} floats; this model needs {H + 1} (hidden_size + 1)")
        if len(raw) < 20 + 4 * n + 8 + 8 * n:
            raise WorkerError("CHECKPOINT_INVALID", f"{path} is truncated")
        params = np.frombuffer(raw, "<f4", n, 20).copy()
        (step,) = struct.unpack("<q", raw[20 + 4 * n:28 + 4 * n])
        m = np.frombuffer(raw, "<f4", n, 28 + 4 * n)
        v = np.frombuffer(raw, "<f4", n, 28 + 8 * n)
        self.set_value_head(params)
        for x, sl in ((self.head.weight, slice(0, H)), (self.head.bias, slice(H, H + 1))):
            st = self.head_opt.state[x]
            st["step"] = torch.tensor(float(step))
            st["exp_avg"] = torch.from_numpy(m[sl].copy()).view(x.shape).to(x.device)
            st["exp_avg_sq"] = torch.from_numpy(v[sl].copy()).view(x.shape).to(x.device)
        self.head_step = int(step)


# ---- helpers ---------------------------------------------------------------------------------

def _i32(batch: dict, key: str) -> np.ndarray:
    if batch.get(key) is None:
        raise WorkerError("CONFIG_INVALID", f"batch.{key} is missing")
    return np.asarray(batch[key]).astype(np.int32, copy=False)


def _temperature(t) -> float:
    t = 1.0 if t is None else float(t)
    if not t > 0:
        raise WorkerError("CONFIG_INVALID", f"temperature must be > 0, got {t}")
    return t


def _check_batch(b: dict) -> None:
    T = len(_i32(b, "tokens"))
    for k in ("lossMask", "advantages", "oldLogprobs", "rolloutLogprobs", "refLogprobs", "oldValues", "returns"):
        v = b.get(k)
        if v is None and k in ("lossMask", "advantages", "oldLogprobs"):
            raise WorkerError("CONFIG_INVALID", f"batch.{k} is missing")
        if v is not None and len(v) != T:
            raise WorkerError("CONFIG_INVALID", f"batch.{k} has {len(v)} entries, the batch has {T} tokens")


def _counts(b: dict) -> tuple[float, float]:
    """Masked tokens, and sequences with at least one."""
    cu, mask = _i32(b, "cuSeqlens"), np.asarray(b["lossMask"]) != 0
    per = np.add.reduceat(mask.astype(np.int64), cu[:-1]) if len(cu) > 1 and len(mask) else np.zeros(0)
    per = np.where(np.diff(cu) > 0, per, 0) if len(per) else per
    return float(mask.sum()), float((per > 0).sum())


def _split(b: dict, max_tokens: int) -> list[dict]:
    """Consecutive whole sequences of at most max_tokens tokens (a longer one alone), as splitTrainBatch."""
    if max_tokens < 1:
        raise WorkerError("CONFIG_INVALID", f"microBatchTokens must be >= 1, got {max_tokens}")
    cu = _i32(b, "cuSeqlens")
    parts, s0, n = [], 0, len(cu) - 1
    while s0 < n:
        s1 = s0 + 1
        while s1 < n and cu[s1 + 1] - cu[s0] <= max_tokens:
            s1 += 1
        a, e = int(cu[s0]), int(cu[s1])
        part = {k: (np.asarray(v)[a:e] if v is not None else None) for k, v in b.items() if k != "cuSeqlens"}
        part["cuSeqlens"] = (cu[s0:s1 + 1] - a).astype(np.int32)
        parts.append(part)
        s0 = s1
    return parts


def _sum_metrics(ms: list[dict]) -> dict:
    out = {k: sum(m[k] for m in ms) for k in ms[0]}
    with_tokens = [m for m in ms if m["numTokens"] > 0]
    out["ratioMin"] = min((m["ratioMin"] for m in with_tokens), default=0.0)
    out["ratioMax"] = max((m["ratioMax"] for m in with_tokens), default=0.0)
    return out


def _flat(ts: list[torch.Tensor]) -> np.ndarray:
    if not ts:
        return np.zeros(0, dtype=np.float32)
    return torch.cat([t.reshape(-1).float() for t in ts]).numpy().astype(np.float32, copy=False)


def _unflat(flat: np.ndarray, like: list[torch.Tensor]) -> list[torch.Tensor]:
    """A flat float32 buffer cut into tensors shaped as `like`, in order."""
    out, off = [], 0
    for p in like:
        out.append(torch.from_numpy(flat[off:off + p.numel()].copy()).view(p.shape))
        off += p.numel()
    return out


def _like(p: torch.Tensor, whole: torch.Tensor) -> torch.Tensor:
    """`whole` laid out as p is: a DTensor sharded as p when p is one, else on p's device."""
    if hasattr(p, "device_mesh"):
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(whole.to(p.device_mesh.device_type), p.device_mesh, p.placements)
    return whole.to(p.device)


def _assign(p: torch.nn.Parameter, whole: torch.Tensor) -> None:
    if hasattr(p, "device_mesh"):
        p.to_local().copy_(_like(p, whole.to(p.dtype)).to_local())
    else:
        p.copy_(whole.to(p.dtype))


def _weight_version(d: str) -> str | None:
    path = os.path.join(d, "model.safetensors")
    if not os.path.exists(path):
        return None
    from safetensors import safe_open

    with safe_open(path, "pt") as f:
        return (f.metadata() or {}).get("weight_version")
