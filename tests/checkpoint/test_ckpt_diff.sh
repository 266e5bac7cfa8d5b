#!/usr/bin/env bash
# dsc-ckpt diff's exit status: 0 only when two checkpoints hold the same tensors
# with the same shapes and every difference is within --tol; 1 for unrelated
# checkpoints (other shapes), missing tensors on either side, values above the
# tolerance; 2 for an unreadable checkpoint. The scripts that compare
# checkpoints (test_resume.sh) rely on it.
# Usage: test_ckpt_diff.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
bin=$build/bin
work=$(mktemp -d "$build/test_ckpt_diff.XXXXXX")
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 DSC_PROGRESS=0
fail() { echo "FAIL: $*" >&2; exit 1; }

"$bin/dsc-train" --prepare "$src/data/tinyshakespeare.txt" "$work/ts.tok" >/dev/null
train() { # SAVE_DIR [args...]: 3 steps on one rank
  local dir=$1
  shift
  "$bin/dsc-train" "$src/tests/checkpoint/resume.json" --set data.path="$work/ts.tok" --sample 0 --no-progress \
    --set checkpoint.save_dir="$dir" --set train.steps=3 --set checkpoint.save_interval=0 "$@" > "$dir.log"
}
# expect RC A B [diff options...]
expect() {
  local want=$1 a=$2 b=$3 rc=0
  shift 3
  "$bin/dsc-ckpt" diff "$@" "$a" "$b" > "$work/out.txt" 2>&1 || rc=$?
  [ "$rc" = "$want" ] || fail "diff $* $(basename "$a") $(basename "$b"): exit $rc, expected $want: $(tail -2 "$work/out.txt")"
  echo "   exit $rc: $(tail -1 "$work/out.txt")"
}

train "$work/a"
train "$work/a2"
train "$work/seed" --set seed=8
train "$work/wide" --set model.d_model=128
"$bin/dsc-ckpt" export "$work/a" --model-only "$work/a_model.h5" > /dev/null

echo "== identical runs: same"
expect 0 "$work/a" "$work/a2"
echo "== another seed: values differ (within a loose --tol, over the default 0)"
expect 1 "$work/a" "$work/seed" --prefix model/
expect 0 "$work/a" "$work/seed" --prefix model/ --tol 1e9
echo "== unrelated models: shapes differ"
expect 1 "$work/a" "$work/wide"
expect 1 "$work/a" "$work/wide" --tol 1e9
grep -q "shapes differ" "$work/out.txt" || fail "no 'shapes differ' line"
echo "== tensors missing on either side"
expect 1 "$work/a" "$work/a_model.h5" --tol 1e9
expect 1 "$work/a_model.h5" "$work/a" --tol 1e9
expect 0 "$work/a_model.h5" "$work/a" --prefix model/
echo "== unreadable checkpoint: an error"
expect 2 "$work/a" "$work/missing"
echo "PASS"
