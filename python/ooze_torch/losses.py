"""The RL losses of the native trainer (native/src/loss.cc, float64 reference src/algorithms/losses.ts),
as differentiable torch expressions over packed per-token tensors.

Per token t with mask 1: r = exp(logp − old), A = advantage,
  pg = max(−A·r, −A·clip(r, 1−eps_clip, 1+eps_clip_high)); for A < 0 with dual clip pg = min(pg, −A·c);
  pg *= min(exp(old − rollout), tis_cap) with TIS;
  ℓ = pg + kl_coef·k(logp − ref) − entropy_coef·entropy + uniform_coef·uniform_ce (−mean_v log π(v));
the critic (value_coef > 0): Vc = old_V + clip(V − old_V, ±value_clip), ℓ_v = max((V−R)², (Vc−R)²)/2.
Reduction: per token (Σ mask·ℓ / Σ mask) or per sample (mean of each sample's masked mean), or divided
by a given normalizer (micro-batches of one batch). Everything is computed in float64.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

DEFAULTS = {
    "epsClip": 0.2, "epsClipHigh": 0.2, "epsClipC": None, "klCoef": 0.0, "klType": "k3", "entropyCoef": 0.0, "uniformCoef": 0.0,
    "tisCap": None, "reduction": "token", "normalizer": None, "temperature": 1.0, "valueCoef": 0.0, "valueClip": 0.2,
}


@dataclass
class LossConfig:
    eps_clip: float
    eps_clip_high: float
    eps_clip_c: float
    kl_coef: float
    kl_type: str
    entropy_coef: float
    uniform_coef: float
    tis_cap: float
    reduction: str
    normalizer: float
    temperature: float
    value_coef: float
    value_clip: float

    @staticmethod
    def parse(raw: dict | None) -> "LossConfig":
        c = {**DEFAULTS, **{k: v for k, v in (raw or {}).items() if v is not None or k in ("epsClipC", "tisCap", "normalizer", "valueClip")}}
        cfg = LossConfig(
            eps_clip=float(c["epsClip"]), eps_clip_high=float(c["epsClipHigh"]), eps_clip_c=float(c["epsClipC"] or 0),
            kl_coef=float(c["klCoef"]), kl_type=str(c["klType"]), entropy_coef=float(c["entropyCoef"]), uniform_coef=float(c["uniformCoef"]),
            tis_cap=float(c["tisCap"] or 0), reduction=str(c["reduction"]), normalizer=float(c["normalizer"] or 0),
            temperature=float(c["temperature"]), value_coef=float(c["valueCoef"]),
            value_clip=float(c["valueClip"]) if c["valueClip"] is not None else 0.0,
        )
        problem = cfg.problem()
        if problem:
            raise ValueError(f"loss config: {problem}")
        return cfg

    def problem(self) -> str:
        if not (self.eps_clip >= 0 and self.eps_clip_high >= 0):
            return "epsClip and epsClipHigh must be >= 0"
        if self.eps_clip_c != 0 and not self.eps_clip_c > 1:
            return "epsClipC (dual clip) must be > 1, or null to disable it"
        if self.kl_type not in ("k1", "k2", "k3"):
            return f"klType must be k1, k2 or k3, got {self.kl_type!r}"
        if not self.uniform_coef >= 0:
            return "uniformCoef must be >= 0 (0 = off)"
        if not self.tis_cap >= 0:
            return "tisCap must be >= 0"
        if self.reduction not in ("token", "sample"):
            return f"reduction must be 'token' or 'sample', got {self.reduction!r}"
        if not self.normalizer >= 0:
            return "normalizer must be >= 0"
        if not self.temperature > 0:
            return "temperature must be > 0"
        if not self.value_coef >= 0:
            return "valueCoef must be >= 0"
        return ""


def reduction_weights(c: LossConfig, mask: torch.Tensor, seq_id: torch.Tensor, num_seqs: int) -> tuple[torch.Tensor, float, float]:
    """Per-token weights w (the loss is Σ w·ℓ), masked token count, samples with ≥ 1 masked token."""
    m = mask.double()
    per_seq = torch.zeros(num_seqs, dtype=torch.float64, device=mask.device).index_add_(0, seq_id, m)
    tokens, samples = float(m.sum()), float((per_seq > 0).sum())
    if c.reduction == "token":
        denom = c.normalizer if c.normalizer > 0 else tokens
        return m / (denom if denom > 0 else 1.0), tokens, samples
    denom = c.normalizer if c.normalizer > 0 else samples
    n = per_seq[seq_id]
    w = torch.where(m > 0, 1.0 / n.clamp(min=1), torch.zeros_like(m))
    return w / (denom if denom > 0 else 1.0), tokens, samples


def rl_loss(c: LossConfig, b: dict, logp: torch.Tensor, ent: torch.Tensor, values: torch.Tensor | None,
            seq_id: torch.Tensor, num_seqs: int, uce: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """The loss (a float64 scalar with autograd through logp, ent, uce, values) and the native metrics."""
    dev = logp.device
    t = lambda k: torch.as_tensor(b[k], device=dev).double()  # noqa: E731
    mask = torch.as_tensor(b["lossMask"], device=dev) != 0
    w, n_tok, n_samp = reduction_weights(c, mask, seq_id, num_seqs)
    lp, A, old = logp.double(), t("advantages"), t("oldLogprobs")
    if c.kl_coef != 0 and b.get("refLogprobs") is None and mask.numel() > 0:
        raise ValueError("klCoef is set but no reference logprobs were given")
    if c.tis_cap > 0 and b.get("rolloutLogprobs") is None and mask.numel() > 0:
        raise ValueError("tisCap is set but no rollout logprobs were given")

    ratio = torch.exp(lp - old)
    clipped_ratio = ratio.clamp(1.0 - c.eps_clip, 1.0 + c.eps_clip_high)
    pg1, pg2 = -A * ratio, -A * clipped_ratio
    pg = torch.maximum(pg1, pg2)
    clipped = pg2 > pg1
    dual = torch.zeros_like(clipped)
    if c.eps_clip_c > 0:
        pg3 = -A * c.eps_clip_c
        dual = (A < 0) & (pg3 < pg)
        pg = torch.where(dual, pg3.detach(), pg)
    tw = torch.ones_like(lp)
    if c.tis_cap > 0:
        tw = torch.exp(old - t("rolloutLogprobs")).clamp(max=c.tis_cap)
    pg = pg * tw
    k = torch.zeros_like(lp)
    if b.get("refLogprobs") is not None:
        delta = lp - t("refLogprobs")
        k = delta if c.kl_type == "k1" else 0.5 * delta * delta if c.kl_type == "k2" else torch.exp(-delta) - 1.0 + delta
    e = ent.double()
    if c.uniform_coef > 0 and uce is None:
        raise ValueError("uniformCoef is set but the forward's uniform cross-entropy was not given")
    u = uce.double() if c.uniform_coef > 0 else torch.zeros_like(lp)
    per_token = pg + c.kl_coef * k - c.entropy_coef * e + c.uniform_coef * u
    wm = torch.where(mask, w, torch.zeros_like(w))
    loss = (wm * torch.where(mask, per_token, torch.zeros_like(per_token))).sum()
    zero = lambda x: torch.where(mask, x, torch.zeros_like(x))  # noqa: E731
    with torch.no_grad():
        metrics = {
            "pgLoss": float((wm * zero(pg)).sum()), "kl": float((wm * zero(k)).sum()), "entropy": float((wm * zero(e)).sum()),
            "clipfrac": float((wm * zero(clipped.double())).sum()), "dualClipfrac": float((wm * zero(dual.double())).sum()),
            "ratioMean": float((wm * zero(ratio)).sum()), "ppoKl": float((wm * zero(old - lp)).sum()),
            "tisMean": float((wm * zero(tw)).sum()), "uniformCe": float((wm * zero(u)).sum()),
            "ratioMin": float(ratio[mask].min()) if n_tok > 0 else 0.0, "ratioMax": float(ratio[mask].max()) if n_tok > 0 else 0.0,
            "numTokens": n_tok, "numSamples": n_samp, "valueLoss": 0.0, "valueClipfrac": 0.0, "valueMean": 0.0,
        }
    if c.value_coef > 0:
        if values is None or b.get("oldValues") is None or b.get("returns") is None:
            raise ValueError("valueCoef is set but values, old values or returns are missing (the trainer needs a value head and the batch oldValues and returns)")
        v, old_v, R = values.double(), t("oldValues"), t("returns")
        l1 = 0.5 * (v - R) ** 2
        lv, vclipped = l1, torch.zeros_like(mask)
        if c.value_clip > 0:
            vc = old_v + (v - old_v).clamp(-c.value_clip, c.value_clip)
            l2 = 0.5 * (vc.detach() - R) ** 2  # V outside the clip range: Vc does not move with V
            vclipped = l2 > l1
            lv = torch.where(vclipped, l2, l1)
        value_loss = (wm * zero(lv)).sum()
        loss = loss + c.value_coef * value_loss
        with torch.no_grad():
            metrics["valueLoss"] = float(value_loss)
            metrics["valueClipfrac"] = float((wm * zero(vclipped.double())).sum())
            metrics["valueMean"] = float((wm * zero(v)).sum())
    metrics["loss"] = float(loss.detach())
    return loss, metrics
