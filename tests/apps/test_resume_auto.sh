#!/usr/bin/env bash
# dsc-train --resume auto, for restart-on-preemption scripts: with no
# checkpoint in checkpoint.save_dir the run starts fresh (and says so); run
# again, it resumes from the latest checkpoint; and the resumed run ends
# with the parameters of one uninterrupted run (dsc-ckpt diff, 0 difference).
# Without checkpoint.save_dir, --resume auto is an error naming the key.
#   test_resume_auto.sh DSC_TRAIN DSC_CKPT SOURCE_DIR WORK_DIR
set -eu
train=$1 ckpt=$2 src=$3 work=$4
rm -rf "$work" && mkdir -p "$work" && cd "$work"
"$train" --prepare "$src/data/tinyshakespeare.txt" ts.tok >/dev/null
cat >job.json <<'JSON'
{"train_batch_size": 4, "seed": 5, "steps_per_print": 1,
 "model": {"arch": "gpt", "n_layer": 1, "d_model": 32, "n_head": 4, "vocab_size": 256, "seq_len": 32},
 "optimizer": {"type": "adamw", "params": {"lr": 0.003}},
 "checkpoint": {"save_dir": "auto", "save_interval": 3},
 "data": {"path": "ts.tok"}, "train": {"steps": 6, "eval_interval": 0}}
JSON
run() { "$train" job.json --sample 0 --no-progress "$@"; }
run --resume auto --set train.steps=3 >first.txt
grep -q "no checkpoint in auto, starting fresh" first.txt
grep -q "saved checkpoint auto/global_step3" first.txt
run --resume auto >second.txt
grep -q "resumed from auto/latest at step 3" second.txt
grep -q "saved checkpoint auto/global_step6" second.txt
! grep -q "starting fresh" second.txt
run --set checkpoint.save_dir=straight >/dev/null
"$ckpt" diff auto/global_step6 straight/global_step6 | tee diff.txt | tail -n 1
grep -q "worst max |a-b| 0.000e+00" diff.txt
if run --resume auto --set checkpoint.save_dir= --set checkpoint.save_interval=0 >/dev/null 2>err.txt; then echo "FAIL: --resume auto without save_dir ran"; exit 1; fi
grep -q 'resume auto needs "checkpoint.save_dir"' err.txt
echo "--resume auto: fresh start, resume, same parameters as one run, and the save_dir error"
