#!/usr/bin/env bash
# TensorBoard event files written by dsc, read back by the tensorboard Python
# package (read_tfevents.py): the events test_monitor writes, then a 2-rank
# dsc-train run with tensorboard and csv_monitor on, whose event file and CSV
# files must hold the same series, one row per step, against samples seen.
# The reader is the first of PYTHON (CMake's), /opt/venv/bin/python and python3 that imports
# tensorboard; exits 77 when none does.
# Usage: test_monitor.sh BUILD_DIR SOURCE_DIR [PYTHON]
set -euo pipefail
build=$1 src=$2
bin=$build/bin
py=
for candidate in "${3:-}" /opt/venv/bin/python "$(command -v python3 || true)"; do
  if [ -n "$candidate" ] && [ -x "$candidate" ] && "$candidate" -c "import tensorboard" 2>/dev/null; then
    py=$candidate
    break
  fi
done
[ -n "$py" ] || { echo "skipped: no python with the tensorboard package"; exit 77; }
work=$(mktemp -d "$build/test_monitor.XXXXXX")
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 DSC_PROGRESS=0 OMP_NUM_THREADS=1 DSC_NUM_THREADS=1

mkdir -p "$work/unit"
"$build/tests/monitor/test_monitor" "$work/unit" >/dev/null
"$py" "$src/tests/monitor/read_tfevents.py" "$work/unit" expected

"$bin/dsc-train" --prepare "$src/data/tinyshakespeare.txt" "$work/ts.tok" >/dev/null
"$bin/dsc-launch" -n 2 "$bin/dsc-train" "$src/tests/config/deepspeed/hf_ds_config_zero2.json" \
  --set 'model={"arch": "gpt", "n_layer": 2, "d_model": 32, "n_head": 2, "seq_len": 16, "vocab_size": 256}' \
  --set data.path="$work/ts.tok" --set train.steps=4 --sample 0 --no-progress \
  --set "tensorboard={\"enabled\": true, \"output_path\": \"$work/run\", \"job_name\": \"job\"}" \
  --set "csv_monitor={\"enabled\": true, \"output_path\": \"$work/run\", \"job_name\": \"job\"}" > "$work/train.log" 2>&1 ||
  { cat "$work/train.log"; exit 1; }
"$py" "$src/tests/monitor/read_tfevents.py" "$work/run" csv
[ "$(wc -l < "$work/run/job/Train_Samples_train_loss.csv")" -eq 5 ] || { echo "FAIL: expected a header and 4 rows"; exit 1; }
echo "event files and csv files agree"
