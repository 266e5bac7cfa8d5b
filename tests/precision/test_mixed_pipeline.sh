#!/usr/bin/env bash
# Mixed precision through the pipeline runner: 6 steps of bf16 and of fp16 on
# 2 pipeline stages give the per-step losses of the same model on 1 rank
# (within 1e-5: f32 summation order only). The pipeline rounds what passes
# between its layers and stages as the default runner does, so a missing
# rounding shows as a bf16-size (1e-3) difference. With activation
# checkpointing (pipeline.activation_checkpoint_interval 1) the 2-stage run
# keeps its checkpointed inputs in 2 bytes: the same losses bit for bit, and
# fewer activation bytes than the f32 run with the same checkpointing. The
# stages exchange activations and their gradients in 2 bytes: comms_logger's
# largest send is half the f32 run's.
# Usage: test_mixed_pipeline.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
bin=$build/bin
work=$(mktemp -d "$build/test_mixed_pipeline.XXXXXX")
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export DSC_PROGRESS=0 OMP_NUM_THREADS=1 DSC_NUM_THREADS=1
cd "$work"
"$bin/dsc-train" --prepare "$src/data/tinyshakespeare.txt" ts.tok >/dev/null
cat > c.json <<'JSON'
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "steps_per_print": 1,
 "model": {"arch": "gpt", "n_layer": 4, "d_model": 32, "n_head": 2, "seq_len": 16, "vocab_size": 256},
 "optimizer": {"type": "adamw", "params": {"lr": 0.003}},
 "data": {"path": "ts.tok"}, "train": {"steps": 6}}
JSON
for mode in bf16 fp16; do
  for stages in 1 2; do
    "$bin/dsc-launch" -n "$stages" "$bin/dsc-train" c.json --set "$mode.enabled=true" --set pipeline.stages="$stages" \
      --metrics "$mode.$stages.jsonl" --sample 0 --no-progress > "$mode.$stages.log" 2>&1 ||
      { cat "$mode.$stages.log"; echo "FAIL: $mode on $stages stages did not train" >&2; exit 1; }
  done
  python3 - "$mode" <<'PY'
import json, sys
mode = sys.argv[1]
a = [json.loads(l)["loss"] for l in open(mode + ".1.jsonl") if '"loss"' in l]
b = [json.loads(l)["loss"] for l in open(mode + ".2.jsonl") if '"loss"' in l]
d = max(abs(x - y) for x, y in zip(a, b))
print("   %s: 2 pipeline stages vs 1 rank, %d steps: max |loss diff| %.2e" % (mode, len(a), d))
if len(a) != 6 or len(b) != 6 or d > 1e-5:
    sys.exit("FAIL: %s differs" % mode)
PY
done
run() { # name, then dsc-train --set arguments
  local name=$1
  shift
  "$bin/dsc-launch" -n 2 "$bin/dsc-train" c.json --set pipeline.stages=2 "$@" --metrics "$name.jsonl" --sample 0 \
    --no-progress > "$name.log" 2>&1 || { cat "$name.log"; echo "FAIL: $name did not train" >&2; exit 1; }
}
logged='comms_logger={"enabled": true}'
run f32.ckpt --set pipeline.activation_checkpoint_interval=1 --set "$logged"
for mode in bf16 fp16; do
  run "$mode.ckpt" --set "$mode.enabled=true" --set pipeline.activation_checkpoint_interval=1 --set "$logged"
  python3 - "$mode" <<'PY'
import json, sys
mode = sys.argv[1]
rows = lambda name: [json.loads(l) for l in open(name + ".jsonl") if '"loss"' in l]
plain, ckpt, f32 = rows(mode + ".2"), rows(mode + ".ckpt"), rows("f32.ckpt")
same = [a["loss"] == b["loss"] for a, b in zip(plain, ckpt)]
act = lambda r: r[-1]["mem_bytes"]["activations"]
print("   %s, 2 stages, checkpoint interval 1: losses equal to the run without it: %s; activation bytes %d "
      "(f32 with the same checkpointing: %d)" % (mode, all(same) and len(same) == 6, act(ckpt), act(f32)))
if len(same) != 6 or not all(same):
    sys.exit("FAIL: %s with checkpointed inputs in 2 bytes changed the losses" % mode)
if act(ckpt) >= act(f32):
    sys.exit("FAIL: %s keeps its checkpointed inputs in f32" % mode)

def largest_send(log):  # rank 0's comms_logger table: the rows under "send"
    units, rows, op = {"B": 1, "KB": 1024, "MB": 1024 ** 2}, [], None
    for line in open(log):
        if line.strip() and not line[0].isspace():
            op = line.strip()
        elif op == "send" and len(line.split()) >= 2 and line.split()[1] in units:
            rows.append(float(line.split()[0]) * units[line.split()[1]])
    return max(rows)
narrow, wide = largest_send(mode + ".ckpt.log"), largest_send("f32.ckpt.log")
print("   %s: largest message stage 0 sends %d bytes (f32: %d)" % (mode, narrow, wide))
if 2 * narrow != wide:
    sys.exit("FAIL: %s stages do not exchange activations in 2 bytes" % mode)
PY
done
echo "mixed precision through the pipeline equals the single-rank run"
