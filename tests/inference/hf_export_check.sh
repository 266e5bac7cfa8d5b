#!/usr/bin/env bash
# Exports each checkpoint test_hf_export made with `dsc-ckpt export --format hf`
# and has transformers check the logits (check_hf_export.py).
#   hf_export_check.sh DSC_CKPT PYTHON CASES_DIR
# Exits 77 (skipped) when PYTHON lacks torch/transformers.
set -u
ckpt_app=$1 python=$2 cases=$3
here=$(cd "$(dirname "$0")" && pwd)
"$python" -c 'import torch, transformers, safetensors' 2>/dev/null || { echo "skipped: $python has no torch/transformers"; exit 77; }
status=0 checks=()
for spec in llama:LlamaForCausalLM qwen2:Qwen2ForCausalLM mixtral:MixtralForCausalLM gpt:GPT2LMHeadModel; do
  name=${spec%%:*} class=${spec#*:}
  rm -rf "$cases/$name/hf"
  "$ckpt_app" export "$cases/$name/ckpt" --format hf "$cases/$name/hf" || { status=1; continue; }
  checks+=("$cases/$name/hf" "$cases/$name/dsc_logits.safetensors" "$class")
done
"$python" "$here/check_hf_export.py" "${checks[@]}" || status=1
exit $status
