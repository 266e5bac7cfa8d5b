#!/usr/bin/env bash
# End-to-end checkpoint tests through dsc-train and dsc-launch:
#  1. resume exactness: 10 steps == 5 steps, save, restore, 5 steps (bitwise, same layout);
#  2. layout change: a DP=2 checkpoint resumed on 1 and 4 ranks matches (<= 1e-5);
#  3. crash safety: a rank SIGKILLed in the middle of a save leaves `latest` on the
#     previous checkpoint, which restores and continues exactly;
#  4. h5dump -H shows global names and global shapes;
#  5. the same for PP x DP with ZeRO-1 (saved PP=2 x DP=2) restored as PP=1 x DP=4
#     with ZeRO-2, PP=4 x DP=1 and one rank; ZeRO-2 and ZeRO-3 resume exactly and
#     restore into other stages and rank counts;
#  6. an MoE model saved with EP=2 resumes exactly and restores with EP=1 and EP=4;
#     PP=2 x EP=2 resumes exactly.
# Usage: test_resume.sh BUILD_DIR SOURCE_DIR [extra dsc-train overrides...]
set -euo pipefail
build=$1 src=$2
shift 2
bin=$build/bin
work=$(mktemp -d "$build/test_resume.XXXXXX")
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 DSC_PROGRESS=0
fail() { echo "FAIL: $*" >&2; exit 1; }

"$bin/dsc-train" --prepare "$src/data/tinyshakespeare.txt" "$work/ts.tok" >/dev/null
common=(--set data.path="$work/ts.tok" --sample 0 --no-progress "$@")
train() { # NP SAVE_DIR MICRO [args...]
  local np=$1 dir=$2 micro=$3
  shift 3
  "$bin/dsc-launch" -n "$np" "$bin/dsc-train" "$src/tests/checkpoint/resume.json" "${common[@]}" \
    --set checkpoint.save_dir="$dir" --set train_micro_batch_size_per_gpu="$micro" \
    --set gradient_accumulation_steps=null "$@"
}
losses() { grep -E '^step +[0-9]+/10 \|' | sed -E 's/ \| [0-9]+ tok\/s.*//'; }
# same_state A B TOL [--prefix P]: dsc-ckpt diff's exit status decides (missing or
# misshapen tensors and differences above TOL fail); prints the worst difference.
same_state() {
  local a=$1 b=$2 tol=$3 out
  shift 3
  out=$("$bin/dsc-ckpt" diff --tol "$tol" "$@" "$a" "$b") || {
    echo "$out" | grep -E 'only in|shapes differ|^worst' | head -5 >&2
    return 1
  }
  echo "$out" | awk '/^worst/ {print $4}'
}
seed_dir() { mkdir -p "$2" && cp -r "$1" "$2/" && basename "$1" > "$2/latest"; }

echo "== 1. resume exactness (DP=2)"
train 2 "$work/a" 4 > "$work/a.log"
seed_dir "$work/a/global_step5" "$work/b"
train 2 "$work/b" 4 --resume > "$work/b.log"
grep -q "resumed from" "$work/b.log" || fail "no resume line"
diff <(losses < "$work/a.log" | tail -5) <(losses < "$work/b.log") || fail "losses after resume differ"
same_state "$work/a/global_step10" "$work/b/global_step10" 0 > /dev/null || fail "state after resume differs"
echo "   losses of steps 6-10 and the whole state at step 10 are bitwise equal"

echo "== 2. layout change (DP=2 -> 1 and 4 ranks)"
for np in 1 4; do
  seed_dir "$work/a/global_step5" "$work/c$np"
  train "$np" "$work/c$np" $((8 / np < 4 ? 8 / np : 4)) --resume > "$work/c$np.log"
  d=$(same_state "$work/a/global_step10" "$work/c$np/global_step10" 1e-5 --prefix model/) ||
    fail "DP=2 -> $np ranks: parameters differ"
  echo "   $np rank(s): max parameter difference at step 10: $d"
done

echo "== 3. crash safety (rank 1 SIGKILLed while saving step 10)"
seed_dir "$work/a/global_step5" "$work/k"
start=$(date +%s)
if DSC_FAILPOINT=checkpoint_write:1 train 2 "$work/k" 4 --resume > "$work/k.log" 2>&1; then
  fail "the killed job reported success"
fi
elapsed=$(( $(date +%s) - start ))
grep -q "rank 1" "$work/k.log" || fail "launcher did not name rank 1: $(tail -3 "$work/k.log")"
[ "$(cat "$work/k/latest")" = "global_step5" ] || fail "latest moved to $(cat "$work/k/latest")"
[ ! -e "$work/k/global_step10" ] || fail "a half-written global_step10 was published"
if pgrep -f "$work/k" > /dev/null; then fail "processes of the killed job remain"; fi
train 2 "$work/k" 4 --resume > "$work/k2.log"
same_state "$work/a/global_step10" "$work/k/global_step10" 0 > /dev/null ||
  fail "continuation after the crash differs"
echo "   job stopped in ${elapsed}s, latest still global_step5, restored and continued bitwise"

echo "== 4. h5dump -H: global names and shapes"
h5dump -H "$work/a/global_step10/state.h5" > "$work/h5.txt"
grep -A3 'DATASET "embed.wte.weight"' "$work/h5.txt" | grep -q 'SIMPLE { ( 256, 64 )' || fail "embed.wte.weight not (256, 64)"
grep -A3 'DATASET "layers.1.mlp.fc.weight"' "$work/h5.txt" | grep -q 'SIMPLE { ( 256, 64 )' || fail "mlp.fc not (256, 64)"
grep -q 'GROUP "optimizer"' "$work/h5.txt" || fail "no optimizer group"
echo "   ok"
# Resumes the checkpoint of step 5 in $1 with NP ranks and compares step 10 (<= 1e-5, or bitwise with "exact").
resume_matches() { # REF_DIR NAME NP MICRO exact|close [args...]
  local ref=$1 name=$2 np=$3 micro=$4 mode=$5
  shift 5
  seed_dir "$ref/global_step5" "$work/$name"
  train "$np" "$work/$name" "$micro" --resume "$@" > "$work/$name.log" 2>&1 || fail "$name: $(tail -2 "$work/$name.log")"
  local d
  local tol=1e-5
  if [ "$mode" = exact ]; then
    diff <(losses < "$ref.log" | tail -5) <(losses < "$work/$name.log") > /dev/null || fail "$name: losses differ"
    tol=0
  fi
  d=$(same_state "$ref/global_step10" "$work/$name/global_step10" "$tol" --prefix model/) ||
    fail "$name: parameters differ (tol $tol)"
  echo "   $name: $np rank(s), max parameter difference at step 10: $d ($mode)"
}

echo "== 5. pipelines and ZeRO"
pp2=(--set pipeline.stages=2 --set zero_optimization.stage=1)
train 4 "$work/p" 2 "${pp2[@]}" > "$work/p.log" 2>&1 || fail "PP=2 x DP=2: $(tail -2 "$work/p.log")"
resume_matches "$work/p" p_same 4 2 exact "${pp2[@]}"
resume_matches "$work/p" p_dp4_zero2 4 2 close --set zero_optimization.stage=2
resume_matches "$work/p" p_pp4 4 8 close --set pipeline.stages=4
resume_matches "$work/p" p_one 1 8 close
train 2 "$work/z" 4 --set zero_optimization.stage=2 > "$work/z.log" 2>&1 || fail "ZeRO-2: $(tail -2 "$work/z.log")"
resume_matches "$work/z" z_same 2 4 exact --set zero_optimization.stage=2
resume_matches "$work/z" z_zero1_dp4 4 2 close --set zero_optimization.stage=1
train 2 "$work/z3" 4 --set zero_optimization.stage=3 > "$work/z3.log" 2>&1 || fail "ZeRO-3: $(tail -2 "$work/z3.log")"
resume_matches "$work/z3" z3_same 2 4 exact --set zero_optimization.stage=3
resume_matches "$work/z3" z3_one_zero0 1 8 close
resume_matches "$work/z" z2_to_zero3_dp4 4 2 close --set zero_optimization.stage=3

echo "== 6. MoE (4 experts; saved with EP=2 on 4 ranks)"
moe=(--set model.arch=gpt-moe --set moe.num_experts=4 --set moe.k=2 --set moe.layer_freq=1)
train 4 "$work/m" 2 "${moe[@]}" --set moe.ep_size=2 > "$work/m.log" 2>&1 || fail "MoE EP=2: $(tail -2 "$work/m.log")"
resume_matches "$work/m" m_same 4 2 exact "${moe[@]}" --set moe.ep_size=2
resume_matches "$work/m" m_ep1 4 2 close "${moe[@]}" --set moe.ep_size=1
resume_matches "$work/m" m_ep4 4 2 close "${moe[@]}" --set moe.ep_size=4
pp_moe=("${moe[@]}" --set moe.ep_size=2 --set pipeline.stages=2)
train 4 "$work/pm" 2 "${pp_moe[@]}" > "$work/pm.log" 2>&1 || fail "PP=2 x EP=2: $(tail -2 "$work/pm.log")"
resume_matches "$work/pm" pm_same 4 2 exact "${pp_moe[@]}"
echo "6 passed, 0 failed"
