#!/usr/bin/env bash
# 3D parallelism equals one process: 10 steps at TP 2 x PP 2 (4 ranks),
# TP 2 x PP 2 x DP 2 (8 ranks, ZeRO-1), TP 2 x DP 2 with ZeRO-3 (pipelines
# off; parameters gathered on use) and TP 2 x PP 2 with sequence parallelism
# (stages pass this tensor rank's positions) print the losses of one rank and end
# within 1e-5 of its parameters; the TP 2 x PP 2 checkpoint of step 5
# resumes at TP 4 x PP 1 and on one rank with the losses of continuing
# unchanged. Through dsc-train and dsc-launch (one thread per rank).
# Usage: test_tp_3d.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
bin=$build/bin
work=$(mktemp -d "$build/test_tp_3d.XXXXXX")
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 DSC_PROGRESS=0
source "$src/tests/support/check.sh"

"$bin/dsc-train" --prepare "$src/data/tinyshakespeare.txt" "$work/ts.tok" >/dev/null
train() { # NAME NP PP TP [args...]
  local name=$1 np=$2 pp=$3 tp=$4
  shift 4
  "$bin/dsc-launch" -n "$np" "$bin/dsc-train" "$src/tests/checkpoint/resume.json" --set data.path="$work/ts.tok" \
    --sample 0 --no-progress --set checkpoint.save_dir="$work/$name" --set pipeline.stages="$pp" \
    --set tensor_parallel.autotp_size="$tp" --set tensor_parallel.tp_grain_size=8 \
    --set train_micro_batch_size_per_gpu=2 --set gradient_accumulation_steps=null "$@" > "$work/$name.log" 2>&1 ||
    { tail -5 "$work/$name.log"; exit 1; }
}
losses() { grep -E '^step +[0-9]+/10 \|' "$1" | sed -E 's/ \| (grad norm|[0-9]+ tok\/s).*//'; }
# model_within A B: dsc-ckpt diff's exit status decides (a missing or misshapen tensor, or a
# difference above 1e-5, fails); its last line (the worst difference) is printed.
model_within() {
  local out
  out=$("$bin/dsc-ckpt" diff --prefix model/ --tol 1e-5 "$1" "$2") || { echo "$out" | tail -1; return 1; }
  echo "   $(echo "$out" | tail -1)"
}
seed_dir() { mkdir -p "$2" && cp -r "$1" "$2/" && basename "$1" > "$2/latest"; }

train one 1 1 1
for case in "tp2pp2 4 2 2" "tp2pp2dp2 8 2 2 --set zero_optimization.stage=1" \
  "tp2dp2z3 4 1 2 --set zero_optimization.stage=3" "tp2pp2sp 4 2 2 --set tensor_parallel.sequence_parallel=true"; do
  read -r name np pp tp extra <<< "$case"
  # shellcheck disable=SC2086
  train "$name" "$np" "$pp" "$tp" $extra
  check "$name: losses equal one rank's" diff <(losses "$work/one.log") <(losses "$work/$name.log")
  check "$name: parameters within 1e-5 of one rank's at step 10" \
    model_within "$work/one/global_step10" "$work/$name/global_step10"
done
for case in "tp4 4 1 4" "single 1 1 1"; do
  read -r name np pp tp <<< "$case"
  seed_dir "$work/tp2pp2/global_step5" "$work/$name"
  train "$name" "$np" "$pp" "$tp" --resume
  check "$name: resumed the TP 2 x PP 2 checkpoint" grep -q "resumed from" "$work/$name.log"
  check "$name: losses of steps 6-10 equal continuing at TP 2 x PP 2" \
    diff <(losses "$work/tp2pp2.log" | tail -5) <(losses "$work/$name.log")
  check "$name: parameters within 1e-5 of TP 2 x PP 2's at step 10" \
    model_within "$work/tp2pp2/global_step10" "$work/$name/global_step10"
done
check_summary
