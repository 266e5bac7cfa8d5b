#!/usr/bin/python3
"""Whole-model fidelity fixtures for tests/nn/test_model_fidelity.c.

Builds tiny GPT-2-style and Llama-style decoders in plain PyTorch (float64,
written here independently of dsc), with fixed random weights and tokens, and
writes for each case: the weights (named exactly like dsc's parameters), the
tokens and targets, the logits and mean loss, every parameter gradient, and
the parameters after 3 AdamW steps with gradient clipping.

Run with Debian's torch:  /usr/bin/python3 tests/ref/make_model_fixtures.py
Output: tests/nn/fixtures/<case>.bin (raw little-endian f32/i32 arrays) and
<case>.idx (text: "meta <key> <value>" lines, then one line per array:
"<name> <dtype> <byte offset> <ndim> <dims...>").
"""
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

B, T = 2, 16
STEPS = 3
LR, BETAS, EPS, WEIGHT_DECAY, CLIP = 1e-2, (0.9, 0.95), 1e-8, 0.1, 1.0
NEAR_ZERO = 1e-5

CASES = {
    "gpt_tied": dict(arch="gpt", n_layer=2, d_model=32, n_head=4, n_kv_head=4, d_ff=128, vocab_size=64,
                     seq_len=16, tie_embeddings=1, qkv_bias=1, rope_theta=10000.0, norm_eps=1e-5),
    "gpt_untied": dict(arch="gpt", n_layer=2, d_model=32, n_head=4, n_kv_head=4, d_ff=128, vocab_size=64,
                       seq_len=16, tie_embeddings=0, qkv_bias=1, rope_theta=10000.0, norm_eps=1e-5),
    "llama": dict(arch="llama", n_layer=2, d_model=32, n_head=4, n_kv_head=2, d_ff=48, vocab_size=64,
                  seq_len=16, tie_embeddings=0, qkv_bias=0, rope_theta=10000.0, norm_eps=1e-5),
}


class RMSNorm(nn.Module):
    def __init__(self, c, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(c))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def make_norm(cfg):
    if cfg["arch"] == "llama":
        return RMSNorm(cfg["d_model"], cfg["norm_eps"])
    return nn.LayerNorm(cfg["d_model"], eps=cfg["norm_eps"])


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope(x, theta):
    """x (B, NH, T, HS); Hugging Face / Llama rotate-half convention."""
    hs, t = x.shape[-1], x.shape[-2]
    inv_freq = 1.0 / (theta ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs))
    freqs = torch.outer(torch.arange(t, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return x * emb.cos() + rotate_half(x) * emb.sin()


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        c, self.nh, self.nkv = cfg["d_model"], cfg["n_head"], cfg["n_kv_head"]
        self.hs = c // self.nh
        self.llama = cfg["arch"] == "llama"
        self.theta = cfg["rope_theta"]
        qkv_bias = bool(cfg["qkv_bias"])
        self.q = nn.Linear(c, c, bias=qkv_bias)
        self.k = nn.Linear(c, self.nkv * self.hs, bias=qkv_bias)
        self.v = nn.Linear(c, self.nkv * self.hs, bias=qkv_bias)
        self.o = nn.Linear(c, c, bias=not self.llama)

    def forward(self, x):
        b, t, c = x.shape
        q = self.q(x).view(b, t, self.nh, self.hs).transpose(1, 2)
        k = self.k(x).view(b, t, self.nkv, self.hs).transpose(1, 2)
        v = self.v(x).view(b, t, self.nkv, self.hs).transpose(1, 2)
        if self.llama:
            q, k = rope(q, self.theta), rope(k, self.theta)
        k = k.repeat_interleave(self.nh // self.nkv, dim=1)
        v = v.repeat_interleave(self.nh // self.nkv, dim=1)
        y = self.attend(q, k, v).transpose(1, 2).reshape(b, t, c)
        return self.o(y)

    def attend(self, q, k, v):
        """Causal softmax attention of (B, NH, T, HS) q, k, v."""
        t = q.shape[-2]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.hs)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
        return att @ v


class Mlp(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        c, f = cfg["d_model"], cfg["d_ff"]
        self.llama = cfg["arch"] == "llama"
        if self.llama:
            self.gate = nn.Linear(c, f, bias=False)
            self.up = nn.Linear(c, f, bias=False)
            self.down = nn.Linear(f, c, bias=False)
        else:
            self.fc = nn.Linear(c, f)
            self.proj = nn.Linear(f, c)

    def forward(self, x):
        if self.llama:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.norm1 = make_norm(cfg)
        self.attn = Attention(cfg)
        self.norm2 = make_norm(cfg)
        self.mlp = Mlp(cfg)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Embed(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.wte = nn.Embedding(cfg["vocab_size"], cfg["d_model"])
        self.wpe = nn.Embedding(cfg["seq_len"], cfg["d_model"]) if cfg["arch"] == "gpt" else None

    def forward(self, tokens):
        x = self.wte(tokens)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(tokens.shape[1]))
        return x


class Head(nn.Module):
    def __init__(self, cfg, wte):
        super().__init__()
        self.norm = make_norm(cfg)
        self.tied = wte if cfg["tie_embeddings"] else None
        if self.tied is None:
            self.weight = nn.Parameter(torch.empty(cfg["vocab_size"], cfg["d_model"]))

    def forward(self, x):
        w = self.tied.weight if self.tied is not None else self.weight
        return self.norm(x) @ w.t()


class Model(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed = Embed(cfg)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg["n_layer"]))
        self.head = Head(cfg, self.embed.wte)

    def forward(self, tokens, targets):
        x = self.embed(tokens)
        for block in self.layers:
            x = block(x)
        logits = self.head(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)
        return logits, loss


def fill_weights(model, gen):
    """Non-trivial values everywhere (norm weights around 1, biases nonzero), rounded to f32."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and "norm" in name and name.endswith("weight"):
                v = 1.0 + 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
            elif p.dim() == 1:
                v = 0.05 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
            else:
                v = 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
            p.copy_(v.float().double())


class Writer:
    def __init__(self, path):
        self.path = path
        self.lines = []
        self.blob = bytearray()

    def meta(self, key, value):
        self.lines.append(f"meta {key} {value}")

    def array(self, name, t):
        t = t.detach().contiguous()
        dtype = "i32" if t.dtype in (torch.int32, torch.int64) else "f32"
        data = t.to(torch.int32 if dtype == "i32" else torch.float32).numpy().tobytes()
        dims = " ".join(str(d) for d in t.shape)
        self.lines.append(f"{name} {dtype} {len(self.blob)} {t.dim()} {dims}".rstrip())
        self.blob += data

    def close(self):
        with open(self.path + ".bin", "wb") as f:
            f.write(self.blob)
        with open(self.path + ".idx", "w") as f:
            f.write("\n".join(self.lines) + "\n")
        return len(self.blob)


def build(cfg, seed):
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = Model(cfg).double()
    fill_weights(model, gen)
    tokens = torch.randint(0, cfg["vocab_size"], (B, T), generator=gen)
    targets = torch.randint(0, cfg["vocab_size"], (B, T), generator=gen)
    targets[0, 3] = targets[1, 0] = targets[1, 15] = -1  # ignored positions
    return model, tokens, targets


def well_conditioned(cfg, seed):
    """Adam's first step is lr * g / (|g| + eps), nearly a sign function: an
    element whose exact gradient is within float32 rounding of 0 moves by an
    arbitrary +-lr in a float32 implementation, and that one weight then shifts
    every later gradient. Such data tests rounding luck, not dsc, so a seed is
    used only if every gradient element is exactly 0 (unused embedding rows, and
    the key bias, which softmax's shift invariance makes identically 0 and the
    C test checks apart) or at least NEAR_ZERO times its tensor's largest."""
    model, tokens, targets = build(cfg, seed)
    _, loss = model(tokens, targets)
    loss.backward()
    for n, p in model.named_parameters():
        g = p.grad.abs()
        top = g.max().item()
        if top < 1e-12:
            continue
        if ((g > 1e-12 * top) & (g < NEAR_ZERO * top)).any():
            return False
    return True


def make_case(name, cfg, base_seed, out_dir):
    seed = next(s for s in range(base_seed, base_seed + 100) if well_conditioned(cfg, s))
    model, tokens, targets = build(cfg, seed)

    w = Writer(os.path.join(out_dir, name))
    w.meta("seed", seed)
    for key, value in cfg.items():
        w.meta(key, value)
    for key, value in dict(batch=B, steps=STEPS, lr=LR, beta1=BETAS[0], beta2=BETAS[1], eps=EPS,
                           weight_decay=WEIGHT_DECAY, clip=CLIP).items():
        w.meta(key, value)
    params = dict(model.named_parameters())
    w.array("tokens", tokens)
    w.array("targets", targets)
    for n, p in params.items():
        w.array("param/" + n, p)

    decay = [p for n, p in params.items() if p.dim() >= 2]
    no_decay = [p for n, p in params.items() if p.dim() < 2]
    opt = torch.optim.AdamW([dict(params=decay, weight_decay=WEIGHT_DECAY), dict(params=no_decay, weight_decay=0.0)],
                            lr=LR, betas=BETAS, eps=EPS)
    for step in range(STEPS):
        opt.zero_grad()
        logits, loss = model(tokens, targets)
        loss.backward()
        if step == 0:
            w.array("logits", logits)
            w.array("loss", loss.reshape(1))
            for n, p in params.items():
                w.array("grad/" + n, p.grad)
        torch.nn.utils.clip_grad_norm_(list(params.values()), CLIP)
        opt.step()
    for n, p in params.items():
        w.array(f"step{STEPS}/" + n, p)
    size = w.close()
    print(f"{name}: seed {seed}, {len(params)} parameters, loss {loss.item():.6f} (last step), {size} bytes")
    return size


def main():
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "nn", "fixtures")
    os.makedirs(out_dir, exist_ok=True)
    total = sum(make_case(name, cfg, 1000 * (i + 1), out_dir) for i, (name, cfg) in enumerate(CASES.items()))
    print(f"total {total} bytes")


if __name__ == "__main__":
    main()
