#!/usr/bin/env python3
"""Tiny random-weight Hugging Face models and their reference logits, for
dsc's inference fidelity test (tests/inference/test_hf_fidelity.c).

Builds LlamaForCausalLM (with Llama-3 RoPE scaling), MistralForCausalLM,
Qwen2ForCausalLM (q/k/v biases, tied embeddings), MixtralForCausalLM
(4 experts, top-2) and Phi3ForCausalLM (fused qkv_proj and gate_up_proj), each with 2 layers, hidden 32, 4 query heads, 2 KV heads
(GQA), vocab 128, in float32, saves them with save_pretrained (config.json +
model.safetensors) under tests/inference/fixtures/hf/<name>/, and writes
ref.safetensors beside each with, for three prompts p:
  tokens_p      (T,)       the prompt
  logits_p      (T, V)     full forward logits at every position
  gen_p         (S,)       6 greedy tokens generated with the KV cache
  gen_logits_p  (S, V)     the logits each generated token was chosen from
                           (row 0 = last prompt position, then one per step)

Run (the venv sees Debian's torch 1.13; transformers 4.43 is the newest that
imports with it and the first with Llama-3 rope scaling):
  /usr/bin/python3 -m venv --system-site-packages /work/venv-hf
  /work/venv-hf/bin/pip install 'transformers==4.43.4' safetensors
  /work/venv-hf/bin/python tests/ref/make_hf_fixtures.py
Names on the command line remake only those fixtures (phi3 was made with
transformers 4.55: PYTHONPATH=/opt/tf4 /opt/venv/bin/python tests/ref/make_hf_fixtures.py phi3).
"""
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, MixtralConfig,
                          MixtralForCausalLM, Phi3Config, Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "inference", "fixtures", "hf")
COMMON = dict(vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, attn_implementation="eager")
PROMPT_LENGTHS = (5, 9, 14)
NEW_TOKENS = 6


def models():
    yield "llama", LlamaForCausalLM(LlamaConfig(**COMMON, rope_theta=10000.0, tie_word_embeddings=False,
                                                rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                              "original_max_position_embeddings": 16}))
    yield "mistral", MistralForCausalLM(MistralConfig(**COMMON, rope_theta=1000.0, sliding_window=64))
    yield "qwen2", Qwen2ForCausalLM(Qwen2Config(**COMMON, rope_theta=10000.0, tie_word_embeddings=True))
    yield "mixtral", MixtralForCausalLM(MixtralConfig(**COMMON, rope_theta=10000.0, num_local_experts=4,
                                                      num_experts_per_tok=2, sliding_window=None))
    yield "phi3", Phi3ForCausalLM(Phi3Config(**COMMON, rope_theta=10000.0, tie_word_embeddings=False,
                                             pad_token_id=None, bos_token_id=1, eos_token_id=2))


def randomize(model, gen):
    """Weights large enough that logits differ visibly between tokens."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=gen))


def write_fixture(d, model, gen):
    """save_pretrained into d (config.json + model.safetensors) and ref.safetensors beside it."""
    model.eval()
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    gc = os.path.join(d, "generation_config.json")
    if os.path.exists(gc):
        os.remove(gc)
    refs = {}
    with torch.no_grad():
        for p, T in enumerate(PROMPT_LENGTHS):
            tokens = torch.randint(0, model.config.vocab_size, (1, T), generator=gen)
            refs[f"tokens_{p}"] = tokens[0].to(torch.int32)
            refs[f"logits_{p}"] = model(tokens).logits[0].float().contiguous()
            out = model(tokens, use_cache=True)
            past, row = out.past_key_values, out.logits[0, -1]
            gen_ids, gen_logits = [], []
            for _ in range(NEW_TOKENS):
                nxt = int(torch.argmax(row))
                gen_ids.append(nxt)
                gen_logits.append(row.clone())
                out = model(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
                past, row = out.past_key_values, out.logits[0, -1]
            refs[f"gen_{p}"] = torch.tensor(gen_ids, dtype=torch.int32)
            refs[f"gen_logits_{p}"] = torch.stack(gen_logits).float().contiguous()
    save_file(refs, os.path.join(d, "ref.safetensors"))
    print(f"{os.path.basename(d)}: {sum(p.numel() for p in model.parameters())} parameters -> {d}")


def main():
    torch.manual_seed(0)
    only = set(sys.argv[1:])
    for i, (name, model) in enumerate(models()):
        if only and name not in only:
            continue
        gen = torch.Generator().manual_seed(100 + i)
        randomize(model, gen)
        write_fixture(os.path.join(OUT, name), model, gen)


if __name__ == "__main__":
    main()
