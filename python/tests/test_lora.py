"""LoRA on the PyTorch worker, in-process (no Node): PEFT's initialisation is a no-op over the base,
the base stays frozen and AdamW holds the adapter alone, the adapter's gradients are the merged
weight's by the chain rule (dA = s·Bᵀ·dW, dB = s·dW·Aᵀ), gradient checkpointing changes them not
and bf16 little, and a checkpoint is a PEFT directory that loads back, with its errors naming the
file and field. The agreement with the native worker is
test/native/torch-worker.test.ts's.
"""
from __future__ import annotations

import json
import os
import tempfile
import unittest

import numpy as np

from ooze_torch.group import Group, pick_device
from ooze_torch.trainer import TorchTrainer, WorkerError
from ooze_torch.wire import decode_body
from test_golden import DEVICE, GOLDEN, close

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class Lora(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(GOLDEN, "rb") as f:
            cls.g = decode_body(f.read())
        b = cls.g["batch"]
        cls.batch = {k: b[k] for k in ("tokens", "cuSeqlens", "lossMask", "advantages", "oldLogprobs")}

    def trainer(self) -> TorchTrainer:
        t = TorchTrainer(Group(0, 1, pick_device(DEVICE, 0)), "fp32", "sdpa", False)
        t.init({"config": self.g["config"], "params": self.g["params"], "seed": None})
        return t

    def logprobs(self, t: TorchTrainer) -> np.ndarray:
        return t.logprobs(self.batch, 1.0)["logprobs"]

    def test_starts_as_the_base_and_trains_the_adapter_alone(self):
        t = self.trainer()
        base = self.logprobs(t)
        t.set_lora({"rank": 2, "alpha": 4, "targets": ALL, "seed": 3})
        np.testing.assert_array_equal(self.logprobs(t), base)
        n = t.info()["lora"]["numParams"]
        self.assertEqual(sum(p.numel() for grp in t.opt.param_groups for p in grp["params"]), n)
        for _ in range(2):
            t.train_step(self.batch, {}, {"lr": 1e-2})
        np.testing.assert_array_equal(t.get_params(), self.g["params"])
        self.assertGreater(float(np.abs(self.logprobs(t) - base).max()), 1e-4)
        self.assertEqual((t.info()["step"], t.get_lora()["step"]), (2, 2))
        t.set_lora(None)  # the whole model trains again
        self.assertIsNone(t.info()["lora"])
        np.testing.assert_array_equal(self.logprobs(t), base)
        self.assertEqual(t.get_grads().size, t.info()["numParams"])

    def test_adapter_gradients_are_the_merged_weights_by_the_chain_rule(self):
        t = self.trainer()
        t.set_lora({"rank": 3, "alpha": 5, "targets": ["q_proj", "o_proj", "up_proj"], "seed": 1})
        lora = t.get_lora()
        rng = np.random.default_rng(0)
        params = rng.uniform(-0.3, 0.3, lora["params"].size).astype(np.float32)
        t.set_lora({**lora["config"], "params": params})
        t.zero_grads()
        t.accumulate(self.batch, {"entropyCoef": 0.01})
        grads = t.get_lora()["grads"]
        # the same model with each adapted weight merged (W + s·B·A), trained whole
        s = 5 / 3
        info = t.info()
        offs = {x["name"]: (x["offset"], x["shape"]) for x in info["tensors"]}
        ad = {x["name"]: (x["offset"], x["shape"]) for x in lora["tensors"]}
        view = lambda flat, o: flat[o[0]:o[0] + int(np.prod(o[1]))].reshape(o[1])  # noqa: E731
        merged = self.g["params"].copy()
        pairs = []
        for name in ad:
            if name.endswith("lora_A.weight"):
                key = name.removeprefix("base_model.model.").removesuffix(".lora_A.weight") + ".weight"
                pairs.append((key, name, name.replace("lora_A", "lora_B")))
        for key, a, b in pairs:
            view(merged, offs[key])[:] += s * view(params, ad[b]) @ view(params, ad[a])
        full = self.trainer()
        full.set_params(merged)
        full.zero_grads()
        full.accumulate(self.batch, {"entropyCoef": 0.01})
        dw = full.get_grads()
        problems = []
        for key, a, b in pairs:
            A, B, dW = view(params, ad[a]), view(params, ad[b]), view(dw, offs[key])
            problems += [close(a, view(grads, ad[a]), s * B.T @ dW, 1e-6, 1e-4), close(b, view(grads, ad[b]), s * dW @ A.T, 1e-6, 1e-4)]
        self.assertEqual([p for p in problems if p], [])

    def test_gradient_checkpointing_and_bf16_with_an_adapter(self):
        grads = {}
        for dtype, ckpt in (("fp32", False), ("fp32", True), ("bf16", False)):
            t = TorchTrainer(Group(0, 1, pick_device(DEVICE, 0)), dtype, "sdpa", ckpt)
            t.init({"config": self.g["config"], "params": self.g["params"], "seed": None})
            t.set_lora({"rank": 2, "targets": ["q_proj", "down_proj"], "seed": 1})
            n = t.info()["lora"]["numParams"]
            t.set_lora({"rank": 2, "targets": ["q_proj", "down_proj"], "params": (0.3 * np.sin(np.arange(n))).astype(np.float32)})
            t.zero_grads()
            t.accumulate(self.batch, {})
            grads[(dtype, ckpt)] = t.get_lora()["grads"]
        self.assertEqual(close("checkpointed", grads[("fp32", True)], grads[("fp32", False)], 1e-7, 0), "")
        self.assertEqual(close("bf16", grads[("bf16", False)], grads[("fp32", False)], 2e-3, 0), "")

    def test_a_checkpoint_is_a_peft_directory_that_loads_back(self):
        t = self.trainer()
        t.set_lora({"rank": 2, "targets": ["q_proj", "v_proj"], "seed": 2})
        t.train_step(self.batch, {}, {"lr": 1e-2})
        with tempfile.TemporaryDirectory() as d:
            t.save(d, "5", {"optimizer": True})
            with open(os.path.join(d, "adapter_config.json")) as f:
                cfg = json.load(f)
            # built from params, not loaded: the base is written beside the adapter, which names it
            self.assertEqual((cfg["r"], cfg["lora_alpha"], cfg["target_modules"], cfg["base_model_name_or_path"]), (2, 4, ["q_proj", "v_proj"], os.path.join(d, "base")))
            u = TorchTrainer(Group(0, 1, pick_device(DEVICE, 0)), "fp32", "sdpa", False)
            info = u.init({"modelDir": d})
            self.assertEqual((info["step"], info["lora"]["rank"]), (1, 2))
            self.assertEqual(close("logprobs", self.logprobs(u), self.logprobs(t), 0, 0), "")
            bad = [({"r": 0}, "adapter_config.json: r must be a positive integer"),
                   ({"target_modules": "q_proj|v_proj"}, "target_modules must be a non-empty list"),
                   ({"bias": "all"}, "bias must be \"none\""),
                   ({"use_dora": True}, "use_dora is set")]
            for change, message in bad:
                with open(os.path.join(d, "adapter_config.json"), "w") as f:
                    json.dump({**cfg, **change}, f)
                with self.assertRaises(WorkerError) as e:
                    u.load_lora(d)
                self.assertEqual(e.exception.code, "CHECKPOINT_INVALID")
                self.assertIn(message, str(e.exception))
            with self.assertRaisesRegex(ValueError, r"setLora.rank must be a positive integer"):
                u.set_lora({"rank": 1.5})


if __name__ == "__main__":
    unittest.main()
