#!/usr/bin/env bash
# End-to-end checkpoint tests through dsc-train and dsc-launch:
#  1. resume exactness: 10 steps == 5 steps, save, restore, 5 steps (bitwise, same layout);
#  2. layout change: a DP=2 checkpoint resumed on 1 and 4 ranks matches (<= 1e-5);
#  3. crash safety: a rank SIGKILLed in the middle of a save leaves `latest` on the
#     previous checkpoint, which restores and continues exactly;
#  4. h5dump -H shows global names and global shapes.
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
common=(--set data.path="$work/ts.tok" --set train.steps=10 --set steps_per_print=1 --set train.eval_interval=0
        --set checkpoint.save_interval=5 --set scheduler.params.warmup_num_steps=3 --set model.n_layer=2
        --set model.d_model=64 --set model.seq_len=32 --set train_batch_size=8 --sample 0 --no-progress "$@")
train() { # NP SAVE_DIR MICRO [args...]
  local np=$1 dir=$2 micro=$3
  shift 3
  "$bin/dsc-launch" -n "$np" "$bin/dsc-train" "$src/configs/main.json" "${common[@]}" \
    --set checkpoint.save_dir="$dir" --set train_micro_batch_size_per_gpu="$micro" \
    --set gradient_accumulation_steps=null "$@"
}
losses() { grep -E '^step +[0-9]+/10 \|' | sed -E 's/ \| [0-9]+ tok\/s.*//'; }
max_model_diff() { "$bin/dsc-ckpt" diff "$1" "$2" | awk '$1 ~ /^model\// { if ($NF + 0 > m) m = $NF + 0 } END { printf "%g", m + 0 }'; }
seed_dir() { mkdir -p "$2" && cp -r "$1" "$2/" && basename "$1" > "$2/latest"; }

echo "== 1. resume exactness (DP=2)"
train 2 "$work/a" 4 > "$work/a.log"
seed_dir "$work/a/global_step5" "$work/b"
train 2 "$work/b" 4 --resume > "$work/b.log"
grep -q "resumed from" "$work/b.log" || fail "no resume line"
diff <(losses < "$work/a.log" | tail -5) <(losses < "$work/b.log") || fail "losses after resume differ"
worst=$("$bin/dsc-ckpt" diff "$work/a/global_step10" "$work/b/global_step10" | awk '/^worst/ {print $NF}')
[ "$worst" = "0.000e+00" ] || fail "state after resume differs: worst $worst"
echo "   losses of steps 6-10 and the whole state at step 10 are bitwise equal"

echo "== 2. layout change (DP=2 -> 1 and 4 ranks)"
for np in 1 4; do
  seed_dir "$work/a/global_step5" "$work/c$np"
  train "$np" "$work/c$np" $((8 / np < 4 ? 8 / np : 4)) --resume > "$work/c$np.log"
  d=$(max_model_diff "$work/a/global_step10" "$work/c$np/global_step10")
  awk -v d="$d" 'BEGIN { exit !(d <= 1e-5) }' || fail "DP=2 -> $np ranks: parameters differ by $d"
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
worst=$("$bin/dsc-ckpt" diff "$work/a/global_step10" "$work/k/global_step10" | awk '/^worst/ {print $NF}')
[ "$worst" = "0.000e+00" ] || fail "continuation after the crash differs: worst $worst"
echo "   job stopped in ${elapsed}s, latest still global_step5, restored and continued bitwise"

echo "== 4. h5dump -H: global names and shapes"
h5dump -H "$work/a/global_step10/state.h5" > "$work/h5.txt"
grep -A3 'DATASET "embed.wte.weight"' "$work/h5.txt" | grep -q 'SIMPLE { ( 256, 64 )' || fail "embed.wte.weight not (256, 64)"
grep -A3 'DATASET "layers.1.mlp.fc.weight"' "$work/h5.txt" | grep -q 'SIMPLE { ( 256, 64 )' || fail "mlp.fc not (256, 64)"
grep -q 'GROUP "optimizer"' "$work/h5.txt" || fail "no optimizer group"
echo "   ok"
echo "4 passed, 0 failed"
