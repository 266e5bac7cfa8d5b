#!/usr/bin/python3
"""Reference fixtures for dsc's MoE gate (moe/gate*.c).

An independent PyTorch restatement of DeepSpeed's top1gating, top2gating and
topkgating (deepspeed/moe/sharded_moe.py) as specified in
/work/shared/reference/moe.md, with every random element off (no random token
selection, no RSample, no second-expert sampling) and ties broken as dsc
documents (docs/moe_gate.md): lower token index first, then lower expert index.

For a few random logit matrices it writes, per case, one small JSON file under
tests/moe/fixtures/: the gate configuration, the logits, the expected routing
(capacity, per-token routes [expert, slot or -1, weight], exp_counts,
kept_counts), l_aux, the router z-loss, and the autograd gradient of
  sum(d_weight * weight) + aux_loss_coef * l_aux + z_loss_coef * z_loss
with respect to the logits.

Precision: the capacity is computed in float32 exactly as DeepSpeed does; the
softmax, weights, losses and gradients in float64 (dsc computes them in double
too). Every case is also re-run in float32, DeepSpeed's precision, and must
give the same routing and weights within 1e-6, which shows the fixtures do not
sit on a precision-sensitive edge.

Run: /usr/bin/python3 tests/ref/moe_gate_ref.py   (torch 1.13; writes the fixtures)
"""
import json
import os

import torch
import torch.nn.functional as F

FIXTURE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "moe", "fixtures")
F32_EPS = torch.finfo(torch.float32).eps  # DeepSpeed clamps the top-2/top-k denominator here


def capacity(num_tokens, num_experts, factor, min_capacity):
    """ceil(S/E * factor) with factor already multiplied by k in Python; the
    product is a float32 tensor as in DeepSpeed's _capacity."""
    c = int(torch.ceil((num_tokens / num_experts) * torch.tensor(factor, dtype=torch.float32)).item())
    return max(c, min_capacity)


def choose_experts(logits, gates, k):
    """Route order per token: top-1; first then second; by descending gate."""
    num_experts = gates.shape[1]
    if k == 1:
        return torch.argmax(gates, dim=1, keepdim=True)
    if k == 2:
        first = torch.argmax(gates, dim=1)
        rest = logits.detach().masked_fill(F.one_hot(first, num_experts).bool(), float("-inf"))
        return torch.stack([first, torch.argmax(rest, dim=1)], dim=1)
    # A stable descending sort keeps the lower expert index first among equal gates.
    return torch.sort(gates.detach(), dim=1, descending=True, stable=True).indices[:, :k]


def locations_and_keep(cfg, gates, choices, cap):
    """Per route: slot in the expert buffer (valid where kept) and whether it is kept."""
    num_tokens, num_experts = gates.shape
    k = cfg["k"]
    masks = [F.one_hot(choices[:, r], num_experts) for r in range(k)]  # k x (S, E) int64
    if k == 1:
        # Without random token selection the first tokens in order win.
        loc = torch.cumsum(masks[0], dim=0) - 1
        locs = [loc]
    elif k == 2:
        first_total = masks[0].sum(dim=0, keepdim=True)
        locs = [torch.cumsum(masks[0], dim=0) - 1, torch.cumsum(masks[1], dim=0) - 1 + first_total]
    else:
        routed = sum(masks)  # (S, E) 0/1
        if cfg["drop_tokens"] and cfg["drop_policy"] == "probs":
            # Keep the cap most probable routed tokens per expert (ties: lower
            # token index, via a stable sort), then number the survivors in token order.
            score = torch.where(routed.bool(), gates.detach(), torch.full_like(gates, -1.0))
            order = torch.sort(score, dim=0, descending=True, stable=True).indices[:cap]
            survivors = torch.zeros_like(routed).scatter(0, order, 1) * routed
            loc = torch.cumsum(survivors, dim=0) - 1
            loc = torch.where(survivors.bool(), loc, torch.full_like(loc, cap))  # cap = "not kept"
        else:
            loc = torch.cumsum(routed, dim=0) - 1
        locs = [loc] * k
    slot = torch.stack([(locs[r] * masks[r]).sum(dim=1) for r in range(k)], dim=1)  # (S, k)
    return slot, slot < cap


def gate(cfg, logits):
    """Returns routing (capacity, experts, slots, kept, counts) and the
    differentiable outputs (weights (S, k), l_aux, z_loss) of one forward."""
    num_tokens, num_experts = logits.shape
    k = cfg["k"]
    gates = F.softmax(logits, dim=1)
    choices = choose_experts(logits, gates, k)  # (S, k)
    masks = [F.one_hot(choices[:, r], num_experts) for r in range(k)]
    exp_counts = sum(masks).sum(dim=0)
    factor = cfg["capacity_factor"] if cfg["training"] else cfg["eval_capacity_factor"]
    if cfg["drop_tokens"]:
        cap = capacity(num_tokens, num_experts, factor * k, cfg["min_capacity"])
    else:
        cap = int(exp_counts.max().item())
        if k == 1:
            cap = min(cap, num_tokens)
    slot, kept = locations_and_keep(cfg, gates, choices, cap)

    route_gates = gates.gather(1, choices) * kept.to(gates.dtype)
    if k == 1:
        weight = route_gates
    else:
        denom = torch.clamp(route_gates.sum(dim=1, keepdim=True), min=F32_EPS)
        weight = route_gates / denom

    me = gates.mean(dim=0)
    if k == 1:
        ce = masks[0].to(gates.dtype).mean(dim=0)
        l_aux = torch.sum(me * ce) * num_experts
    elif k == 2:
        ce = masks[0].to(gates.dtype).mean(dim=0)  # first choices only
        l_aux = torch.mean(me * ce) * num_experts * num_experts
    else:
        ce = sum(masks).to(gates.dtype).mean(dim=0)
        l_aux = torch.mean(me * ce) * num_experts * num_experts / k
    z_loss = torch.mean(torch.logsumexp(logits, dim=1) ** 2)
    routing = {
        "capacity": cap,
        "expert": choices,
        "slot": torch.where(kept, slot, torch.full_like(slot, -1)),
        "kept": kept,
        "exp_counts": exp_counts,
        "kept_counts": torch.zeros(num_experts, dtype=torch.int64).scatter_add(0, choices[kept], torch.ones_like(choices[kept])),
    }
    return routing, weight, l_aux, z_loss


def grid(t, step):
    """Rounds to a multiple of `step` (a power of two), so values are exact in float32 and short in JSON."""
    return torch.round(t / step) * step


def well_separated(cfg, logits):
    """No exact or near ties anywhere a tie rule would decide: among a token's
    logits, and among the gates of the tokens routed to one expert."""
    gates = F.softmax(logits, dim=1)
    sorted_rows = torch.sort(logits, dim=1, descending=True).values
    if (sorted_rows[:, :-1] - sorted_rows[:, 1:]).min() < 1e-3:
        return False
    routing, _, _, _ = gate(cfg, logits)
    for e in range(logits.shape[1]):
        tokens = (routing["expert"] == e).any(dim=1)
        g = torch.sort(gates[tokens, e]).values
        if len(g) > 1 and (g[1:] - g[:-1]).min() < 1e-5:
            return False
    return True


def make_case(case):
    gen = torch.Generator().manual_seed(case["seed"])
    S, E, k = case["S"], case["E"], case["k"]
    cfg = {
        "k": k,
        "capacity_factor": case.get("capacity_factor", 1.0),
        "eval_capacity_factor": case.get("eval_capacity_factor", 1.0),
        "min_capacity": case.get("min_capacity", 4),
        "drop_tokens": case.get("drop_tokens", True),
        "drop_policy": case.get("drop_policy", "probs"),
        "training": case.get("training", True),
        "aux_loss_coef": case.get("aux_loss_coef", 0.01),
        "z_loss_coef": case.get("z_loss_coef", 0.0),
    }
    while True:
        # A per-expert bias makes some experts popular, so capacity matters.
        bias = torch.randn(E, generator=gen, dtype=torch.float64)
        logits = grid(torch.randn(S, E, generator=gen, dtype=torch.float64) * 1.5 + bias, 1 / 64)
        if well_separated(cfg, logits):
            break
    d_weight = grid(torch.randn(S, k, generator=gen, dtype=torch.float64), 1 / 64)

    x = logits.clone().requires_grad_(True)
    routing, weight, l_aux, z_loss = gate(cfg, x)
    objective = (d_weight * weight).sum() + cfg["aux_loss_coef"] * l_aux + cfg["z_loss_coef"] * z_loss
    objective.backward()

    # DeepSpeed's own precision must lead to the same routing and the same numbers.
    r32, w32, l32, _ = gate(cfg, logits.float())
    for key in ("expert", "slot", "exp_counts", "kept_counts"):
        assert torch.equal(routing[key], r32[key]), (case["name"], key)
    assert routing["capacity"] == r32["capacity"]
    assert (w32.double() - weight.detach()).abs().max() < 1e-6, case["name"]
    assert abs(l32.item() - l_aux.item()) < 1e-6 * max(1.0, abs(l_aux.item())), case["name"]

    routes = []
    for s in range(S):
        routes.append([[int(routing["expert"][s, r]), int(routing["slot"][s, r]), float(weight[s, r])]
                       for r in range(k)])
    return {
        "name": case["name"],
        "description": case["description"],
        "config": cfg,
        "logits": logits.tolist(),
        "expected": {
            "capacity": routing["capacity"],
            "routes": routes,
            "exp_counts": routing["exp_counts"].tolist(),
            "kept_counts": routing["kept_counts"].tolist(),
            "l_aux": l_aux.item(),
            "z_loss": z_loss.item(),
        },
        "backward": {
            "d_weight": d_weight.tolist(),
            "d_logits": [[float("%.10g" % v) for v in row] for row in x.grad.tolist()],
        },
    }


CASES = [
    dict(name="top1_s32_e4_cf1", S=32, E=4, k=1, capacity_factor=1.0, seed=11,
         description="top-1, capacity 8, popular experts overflow"),
    dict(name="top1_s64_e8_cf1p5", S=64, E=8, k=1, capacity_factor=1.5, seed=12, z_loss_coef=0.001,
         description="top-1, capacity factor 1.5, with z-loss"),
    dict(name="top1_s16_e8_mincap", S=16, E=8, k=1, capacity_factor=1.0, min_capacity=5, seed=13,
         description="top-1, min_capacity 5 raises capacity from 2"),
    dict(name="top1_s48_e8_nodrop", S=48, E=8, k=1, drop_tokens=False, seed=14,
         description="top-1, drop_tokens false: capacity = largest load"),
    dict(name="top2_s32_e4_cf1", S=32, E=4, k=2, capacity_factor=1.0, seed=21,
         description="top-2, capacity 16, second choices dropped first"),
    dict(name="top2_s64_e8_cf1p5", S=64, E=8, k=2, capacity_factor=1.5, seed=22, z_loss_coef=0.001,
         description="top-2, capacity factor 1.5, with z-loss"),
    dict(name="top2_s24_e8_nodrop", S=24, E=8, k=2, drop_tokens=False, seed=23,
         description="top-2, drop_tokens false"),
    dict(name="top2_s20_e4_eval", S=20, E=4, k=2, capacity_factor=2.0, eval_capacity_factor=0.75,
         training=False, seed=24, description="top-2 in eval mode: eval_capacity_factor 0.75 applies"),
    dict(name="top3_s32_e8_probs_cf1", S=32, E=8, k=3, capacity_factor=1.0, seed=31,
         description="top-3, drop policy probs"),
    dict(name="top3_s48_e8_position_cf1", S=48, E=8, k=3, capacity_factor=1.0, drop_policy="position", seed=32,
         description="top-3, drop policy position"),
    dict(name="top3_s64_e4_probs_cf1", S=64, E=4, k=3, capacity_factor=1.0, seed=33, z_loss_coef=0.001,
         description="top-3 of 4 experts, drop policy probs, with z-loss"),
    dict(name="top3_s40_e8_nodrop", S=40, E=8, k=3, drop_tokens=False, seed=34,
         description="top-3, drop_tokens false"),
]


def main():
    os.makedirs(FIXTURE_DIR, exist_ok=True)
    for case in CASES:
        fixture = make_case(case)
        path = os.path.join(FIXTURE_DIR, case["name"] + ".json")
        with open(path, "w") as f:
            json.dump(fixture, f, separators=(",", ":"))
            f.write("\n")
        exp = fixture["expected"]
        dropped = sum(e - k for e, k in zip(exp["exp_counts"], exp["kept_counts"]))
        print("%-28s capacity %3d  routes %4d  dropped %3d  l_aux %.6f" %
              (case["name"], exp["capacity"], sum(exp["exp_counts"]), dropped, exp["l_aux"]))


if __name__ == "__main__":
    main()
