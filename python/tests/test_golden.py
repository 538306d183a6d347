"""The PyTorch worker's own tests (no Node needed): the golden vectors of test/fixtures/trainer-golden
(expected losses and gradients from ooze's float64 references) through TorchTrainer in-process, and
the wire format's typed arrays. On a GPU machine: OOZE_TEST_DEVICE=cuda.

    cd python && .venv/bin/python -m unittest discover -s tests -v
"""
from __future__ import annotations

import os
import unittest

import numpy as np
import torch

from ooze_torch.group import Group, pick_device
from ooze_torch.trainer import TorchTrainer
from ooze_torch.wire import decode_body, encode_frame

GOLDEN = os.path.join(os.path.dirname(__file__), "..", "..", "test", "fixtures", "trainer-golden", "golden.msgpack")
DEVICE = os.environ.get("OOZE_TEST_DEVICE", "cpu")


def close(name: str, got: np.ndarray, want: np.ndarray, atol: float, rtol: float) -> str:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    bad = ~(np.abs(got - want) <= atol + rtol * np.abs(want))
    if not bad.any():
        return ""
    i = int(np.argmax(np.abs(got - want)))
    return f"{name}: {int(bad.sum())}/{bad.size} differ; worst at {i}: {got[i]} vs {want[i]}"


class GoldenVectors(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(GOLDEN, "rb") as f:
            cls.g = decode_body(f.read())

    def trainer(self) -> TorchTrainer:
        t = TorchTrainer(Group(0, 1, pick_device(DEVICE, 0)), "fp32", "sdpa", False)
        t.init({"config": self.g["config"], "params": self.g["params"], "seed": None})
        t.set_value_head(self.g["valueHead"])
        return t

    def test_forward(self):
        t, g = self.trainer(), self.g
        out = t.logprobs({"tokens": g["batch"]["tokens"], "cuSeqlens": g["batch"]["cuSeqlens"]}, g["temperature"])
        for k in ("logprobs", "entropy", "values"):
            self.assertEqual(close(k, out[k], g["forward"][k], 2e-5, 0), "")

    def test_every_case(self):
        t, g, b = self.trainer(), self.g, self.g["batch"]
        problems = []
        for c in g["cases"]:
            t.zero_grads()
            loss = c["loss"]
            batch = {**b, "rolloutLogprobs": b["rolloutLogprobs"] if loss.get("tisCap") else None,
                     "refLogprobs": b["refLogprobs"] if loss.get("klCoef") else None,
                     "oldValues": b["oldValues"] if c["critic"] else None, "returns": b["returns"] if c["critic"] else None}
            m = t.accumulate(batch, loss)
            for k, want in c["metrics"].items():
                if not abs(m[k] - want) <= 1e-5 + 1e-4 * abs(want):
                    problems.append(f"{c['name']}: {k} {m[k]} vs {want}")
            problems.append(close(f"{c['name']}: grads", t.get_grads(), c["grads"], 3e-5, 1e-3))
            head = t.get_value_head()["grads"]
            problems.append(close(f"{c['name']}: value head", head, c["headGrads"] if c["headGrads"] is not None else np.zeros_like(head), 3e-5, 1e-3))
        self.assertEqual([p for p in problems if p], [])


class Precision(unittest.TestCase):
    """bf16 compute (fp32 master weights) and gradient checkpointing against plain fp32."""

    @classmethod
    def setUpClass(cls):
        with open(GOLDEN, "rb") as f:
            cls.g = decode_body(f.read())

    def step(self, dtype: str, ckpt: bool):
        g, b = self.g, self.g["batch"]
        t = TorchTrainer(Group(0, 1, pick_device(DEVICE, 0)), dtype, "sdpa", ckpt)
        t.init({"config": g["config"], "params": g["params"], "seed": None})
        calls = []
        t.model.model.layers[0].self_attn.register_forward_pre_hook(lambda *_: calls.append(1))
        batch = {k: b[k] for k in ("tokens", "cuSeqlens", "lossMask", "advantages", "oldLogprobs")}
        m = t.train_step(batch, {"temperature": g["temperature"]}, {"lr": 1e-3})
        self.attention_calls = len(calls)  # 2 with checkpointing: the backward ran the layer again
        return m, t.get_params()

    def test_gradient_checkpointing_changes_nothing(self):
        m1, p1 = self.step("fp32", False)
        self.assertEqual(self.attention_calls, 1)
        m2, p2 = self.step("fp32", True)
        self.assertEqual(self.attention_calls, 2)
        self.assertAlmostEqual(m1["loss"], m2["loss"], delta=1e-6)
        self.assertAlmostEqual(m1["gradNorm"], m2["gradNorm"], delta=1e-5 * max(1.0, m1["gradNorm"]))
        self.assertEqual(close("params", p2, p1, 1e-6, 0), "")

    def test_bf16_is_near_fp32_and_keeps_fp32_weights(self):
        (m1, p1), (m2, p2) = self.step("fp32", False), self.step("bf16", False)
        self.assertEqual(p2.dtype, np.float32)
        self.assertLess(abs(m1["loss"] - m2["loss"]), 2e-2 + 2e-2 * abs(m1["loss"]))
        self.assertLess(abs(m1["gradNorm"] - m2["gradNorm"]), 0.05 * m1["gradNorm"])
        # one AdamW step at lr 1e-3 moves each weight by about lr: bf16's noise must not change its direction much
        moved1, moved2 = p1 - self.g["params"], p2 - self.g["params"]
        agree = float(np.mean(np.sign(moved1) == np.sign(moved2)))
        self.assertGreater(agree, 0.8)


class Wire(unittest.TestCase):
    def test_typed_arrays_round_trip(self):
        msg = {"id": 7, "a": np.arange(5, dtype=np.float32), "b": np.array([1, 0, 1], dtype=np.uint8), "c": np.array([-3, 4], dtype=np.int32), "d": None}
        back = decode_body(encode_frame(msg)[4:])
        self.assertEqual(back["id"], 7)
        for k in ("a", "b", "c"):
            self.assertEqual(back[k].dtype, msg[k].dtype)
            self.assertTrue(np.array_equal(back[k], msg[k]))
        self.assertIsNone(back["d"])


if __name__ == "__main__":
    torch.manual_seed(0)
    unittest.main()
