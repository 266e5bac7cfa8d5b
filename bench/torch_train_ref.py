#!/usr/bin/python3
"""PyTorch reference for bench_train: the same GPT-2 model (pre-LayerNorm
blocks, tanh GELU, learned positions, tied embeddings, biases), the same batch
and AdamW, on the same number of CPU threads (--bf16: under bf16 autocast, against
dsc's bf16 mixed precision; --fp16: under fp16 autocast with GradScaler, against dsc's fp16). Prints tokens/s on its last line
as "tokens_per_s <value>" for bench_train to read.

Run with Debian's /usr/bin/python3 (python3-torch)."""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, nh):
        super().__init__()
        self.nh = nh
        self.ln1 = nn.LayerNorm(c)
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)
        self.ln2 = nn.LayerNorm(c)
        self.fc = nn.Linear(c, 4 * c)
        self.out = nn.Linear(4 * c, c)

    def forward(self, x, mask):
        b, t, c = x.shape
        hs = c // self.nh
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.nh, hs).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(mask[:t, :t], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, c, nh, vocab, seq):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.wpe = nn.Embedding(seq, c)
        self.blocks = nn.ModuleList(Block(c, nh) for _ in range(layers))
        self.ln_f = nn.LayerNorm(c)
        self.register_buffer("mask", torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1))

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t))
        for blk in self.blocks:
            x = blk(x, self.mask)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--d-model", type=int, required=True)
    p.add_argument("--heads", type=int, required=True)
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--bf16", action="store_true", help="forward and backward under torch.autocast(cpu, bfloat16)")
    p.add_argument("--fp16", action="store_true",
                   help="forward and backward under torch.autocast(cpu, float16), the loss scaled by GradScaler")
    p.add_argument("--flush-denormal", action="store_true",
                   help="torch.set_flush_denormal(True): subnormal results as zero (they cost Intel cores assists)")
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    torch.set_flush_denormal(a.flush_denormal)
    model = GPT(a.layers, a.d_model, a.heads, a.vocab, a.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    data = torch.randint(0, min(a.vocab, 256), (a.batch, a.seq + 1))
    x, y = data[:, :-1], data[:, 1:]

    low = torch.float16 if a.fp16 else torch.bfloat16
    scaler = torch.amp.GradScaler("cpu", enabled=a.fp16)

    def step():
        with torch.autocast("cpu", dtype=low, enabled=a.bf16 or a.fp16):
            loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss.item()

    step()  # warm-up
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    dt = time.perf_counter() - t0
    params = sum(q.numel() for q in model.parameters())
    mixed = ", bf16 autocast" if a.bf16 else ", fp16 autocast + GradScaler" if a.fp16 else ""
    print(f"torch {torch.__version__}, {params} parameters, {a.threads} threads{mixed}"
          f"{', denormals flushed' if a.flush_denormal else ''}")
    print(f"tokens_per_s {a.batch * a.seq * a.steps / dt:.1f}")


if __name__ == "__main__":
    main()
