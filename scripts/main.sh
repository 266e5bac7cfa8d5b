#!/usr/bin/env bash
# The main command: builds dsc, runs the communication self-check (process
# groups, every collective, byte counters), then trains a small GPT
# (configs/main.json) on data/tinyshakespeare.txt with 2 pipeline stages
# (1F1B over 4 micro-batches; DSC_MAIN_RANKS=4 adds 2-way data parallelism),
# printing the partition summary, the falling loss, the validation loss, and
# a generated sample; the loss curve lands in build/main-loss.svg. Extra
# arguments go to dsc-train (e.g. --set train.steps=100). dsc-launch builds
# the mpirun command (root, oversubscription, one thread per rank) and names
# the rank that failed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/build.sh"
build=${DSC_BUILD_DIR:-$root/build}
ranks=${DSC_MAIN_RANKS:-2}

echo "== communication self-check ($ranks ranks)"
"$build/bin/dsc-launch" -n "$ranks" "$build/bin/dsc-selfcheck"

echo "== training a small GPT on tinyshakespeare ($ranks ranks: 2 pipeline stages x $((ranks / 2)) data-parallel)"
tokens=$build/data/tinyshakespeare.tok
if [ ! -f "$tokens" ] || [ "$tokens" -ot "$root/data/tinyshakespeare.txt" ]; then
  mkdir -p "$build/data"
  "$build/bin/dsc-train" --prepare "$root/data/tinyshakespeare.txt" "$tokens"
fi
# Under mpirun every rank's stdout is a pseudo-terminal, so the progress bar
# follows this script's own stdout.
if [ -t 1 ]; then export DSC_PROGRESS=1; else export DSC_PROGRESS=0; fi
metrics=$build/main-metrics.jsonl
"$build/bin/dsc-launch" -n "$ranks" "$build/bin/dsc-train" "$root/configs/main.json" \
  --set data.path="$tokens" --metrics "$metrics" "$@"
"$build/bin/dsc-train" --plot "$metrics" "$build/main-loss.svg"
