"""DeepSpeed's OneCycle and LRRangeTest (deepspeed/runtime/lr_schedules.py),
restated in Python as a user's training loop sees them: the scheduler is built
before the first step (which sets the starting lr, and for OneCycle the
starting momentum cycle_min_mom) and stepped after every optimizer step. The
values each optimizer step n = 1..N runs with are written to
tests/engine/lr_schedule_fixtures.json for tests/engine/test_lr_schedule.c.

Rerun: python3 tests/ref/lr_schedule_ref.py
"""
import json
import math
import os


def one_cycle(p, steps):
    first = float(p["cycle_first_step_size"])
    second = float(p["cycle_second_step_size"]) if "cycle_second_step_size" in p else first
    total = first + second
    ratio = first / total
    stairs1 = p.get("cycle_first_stair_count", 0)
    stairs2 = p.get("cycle_second_stair_count", stairs1)
    decay_step = p.get("decay_step_size", 0)
    lo, hi = p["cycle_min_lr"], p["cycle_max_lr"]
    mlo, mhi = p.get("cycle_min_mom", 0.8), p.get("cycle_max_mom", 0.9)

    def scale(last):
        b = last + 1
        cycle = math.floor(1 + b / total)
        x = 1.0 + b / total - cycle
        if x <= ratio:
            s, stairs = x / ratio, stairs1
        else:
            s, stairs = (x - 1) / (ratio - 1), stairs2
        if stairs > 0:
            it = b % total
            pos = it * stairs / first if it <= first else (total - it) * stairs / second
            s = math.floor(pos) / stairs
        return s

    def lr_mom(last):
        if last < total:
            s = scale(last)
            return lo + (hi - lo) * s, mhi - (mhi - mlo) * s
        after = last - total + 1
        lr = lo if decay_step == 0 or p.get("decay_lr_rate", 0) == 0 else lo / (1 + p["decay_lr_rate"] * after / decay_step)
        mom = mhi if decay_step == 0 or p.get("decay_mom_rate", 0) == 0 else mhi * (1 + p["decay_mom_rate"] * after / decay_step)
        return lr, mom

    out = [(lo, mlo)]  # set when the scheduler is built
    for last in range(steps - 1):  # scheduler.step() after optimizer steps 1 .. N-1
        out.append(lr_mom(last))
    return out


def lr_range_test(p, steps):
    out = [p["lr_range_test_min_lr"]]
    for last in range(steps - 1):
        interval = (last + 1) / p["lr_range_test_step_size"]
        if p.get("lr_range_test_staircase", False):
            interval = math.floor(interval)
        out.append(p["lr_range_test_min_lr"] * (1 + p["lr_range_test_step_rate"] * interval))
    return out


cases = []
for params in [
    dict(cycle_min_lr=0.004, cycle_max_lr=0.015, cycle_first_step_size=10, cycle_second_step_size=4,
         cycle_first_stair_count=0, decay_step_size=5, decay_lr_rate=0.01, decay_mom_rate=0.1),
    dict(cycle_min_lr=0.004, cycle_max_lr=0.015, cycle_first_step_size=10, cycle_second_step_size=6,
         cycle_first_stair_count=4, cycle_second_stair_count=3, decay_step_size=0, cycle_min_mom=0.85,
         cycle_max_mom=0.95),
]:
    v = one_cycle(params, 30)
    cases.append(dict(type="OneCycle", params=params, lr=[x[0] for x in v], beta1=[x[1] for x in v]))
for params in [
    dict(lr_range_test_min_lr=1e-4, lr_range_test_step_size=5, lr_range_test_step_rate=2.0),
    dict(lr_range_test_min_lr=1e-4, lr_range_test_step_size=5, lr_range_test_step_rate=2.0,
         lr_range_test_staircase=True),
]:
    cases.append(dict(type="LRRangeTest", params=params, lr=lr_range_test(params, 30)))

path = os.path.join(os.path.dirname(__file__), "..", "engine", "lr_schedule_fixtures.json")
with open(path, "w") as f:
    json.dump(cases, f, indent=1)
print("wrote", os.path.normpath(path))
