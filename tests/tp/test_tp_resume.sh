#!/usr/bin/env bash
# Tensor-parallel checkpoints reshard: a checkpoint saved at TP=2 (step 5 of
# 10) resumes at TP=2 bitwise, and at TP=4 and on one rank with the losses of
# steps 6-10 equal to continuing unchanged (as printed) and parameters within
# 1e-5; h5dump shows the global shapes; dsc-generate on the TP=2 checkpoint
# samples the same tokens at TP=3 as at TP=1. Through dsc-train and dsc-launch.
# Usage: test_tp_resume.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
bin=$build/bin
work=$(mktemp -d "$build/test_tp_resume.XXXXXX")
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 DSC_PROGRESS=0
source "$src/tests/support/check.sh"

"$bin/dsc-train" --prepare "$src/data/tinyshakespeare.txt" "$work/ts.tok" >/dev/null
train() { # NP TP SAVE_DIR [args...]
  local np=$1 tp=$2 dir=$3
  shift 3
  "$bin/dsc-launch" -n "$np" "$bin/dsc-train" "$src/tests/checkpoint/resume.json" --set data.path="$work/ts.tok" \
    --sample 0 --no-progress --set checkpoint.save_dir="$dir" --set tensor_parallel.autotp_size="$tp" \
    --set tensor_parallel.tp_grain_size=8 "$@"
}
losses() { grep -E '^step +[0-9]+/10 \|' | sed -E 's/ \| [0-9]+ tok\/s.*//'; }
# model_within A B TOL: dsc-ckpt diff's exit status decides (a missing or misshapen
# tensor, or a difference above TOL, fails); prints the worst difference.
model_within() {
  local out
  out=$("$bin/dsc-ckpt" diff --prefix model/ --tol "$3" "$1" "$2") || { echo "$out" | tail -1; return 1; }
  echo "$out" | awk '/^worst/ {print $4}'
}
seed_dir() { mkdir -p "$2" && cp -r "$1" "$2/" && basename "$1" > "$2/latest"; }

train 2 2 "$work/a" > "$work/a.log" 2>&1 || { tail -5 "$work/a.log"; exit 1; }
check "the TP=2 run prints each rank's shard" grep -q "tp rank 1: q heads \[2, 4)" "$work/a.log"
h5dump -H "$work/a/global_step10/state.h5" > "$work/h5.txt"
global_fc() { grep -A3 'DATASET "layers.1.mlp.fc.weight"' "$work/h5.txt" | grep -q 'SIMPLE { ( 256, 64 )'; }
check "the checkpoint holds global shapes" global_fc
for case in "tp2 2 2" "tp4 4 4" "one 1 1"; do
  read -r name np tp <<< "$case"
  seed_dir "$work/a/global_step5" "$work/$name"
  train "$np" "$tp" "$work/$name" --resume > "$work/$name.log" 2>&1 || { tail -5 "$work/$name.log"; exit 1; }
  check "$name: resumed" grep -q "resumed from" "$work/$name.log"
  check "$name: losses of steps 6-10 equal continuing at TP=2" \
    diff <(losses < "$work/a.log" | tail -5) <(losses < "$work/$name.log")
  tol=1e-5
  if [ "$name" = tp2 ]; then tol=0; fi
  check "$name: parameters within $tol" model_within "$work/a/global_step10" "$work/$name/global_step10" "$tol"
  echo "   $name ($np rank(s), TP=$tp): max parameter difference at step 10: $(model_within "$work/a/global_step10" "$work/$name/global_step10" 1e9)"
done
gen() { # NP: sampled tokens (seed 5) of the TP=2 checkpoint at tensor parallelism NP
  "$bin/dsc-launch" -n "$1" "$bin/dsc-generate" "$work/a" --tp "$1" --tokens 72,101,108,108,111 --max-new-tokens 16 \
    --temperature 1 --seed 5 --quiet 2> "$work/gen$1.err"
}
gen 1 > "$work/gen1.txt" || { tail -3 "$work/gen1.err"; exit 1; }
gen 3 > "$work/gen3.txt" || { tail -3 "$work/gen3.err"; exit 1; }
echo "   dsc-generate TP=1: $(head -c 80 "$work/gen1.txt")"
check "dsc-generate at TP=3 gives the tokens of TP=1" diff "$work/gen1.txt" "$work/gen3.txt"
check "dsc-generate printed tokens" test -s "$work/gen1.txt"
check_summary
