#!/usr/bin/env python3
"""The evaluation fixture of tests/engine/test_train.c: the validation loss
dsc_engine_evaluate must report, computed by PyTorch (float64) on the tiny
GPT of make_model_fixtures.py (the model restated there independently of
dsc, weights named like dsc's parameters).

The test writes `tokens` as a token file with data.val_fraction 0.25: the
val split is the last 250 of 1000 tokens, read in order as windows of
seq_len + 1 tokens at offsets 16 k; train.eval_iters 2 batches of 2
micro-batches of 2 sequences read windows k = 0..7. `val_loss` is the mean
token loss over those 8 windows.

Run: /opt/venv/bin/python tests/ref/make_eval_fixture.py
Output: tests/nn/fixtures/eval_gpt.{bin,idx} (the format and folder of make_model_fixtures.py).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_model_fixtures import CASES, Model, Writer, fill_weights  # noqa: E402

N_TOKENS, VAL_FRACTION, EVAL_ITERS, MICRO, ACCUM, SEED = 1000, 0.25, 2, 2, 2, 4242


def main():
    cfg = CASES["gpt_tied"]
    T = cfg["seq_len"]
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    model = Model(cfg).double()
    fill_weights(model, gen)
    tokens = torch.randint(0, cfg["vocab_size"], (N_TOKENS,), generator=gen)
    n_val = int(N_TOKENS * VAL_FRACTION)
    begin = N_TOKENS - n_val
    windows = (n_val - 1) // T
    K = EVAL_ITERS * ACCUM * MICRO
    starts = [begin + (k % windows) * T for k in range(K)]
    x = torch.stack([tokens[s:s + T] for s in starts])
    y = torch.stack([tokens[s + 1:s + T + 1] for s in starts])
    with torch.no_grad():
        _, loss = model(x, y)
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "nn", "fixtures")
    os.makedirs(out, exist_ok=True)
    w = Writer(os.path.join(out, "eval_gpt"))
    w.meta("seed", SEED)
    for key, value in cfg.items():
        w.meta(key, value)
    for key, value in dict(n_tokens=N_TOKENS, val_fraction=VAL_FRACTION, eval_iters=EVAL_ITERS, micro=MICRO,
                           accumulation=ACCUM).items():
        w.meta(key, value)
    w.array("tokens", tokens)
    for n, p in model.named_parameters():
        w.array("param/" + n, p)
    w.array("val_loss", loss.reshape(1))
    size = w.close()
    print(f"eval_gpt: {K} windows from token {begin}, val loss {loss.item():.9f}, {size} bytes")


if __name__ == "__main__":
    main()
