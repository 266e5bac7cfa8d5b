"""Reference results for dsc's optimizers: three steps of each update rule in
PyTorch, from the same start values and gradients, written to
tests/engine/optimizer_fixtures.json (read by tests/engine/test_optimizer_rules.c).

AdamW, Adam (L2 weight decay, adam_w_mode false) and SGD with momentum are
torch.optim's own. Adam without bias correction, Lamb and Lion have no
torch.optim class, so they are restated here in PyTorch as DeepSpeed defines
them: Lamb as deepspeed/ops/lamb (csrc/lamb/fused_lamb_cuda_kernel.cu: direction
m / (sqrt(v) + eps) + wd * p from the uncorrected moments, step size
lr * sqrt(1 - b2^t) / (1 - b1^t), trust ratio ||p|| / ||direction|| per
parameter clamped to [min_coeff, max_coeff], 1 when either norm is 0), Lion as
the paper (Chen et al. 2023, Algorithm 1) and deepspeed/ops/lion.

The matrix has weight decay, the vector none (two parameter groups).
Rerun: /opt/venv/bin/python tests/ref/make_optimizer_fixtures.py
"""
import json
import os

import torch

torch.manual_seed(0)
W0 = torch.randn(4, 3)
b0 = torch.randn(5)
grads = [(torch.randn(4, 3), torch.randn(5)) for _ in range(3)]
LR, WD, BETAS, EPS = 0.01, 0.1, (0.9, 0.99), 1e-8


def params():
    return [W0.clone().requires_grad_(True), b0.clone().requires_grad_(True)]


def run_torch(make):
    W, b = params()
    opt = make([{"params": [W]}, {"params": [b], "weight_decay": 0.0}])
    for gW, gb in grads:
        W.grad, b.grad = gW.clone(), gb.clone()
        opt.step()
    return W.detach(), b.detach()


def run_manual(update):
    ps = [W0.clone(), b0.clone()]
    state = [dict(m=torch.zeros_like(p), v=torch.zeros_like(p)) for p in ps]
    for t, gs in enumerate(grads, start=1):
        for i, (p, g) in enumerate(zip(ps, gs)):
            update(p, g, state[i], t, WD if i == 0 else 0.0)
    return ps


def adam_no_bias_correction(p, g, s, t, wd):
    p.mul_(1 - LR * wd)
    s["m"].mul_(BETAS[0]).add_(g, alpha=1 - BETAS[0])
    s["v"].mul_(BETAS[1]).add_(g * g, alpha=1 - BETAS[1])
    p.sub_(LR * s["m"] / (s["v"].sqrt() + EPS))


def lamb(max_coeff, min_coeff):
    def update(p, g, s, t, wd):
        b1, b2 = BETAS
        s["m"].mul_(b1).add_(g, alpha=1 - b1)
        s["v"].mul_(b2).add_(g * g, alpha=1 - b2)
        u = s["m"] / (s["v"].sqrt() + EPS) + wd * p
        step_size = LR * (1 - b2**t) ** 0.5 / (1 - b1**t)
        w_norm, u_norm = p.norm(), u.norm()
        trust = 1.0
        if w_norm > 0 and u_norm > 0:
            trust = float(torch.clamp(w_norm / u_norm, min_coeff, max_coeff))
        p.sub_(step_size * trust * u)

    return update


def lion(p, g, s, t, wd):
    b1, b2 = BETAS
    c = b1 * s["m"] + (1 - b1) * g
    p.mul_(1 - LR * wd).sub_(LR * torch.sign(c))
    s["m"].mul_(b2).add_(g, alpha=1 - b2)


cases = {
    "adamw": run_torch(lambda g: torch.optim.AdamW(g, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)),
    "adam_l2": run_torch(lambda g: torch.optim.Adam(g, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)),
    "adamw_no_bias_correction": run_manual(adam_no_bias_correction),
    "sgd_momentum": run_torch(lambda g: torch.optim.SGD(g, lr=LR, momentum=0.9, weight_decay=WD)),
    "lamb": run_manual(lamb(10.0, 0.01)),
    "lamb_clamped": run_manual(lamb(0.3, 0.01)),
    "lion": run_manual(lion),
}

out = {
    "lr": LR, "weight_decay": WD, "betas": list(BETAS), "eps": EPS, "momentum": 0.9,
    "init": [W0.flatten().tolist(), b0.tolist()],
    "grads": [[gW.flatten().tolist(), gb.tolist()] for gW, gb in grads],
    "expected": {k: [v[0].flatten().tolist(), v[1].flatten().tolist()] for k, v in cases.items()},
}
path = os.path.join(os.path.dirname(__file__), "..", "engine", "optimizer_fixtures.json")
with open(path, "w") as f:
    json.dump(out, f, indent=1)
print("wrote", os.path.normpath(path))
