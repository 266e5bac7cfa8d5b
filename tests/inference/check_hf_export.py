#!/usr/bin/env python3
"""Loads a model written by `dsc-ckpt export --format hf` with transformers and
compares its logits with dsc's training logits.

  check_hf_export.py HF_DIR DSC_LOGITS.safetensors CLASS [HF_DIR DSC_LOGITS CLASS]...

DSC_LOGITS holds "tokens" (T,) int32 and "logits" (T, V) float32, written by
tests/inference/test_hf_export.c from dsc's training layers. The model is
loaded with AutoModelForCausalLM in float32 with eager attention; the check
is max |hf - dsc| / max |dsc| <= 1e-5 over every position and vocabulary
entry. CLASS is the class transformers must pick. Exits 77
(skipped) when torch, transformers or safetensors cannot be imported: run
it with /opt/venv/bin/python (transformers 5.x) or
PYTHONPATH=/opt/tf4 /opt/venv/bin/python (4.x)."""
import sys

try:
    import torch
    import transformers
    from safetensors.torch import load_file
except ImportError as e:  # the test is skipped, not failed, without the packages
    print(f"skipped: {e}")
    sys.exit(77)

TOLERANCE = 1e-5


def check(hf_dir, logits_path, want_class):
    ref = load_file(logits_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32,
                                                              attn_implementation="eager")
    model.eval()
    name = type(model).__name__
    if name != want_class:
        print(f"FAIL: {hf_dir} loaded as {name}, expected {want_class}")
        return False
    with torch.no_grad():
        logits = model(ref["tokens"].long()[None, :]).logits[0].float()
    dsc = ref["logits"]
    if logits.shape != dsc.shape:
        print(f"FAIL: transformers logits {tuple(logits.shape)} vs dsc {tuple(dsc.shape)}")
        return False
    err = ((logits - dsc).abs().max() / dsc.abs().max()).item()
    print(f"{hf_dir}: {name} (transformers {transformers.__version__}), logits {tuple(dsc.shape)}, "
          f"max rel err vs dsc {err:.3e} (tolerance {TOLERANCE:g})")
    return err <= TOLERANCE


def main():
    args = sys.argv[1:]
    if not args or len(args) % 3:
        print(__doc__)
        return 2
    ok = [check(*args[i:i + 3]) for i in range(0, len(args), 3)]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
