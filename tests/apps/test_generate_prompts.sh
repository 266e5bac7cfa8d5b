#!/usr/bin/env bash
# dsc-generate with several prompts: --prompt repeated, --prompts-file (and
# `-` for stdin), --tokens repeated, all batched through the scheduler in one
# run, must print exactly what separate runs print, one after the other, in
# the order given; greedy and sampled (each prompt has the run's seed), on a
# tiny dsc llama trained here (byte tokenizer) and on the transformers Llama
# fixture (token ids).
#   test_generate_prompts.sh DSC_TRAIN DSC_GENERATE SOURCE_DIR WORK_DIR
set -eu
train=$1 generate=$2 src=$3 work=$4
rm -rf "$work" && mkdir -p "$work" && cd "$work"
"$train" --prepare "$src/data/tinyshakespeare.txt" ts.tok >/dev/null
cat >job.json <<'JSON'
{"train_batch_size": 8, "seed": 3, "steps_per_print": 100,
 "model": {"arch": "llama", "n_layer": 2, "d_model": 32, "n_head": 4, "n_kv_head": 2, "d_ff": 64, "vocab_size": 256, "seq_len": 64},
 "optimizer": {"type": "adamw", "params": {"lr": 0.01}}, "checkpoint": {"save_dir": "ckpt"},
 "data": {"path": "ts.tok"}, "train": {"steps": 40, "eval_interval": 0}}
JSON
"$train" job.json --sample 0 --no-progress >/dev/null
fail=0
same() { # NAME FILE_A FILE_B
  if cmp -s "$2" "$3"; then echo "$1: identical ($(wc -c <"$2") bytes)"; else echo "FAIL: $1 differs"; diff "$2" "$3" | head -20; fail=1; fi
}
prompts=("ROMEO:" "First Citizen:" "the king" "O")
for mode in "" "--temperature 0.9 --top-k 20 --seed 7"; do
  : >separate.txt
  for p in "${prompts[@]}"; do
    # shellcheck disable=SC2086
    "$generate" ckpt --prompt "$p" --max-new-tokens 24 --quiet $mode >>separate.txt
  done
  args=()
  for p in "${prompts[@]}"; do args+=(--prompt "$p"); done
  # shellcheck disable=SC2086
  "$generate" ckpt "${args[@]}" --max-new-tokens 24 --quiet $mode >together.txt
  same "4 x --prompt ${mode:-greedy}" separate.txt together.txt
  printf '%s\n' "${prompts[0]}" "${prompts[1]}" "" "${prompts[2]}" "${prompts[3]}" >prompts.txt
  # shellcheck disable=SC2086
  "$generate" ckpt --prompts-file prompts.txt --max-new-tokens 24 --quiet $mode >file.txt
  same "--prompts-file ${mode:-greedy}" separate.txt file.txt
  # shellcheck disable=SC2086
  "$generate" ckpt --prompts-file - --max-new-tokens 24 --quiet $mode <prompts.txt >stdin.txt
  same "--prompts-file - ${mode:-greedy}" separate.txt stdin.txt
done
"$generate" ckpt --prompt "ROMEO:" --max-new-tokens 24 --quiet >one.txt
echo "ROMEO:" | "$generate" ckpt --prompt - --max-new-tokens 24 --quiet >one_stdin.txt
same "--prompt -" one.txt one_stdin.txt

hf="$src/tests/inference/fixtures/hf/llama"
: >separate.txt
for t in 71,69,123,44,56 3,1,4,1,5,9,2,6 100; do "$generate" "$hf" --tokens $t --max-new-tokens 6 --quiet >>separate.txt; done
"$generate" "$hf" --tokens 71,69,123,44,56 --tokens 3,1,4,1,5,9,2,6 --tokens 100 --max-new-tokens 6 --quiet >together.txt
same "3 x --tokens (transformers Llama fixture)" separate.txt together.txt
head -n 1 together.txt | grep -qx "71 69 123 44 56 74 10 9 122 92 49" || { echo "FAIL: first continuation is not transformers'"; fail=1; }
exit $fail
