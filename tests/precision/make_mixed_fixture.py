#!/usr/bin/env python3
"""PyTorch reference for mixed-precision training (tests/precision/test_mixed_fidelity.c).

The tiny untied GPT of tests/ref/make_model_fixtures.py ("gpt_untied": same
classes, same weights and tokens), trained STEPS steps on one batch with
AdamW + clipping in the schemes DeepSpeed's optimizers implement:

  fp32        plain f32 training (the baseline);
  bf16        fp32 master weights and AdamW state; every step the model's
              parameters are the master rounded to bf16, forward/backward
              compute in f32 on them (as dsc does on the CPU) but for the
              linear layers' products (and the head's), whose operands are
              rounded to bf16 and whose products are summed in f32, forward
              and backward (autocast's bf16 matmuls; dsc's
              dsc_kernels_set_matmul_dtype), the attention computed as a
              bf16 flash attention (LowAttention), the feed-forward's first
              products' outputs (fc; gate and up) rounded to bf16 before the
              activation reads them (a bf16 linear's output) and each block's
              residual sum x + attn(norm1(x)) and the logits rounded to bf16
              (a bf16 model's), the activations between layers
              (embedding and block outputs) and their gradients are rounded
              to bf16, every gradient is rounded to bf16, then clip + AdamW
              update the master;
  fp16        the same with fp16 (the products' operands, the attention as an
              fp16 flash attention: a GPU's fp16 GEMMs with f32 sums) and
              DeepSpeed's dynamic loss scaling: (loss * scale).backward(), so
              the gradient operands are rounded at the scale, gradients
              rounded to fp16, an inf/nan gradient skips the step, scale from DeepSpeed's own
              DynamicLossScaler (loaded from /opt/ds; see
              gen_precision_fixtures.py), unscaled before clipping;
  bf16_lowp   DeepSpeed as it runs on a GPU: model.to(torch.bfloat16),
              forward and backward computed in bf16 (activations bf16 too),
              gradients cast to f32 for the fp32 master's AdamW;
  fp16_lowp   the same in fp16 with the dynamic loss scale;
  bf16_autocast  torch.autocast("cpu", dtype=torch.bfloat16) over the f32
              model (autocast's own choice of what runs in bf16: the
              linears and matmuls, with bf16 outputs; the residual stream
              stays f32), f32 parameter gradients, the fp32 AdamW;
  fp16_autocast  the same in fp16, with the dynamic loss scale.

Written: tests/precision/fixtures/mixed_gpt.{idx,bin} (the nn fixture
format: meta lines, params, tokens, and loss/<mode> (STEPS,), skipped/<mode>,
scale/<mode>, grad0_bf16/<param>: bf16's first-step gradients, and
grad0_fp16/<param>: fp16's at the loss scale 2^fp16_grad0_scale_power, still
scaled).

Run: PYTHONPATH=/opt/ds /opt/venv/bin/python tests/precision/make_mixed_fixture.py
"""
import copy
import math
import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "ref"))
sys.path.insert(0, HERE)
import make_model_fixtures as mm  # noqa: E402
from gen_precision_fixtures import load_deepspeed_loss_scaler  # noqa: E402

STEPS = 8
CASE = "gpt_untied"
FP16 = dict(initial_scale_power=20, loss_scale_window=3, hysteresis=2, min_loss_scale=1.0)
FP16_GRAD0_POWER = 8


def round_to(t, dtype):
    return t if dtype is None else t.to(dtype).float()


class RoundBetween(torch.autograd.Function):
    """An activation stored in `dtype` between layers; its gradient too (already at the loss scale)."""

    @staticmethod
    def forward(ctx, x, dtype):
        ctx.dtype = dtype
        return x.to(dtype).float()

    @staticmethod
    def backward(ctx, g):
        return g.to(ctx.dtype).float(), None


class LowLinear(torch.autograd.Function):
    """x @ w.T + b with both operands of each product rounded to `low` (bf16 / fp16) and f32 sums:
    forward, and the two products of the backward (dsc's linear in bf16 / fp16 products)."""

    @staticmethod
    def forward(ctx, x, w, b, low):
        xr, wr = round_to(x, low), round_to(w, low)
        ctx.save_for_backward(xr, wr)
        ctx.bias, ctx.low = b is not None, low
        y = xr @ wr.t()
        return y + b if b is not None else y

    @staticmethod
    def backward(ctx, g):
        xr, wr = ctx.saved_tensors
        gr = round_to(g, ctx.low)
        dw = gr.reshape(-1, gr.shape[-1]).t() @ xr.reshape(-1, xr.shape[-1])
        db = g.reshape(-1, g.shape[-1]).sum(0) if ctx.bias else None
        return gr @ wr, dw, db, None


class LowAttention(torch.autograd.Function):
    """Causal attention of (B, NH, T, HS) q, k, v as a bf16 / fp16 flash attention computes it
    (PyTorch's CPU flash kernel, FlashAttention-2; dsc's CPU attention in bf16 / fp16 products):
    every product's operands rounded to `low` and summed in f32; the exponentials rounded after their f32 row sum is
    taken and before they multiply v, the output rounded once normalised. The backward rounds the
    output gradient, the recomputed probabilities before dv and the score gradients P (dP - D)
    before dq and dk. T fits one key block, so the maximum is the row's."""

    @staticmethod
    def scores(qr, kr):
        t = qr.shape[-2]
        s = (qr @ kr.transpose(-2, -1)) / math.sqrt(qr.shape[-1])
        return s.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1), float("-inf"))

    @staticmethod
    def forward(ctx, q, k, v, low):
        bf = ctx.low = low
        qr, kr, vr = round_to(q, bf), round_to(k, bf), round_to(v, bf)
        s = LowAttention.scores(qr, kr)
        m = s.amax(-1, keepdim=True)
        e = torch.exp(s - m)
        total = e.sum(-1, keepdim=True)
        out = round_to((round_to(e, bf) @ vr) / total, bf)
        ctx.save_for_backward(qr, kr, vr, out, m + torch.log(total))
        return out

    @staticmethod
    def backward(ctx, g):
        bf = ctx.low
        qr, kr, vr, out, lse = ctx.saved_tensors
        gr = round_to(g, bf)
        p = torch.exp(LowAttention.scores(qr, kr) - lse)
        ds = round_to(p * (gr @ vr.transpose(-2, -1) - (gr * out).sum(-1, keepdim=True)), bf)
        scale = 1 / math.sqrt(qr.shape[-1])
        return ds @ kr * scale, ds.transpose(-2, -1) @ qr * scale, round_to(p, bf).transpose(-2, -1) @ gr, None


def mlp_rounded(mlp, x, dtype):
    """mm.Mlp with what its activation reads rounded to `dtype` (the gradient passes through)."""
    if mlp.llama:
        return mlp.down(F.silu(RoundOutput.apply(mlp.gate(x), dtype)) * RoundOutput.apply(mlp.up(x), dtype))
    return mlp.proj(F.gelu(RoundOutput.apply(mlp.fc(x), dtype), approximate="tanh"))


class RoundOutput(torch.autograd.Function):
    """A product's output stored in `dtype`; the gradient as it is (the next product rounds it)."""

    @staticmethod
    def forward(ctx, x, dtype):
        return x.to(dtype).float()

    @staticmethod
    def backward(ctx, g):
        return g, None


def block_rounded(block, x, dtype):
    """mm.Block with its residual sum stored in `dtype` (its input is, between layers)."""
    r = RoundOutput.apply(x + block.attn(block.norm1(x)), dtype)
    return r + block.mlp(block.norm2(r))


def forward_rounded(model, tokens, targets, dtype):
    plain, plain_attend, plain_mlp = torch.nn.Linear.forward, mm.Attention.attend, mm.Mlp.forward
    plain_block = mm.Block.forward
    mm.Block.forward = lambda self, x: block_rounded(self, x, dtype)
    torch.nn.Linear.forward = lambda self, x: LowLinear.apply(x, self.weight, self.bias, dtype)
    mm.Attention.attend = lambda self, q, k, v: LowAttention.apply(q, k, v, dtype)
    mm.Mlp.forward = lambda self, x: mlp_rounded(self, x, dtype)
    try:
        x = RoundBetween.apply(model.embed(tokens), dtype)
        for block in model.layers:
            x = RoundBetween.apply(block(x), dtype)
        head = model.head
        w = head.tied.weight if head.tied is not None else head.weight
        logits = RoundOutput.apply(LowLinear.apply(head.norm(x), w, None, dtype), dtype)
    finally:
        torch.nn.Linear.forward, mm.Attention.attend, mm.Mlp.forward = plain, plain_attend, plain_mlp
        mm.Block.forward = plain_block
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)


def train(model0, tokens, targets, mode, ds, steps=STEPS, scale_power=FP16["initial_scale_power"]):
    master = copy.deepcopy(model0).float()
    names = [n for n, _ in master.named_parameters()]
    mp = dict(master.named_parameters())
    decay = [mp[n] for n in names if mp[n].dim() >= 2]
    no_decay = [mp[n] for n in names if mp[n].dim() < 2]
    opt = torch.optim.AdamW([dict(params=decay, weight_decay=mm.WEIGHT_DECAY),
                             dict(params=no_decay, weight_decay=0.0)], lr=mm.LR, betas=mm.BETAS, eps=mm.EPS)
    low = {"bf16": torch.bfloat16, "fp16": torch.float16, "bf16_lowp": torch.bfloat16,
           "fp16_lowp": torch.float16, "bf16_autocast": torch.bfloat16, "fp16_autocast": torch.float16}.get(mode)
    lowp = mode.endswith("_lowp")
    autocast = mode.endswith("_autocast")
    grad_low = None if autocast else low  # autocast's parameter gradients are f32
    scaler = None
    if low is torch.float16:
        scaler = ds.DynamicLossScaler(init_scale=2.0 ** scale_power,
                                      scale_window=FP16["loss_scale_window"], min_scale=FP16["min_loss_scale"],
                                      delayed_shift=FP16["hysteresis"], consecutive_hysteresis=False)
    losses, skipped, scales, grads0 = [], [], [], {}
    for step in range(steps):
        work = copy.deepcopy(master)
        if lowp:
            work = work.to(low)
        elif not autocast:
            with torch.no_grad():
                for p in work.parameters():
                    p.copy_(round_to(p, low))
        scale = scaler.cur_scale if scaler else 1.0
        if autocast:
            with torch.autocast("cpu", dtype=low):
                _, loss = work(tokens, targets)
        elif low is None or lowp:
            _, loss = work(tokens, targets)
        else:
            loss = forward_rounded(work, tokens, targets, low)
        (loss * scale).backward()
        overflow = False
        wp = dict(work.named_parameters())
        for n in names:
            g = round_to(wp[n].grad.float(), grad_low)
            overflow |= not torch.isfinite(g).all().item()
            mp[n].grad = g
        if step == 0:
            grads0 = {n: mp[n].grad.clone() for n in names}
        losses.append(loss.float().item())
        scales.append(scale)
        skipped.append(1 if overflow else 0)
        if scaler:
            scaler.update_scale(overflow)
        if overflow:
            opt.zero_grad()
            continue
        for n in names:
            mp[n].grad = mp[n].grad / scale
        torch.nn.utils.clip_grad_norm_([mp[n] for n in names], mm.CLIP)
        opt.step()
        opt.zero_grad()
    return losses, skipped, scales, grads0


def main():
    ds, _ = load_deepspeed_loss_scaler()
    cfg = mm.CASES[CASE]
    seed = next(s for s in range(2000, 2100) if mm.well_conditioned(cfg, s))
    model, tokens, targets = mm.build(cfg, seed)
    out = os.path.join(HERE, "fixtures")
    os.makedirs(out, exist_ok=True)
    w = mm.Writer(os.path.join(out, "mixed_gpt"))
    w.meta("seed", seed)
    for k, v in cfg.items():
        w.meta(k, v)
    for k, v in dict(batch=mm.B, steps=STEPS, lr=mm.LR, beta1=mm.BETAS[0], beta2=mm.BETAS[1], eps=mm.EPS,
                     weight_decay=mm.WEIGHT_DECAY, clip=mm.CLIP, **FP16).items():
        w.meta(k, v)
    w.meta("fp16_grad0_scale_power", FP16_GRAD0_POWER)
    w.array("tokens", tokens)
    w.array("targets", targets)
    for n, p in model.named_parameters():
        w.array("param/" + n, p.float())
    for mode in ["fp32", "bf16", "fp16", "bf16_lowp", "fp16_lowp", "bf16_autocast", "fp16_autocast"]:
        losses, skipped, scales, grads0 = train(model, tokens, targets, mode, ds)
        if mode == "bf16":  # the first step's gradients, rounded to bf16 (scale 1)
            for n, g in grads0.items():
                w.array("grad0_bf16/" + n, g)
        if mode == "fp16":  # the first step's gradients at a scale that does not overflow: 2^8 times
            first = train(model, tokens, targets, mode, ds, steps=1, scale_power=FP16_GRAD0_POWER)
            assert first[1] == [0]
            for n, g in first[3].items():
                w.array("grad0_fp16/" + n, g)
        w.array("loss/" + mode, torch.tensor(losses))
        w.array("skipped/" + mode, torch.tensor(skipped, dtype=torch.int32))
        w.array("scale/" + mode, torch.tensor(scales))
        print(f"{mode:10s} " + " ".join(f"{x:.5f}" for x in losses) + f"  skipped {skipped}")
    w.close()


if __name__ == "__main__":
    main()
