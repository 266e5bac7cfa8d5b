#!/usr/bin/env python3
"""The text dsc-generate must print for dsc's own MoE checkpoints, computed by
PyTorch (float64) from the checkpoint's weights with the models restated here
from their definitions (docs/models.md, docs/moe.md), not from dsc's code:

  gpt-moe   GPT-2 blocks (LayerNorm, learned positions, q/k/v/o biases, tanh
            GELU, tied head); every layer_freq-th block's MLP is a MoE of GELU
            experts with biases
  mixtral   Llama blocks (RMSNorm, rotate-half RoPE, grouped-query attention,
            untied head); MoE of SwiGLU experts (gate, up, down)
  MoE       router logits x @ gate^T, softmax over all experts, the top-k
            probabilities (ties to the lower expert id), combined with
            DeepSpeed's weights (top-1: the raw probability; top-k: divided by
            their sum), no capacity limit.

For each of tests/inference/fixtures/dsc/{gpt-moe,mixtral}.h5 it continues the
byte-tokenized prompt "ROMEO:" greedily by 20 tokens and writes
<arch>.expected.txt: the prompt, the continuation, a newline.

The checkpoints were trained by dsc (the configs beside them) and exported
model-only; any weights would do, trained ones give decisive logits:
  build/bin/dsc-train --prepare data/tinyshakespeare.txt ts.tok
  build/bin/dsc-train tests/inference/fixtures/dsc/ARCH.json --set data.path=ts.tok \\
      --set checkpoint.save_dir=ck --set train.steps=200 --set optimizer.params.lr=0.005 --sample 0
  build/bin/dsc-ckpt export ck --model-only tests/inference/fixtures/dsc/ARCH.h5
Run: /opt/venv/bin/python tests/ref/make_dsc_moe_reference.py
"""
import json
import math
import os

import h5py
import torch

DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "inference", "fixtures", "dsc")
PROMPT, N_NEW = b"ROMEO:", 20


def load(path):
    with h5py.File(path, "r") as f:
        cfg = json.loads(f.attrs["config"])
        w = {}
        f["model"].visititems(lambda n, o: w.__setitem__(n, torch.tensor(o[...], dtype=torch.float64))
                              if isinstance(o, h5py.Dataset) else None)
    return cfg, w


class Model:
    def __init__(self, cfg, w):
        m, e = cfg["model"], cfg["moe"]
        self.w, self.gpt = w, m["arch"] == "gpt-moe"
        self.L, self.C, self.NH, self.KVH = m["n_layer"], m["d_model"], m["n_head"], m["n_kv_head"]
        self.eps, self.theta = m["norm_eps"], m["rope_theta"]
        self.E, self.K, self.freq = e["num_experts"], e["k"], e["layer_freq"]
        assert not e["use_residual"]

    def norm(self, x, name):
        w = self.w
        if self.gpt:
            return torch.nn.functional.layer_norm(x, (self.C,), w[name + ".weight"], w[name + ".bias"], self.eps)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w[name + ".weight"]

    def linear(self, x, name):
        y = x @ self.w[name + ".weight"].t()
        return y + self.w[name + ".bias"] if name + ".bias" in self.w else y

    def rope(self, x):  # x (NH, T, HS)
        hs, T = x.shape[-1], x.shape[-2]
        inv = self.theta ** (-torch.arange(0, hs, 2, dtype=torch.float64) / hs)
        ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
        cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
        h = hs // 2
        rot = torch.cat([-x[..., h:], x[..., :h]], -1)
        return x * cos + rot * sin

    def attention(self, x, p):
        T, HS = x.shape[0], self.C // self.NH
        q = self.linear(x, p + ".q").view(T, self.NH, HS).transpose(0, 1)
        k = self.linear(x, p + ".k").view(T, self.KVH, HS).transpose(0, 1)
        v = self.linear(x, p + ".v").view(T, self.KVH, HS).transpose(0, 1)
        if not self.gpt:
            q, k = self.rope(q), self.rope(k)
        rep = self.NH // self.KVH
        k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
        att = q @ k.transpose(-1, -2) / math.sqrt(HS)
        att = att.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf")).softmax(-1)
        return self.linear((att @ v).transpose(0, 1).reshape(T, self.C), p + ".o")

    def gelu(self, x):
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))

    def expert(self, x, p):
        if self.gpt:
            return self.linear(self.gelu(self.linear(x, p + ".fc")), p + ".proj")
        g = self.linear(x, p + ".gate")
        return self.linear(g * torch.sigmoid(g) * self.linear(x, p + ".up"), p + ".down")

    def moe(self, x, p):
        probs = (x @ self.w[p + ".gate.weight"].t()).softmax(-1)
        out = torch.zeros_like(x)
        for t in range(x.shape[0]):
            chosen = sorted(range(self.E), key=lambda e: (-probs[t, e].item(), e))[: self.K]
            s = sum(probs[t, e] for e in chosen)
            for e in chosen:
                wgt = probs[t, e] if self.K == 1 else probs[t, e] / max(s, 2.0 ** -23)
                out[t] += wgt * self.expert(x[t:t + 1], "%s.experts.%d" % (p, e))[0]
        return out

    def logits(self, ids):
        w, T = self.w, len(ids)
        x = w["embed.wte.weight"][ids]
        if self.gpt:
            x = x + w["embed.wpe.weight"][:T]
        for l in range(self.L):
            p = "layers.%d" % l
            x = x + self.attention(self.norm(x, p + ".norm1"), p + ".attn")
            h = self.norm(x, p + ".norm2")
            is_moe = self.freq <= 1 or l % self.freq == self.freq - 1
            x = x + (self.moe(h, p + ".moe") if is_moe else self.linear(self.gelu(self.linear(h, p + ".mlp.fc")),
                                                                          p + ".mlp.proj"))
        head = w["head.weight"] if "head.weight" in w else w["embed.wte.weight"]
        return self.norm(x, "head.norm") @ head.t()


def main():
    for arch in ("gpt-moe", "mixtral"):
        cfg, w = load(os.path.join(DIR, arch + ".h5"))
        model, ids = Model(cfg, w), list(PROMPT)
        margins = []
        for _ in range(N_NEW):
            last = model.logits(torch.tensor(ids))[-1]
            top = torch.topk(last, 2).values
            margins.append((top[0] - top[1]).item())
            ids.append(int(torch.argmax(last)))
        with open(os.path.join(DIR, arch + ".expected.txt"), "wb") as f:
            f.write(bytes(ids) + b"\n")
        print("%s: %r (smallest top-1 margin %.3g)" % (arch, bytes(ids), min(margins)))


if __name__ == "__main__":
    main()
