#!/usr/bin/python3
"""PyTorch reference for bench_moe (EP 1): the same MoE layer, forward and
backward, on one process and the same number of threads.

The layer as DeepSpeed computes it (its TopKGate and MOELayer, written here
from their description, not copied): router logits x @ Wg^T in f32, top-k
gate with GShard capacity k * cf * S / E (at least min_capacity), slots from a
cumulative sum over tokens, no random token selection or sampled second
expert (bench_moe turns both off); dispatch as the einsum "sec,sm->ecm" of the
dispatch mask, the experts as batched GEMMs over (E, C, M) with biases and
tanh GELU, combine as "sec,ecm->sm" with the normalised gate weights.
--dispatch gather replaces both einsums by index_select / index_add (what a
PyTorch user would write to avoid the dense (S, E, C) masks); bench_moe takes
the faster of the two as its peer.

Prints "tokens_per_s <value>" on its last line."""
import argparse
import math
import time

import torch
import torch.nn.functional as F


def gate(logits, k, capacity_factor, min_capacity):
    """Routes (S, k): expert, slot (-1: dropped), normalised weight; and the capacity."""
    S, E = logits.shape
    probs = F.softmax(logits, dim=1)
    capacity = max(min_capacity, math.ceil(k * capacity_factor * S / E))
    top_w, top_e = torch.topk(probs, k, dim=1)
    masks = F.one_hot(top_e, E)  # (S, k, E)
    # the first choices of every token fill the slots before the second choices
    order = masks.permute(1, 0, 2).reshape(k * S, E)
    slots = (torch.cumsum(order, dim=0) - 1).reshape(k, S, E).permute(1, 0, 2)
    slot = (slots * masks).sum(dim=2)  # (S, k)
    kept = slot < capacity
    w = top_w * kept
    w = w / w.sum(dim=1, keepdim=True).clamp_min(torch.finfo(w.dtype).eps)
    return top_e, torch.where(kept, slot, torch.full_like(slot, -1)), w, capacity


def experts(xin, w1, b1, w2, b2):
    h = F.gelu(torch.baddbmm(b1.unsqueeze(1), xin, w1), approximate="tanh")
    return torch.baddbmm(b2.unsqueeze(1), h, w2)


def moe_einsum(x, wg, w1, b1, w2, b2, k, cf, min_cap):
    S, M = x.shape
    E = wg.shape[0]
    e, slot, w, C = gate(x @ wg.t(), k, cf, min_cap)
    keep = slot >= 0
    sec = torch.zeros(S, E, C, dtype=x.dtype)
    tok = torch.arange(S).unsqueeze(1).expand_as(e)
    sec[tok[keep], e[keep], slot[keep]] = w[keep]
    dispatch = (sec > 0).to(x.dtype)
    xin = torch.einsum("sec,sm->ecm", dispatch, x)
    return torch.einsum("sec,ecm->sm", sec, experts(xin, w1, b1, w2, b2))


def moe_gather(x, wg, w1, b1, w2, b2, k, cf, min_cap):
    S, M = x.shape
    E = wg.shape[0]
    e, slot, w, C = gate(x @ wg.t(), k, cf, min_cap)
    keep = (slot >= 0).reshape(-1)
    rows = (e * C + slot).reshape(-1)[keep]
    tok = torch.arange(S).repeat_interleave(k)[keep]
    xin = torch.zeros(E * C, M, dtype=x.dtype).index_copy(0, rows, x.index_select(0, tok))
    y = experts(xin.view(E, C, M), w1, b1, w2, b2).view(E * C, M)
    contrib = y.index_select(0, rows) * w.reshape(-1)[keep].unsqueeze(1)
    return torch.zeros(S, M, dtype=x.dtype).index_add(0, tok, contrib)


def main():
    ap = argparse.ArgumentParser()
    for name, default in [("tokens", 1024), ("d-model", 256), ("d-ff", 512), ("experts", 8), ("k", 2),
                          ("iters", 10), ("threads", 1), ("min-capacity", 4)]:
        ap.add_argument("--" + name, type=int, default=default)
    ap.add_argument("--capacity-factor", type=float, default=1.0)
    ap.add_argument("--dispatch", choices=["einsum", "gather"], default="einsum")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    S, M, F_, E = a.tokens, a.d_model, a.d_ff, a.experts
    params = [torch.randn(E, M) * 0.02, torch.randn(E, M, F_) * 0.02, torch.zeros(E, F_),
              torch.randn(E, F_, M) * 0.02, torch.zeros(E, M)]
    for p in params:
        p.requires_grad_(True)
    x = (torch.rand(S, M) - 0.5).requires_grad_(True)
    g = torch.rand(S, M) - 0.5
    layer = moe_einsum if a.dispatch == "einsum" else moe_gather
    t0 = 0.0
    for it in range(-2, a.iters):
        if it == 0:
            t0 = time.perf_counter()
        out = layer(x, *params, a.k, a.capacity_factor, a.min_capacity)
        (out * g).sum().backward()
    t = (time.perf_counter() - t0) / a.iters
    C = max(a.min_capacity, math.ceil(a.k * a.capacity_factor * S / E))
    print(f"torch MoE ({a.dispatch} dispatch, Cap {C}): {1e3 * t:.2f} ms per forward+backward")
    print(f"tokens_per_s {S / t:.1f}")


if __name__ == "__main__":
    main()
