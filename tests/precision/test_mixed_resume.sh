#!/usr/bin/env bash
# Resuming mixed precision: 6 steps of fp16 (a loss scale that overflows at
# first, so steps are skipped and the scale moves) and of bf16 in one run,
# and as 3 steps + --resume for 3 more, give the same losses at steps 4-6:
# the fp32 master (optimizer/master/*) and the loss scaler (loss_scale,
# loss_scaler) come back from the checkpoint, not from the rounded weights
# or the config's initial scale.
# Usage: test_mixed_resume.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
bin=$build/bin
work=$(mktemp -d "$build/test_mixed_resume.XXXXXX")
trap 'rm -rf "$work"' EXIT
export DSC_PROGRESS=0 OMP_NUM_THREADS=1 DSC_NUM_THREADS=1
fail() { echo "FAIL: $*" >&2; exit 1; }
cd "$work"
"$bin/dsc-train" --prepare "$src/data/tinyshakespeare.txt" ts.tok >/dev/null
cat > c.json <<'JSON'
{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "steps_per_print": 1,
 "model": {"arch": "gpt", "n_layer": 2, "d_model": 32, "n_head": 2, "seq_len": 16, "vocab_size": 256},
 "optimizer": {"type": "adamw", "params": {"lr": 0.003}},
 "data": {"path": "ts.tok"}, "train": {"steps": 6}}
JSON
losses() { grep -E '^step +[456]/6 \| loss' "$1" | cut -d'|' -f1-2; }
check() {
  local name=$1
  shift
  "$bin/dsc-train" c.json "$@" --sample 0 --no-progress > "$name.full" 2>&1 || { cat "$name.full"; fail "$name: full run"; }
  "$bin/dsc-train" c.json "$@" --set train.steps=3 --set checkpoint.save_dir="$name.ck" \
    --set checkpoint.save_interval=3 --sample 0 --no-progress > "$name.first" 2>&1 || { cat "$name.first"; fail "$name: first half"; }
  "$bin/dsc-train" c.json "$@" --set checkpoint.save_dir="$name.ck" --resume latest --sample 0 --no-progress \
    > "$name.resumed" 2>&1 || { cat "$name.resumed"; fail "$name: resumed half"; }
  [ "$(losses "$name.full" | wc -l)" = 3 ] || { cat "$name.full"; fail "$name: no losses for steps 4-6"; }
  diff <(losses "$name.full") <(losses "$name.resumed") || fail "$name: resumed losses differ"
  echo "   $name: steps 4-6 resumed equal: $(losses "$name.resumed" | tr -s ' ' | tr '\n' ';')"
}
check fp16 --set fp16.enabled=true --set fp16.initial_scale_power=19 --set fp16.hysteresis=1 \
  --set fp16.loss_scale_window=2
grep -q 'skipped: the gradients overflowed' fp16.first || fail "fp16: no skipped step before the checkpoint"
check bf16 --set bf16.enabled=true
echo "mixed-precision resume equals the uninterrupted runs"
