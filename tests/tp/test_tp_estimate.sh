#!/usr/bin/env bash
# `dsc-train --estimate-memory` for a GPT-MoE under tensor (and expert)
# parallelism: the per-rank parameter count it predicts from the config
# equals what each rank of the built model holds (the memory report's psi),
# and its model-state bytes are within 5% of the allocator's parameter +
# gradient + AdamW bytes after 3 steps (the gap: each tensor's 64-element
# alignment). Cases: TP 2 x EP 2 with the experts whole on every tensor
# rank and split by TP (moe.enable_expert_tensor_parallelism), the same with
# ZeRO-1 over the data-parallel group, TP 4 with split experts (4 ranks), and
# the GQA Mixtral (no biases) and PR-MoE (moe.use_residual: a whole residual
# MLP) at TP 2 x EP 2 split. Through dsc-train and
# dsc-launch (one thread per rank).
# Usage: test_tp_estimate.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
bin=$build/bin
work=$(mktemp -d "$build/test_tp_estimate.XXXXXX")
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 DSC_PROGRESS=0
source "$src/tests/support/check.sh"

"$bin/dsc-train" --prepare "$src/data/tinyshakespeare.txt" "$work/ts.tok" >/dev/null
# Wide enough that the alignment is small beside each rank's share.
common=(--set data.path="$work/ts.tok" --set checkpoint.save_interval=0 --set model.d_model=128
        --set model.d_ff=512 --set train.steps=3)
split="--set moe.enable_expert_tensor_parallelism=true"
# estimated NAME: the estimate's per-rank "PARAMS BYTES" for 4 ranks.
estimated() {
  sed -n 's/^per rank at ZeRO stage [0-9]*: \([0-9]*\) parameters .*, \([0-9]*\) bytes of model states$/\1 \2/p' \
    "$work/$1.est"
}
# measured NAME: every rank's "PSI BYTES" from the memory report (MiB columns params, grads, optim).
measured() {
  awk '/^rank +psi/ { on = 1; next } on && $1 ~ /^[0-9]+$/ { printf "%s %.0f\n", $2, ($3 + $4 + $5) * 1048576 }' \
    "$work/$1.log"
}
within() { # NAME: every rank's psi equals the estimate's, and its bytes are within 5%
  local e p b
  e=$(estimated "$1")
  [ -n "$e" ] && [ "$(measured "$1" | wc -l)" -eq 4 ] || return 1
  read -r p b <<< "$e"
  measured "$1" | awk -v p="$p" -v b="$b" '{ r = $2 / b; if ($1 != p || r < 0.95 || r > 1.05) bad = 1; w = r }
    END { printf "   estimate %d parameters, %d bytes; measured %d, ratio %.4f\n", p, b, $1, w; exit bad }'
}
case_() { # NAME TP EP [args...]
  local name=$1 tp=$2 ep=$3
  shift 3
  local args=("${common[@]}" --set tensor_parallel.autotp_size="$tp" --set moe.ep_size="$ep" "$@")
  "$bin/dsc-train" "$src/tests/tp/moe.json" "${args[@]}" --estimate-memory 4 > "$work/$name.est" 2>&1 ||
    { cat "$work/$name.est"; exit 1; }
  "$bin/dsc-launch" -n 4 "$bin/dsc-train" "$src/tests/tp/moe.json" "${args[@]}" --sample 0 --no-progress \
    --report-memory > "$work/$name.log" 2>&1 || { tail -5 "$work/$name.log"; exit 1; }
  check "$name: --estimate-memory's per-rank parameters and bytes match the built model" within "$name"
}
case_ tp2ep2 2 2
# shellcheck disable=SC2086
case_ tp2ep2x 2 2 $split
# shellcheck disable=SC2086
case_ tp2ep2x_zero1 2 2 $split --set zero_optimization.stage=1
# shellcheck disable=SC2086
case_ tp4x 4 1 $split
# shellcheck disable=SC2086
case_ mixtral_tp2ep2x 2 2 $split --set model.arch=\"mixtral\" --set model.n_kv_head=2
# shellcheck disable=SC2086
case_ residual_tp2ep2x 2 2 $split --set moe.use_residual=true
check_summary
