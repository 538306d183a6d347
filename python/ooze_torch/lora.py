"""LoRA adapters on the PyTorch worker, as the native trainer has them (native/src/lora.h): for a
targeted Linear W [out, in], y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ with A [rank, in], B [out, rank] and
s = alpha / rank (alpha / √rank with rsLoRA), on any of q/k/v/o/gate/up/down in every decoder layer.

The layers are PEFT's own (`peft.inject_adapter_in_model`: its LoRA Linear, its initialisation, the
base frozen). What PEFT's model wrapper and save_pretrained would add does not fit the worker's
protocol, so this module keeps the rest: the adapter as an ordered list of tensors in the native
layout (per layer, per target in the order above, A then B) under the names PEFT saves them by
(`base_model.model.model.layers.L.self_attn.q_proj.lora_A.weight`), and the on-disk format written
and read exactly as the native worker does (adapter_config.json with the same fields, F32
adapter_model.safetensors with the weight version in its metadata), with its errors naming the file
and the field or tensor that does not fit.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass

import torch

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
_NAMES = ", ".join(TARGETS)
_MODULE_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:.+\.)?(" + "|".join(TARGETS) + r")$")
_PLAIN_ONLY = ["use_dora", "fan_in_fan_out", "modules_to_save", "layers_to_transform", "rank_pattern", "alpha_pattern"]


class AdapterError(ValueError):
    """An adapter config or directory that does not fit (the message names the field, file or tensor)."""


@dataclass
class Spec:
    """An adapter's shape: rank, alpha, the targeted modules (in TARGETS order), rsLoRA."""
    rank: int
    alpha: float
    targets: list[str]
    rslora: bool

    @property
    def scaling(self) -> float:
        return self.alpha / (math.sqrt(self.rank) if self.rslora else self.rank)

    def as_dict(self) -> dict:
        return {"rank": self.rank, "alpha": self.alpha, "targets": list(self.targets), "rslora": self.rslora}

    @staticmethod
    def parse(o: dict, where: str) -> "Spec":
        """setLora's {rank, alpha, targets, rslora} (rank 8, alpha 2 × rank, q_proj and v_proj by default)."""
        r = o.get("rank", 8)
        if isinstance(r, bool) or not isinstance(r, (int, float)) or r != int(r) or r < 1:
            raise AdapterError(f"{where}.rank must be a positive integer, got {r!r}")
        alpha = o.get("alpha")
        alpha = 2.0 * int(r) if alpha is None else alpha
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not (alpha > 0 and math.isfinite(alpha)):
            raise AdapterError(f"{where}.alpha must be a number > 0, got {alpha!r}")
        names = o.get("targets", ["q_proj", "v_proj"])
        if not isinstance(names, list):
            raise AdapterError(f"{where}.targets must be an array of module names ({_NAMES})")
        for i, n in enumerate(names):
            if n not in TARGETS:
                raise AdapterError(f"{where}.targets[{i}] '{n}' is not one of {_NAMES}")
        if not names:
            raise AdapterError(f"{where}.targets must name at least one of {_NAMES}")
        return Spec(int(r), float(alpha), [t for t in TARGETS if t in names], bool(o.get("rslora", False)))


@dataclass
class Slot:
    """One adapter tensor: its PEFT name, the module it adapts, A or B, and its shape."""
    name: str
    module: str
    part: str  # "lora_A" | "lora_B"
    shape: list[int]


def layout(model: torch.nn.Module, spec: Spec) -> list[Slot]:
    """The adapter's tensors for `model` in the native order; AdapterError when a decoder layer lacks a target."""
    found: dict[tuple[int, str], tuple[str, torch.nn.Module]] = {}
    for name, mod in model.named_modules():
        m = _MODULE_RE.search(name)
        if m and m.group(2) in spec.targets:  # PEFT's own submodules (base_layer, lora_A, …) end otherwise
            base = mod.get_base_layer() if hasattr(mod, "get_base_layer") else mod
            if isinstance(base, torch.nn.Linear):
                found[(int(m.group(1)), m.group(2))] = (name, base)
    layers = len(model.get_decoder().layers)
    slots = []
    for layer in range(layers):
        for t in spec.targets:
            if (layer, t) not in found:
                raise AdapterError(f"target {t}: decoder layer {layer} of this {model.config.model_type} model has no Linear {t} to adapt")
            name, lin = found[(layer, t)]
            key = f"base_model.model.{name}"
            slots.append(Slot(f"{key}.lora_A.weight", name, "lora_A", [spec.rank, lin.in_features]))
            slots.append(Slot(f"{key}.lora_B.weight", name, "lora_B", [lin.out_features, spec.rank]))
    return slots


def attach(model: torch.nn.Module, spec: Spec, seed: int) -> list[tuple[Slot, torch.nn.Parameter]]:
    """Puts PEFT's LoRA layers for `spec` into `model` (any earlier adapter removed first), with PEFT's
    initialisation from `seed` (A kaiming-uniform: ±1/√in; B zero), the base frozen; returns the
    adapter's tensors in layout order."""
    from peft import LoraConfig, inject_adapter_in_model

    detach(model)
    slots = layout(model, spec)
    cfg = LoraConfig(r=spec.rank, lora_alpha=spec.alpha, target_modules=list(spec.targets), lora_dropout=0.0, bias="none",
                     use_rslora=spec.rslora, init_lora_weights=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        inject_adapter_in_model(cfg, model)
    # PEFT casts each LoRA layer's input to the adapter's dtype (fp32 here). The worker never needs it:
    # in fp32 the input is fp32 already, under bf16 autocast the adapter's matmuls run in bf16 anyway,
    # and FSDP2's mixed precision makes the adapter bf16 too. Under autocast that cast was a full copy
    # of every targeted layer's input, forward and backward (an H200 profile: LoRA on all seven targets
    # stepped slower than training the whole model; docs/experiments/torch-worker.md).
    from peft.tuners.lora import LoraLayer

    for m in model.modules():
        if isinstance(m, LoraLayer):
            m.cast_input_dtype_enabled = False
    return collect(model, slots)


def collect(model: torch.nn.Module, slots: list[Slot]) -> list[tuple[Slot, torch.nn.Parameter]]:
    """The adapter's tensors of a model PEFT's layers are in, in layout order (after FSDP2 shards a
    model its parameters are new objects: collected again then)."""
    out = []
    for s in slots:
        p = getattr(model.get_submodule(s.module), s.part)["default"].weight
        if list(p.shape) != s.shape:
            raise AdapterError(f"{s.name}: PEFT made it {list(p.shape)}, the layout needs {s.shape}")
        out.append((s, p))
    return out


def detach(model: torch.nn.Module) -> None:
    """Puts each LoRA layer's base Linear back and unfreezes the model (no adapter: everything trains)."""
    from peft.tuners.lora import LoraLayer

    for name, mod in list(model.named_modules()):
        if isinstance(mod, LoraLayer):
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, mod.get_base_layer())
    for p in model.parameters():
        p.requires_grad_(True)


# ---- PEFT's on-disk format ---------------------------------------------------------------------

def read_config(d: str) -> Spec:
    """adapter_config.json of a PEFT adapter directory, checked as the native worker checks it."""
    path = os.path.join(d, CONFIG_FILE)
    if not os.path.exists(path):
        raise AdapterError(f"{path}: not found (is '{d}' a PEFT adapter directory?)")
    try:
        with open(path, encoding="utf-8") as f:
            j = json.load(f)
    except json.JSONDecodeError as e:
        raise AdapterError(f"{path}: not valid JSON: {e}") from e
    if not isinstance(j, dict):
        raise AdapterError(f"{path}: not a JSON object")
    if "peft_type" in j and j["peft_type"] != "LORA":
        raise AdapterError(f"{path}: peft_type must be \"LORA\", got {json.dumps(j['peft_type'])}")
    r = j.get("r")
    if isinstance(r, bool) or not isinstance(r, (int, float)) or r != int(r) or r <= 0:
        raise AdapterError(f"{path}: r must be a positive integer")
    alpha = j.get("lora_alpha")
    alpha = float(alpha) if isinstance(alpha, (int, float)) and not isinstance(alpha, bool) else 8.0  # PEFT's default
    tm = j.get("target_modules")
    if not isinstance(tm, list) or not tm:
        raise AdapterError(f"{path}: target_modules must be a non-empty list of module names ({_NAMES}); a regex is not supported")
    for m in tm:
        if m not in TARGETS:
            raise AdapterError(f"{path}: target_modules: '{m}' is not a Linear layer ooze adapts ({_NAMES})")
    for k in _PLAIN_ONLY:
        if j.get(k):
            raise AdapterError(f"{path}: {k} is set; ooze implements plain LoRA only (unset it)")
    if j.get("bias", "none") != "none":
        raise AdapterError(f"{path}: bias must be \"none\" (adapters with trained biases are not supported)")
    if not alpha > 0:
        raise AdapterError(f"{path}: alpha (lora_alpha) must be > 0")
    return Spec(int(r), alpha, [t for t in TARGETS if t in tm], j.get("use_rslora") is True)


def read_weights(d: str, spec: Spec, slots: list[Slot]) -> tuple[dict[str, torch.Tensor], str]:
    """The adapter's tensors (F32, F16 or BF16 on disk; fp32 here) by name, checked against `slots`,
    and the weight version in the file's metadata ("" when none)."""
    from safetensors import safe_open

    path = os.path.join(d, WEIGHTS_FILE)
    if not os.path.exists(path):
        if os.path.exists(os.path.join(d, "adapter_model.bin")):
            raise AdapterError(f"{os.path.join(d, 'adapter_model.bin')}: pickle adapters are not read; save with safe_serialization=True")
        raise AdapterError(f"{path}: not found")
    want = {s.name for s in slots}
    out: dict[str, torch.Tensor] = {}
    try:
        with safe_open(path, "pt") as f:
            version = (f.metadata() or {}).get("weight_version", "")
            names = set(f.keys())
            extra = sorted(names - want)
            if extra:
                raise AdapterError(f"{path}: tensor '{extra[0]}' is not part of a rank-{spec.rank} adapter of this base and these target_modules")
            for s in slots:  # in layout order, so that the first misfit named is the first tensor
                if s.name not in names:
                    raise AdapterError(f"{path}: tensor '{s.name}' is missing (target_modules lists its module)")
                shape = list(f.get_slice(s.name).get_shape())
                if shape != s.shape:
                    raise AdapterError(f"{path}: tensor '{s.name}': shape {shape} but the config needs {s.shape}")
                out[s.name] = f.get_tensor(s.name).float()
    except AdapterError:
        raise
    except Exception as e:  # a truncated file or a bad header: safetensors' own message
        raise AdapterError(f"{path}: not a readable safetensors file: {e}") from e
    return out, version


def write_dir(d: str, spec: Spec, tensors: list[tuple[str, torch.Tensor]], base_model: str, weight_version: str) -> None:
    """dir/adapter_model.safetensors (F32, the weight version in the metadata when set), then
    dir/adapter_config.json with the native worker's fields, each through a temporary file and a rename."""
    from safetensors.torch import save_file

    os.makedirs(d, exist_ok=True)
    meta = {"format": "pt", **({"weight_version": weight_version} if weight_version else {})}
    tmp = os.path.join(d, WEIGHTS_FILE + ".tmp")
    save_file({n: t.detach().float().cpu().contiguous() for n, t in tensors}, tmp, metadata=meta)
    os.replace(tmp, os.path.join(d, WEIGHTS_FILE))
    text = ("{\n  \"peft_type\": \"LORA\",\n  \"task_type\": \"CAUSAL_LM\",\n"
            f"  \"base_model_name_or_path\": {json.dumps(base_model)},\n  \"r\": {spec.rank},\n  \"lora_alpha\": {spec.alpha:.9g},\n"
            f"  \"target_modules\": [{', '.join(json.dumps(t) for t in spec.targets)}],\n  \"lora_dropout\": 0.0,\n"
            f"  \"bias\": \"none\",\n  \"use_rslora\": {'true' if spec.rslora else 'false'},\n  \"fan_in_fan_out\": false,\n  \"inference_mode\": true\n}}\n")
    tmp = os.path.join(d, CONFIG_FILE + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, os.path.join(d, CONFIG_FILE))


def is_adapter_dir(d: str) -> bool:
    """A PEFT adapter directory and not a model directory (native/model-dir.ts isAdapterDir)."""
    return not os.path.exists(os.path.join(d, "model.safetensors")) and os.path.exists(os.path.join(d, WEIGHTS_FILE)) \
        and os.path.exists(os.path.join(d, CONFIG_FILE))


def base_dir(d: str) -> str:
    """The base model directory an adapter directory names (native/model-dir.ts adapterBaseDir)."""
    path = os.path.join(d, CONFIG_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            base = json.load(f).get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError) as e:
        raise AdapterError(f"{path}: cannot read ({e})") from e
    if not isinstance(base, str) or not base:
        raise AdapterError(f"{path}: base_model_name_or_path is not set; ooze needs the base model's directory there to load the adapter")
    full = os.path.abspath(os.path.join(d, base))
    if not os.path.exists(os.path.join(full, "config.json")):
        raise AdapterError(f"{path}: base_model_name_or_path '{base}' is not a model directory (no {os.path.join(full, 'config.json')}); a hub model id cannot be fetched here")
    return full
