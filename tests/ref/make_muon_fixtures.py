"""Reference results for dsc's Muon: three steps of DeepSpeed's own Muon
update on a few parameters, written to tests/engine/muon_fixtures.json (read
by tests/engine/test_optimizer_muon.c).

DeepSpeed's pieces are called directly (deepspeed 0.19, installed without
its dependencies: pip install --no-deps --target /opt/ds deepspeed hjson
py-cpuinfo msgpack ninja psutil einops):
  - which parameters use Muon: deepspeed.set_optimizer_flags' rule (ndim >= 2
    and no "embed" / "lm_head" in the name; dsc's LM head is "head.weight");
  - the Muon direction: deepspeed/runtime/zero/muon/original_muon.muon_update
    (Nesterov momentum, Newton-Schulz "gram" or "standard", the
    max(1, rows/cols)^0.5 scale; expert banks through is_expert_group),
    which DeepSpeed's ZeRO-1/2 applies in get_flat_partition;
  - the step: muon_optimizer.MuonWithAuxAdam.step's arithmetic
    (p *= 1 - lr*wd; p -= lr*update for Muon parameters, original_muon's
    adam_update for the rest).
DeepSpeed runs Newton-Schulz in bf16 where the accelerator supports it; dsc
runs it in f32, so the accelerator is made to report no bf16/fp16 support.

Rerun: PYTHONPATH=/opt/ds /opt/venv/bin/python tests/ref/make_muon_fixtures.py
"""
import json
import os

import torch
from deepspeed.runtime.zero.muon import original_muon as om


class _F32Only:
    def is_bf16_supported(self):
        return False

    def is_fp16_supported(self):
        return False


om.get_accelerator = lambda: _F32Only()

torch.manual_seed(0)
# name, shape, weight decay applies (dsc: DSC_PARAM_NO_DECAY clear)
PARAMS = [
    ("layers.0.attn.q.weight", (6, 4), True),  # rows > cols: transposed inside NS, scale sqrt(1.5)
    ("layers.0.mlp.down.weight", (3, 5), True),  # rows < cols: the Gram iteration proper
    ("layers.0.mlp.up.weight", (4, 4), True),  # square: the standard iteration in both methods
    ("layers.0.moe.experts.up.weight", (2, 5, 3), True),  # expert bank: one matrix per expert
    ("embed.wte.weight", (7, 4), True),  # an embedding: Adam
    ("layers.0.ln1.weight", (4,), False),  # a vector: Adam, no decay
]
EXPERT = "experts"
LR, MUON_LR, ADAM_LR, WD, MOMENTUM, BETAS, EPS = 0.01, 0.02, 0.003, 0.1, 0.95, (0.9, 0.95), 1e-10

init = [torch.randn(shape) for _, shape, _ in PARAMS]
grads = [[torch.randn(shape) for _, shape, _ in PARAMS] for _ in range(3)]


def uses_muon(name, shape):
    return len(shape) >= 2 and not any(k in name.lower() for k in ("embed", "lm_head")) and name != "head.weight"


def run(ns_method):
    ps = [p.clone() for p in init]
    state = [dict(m=torch.zeros_like(p), v=torch.zeros_like(p)) for p in ps]
    for t, gs in enumerate(grads, start=1):
        for i, ((name, shape, decay), p, g) in enumerate(zip(PARAMS, ps, gs)):
            wd = WD if decay else 0.0
            g = g.clone()
            if uses_muon(name, shape):
                update = om.muon_update(g, state[i]["m"], beta=MOMENTUM, ns_method=ns_method,
                                        is_expert_group=EXPERT in name)
                p.mul_(1 - MUON_LR * wd)
                p.add_(update.reshape(p.shape), alpha=-MUON_LR)
            else:
                update = om.adam_update(g, state[i]["m"], state[i]["v"], t, BETAS, EPS)
                p.mul_(1 - ADAM_LR * wd)
                p.add_(update, alpha=-ADAM_LR)
    return ps


out = {
    "lr": LR, "muon_lr": MUON_LR, "adam_lr": ADAM_LR, "weight_decay": WD, "momentum": MOMENTUM,
    "betas": list(BETAS), "eps": EPS,
    "params": [{"name": n, "shape": list(s), "decay": d} for n, s, d in PARAMS],
    "init": [p.flatten().tolist() for p in init],
    "grads": [[g.flatten().tolist() for g in gs] for gs in grads],
    "expected": {m: [p.flatten().tolist() for p in run(m)] for m in ("gram", "standard")},
}
path = os.path.join(os.path.dirname(__file__), "..", "engine", "muon_fixtures.json")
with open(path, "w") as f:
    json.dump(out, f, indent=1)
print("wrote", os.path.normpath(path))
