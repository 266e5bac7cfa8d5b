#!/usr/bin/env bash
# dsc-train preempted: a SIGTERM to dsc-launch (which the ranks get as
# SIGUSR2 through mpirun) in the middle of a long run stops every rank after
# the step in progress, saves that step's checkpoint and exits 0 (the
# launcher too); `--resume auto` then continues from that very step. A
# SIGTERM straight to a one-rank dsc-train does the same; without
# checkpoint.save_dir the stop says that nothing was saved.
#   test_train_preempt.sh DSC_LAUNCH DSC_TRAIN SOURCE_DIR WORK_DIR
# Every wait has a deadline (60 s); none is a speed claim.
set -eu
launch=$1 train=$2 src=$3 work=$4
rm -rf "$work" && mkdir -p "$work" && cd "$work"
"$train" --prepare "$src/data/tinyshakespeare.txt" ts.tok >/dev/null
cat >job.json <<'JSON'
{"train_batch_size": 4, "seed": 5, "steps_per_print": 1,
 "model": {"arch": "gpt", "n_layer": 1, "d_model": 32, "n_head": 4, "vocab_size": 256, "seq_len": 32},
 "optimizer": {"type": "adamw", "params": {"lr": 0.003}},
 "checkpoint": {"save_dir": "ckpt", "save_interval": 0},
 "data": {"path": "ts.tok"}, "train": {"steps": 1000000, "eval_interval": 0}}
JSON

# stop NAME PID: once NAME.jsonl has 3 steps, SIGTERM to PID; waits for PID's exit (status in $rc).
stop() {
  local name=$1 pid=$2
  for _ in $(seq 1200); do
    [ -f "$name.jsonl" ] && [ "$(wc -l <"$name.jsonl")" -ge 3 ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  kill -TERM "$pid"
  for _ in $(seq 1200); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "FAIL: $name still runs 60 s after SIGTERM"
    kill -KILL "$pid"
  fi
  set +e
  wait "$pid"
  rc=$?
  set -e
  echo "--- $name: exit $rc"
  cat "$name.out"
}

# Two ranks under dsc-launch.
"$launch" -n 2 "$train" job.json --sample 0 --no-progress --metrics launched.jsonl >launched.out 2>&1 &
stop launched $!
[ "$rc" -eq 0 ]
line=$(grep -E "dsc-train: stopped by signal 12 after step [0-9]+ of 1000000; run again with --resume auto" launched.out)
step=$(echo "$line" | sed -E 's/.*after step ([0-9]+) of.*/\1/')
[ "$step" -ge 3 ] && [ "$step" -lt 1000000 ]
grep -q "saved checkpoint ckpt/global_step$step\$" launched.out
grep -q "every rank stopped and exited 0 after signal 15" launched.out
[ "$(grep -c "\"step\": " launched.jsonl)" -eq "$step" ] # the step lines end at the saved step

"$train" job.json --sample 0 --no-progress --resume auto --set "train.steps=$((step + 2))" >resumed.out
grep -q "resumed from ckpt/latest at step $step" resumed.out
grep -q "saved checkpoint ckpt/global_step$((step + 2))" resumed.out
! grep -q "stopped by signal" resumed.out

# One rank, SIGTERM to dsc-train itself, nothing to save to.
"$train" job.json --sample 0 --no-progress --set checkpoint.save_dir= --metrics alone.jsonl >alone.out 2>&1 &
stop alone $!
[ "$rc" -eq 0 ]
grep -qE "stopped by signal 15 after step [0-9]+ of 1000000; nothing was saved" alone.out
! grep -q "saved checkpoint" alone.out
echo "dsc-train preempted under dsc-launch and alone: stopped after a whole step, saved, resumed"
