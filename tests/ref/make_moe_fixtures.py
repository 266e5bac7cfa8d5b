#!/usr/bin/python3
"""MoE fidelity fixtures for tests/moe/test_moe_fixtures.c.

Restates, in plain PyTorch (float64, independently of dsc), the MoE layer of
docs/moe.md with top-2 routing and no dropped tokens (DeepSpeed's top2gating
with drop_tokens=False and deterministic second expert, which is Mixtral's
router: softmax, top-2, weights renormalised over the two), the load-balancing
loss l_aux = E * sum_e me[e] * ce[e] (ce from first choices), the router
z-loss, GELU or SwiGLU experts and the PR-MoE residual; and a tiny
Mixtral-style model (RMSNorm, RoPE, GQA, SwiGLU experts, top-2, every block
MoE) and a GPT-MoE (every second block MoE, GELU experts) built from the
dense pieces of make_model_fixtures.py.

Each case stores the weights under dsc's parameter names, the inputs, the
outputs, the losses and every gradient of
    layer cases: J = sum(out * G) + aux_coef * l_aux + z_coef * z_loss
    model cases: J = cross_entropy + sum over MoE blocks of (aux_coef * l_aux + z_coef * z_loss)

Run with Debian's torch:  /usr/bin/python3 tests/ref/make_moe_fixtures.py
Output: tests/moe/fixtures/<case>.{bin,idx} in make_model_fixtures.py's format.
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_model_fixtures import Attention, Embed, Head, Writer, fill_weights, make_norm  # noqa: E402

B, T = 2, 8
AUX_COEF, Z_COEF = 0.1, 0.01

LAYER_CASES = {
    "moe_layer_gelu_residual": dict(arch="gpt", d_model=16, d_ff=24, num_experts=4, use_residual=1),
    "moe_layer_swiglu": dict(arch="llama", d_model=16, d_ff=24, num_experts=4, use_residual=0),
}

MODEL_CASES = {
    "mixtral_tiny": dict(arch="llama", model_arch="mixtral", n_layer=2, d_model=16, n_head=4, n_kv_head=2, d_ff=24,
                         vocab_size=32, seq_len=T, tie_embeddings=0, qkv_bias=0, rope_theta=10000.0,
                         norm_eps=1e-5, num_experts=4, layer_freq=1),
    "gpt_moe_tiny": dict(arch="gpt", model_arch="gpt_moe", n_layer=2, d_model=16, n_head=4, n_kv_head=4, d_ff=24,
                         vocab_size=32, seq_len=T, tie_embeddings=1, qkv_bias=1, rope_theta=10000.0,
                         norm_eps=1e-5, num_experts=4, layer_freq=2),
}


class Expert(nn.Module):
    """One expert, named as dsc names it: fc/proj with biases (GELU) or gate/up/down (SwiGLU)."""

    def __init__(self, cfg):
        super().__init__()
        m, f = cfg["d_model"], cfg["d_ff"]
        self.swiglu = cfg["arch"] == "llama"
        if self.swiglu:
            self.gate = nn.Linear(m, f, bias=False)
            self.up = nn.Linear(m, f, bias=False)
            self.down = nn.Linear(f, m, bias=False)
        else:
            self.fc = nn.Linear(m, f)
            self.proj = nn.Linear(f, m)

    def forward(self, x):
        if self.swiglu:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class MoE(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        m, e = cfg["d_model"], cfg["num_experts"]
        self.gate = nn.Linear(m, e, bias=False)
        self.experts = nn.ModuleList(Expert(cfg) for _ in range(e))
        self.residual = bool(cfg.get("use_residual", 0))
        if self.residual:
            self.mlp = Expert(cfg)
            self.coefficient = nn.Linear(m, 2)

    def forward(self, x):
        """x (..., M) -> (out, gate loss); top-2, nothing dropped."""
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        s, e = x.shape[0], len(self.experts)
        logits = self.gate(x)
        probs = logits.softmax(dim=-1)
        top_p, top_i = probs.topk(2, dim=-1)  # (S, 2): first choice, then second
        weights = top_p / top_p.sum(dim=-1, keepdim=True).clamp(min=torch.finfo(torch.float32).eps)
        out = torch.zeros_like(x)
        for j in range(2):
            for k in range(e):
                rows = top_i[:, j] == k
                if rows.any():
                    out[rows] += weights[rows, j:j + 1] * self.experts[k](x[rows])
        me = probs.mean(dim=0)
        ce = torch.bincount(top_i[:, 0], minlength=e).to(x.dtype) / s
        l_aux = e * (me * ce).sum()
        z_loss = torch.logsumexp(logits, dim=-1).pow(2).mean()
        if self.residual:
            coef = self.coefficient(x).softmax(dim=-1)
            out = out * coef[:, 0:1] + self.mlp(x) * coef[:, 1:2]
        return out.reshape(shape), AUX_COEF * l_aux + Z_COEF * z_loss, top_i


class MoEBlock(nn.Module):
    def __init__(self, cfg, moe):
        super().__init__()
        self.norm1 = make_norm(cfg)
        self.attn = Attention(cfg)
        self.norm2 = make_norm(cfg)
        if moe:
            self.moe = MoE(cfg)
        else:
            self.mlp = Expert(cfg)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        if hasattr(self, "moe"):
            m, loss, _ = self.moe(self.norm2(x))
            return x + m, loss
        return x + self.mlp(self.norm2(x)), 0.0


class Model(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed = Embed(cfg)
        freq = cfg["layer_freq"]
        self.layers = nn.ModuleList(MoEBlock(cfg, (i + 1) % freq == 0) for i in range(cfg["n_layer"]))
        self.head = Head(cfg, self.embed.wte)

    def forward(self, tokens, targets):
        x = self.embed(tokens)
        aux = 0.0
        for block in self.layers:
            x, loss = block(x)
            aux = aux + loss
        logits = self.head(x)
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)
        return logits, ce, aux


def margins_ok(logits):
    """Top-2 routing must not sit on a near-tie that float32 rounding could flip."""
    top = logits.topk(3, dim=-1).values
    return bool(((top[:, 0] - top[:, 1]).min() > 1e-3) and ((top[:, 1] - top[:, 2]).min() > 1e-3))


def write_grads(w, named):
    for n, p in named:
        w.array("grad/" + n, p.grad)


def make_layer_case(name, cfg, base_seed, out_dir):
    for seed in range(base_seed, base_seed + 100):
        gen = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        moe = MoE(cfg).double()
        fill_weights(moe, gen)
        with torch.no_grad():  # a router strong enough that routing is clear-cut
            moe.gate.weight.mul_(5.0)
            moe.gate.weight.copy_(moe.gate.weight.float().double())
        x = torch.randn(B, T, cfg["d_model"], generator=gen, dtype=torch.float64).float().double()
        g = torch.randn(B, T, cfg["d_model"], generator=gen, dtype=torch.float64).float().double()
        if margins_ok(moe.gate(x.reshape(-1, cfg["d_model"]))):
            break
    x.requires_grad_(True)
    out, gate_loss, top_i = moe(x)
    ((out * g).sum() + gate_loss).backward()
    w = Writer(os.path.join(out_dir, name))
    w.meta("seed", seed)
    for key, value in cfg.items():
        w.meta(key, value)
    for key, value in dict(batch=B, seq=T, k=2, aux_coef=AUX_COEF, z_coef=Z_COEF).items():
        w.meta(key, value)
    named = [("layers.0.moe." + n, p) for n, p in moe.named_parameters()]
    for n, p in named:
        w.array("param/" + n, p)
    w.array("x", x)
    w.array("g", g)
    w.array("out", out)
    w.array("gate_loss", gate_loss.reshape(1))
    w.array("experts", top_i)
    w.array("grad/x", x.grad)
    write_grads(w, named)
    size = w.close()
    print(f"{name}: seed {seed}, gate loss {gate_loss.item():.6f}, {size} bytes")
    return size


def make_model_case(name, cfg, base_seed, out_dir):
    for seed in range(base_seed, base_seed + 100):
        torch.manual_seed(seed)
        gen = torch.Generator().manual_seed(seed)
        model = Model(cfg).double()
        fill_weights(model, gen)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n.endswith("moe.gate.weight"):
                    p.mul_(5.0)
                    p.copy_(p.float().double())
        tokens = torch.randint(0, cfg["vocab_size"], (B, T), generator=gen)
        targets = torch.randint(0, cfg["vocab_size"], (B, T), generator=gen)
        targets[0, 3] = -1
        routed = []
        hooks = [blk.moe.gate.register_forward_hook(lambda mod, inp, out: routed.append(out))
                 for blk in model.layers if hasattr(blk, "moe")]
        with torch.no_grad():
            model(tokens, targets)
        for h in hooks:
            h.remove()
        if all(margins_ok(r) for r in routed):
            break
    logits, ce, aux = model(tokens, targets)
    (ce + aux).backward()
    w = Writer(os.path.join(out_dir, name))
    w.meta("seed", seed)
    for key, value in cfg.items():
        w.meta(key, value)
    for key, value in dict(batch=B, k=2, aux_coef=AUX_COEF, z_coef=Z_COEF).items():
        w.meta(key, value)
    named = list(model.named_parameters())
    for n, p in named:
        w.array("param/" + n, p)
    w.array("tokens", tokens)
    w.array("targets", targets)
    w.array("logits", logits)
    w.array("loss", ce.reshape(1))
    w.array("aux_loss", aux.reshape(1))
    write_grads(w, named)
    size = w.close()
    print(f"{name}: seed {seed}, loss {ce.item():.6f}, aux {aux.item():.6f}, {len(named)} parameters, {size} bytes")
    return size


def main():
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "moe", "fixtures")
    os.makedirs(out_dir, exist_ok=True)
    total = sum(make_layer_case(n, c, 100 * (i + 1), out_dir) for i, (n, c) in enumerate(LAYER_CASES.items()))
    total += sum(make_model_case(n, c, 5000 + 100 * i, out_dir) for i, (n, c) in enumerate(MODEL_CASES.items()))
    print(f"total {total} bytes")


if __name__ == "__main__":
    main()
