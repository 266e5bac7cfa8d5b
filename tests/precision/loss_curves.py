#!/usr/bin/env python3
"""Loss curves of fp32, bf16 and fp16 (dynamic loss scaling, DeepSpeed's
defaults) training of one small GPT on tinyshakespeare (bytes), same seed,
same data order: the band the mixed-precision runs stay in around fp32.

  loss_curves.py --build BUILD [--steps 300] [--band B] [--png OUT.png]

Prints the per-step and the 25-step-mean maximum |loss - fp32 loss| of bf16
and fp16; --band fails (exit 1) when a 25-step mean leaves B; --png draws the
three curves (Pillow), as committed in docs/mixed_precision_loss.png. The
runs are niced and take about 10 s each (1 thread) for 300 steps."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.normpath(os.path.join(HERE, "..", ".."))
CONFIG = {
    "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1, "steps_per_print": 100, "seed": 7,
    "model": {"arch": "gpt", "n_layer": 2, "d_model": 64, "n_head": 4, "seq_len": 64, "vocab_size": 256},
    "optimizer": {"type": "adamw", "params": {"lr": 0.002, "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 50, "warmup_type": "linear"}},
    "gradient_clipping": 1.0,
}
MODES = {"fp32": [], "bf16": ["--set", "bf16.enabled=true"], "fp16": ["--set", "fp16.enabled=true"]}
WINDOW = 25


def run(build, work, steps):
    train = os.path.join(build, "bin", "dsc-train")
    tok = os.path.join(work, "ts.tok")
    subprocess.run([train, "--prepare", os.path.join(SRC, "data", "tinyshakespeare.txt"), tok], check=True,
                   stdout=subprocess.DEVNULL)
    cfg = dict(CONFIG, data={"path": tok}, train={"steps": steps})
    path = os.path.join(work, "curves.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    env = dict(os.environ, OMP_NUM_THREADS="1", DSC_NUM_THREADS="1", DSC_PROGRESS="0")
    curves = {}
    for mode, extra in MODES.items():
        metrics = os.path.join(work, mode + ".jsonl")
        subprocess.run(["nice", "-n", "10", train, path, *extra, "--metrics", metrics, "--sample", "0",
                        "--no-progress"], check=True, env=env, stdout=subprocess.DEVNULL)
        rows = [json.loads(line) for line in open(metrics)]
        curves[mode] = [r for r in rows if "loss" in r]
    return curves


def mean(xs):
    return sum(xs) / len(xs)


def bands(curves):
    base = [r["loss"] for r in curves["fp32"]]
    out = {}
    for mode in ("bf16", "fp16"):
        got = [r["loss"] for r in curves[mode]]
        raw = max(abs(a - b) for a, b in zip(got, base))
        smooth = max(abs(mean(got[i:i + WINDOW]) - mean(base[i:i + WINDOW])) for i in range(0, len(base) - WINDOW + 1))
        skipped = sum(1 for r in curves[mode] if r.get("skipped"))
        out[mode] = (raw, smooth, skipped, mean(got[-WINDOW:]))
    return out, mean(base[-WINDOW:])


def panel(d, box, series, colors, title, steps, zero=False):
    L, T, R, B = box
    vals = [v for _, pts in series for v in pts]
    lo, hi = min(vals), max(vals)
    if zero:
        m = max(abs(lo), abs(hi), 1e-3)
        lo, hi = -1.1 * m, 1.1 * m
    else:
        lo, hi = lo - 0.05, hi + 0.05
    x = lambda s: L + (R - L) * (s - 1) / max(steps - 1, 1)
    y = lambda v: T + (B - T) * (hi - v) / (hi - lo)
    d.rectangle([L, T, R, B], outline="black")
    for i in range(5):
        v = lo + (hi - lo) * i / 4
        d.line([L - 4, y(v), L, y(v)], fill="black")
        d.text((6, y(v) - 6), ("%+.3f" if zero else "%.2f") % v, fill="black")
    if zero:
        d.line([L, y(0), R, y(0)], fill=(160, 160, 160))
    for name, pts in series:
        d.line([(x(i + 1), y(v)) for i, v in enumerate(pts)], fill=colors[name], width=1 if not zero else 2)
    d.text((L + 6, T + 4), title, fill="black")
    return x


def draw(curves, b, png):
    from PIL import Image, ImageDraw
    W, H, L, R = 900, 720, 70, 880
    img = Image.new("RGB", (W, H), "white")
    d = ImageDraw.Draw(img)
    steps = len(curves["fp32"])
    colors = {"fp32": (0, 0, 0), "bf16": (31, 119, 180), "fp16": (214, 39, 40)}
    loss = {m: [r["loss"] for r in rows] for m, rows in curves.items()}
    d.text((L, 10), "small GPT (2 x 64, T 64) on tinyshakespeare bytes, same seed and data order; AdamW, "
           "WarmupCosineLR; fp16: dynamic loss scale (DeepSpeed's defaults)", fill="black")
    panel(d, (L, 34, R, 440), [(m, loss[m]) for m in MODES], colors, "train loss per step", steps)
    run_mean = lambda xs: [mean(xs[max(0, i - WINDOW + 1):i + 1]) for i in range(len(xs))]
    base = run_mean(loss["fp32"])
    diffs = [(m, [g - f for g, f in zip(run_mean(loss[m]), base)]) for m in ("bf16", "fp16")]
    x = panel(d, (L, 470, R, 680), diffs, colors,
              "%d-step running mean of loss minus fp32's" % WINDOW, steps, zero=True)
    for i in range(6):
        s = 1 + (steps - 1) * i / 5
        d.line([x(s), 680, x(s), 684], fill="black")
        d.text((x(s) - 10, 688), "%d" % s, fill="black")
    d.text((W // 2 - 10, 704), "step", fill="black")
    ly = 60
    for mode in MODES:
        label = mode if mode == "fp32" else "%s: max |diff| %.3f per step, %.4f of %d-step means" % (
            mode, b[mode][0], b[mode][1], WINDOW)
        d.line([R - 370, ly + 6, R - 340, ly + 6], fill=colors[mode], width=3)
        d.text((R - 335, ly), label, fill="black")
        ly += 18
    img.save(png)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--band", type=float)
    ap.add_argument("--png")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        curves = run(a.build, work, a.steps)
    b, last = bands(curves)
    print("fp32: mean loss of the last %d steps %.4f" % (WINDOW, last))
    for mode, (raw, smooth, skipped, end) in b.items():
        print("%s: max |loss - fp32| per step %.4f, of %d-step means %.4f; last %d steps %.4f; %d steps skipped" %
              (mode, raw, WINDOW, smooth, WINDOW, end, skipped))
    if a.png:
        draw(curves, b, a.png)
    if a.band is not None:
        bad = [m for m, v in b.items() if v[1] > a.band]
        if bad:
            print("FAIL: %s outside the band %.4f" % (", ".join(bad), a.band))
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
