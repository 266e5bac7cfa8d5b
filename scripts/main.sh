#!/usr/bin/env bash
# The main job, on 4 ranks through dsc-launch:
#   1. communication self-check (process groups, every collective, byte counters);
#   2. train a GPT-MoE (configs/main.json: 4 blocks, every second one a 4-expert
#      top-2 MoE layer) on data/tinyshakespeare.txt with 2 pipeline stages x 2
#      expert-parallel ranks: partition summary, progress bar, falling loss,
#      per-expert load, checkpoints in build/main-ckpt;
#   3. resume the latest checkpoint resharded to 2 pipeline stages x 2
#      tensor-parallel ranks (attention split by heads, every expert split by
#      TP: moe.enable_expert_tensor_parallelism) and train further;
#   4. generate text from the final checkpoint with the inference engine
#      across 4 ranks: 2 tensor-parallel x 2 pipeline stages;
#   5. serve the checkpoint over HTTP (dsc-serve, OpenAI's API) on 4 ranks,
#      2 tensor-parallel x 2 pipeline stages, stream one completion with curl,
#      stop it with SIGTERM to dsc-launch (every rank drains and exits 0, and
#      so does the launcher).
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
echo "== 3. resuming from $(cat "$ckpt/latest") resharded to 2 pipeline stages x 2 tensor-parallel ranks"
echo "   (experts split by TP), training to step $steps"
"${run[@]}" --set train.steps="$steps" --resume latest --sample 0 --set tensor_parallel.autotp_size=2 \
  --set moe.ep_size=1 --set moe.enable_expert_tensor_parallelism=true "$@"
"$bin/dsc-ckpt" ls "$ckpt"
"$bin/dsc-train" --plot "$metrics" "$build/main-loss.svg"

echo
echo "== 4. generating from the checkpoint on 4 ranks: 2 tensor-parallel x 2 pipeline stages"
"$bin/dsc-launch" -n 4 "$bin/dsc-generate" "$ckpt" --tp 2 --pp 2 --prompt "ROMEO:" --max-new-tokens 58 \
  --temperature 0.8 --top-p 0.95 --seed 1
echo

echo
echo "== 5. serving the checkpoint over HTTP: dsc-serve on 4 ranks, 2 tensor-parallel x 2 pipeline stages"
log=$build/main-serve.log
"$bin/dsc-launch" -n 4 "$bin/dsc-serve" "$ckpt" --tp 2 --pp 2 --port 0 >"$log" 2>&1 &
launcher=$!
# On an early exit: two signals end the job at once (one would let it drain).
trap 'kill "$launcher" 2>/dev/null; kill "$launcher" 2>/dev/null || true' EXIT
for _ in $(seq 1200); do # the "listening on http://HOST:PORT (... pids ...)" line, within 120 s
  grep -q "listening on" "$log" && break
  kill -0 "$launcher" 2>/dev/null || { cat "$log"; exit 1; }
  sleep 0.1
done
listening=$(grep -m1 "listening on" "$log") || { cat "$log"; exit 1; }
echo "$listening"
url=$(echo "$listening" | grep -o 'http://[0-9.]*:[0-9]*')
request='{"prompt": "ROMEO:", "max_tokens": 40, "temperature": 0.8, "top_p": 0.95, "seed": 1, "stream": true}'
echo "\$ curl -sN $url/v1/completions -d '$request'"
sse=$build/main-serve.sse
curl -sSN --fail-with-body --max-time 120 "$url/v1/completions" -H 'Content-Type: application/json' -d "$request" >"$sse"
grep -m2 '^data: ' "$sse"
echo "... ($(grep -c '^data: {' "$sse") chunks in all, one per token)"
grep '^data: ' "$sse" | tail -n 2
text=$(sed -n 's/^data: .*"text":"\(\([^"\\]\|\\.\)*\)",.*/\1/p' "$sse" | tr -d '\n')
printf 'the completion: ROMEO:%b\n' "$text"
echo "\$ kill -TERM $launcher    # dsc-launch: every rank drains and exits 0"
kill -TERM "$launcher"
status=0
wait "$launcher" || status=$?
trap - EXIT
grep -E "^dsc-(serve|launch):" "$log" | tail -n 2
if [ "$status" -ne 0 ]; then
  echo "dsc-launch exited $status after SIGTERM; its log: $log"
  exit 1
fi
