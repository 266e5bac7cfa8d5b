#!/usr/bin/env bash
# Real DeepSpeed config files (tests/config/deepspeed/, sources in SOURCES.md)
# train for 3 steps on 2 ranks, unchanged apart from dsc's own model / data /
# train sections given with --set; fp16 runs as the files ask, except fp16
# master weights (CIFAR: dsc's master is fp32), switched off there. Each run must finish, print a finite loss for step 3
# and use the optimizer, scheduler and ZeRO stage the file names.
# Usage: test_deepspeed_configs.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
bin=$build/bin dir=$src/tests/config/deepspeed
work=$(mktemp -d "$build/test_deepspeed_configs.XXXXXX")
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 DSC_PROGRESS=0 OMP_NUM_THREADS=1 DSC_NUM_THREADS=1
fail() { echo "FAIL: $*" >&2; exit 1; }

"$bin/dsc-train" --prepare "$src/data/tinyshakespeare.txt" "$work/ts.tok" >/dev/null
model='{"arch": "gpt", "n_layer": 2, "d_model": 32, "n_head": 2, "seq_len": 16, "vocab_size": 256}'
dsc=(--set "model=$model" --set data.path="$work/ts.tok" --set train.steps=3 --sample 0 --no-progress)

# FILE  EXTRA-OVERRIDES  EXPECTED-IN-LOG...
run() {
  local file=$1 extra=$2
  shift 2
  local log=$work/$file.log
  # shellcheck disable=SC2086 # $extra is zero or more --set words
  if ! "$bin/dsc-launch" -n 2 "$bin/dsc-train" "$dir/$file" "${dsc[@]}" $extra > "$log" 2>&1; then
    cat "$log" >&2
    fail "$file did not train"
  fi
  grep -Eq '^step +3/3 \| loss [0-9]+\.[0-9]+ ' "$log" || { cat "$log" >&2; fail "$file: no finite loss at step 3"; }
  for want in "$@"; do grep -q -- "$want" "$log" || { cat "$log" >&2; fail "$file: no \"$want\" in the log"; }; done
  echo "   $file: $(grep -E '^step +3/3' "$log" | cut -d'|' -f1-2)"
}

run hf_ds_config_zero2.json "" '"optimizer.params.lr" "auto" -> 5e-05' 'offload to "cpu"'
run hf_ds_config_zero3.json "" '"zero_optimization.reduce_bucket_size" "auto" -> 1024' \
  '"zero_optimization.stage3_max_reuse_distance" accepted'
run hf_zero_stage1_config.json "" '"scheduler.params.total_num_steps" "auto" -> null' 'fp16 mixed precision'
run dse_cifar_ds_config.json "--set fp16.fp16_master_weights_and_grads=false" 'offload to "cpu"'
run dse_qanet_ds_bsz512_1cycle.json ""
run mds_ds_config_gbs256_mbs8_log1_zero1.json ""
run mds_ds_config_gbs16_mbs1_log1_zero3.json "" 'fp16 mixed precision: fp32 master weights'
echo "all DeepSpeed config files trained on 2 ranks"
