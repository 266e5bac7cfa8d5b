#!/usr/bin/env bash
# dsc-train --init-from-hf end to end: 2 ranks under ZeRO-3 start from the
# tiny transformers Mistral fixture, take one step with lr 0 (the parameters
# stay the HF values) and save; dsc-generate's greedy continuation of the
# fixture's prompt 0 from that dsc checkpoint must be transformers' own
# (ref.safetensors gen_0 = 108 100 32 1 25 68, see tests/ref/make_hf_fixtures.py).
#   hf_init_cli.sh MPIEXEC DSC_TRAIN DSC_GENERATE SOURCE_DIR WORK_DIR
set -eu
mpiexec=$1 train=$2 generate=$3 src=$4 work=$5
rm -rf "$work" && mkdir -p "$work" && cd "$work"
"$train" --prepare "$src/data/tinyshakespeare.txt" ts.tok >/dev/null # ASCII: every id < the fixture's 128
cat >job.json <<'JSON'
{"train_batch_size": 4, "model": {"seq_len": 16}, "zero_optimization": {"stage": 3},
 "optimizer": {"type": "adamw", "params": {"lr": 0}}, "checkpoint": {"save_dir": "ckpt"},
 "data": {"path": "ts.tok"}, "train": {"steps": 1, "eval_interval": 0}}
JSON
"$mpiexec" --oversubscribe -np 2 "$train" job.json --init-from-hf "$src/tests/inference/fixtures/hf/mistral" --sample 0
got=$("$generate" ckpt --tokens 24,88,122,116,103 --max-new-tokens 6 --quiet | od -An -tu1 | tr -s ' \n' ' ')
want=$(printf '24 88 122 116 103\x6c\x64\x20\x01\x19\x44\n' | od -An -tu1 | tr -s ' \n' ' ')
echo "dsc-generate from the --init-from-hf checkpoint (bytes):$got"
echo "transformers' greedy continuation (bytes):              $want"
[ "$got" = "$want" ]
