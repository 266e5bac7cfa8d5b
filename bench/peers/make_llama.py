#!/usr/bin/env python3
"""Writes one random-weight Llama (134M parameters: hidden 768, 12 layers,
12 heads, 12 KV heads, MLP 2048, vocab 32000; normal(0, 0.02) weights,
seed 0) twice: as a Hugging Face directory (config.json + f32
model.safetensors) that dsc loads, and as GGUF files (f32, f16, q8_0)
written with the gguf package's writer for llama.cpp. The GGUF copy holds
the same numbers: q and k rows are permuted as llama.cpp's converter does
(its RoPE pairs adjacent columns; Hugging Face's pairs the two halves), and
a placeholder 32000-token vocabulary (byte tokens + "<tN>") satisfies the
loader; no text is ever tokenized.

Run (peers installed by bench/peers/setup.sh, outside the repository):
  /work/.peers/venv/bin/python bench/peers/make_llama.py --dir /tmp/dsc-llama134m
Never part of the test suite."""
import argparse
import json
import os

import numpy as np

C, L, NH, NKV, F, V = 768, 12, 12, 12, 2048, 32000
HS = C // NH


def weights():
    rng = np.random.default_rng(0)

    def w(rows, cols):
        return (0.02 * rng.standard_normal((rows, cols))).astype(np.float32)

    t = {"model.embed_tokens.weight": w(V, C), "model.norm.weight": np.ones(C, np.float32), "lm_head.weight": w(V, C)}
    for l in range(L):
        p = f"model.layers.{l}."
        t[p + "input_layernorm.weight"] = np.ones(C, np.float32)
        t[p + "post_attention_layernorm.weight"] = np.ones(C, np.float32)
        t[p + "self_attn.q_proj.weight"] = w(NH * HS, C)
        t[p + "self_attn.k_proj.weight"] = w(NKV * HS, C)
        t[p + "self_attn.v_proj.weight"] = w(NKV * HS, C)
        t[p + "self_attn.o_proj.weight"] = w(C, NH * HS)
        t[p + "mlp.gate_proj.weight"] = w(F, C)
        t[p + "mlp.up_proj.weight"] = w(F, C)
        t[p + "mlp.down_proj.weight"] = w(C, F)
    return t


def write_hf(path, t):
    from safetensors.numpy import save_file

    os.makedirs(path, exist_ok=True)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V, "hidden_size": C,
           "intermediate_size": F, "num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": NKV,
           "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
           "tie_word_embeddings": False, "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    save_file(t, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})


def permute(w, heads):  # Hugging Face's RoPE layout -> llama.cpp's (as its converter does)
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, t, kind):
    import gguf

    q = gguf.GGMLQuantizationType
    wtype = {"f32": q.F32, "f16": q.F16, "q8_0": q.Q8_0}[kind]
    ftype = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
             "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[kind]
    wr = gguf.GGUFWriter(path, "llama")
    wr.add_name("dsc-bench-llama134m")
    wr.add_context_length(2048)
    wr.add_embedding_length(C)
    wr.add_block_count(L)
    wr.add_feed_forward_length(F)
    wr.add_head_count(NH)
    wr.add_head_count_kv(NKV)
    wr.add_rope_dimension_count(HS)
    wr.add_rope_freq_base(10000.0)
    wr.add_layer_norm_rms_eps(1e-6)
    wr.add_vocab_size(V)
    wr.add_file_type(ftype)
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    toks += [f"<t{i}>" for i in range(len(toks), V)]
    types += [1] * (V - len(types))
    wr.add_tokenizer_model("llama")
    wr.add_token_list(toks)
    wr.add_token_scores([0.0] * V)
    wr.add_token_types(types)
    wr.add_bos_token_id(1)
    wr.add_eos_token_id(2)

    def add(name, a):
        if a.ndim == 2 and wtype != q.F32:
            wr.add_tensor(name, gguf.quants.quantize(a, wtype), raw_dtype=wtype)
        else:
            wr.add_tensor(name, a)

    add("token_embd.weight", t["model.embed_tokens.weight"])
    add("output_norm.weight", t["model.norm.weight"])
    add("output.weight", t["lm_head.weight"])
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for l in range(L):
        for hf, gg in names.items():
            a = t[f"model.layers.{l}.{hf}.weight"]
            if hf == "self_attn.q_proj":
                a = permute(a, NH)
            elif hf == "self_attn.k_proj":
                a = permute(a, NKV)
            add(f"blk.{l}.{gg}.weight", np.ascontiguousarray(a))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/dsc-llama134m")
    ap.add_argument("--gguf", default="f32,f16,q8_0", help="GGUF weight types to write")
    a = ap.parse_args()
    t = weights()
    if not os.path.exists(os.path.join(a.dir, "model.safetensors")):
        write_hf(a.dir, t)
    for kind in filter(None, a.gguf.split(",")):
        out = os.path.join(a.dir, f"model-{kind}.gguf")
        if not os.path.exists(out):
            write_gguf(out, t, kind)
        print(out)


if __name__ == "__main__":
    main()
