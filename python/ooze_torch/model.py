"""The policy model of the PyTorch worker: loading a causal LM, its flat parameter layout, and the
per-token forward the losses need (logprobs and entropies of the sampled tokens at a temperature, and
the critic's values from a value head on the final hidden states).

Batches arrive packed as the native trainer takes them: tokens [T] and cu_seqlens [S + 1]; entry i
of every per-token array belongs to tokens[i] given its sequence's earlier tokens (0 at each
sequence's first token). The forward runs them as a right-padded [S, L] batch.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

# The native trainer's tensor order within a layer (native/reference/model.ts referenceLayout), so that
# flat parameter buffers of the two workers line up for the families both support.
_LAYER_ORDER = [
    "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.weight",
    "self_attn.k_proj.bias", "self_attn.v_proj.weight", "self_attn.v_proj.bias", "self_attn.o_proj.weight",
    "self_attn.o_proj.bias", "self_attn.q_norm.weight", "self_attn.k_norm.weight", "post_attention_layernorm.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
]
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def layout_key(name: str, index: int) -> tuple:
    """Sort key of a parameter: the native order where the name is one it knows, module order otherwise."""
    if name == "model.embed_tokens.weight":
        return (0, 0, 0, index)
    m = _LAYER_RE.match(name)
    if m:
        rest = m.group(2)
        return (1, int(m.group(1)), _LAYER_ORDER.index(rest) if rest in _LAYER_ORDER else len(_LAYER_ORDER), index)
    if name == "model.norm.weight":
        return (2, 0, 0, index)
    if name == "lm_head.weight":
        return (3, 0, 0, index)
    return (4, 0, 0, index)


def ordered_params(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """The trainable parameters (tied ones once) in layout order."""
    named = list(model.named_parameters())  # named_parameters yields a tied tensor once
    order = sorted(range(len(named)), key=lambda i: layout_key(named[i][0], i))
    return [named[i] for i in order]


def read_config(model_dir: str) -> dict:
    path = os.path.join(model_dir, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError as e:
        raise ValueError(f"{model_dir}: no config.json (not a Hugging Face model directory)") from e
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON: {e}") from e


def hf_config(cfg: dict):
    """A transformers config from a config.json dict (model_type selects the class)."""
    from transformers import AutoConfig

    cfg = dict(cfg)
    model_type = cfg.pop("model_type", None) or "llama"
    return AutoConfig.for_model(model_type, **cfg)


def load_model(model_dir: str, attn: str) -> torch.nn.Module:
    """The causal LM of a directory, in fp32 (the master weights), in eval mode (no dropout)."""
    from transformers import AutoModelForCausalLM

    read_config(model_dir)  # a clear error for a directory without a readable config
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation=attn)
    except Exception as e:
        raise ValueError(f"{model_dir}: transformers cannot load this model directory: {e}") from e
    return model.eval()


def model_from_config(cfg: dict, attn: str, seed: int | None) -> torch.nn.Module:
    """A randomly initialised causal LM of a config.json dict (fp32, eval mode)."""
    if seed is not None:
        torch.manual_seed(seed)
    return model_like(hf_config(cfg), attn)


def model_like(config, attn: str) -> torch.nn.Module:
    """A new causal LM of a transformers config object (fp32, eval mode; its weights to be set)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation=attn).eval()


@dataclass
class Packed:
    """A packed batch as a right-padded [S, L] batch, and where each sequence lies in the packing."""
    input_ids: torch.Tensor  # [S, L] int64
    attention_mask: torch.Tensor  # [S, L] int64
    starts: list[int]
    lengths: list[int]
    T: int


def unpack(tokens: np.ndarray, cu_seqlens: np.ndarray, device: torch.device, vocab: int) -> Packed:
    T = int(tokens.shape[0])
    cu = [int(x) for x in cu_seqlens]
    if len(cu) < 1 or cu[0] != 0 or cu[-1] != T or any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"cuSeqlens must rise from 0 to the token count {T}; got {cu[:8]}{'…' if len(cu) > 8 else ''}")
    if T and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
        bad = int(np.nonzero((tokens < 0) | (tokens >= vocab))[0][0])
        raise ValueError(f"token {int(tokens[bad])} at position {bad} is outside the vocabulary (size {vocab})")
    starts, lengths = cu[:-1], [b - a for a, b in zip(cu, cu[1:])]
    S, L = len(starts), max(lengths, default=0)
    ids = np.zeros((S, max(L, 1)), dtype=np.int64)
    mask = np.zeros((S, max(L, 1)), dtype=np.int64)
    for s, (a, n) in enumerate(zip(starts, lengths)):
        ids[s, :n] = tokens[a:a + n]
        mask[s, :n] = 1
    return Packed(torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device), starts, lengths, T)


def prediction_rows(p: Packed) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sequence, position) of every row that predicts a token, and that token's packed index."""
    n = np.asarray(p.lengths, dtype=np.int64)
    rows = np.maximum(n - 1, 0)
    seq = np.repeat(np.arange(len(n)), rows)
    first = np.concatenate([[0], np.cumsum(rows)[:-1]]) if len(n) else np.zeros(0, dtype=np.int64)
    pos = np.arange(int(rows.sum())) - np.repeat(first, rows)
    target = np.repeat(np.asarray(p.starts, dtype=np.int64), rows) + pos + 1
    dev = p.input_ids.device
    return tuple(torch.from_numpy(x.astype(np.int64)).to(dev) for x in (seq, pos, target))


class PolicyNet(torch.nn.Module):
    """The causal LM run the way the losses need it: the decoder over the padded batch, then the LM head
    on the predicting rows only (in chunks, logits in fp32), returning packed [T] logprobs, entropies and
    the uniform distribution's cross-entropies against the model's (−mean_v log π(v)), and the rows'
    final hidden states (for the value head). One module, so that under FSDP2 it is the
    root whose forward gathers the embedding, final norm and LM head."""

    def __init__(self, lm: torch.nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, p: Packed, tokens: torch.Tensor, temperature: float, autocast: torch.dtype | None,
                chunk_rows: int = 2048) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        dev = p.input_ids.device
        with torch.autocast(device_type=dev.type, dtype=autocast, enabled=autocast is not None):
            out = self.lm.get_decoder()(input_ids=p.input_ids, attention_mask=p.attention_mask, use_cache=False)
        h = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        seq, pos, target = prediction_rows(p)
        rows_h = h[seq, pos]
        head = self.lm.get_output_embeddings()
        lps, ents, uces = [], [], []
        for c0 in range(0, seq.numel(), chunk_rows):
            with torch.autocast(device_type=dev.type, dtype=autocast, enabled=autocast is not None):
                logits = head(rows_h[c0:c0 + chunk_rows])
            logp = F.log_softmax(logits.float() / temperature, dim=-1)
            lps.append(logp.gather(1, tokens[target[c0:c0 + chunk_rows]].unsqueeze(1)).squeeze(1))
            ents.append(-(logp.exp() * logp).sum(-1))
            uces.append(-logp.mean(-1))
        lp = torch.zeros(p.T, dtype=torch.float32, device=dev)
        ent = torch.zeros(p.T, dtype=torch.float32, device=dev)
        uce = torch.zeros(p.T, dtype=torch.float32, device=dev)
        if lps:
            lp = lp.index_put((target,), torch.cat(lps))
            ent = ent.index_put((target,), torch.cat(ents))
            uce = uce.index_put((target,), torch.cat(uces))
        return lp, ent, uce, rows_h, target


def values_of(head: torch.nn.Linear, rows_h: torch.Tensor, target: torch.Tensor, T: int) -> torch.Tensor:
    """Packed [T] values: V at each predicted token from the hidden state before it (0 at sequence starts)."""
    v = torch.zeros(T, dtype=torch.float32, device=rows_h.device)
    if target.numel() == 0:
        return v
    return v.index_put((target,), head(rows_h.float()).squeeze(-1))
