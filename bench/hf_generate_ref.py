#!/usr/bin/env python3
"""The transformers (PyTorch) side of bench_inference: creates a ~100M
parameter Llama-shaped model (hidden 768, 12 layers, 12 heads, 4 KV heads,
MLP 2048, vocab 16384; random weights, seed 0), saves it as a Hugging Face
directory that build/bench/bench_inference loads (--model DIR), and measures
on the same threads, in float32, with transformers' eager attention:
  prefill tokens/s  batch 1 x 512 tokens, batch 32 x 128 tokens (one forward)
  decode  tokens/s  batch 1 and 32 after a 128-token prompt, 32 steps with the KV cache

Run:
  /usr/bin/python3 -m venv --system-site-packages /work/venv-hf
  /work/venv-hf/bin/pip install 'transformers==4.43.4' safetensors
  /work/venv-hf/bin/python bench/hf_generate_ref.py [--dir /tmp/dsc-bench-llama100m] [--threads 2] [--reps 2]
Prints, never asserts.
"""
import argparse
import os
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

PROMPT, STEPS = 128, 32


def make_model(path):
    cfg = LlamaConfig(vocab_size=16384, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                      num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=2048,
                      tie_word_embeddings=False, attn_implementation="eager")
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    if not os.path.exists(os.path.join(path, "model.safetensors")):
        model.save_pretrained(path, safe_serialization=True)
    return model


REPS = 2


def best_of(fn, reps=None):
    reps = reps or REPS
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def prefill(model, batch, length):
    ids = torch.randint(0, model.config.vocab_size, (batch, length))
    return batch * length / best_of(lambda: model(ids, use_cache=False))


def decode(model, batch):
    ids = torch.randint(0, model.config.vocab_size, (batch, PROMPT))

    def run():
        out = model(ids, use_cache=True)
        past, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        t = time.perf_counter()
        for _ in range(STEPS):
            out = model(nxt, past_key_values=past, use_cache=True)
            past, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        return time.perf_counter() - t

    return batch * STEPS / min(run() for _ in range(REPS))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/dsc-bench-llama100m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2, help="best of this many runs (the machine may be shared)")
    a = ap.parse_args()
    global REPS
    REPS = a.reps
    torch.set_num_threads(a.threads)
    model = make_model(a.dir)
    n = sum(p.numel() for p in model.parameters())
    print(f"transformers {__import__('transformers').__version__}, torch {torch.__version__}, "
          f"{a.threads} threads, {n / 1e6:.1f}M parameters, saved in {a.dir}")
    with torch.no_grad():
        print(f"prefill batch 1 x 512 : {prefill(model, 1, 512):9.1f} tokens/s")
        print(f"prefill batch 32 x 128: {prefill(model, 32, 128):9.1f} tokens/s")
        print(f"decode  batch 1       : {decode(model, 1):9.1f} tokens/s")
        print(f"decode  batch 32      : {decode(model, 32):9.1f} tokens/s")


if __name__ == "__main__":
    main()
