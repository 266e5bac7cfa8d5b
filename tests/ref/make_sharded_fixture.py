#!/usr/bin/env python3
"""The sharded half-precision checkpoint of test_hf_formats, written by
safetensors/torch (not by dsc), from the tiny Llama fixture
tests/inference/fixtures/hf/llama/:

  fixtures/hf/llama_sharded/   config.json, model.safetensors.index.json,
                               model-00001-of-00002.safetensors  (first half of the tensors, f32)
                               model-00002-of-00002.safetensors  (second half, bf16; the last one f16)
  fixtures/hf/llama_rounded/   config.json, model.safetensors: every tensor in f32 holding
                               torch's rounding to the dtype its shard stores
                               (t.to(dtype).to(float32)), the expected finalized values

Tensors are split in name order. Run:
  /opt/venv/bin/python tests/ref/make_sharded_fixture.py
"""
import json
import os
import shutil

import torch
from safetensors import safe_open
from safetensors.torch import save_file

HF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "inference", "fixtures", "hf")


def main():
    src = os.path.join(HF, "llama")
    with safe_open(os.path.join(src, "model.safetensors"), "pt") as f:
        tensors = {name: f.get_tensor(name) for name in sorted(f.keys())}
    names = list(tensors)
    half = len(names) // 2
    dtype = {n: torch.float32 if i < half else (torch.float16 if i == len(names) - 1 else torch.bfloat16)
             for i, n in enumerate(names)}
    sharded, rounded = os.path.join(HF, "llama_sharded"), os.path.join(HF, "llama_rounded")
    for d in (sharded, rounded):
        os.makedirs(d, exist_ok=True)
        shutil.copy(os.path.join(src, "config.json"), os.path.join(d, "config.json"))
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    weight_map = {}
    for file, part in shards.items():
        save_file({n: tensors[n].to(dtype[n]).contiguous() for n in part}, os.path.join(sharded, file),
                  metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
    with open(os.path.join(sharded, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1)
    save_file({n: tensors[n].to(dtype[n]).to(torch.float32).contiguous() for n in names},
              os.path.join(rounded, "model.safetensors"), metadata={"format": "pt"})
    print("%d tensors: %d f32, %d bf16, %d f16" % (len(names), half, len(names) - half - 1, 1))


if __name__ == "__main__":
    main()
