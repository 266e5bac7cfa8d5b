#!/usr/bin/env bash
# The main job, on 4 ranks through dsc-launch:
#   1. communication self-check (process groups, every collective, byte counters);
#   2. train a GPT-MoE (configs/main.json: 4 blocks, every second one a 4-expert
#      top-2 MoE layer) on data/tinyshakespeare.txt with 2 pipeline stages x 2
#      expert-parallel ranks: partition summary, progress bar, falling loss,
#      per-expert load, checkpoints in build/main-ckpt;
#   3. resume from the latest checkpoint and train further;
#   4. generate text from the final checkpoint with the inference engine.
# DSC_MAIN_STEPS (default 200) sets the total steps; the first run stops at
# 3/4 of them. Extra arguments go to both dsc-train runs.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/build.sh"
build=${DSC_BUILD_DIR:-$root/build}
bin=$build/bin
steps=${DSC_MAIN_STEPS:-200}
first=$((steps * 3 / 4))
ckpt=$build/main-ckpt
metrics=$build/main-metrics.jsonl

echo "== 1. communication self-check (4 ranks)"
"$bin/dsc-launch" -n 4 "$bin/dsc-selfcheck"

tokens=$build/data/tinyshakespeare.tok
if [ ! -f "$tokens" ] || [ "$tokens" -ot "$root/data/tinyshakespeare.txt" ]; then
  mkdir -p "$build/data"
  "$bin/dsc-train" --prepare "$root/data/tinyshakespeare.txt" "$tokens"
fi
# Under mpirun every rank's stdout is a pseudo-terminal, so the progress bar
# follows this script's own stdout.
if [ -t 1 ]; then export DSC_PROGRESS=1; else export DSC_PROGRESS=0; fi
rm -rf "$ckpt" "$metrics"
run=("$bin/dsc-launch" -n 4 "$bin/dsc-train" "$root/configs/main.json" --set data.path="$tokens"
     --set checkpoint.save_dir="$ckpt" --set scheduler.params.total_num_steps="$steps" --metrics "$metrics")

echo
echo "== 2. training a GPT-MoE: 2 pipeline stages x 2 expert-parallel ranks, steps 1-$first"
"${run[@]}" --set train.steps="$first" --sample 0 "$@"

echo
echo "== 3. resuming from $(cat "$ckpt/latest") and training to step $steps"
"${run[@]}" --set train.steps="$steps" --resume latest --sample 0 "$@"
"$bin/dsc-ckpt" ls "$ckpt"
"$bin/dsc-train" --plot "$metrics" "$build/main-loss.svg"

echo
echo "== 4. generating from the checkpoint with the inference engine"
"$bin/dsc-generate" "$ckpt" --prompt "ROMEO:" --max-new-tokens 58 --temperature 0.8 --top-p 0.95 --seed 1
echo
