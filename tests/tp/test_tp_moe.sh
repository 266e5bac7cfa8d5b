#!/usr/bin/env bash
# MoE with tensor parallelism equals one process (tests/tp/moe.json: a GPT-MoE
# of 2 blocks, the second with 4 top-2 experts, no token dropping): 10 steps
# at TP 2 x EP 2 (4 ranks: attention over the tensor group, experts over
# expert-parallel groups cut from the data-parallel groups), with the experts
# whole and split by TP (moe.enable_expert_tensor_parallelism), give the
# losses of one rank (metrics JSONL, <= 1e-6 relative) and its parameters
# (<= 1e-5), print the whole model's parameter count, and report the
# per-expert load of one rank (every tensor rank gates the same tokens, which
# count once). The PP 2 x EP 2 checkpoint of step 5 resumes at PP 2 x TP 2 with
# the experts split by TP, and the TP 2 x EP 2 split-expert one on one rank,
# with the losses and parameters of continuing unchanged, also with a gate
# that samples (the tensor group shares its stream). Through dsc-train
# and dsc-launch (one thread per rank).
# Usage: test_tp_moe.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
bin=$build/bin
work=$(mktemp -d "$build/test_tp_moe.XXXXXX")
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 DSC_PROGRESS=0
source "$src/tests/support/check.sh"

"$bin/dsc-train" --prepare "$src/data/tinyshakespeare.txt" "$work/ts.tok" >/dev/null
train() { # NAME NP PP TP EP [args...]
  local name=$1 np=$2 pp=$3 tp=$4 ep=$5
  shift 5
  "$bin/dsc-launch" -n "$np" "$bin/dsc-train" "$src/tests/tp/moe.json" --set data.path="$work/ts.tok" \
    --sample 0 --no-progress --set checkpoint.save_dir="$work/$name" --set pipeline.stages="$pp" \
    --set tensor_parallel.autotp_size="$tp" --set moe.ep_size="$ep" --metrics "$work/$name.jsonl" "$@" \
    > "$work/$name.log" 2>&1 || { tail -5 "$work/$name.log"; exit 1; }
}
# losses_within A.jsonl B.jsonl [LAST_N]: the loss of every step both list, <= 1e-6 relative.
losses_within() {
  local n=${3:-10}
  paste <(grep -o '"step": [0-9]*, "loss": [-0-9.e]*' "$1" | tail -"$n") \
        <(grep -o '"step": [0-9]*, "loss": [-0-9.e]*' "$2" | tail -"$n") | tr -d ',"' |
    awk -v n="$n" '{ if ($2 != $6) bad = 1; d = ($4 - $8) / $4; if (d < 0) d = -d; if (d > w) w = d; c++ }
      END { printf "   %d steps, max relative loss difference %.3e\n", c, w; exit !(c == n && !bad && w <= 1e-6) }'
}
model_within() { # A B: dsc-ckpt diff's exit status decides; its last line (the worst difference) is printed
  local out
  out=$("$bin/dsc-ckpt" diff --prefix model/ --tol 1e-5 "$1" "$2") || { echo "$out" | tail -1; return 1; }
  echo "   $(echo "$out" | tail -1)"
}
seed_dir() { mkdir -p "$2" && cp -r "$1" "$2/" && basename "$1" > "$2/latest"; }
split="--set moe.enable_expert_tensor_parallelism=true"

train one 1 1 1 1
train pp2ep2 4 2 1 2
# shellcheck disable=SC2086
train tp2ep2x 4 1 2 2 $split
check "tp2ep2x: the experts are split by TP" grep -q "experts split over 2 tensor ranks" "$work/tp2ep2x.log"
train tp2ep2 4 1 2 2
count() { grep -o '[0-9]* parameters' "$work/$1.log" | head -1; }
for name in tp2ep2 tp2ep2x pp2ep2; do
  check "$name: prints the whole model's parameter count ($(count one))" test "$(count "$name")" = "$(count one)"
done
load() { grep -A1 "^per-expert load" "$work/$1.log" | tail -1; }
check "one: reports the per-expert load" test -n "$(load one)"
for name in tp2ep2 tp2ep2x pp2ep2; do
  check "$name: per-expert load equals one rank's ($(load one | cut -c1-40)...)" test "$(load "$name")" = "$(load one)"
done
for name in tp2ep2 tp2ep2x pp2ep2; do
  check "$name: losses equal one rank's" losses_within "$work/one.jsonl" "$work/$name.jsonl"
  check "$name: parameters within 1e-5 of one rank's at step 10" \
    model_within "$work/one/global_step10" "$work/$name/global_step10"
done
for case in "pp2tp2x 4 2 2 1 pp2ep2" "single 1 1 1 1 tp2ep2x"; do
  read -r name np pp tp ep from <<< "$case"
  seed_dir "$work/$from/global_step5" "$work/$name"
  # shellcheck disable=SC2086
  train "$name" "$np" "$pp" "$tp" "$ep" --resume $split
  check "$name: resumed the $from checkpoint" grep -q "resumed from" "$work/$name.log"
  check "$name: losses of steps 6-10 equal continuing $from" \
    losses_within "$work/$from.jsonl" "$work/$name.jsonl" 5
  check "$name: parameters within 1e-5 of $from's at step 10" \
    model_within "$work/$from/global_step10" "$work/$name/global_step10"
done
# Routes chosen over the resumed 5 steps: 8 sequences x 16 positions x top-2, counted once per tensor group.
routes() { load "$1" | grep -o ' [0-9]*/' | tr -d ' /' | awk '{ n += $1 } END { print n }'; }
check "pp2tp2x: 5 steps route 1280 tokens to experts ($(routes pp2tp2x))" test "$(routes pp2tp2x)" = 1280
# With the gate's sampled second expert the restored per-rank streams of PP 2 x EP 2 differ between the ranks
# that become one tensor group; they must draw alike (dsc_tp_sync_rng), or their expert capacities disagree.
sample="--set moe.top2_2nd_expert_sampling=true"
# shellcheck disable=SC2086
train pp2ep2s 4 2 1 2 $sample
seed_dir "$work/pp2ep2s/global_step5" "$work/pp2tp2xs"
# shellcheck disable=SC2086
train pp2tp2xs 4 2 2 1 --resume $split $sample
check "pp2tp2xs: a sampling gate resumes at PP 2 x TP 2 and trains to step 10" grep -q "^step *10/10" \
  "$work/pp2tp2xs.log"
check_summary
