#!/usr/bin/env bash
# Resuming after a crash needs no person. Each case lays out save_dir as a
# crash leaves it, then runs `dsc-train --resume` (one rank, 6 steps, saves
# every 2) and checks that it finishes with the state of an uninterrupted run:
#  1. killed between publishing global_step4 and updating latest (latest still
#     global_step2): global_step4 is verified and adopted; training continues
#     from step 4;
#  2. the same with a damaged global_step4: it is set aside as
#     global_step4.damaged (kept, not deleted), training continues from step 2;
#  3. killed while pruning: an empty global_step1/ and a half-deleted
#     .global_step0.pruning/ are gone after the next prune (keep_last 2);
#  4. checkpoint.tag names the saves ("run_{step}" -> run_2, run_4, run_6).
# Usage: test_ckpt_recover.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
bin=$build/bin
work=$(mktemp -d "$build/test_ckpt_recover.XXXXXX")
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 DSC_PROGRESS=0
fail() { echo "FAIL: $*" >&2; exit 1; }

"$bin/dsc-train" --prepare "$src/data/tinyshakespeare.txt" "$work/ts.tok" >/dev/null
train() { # SAVE_DIR STEPS [args...]
  local dir=$1 steps=$2
  shift 2
  "$bin/dsc-train" "$src/tests/checkpoint/resume.json" --set data.path="$work/ts.tok" --sample 0 --no-progress \
    --set checkpoint.save_dir="$dir" --set train.steps="$steps" --set checkpoint.save_interval=2 "$@"
}
same() { "$bin/dsc-ckpt" diff "$1" "$2" > "$work/diff.txt" || fail "$3: $(tail -1 "$work/diff.txt")"; }

train "$work/ref" 6 > "$work/ref.log"
[ "$(cat "$work/ref/latest")" = global_step6 ] || fail "reference run: latest is $(cat "$work/ref/latest")"

echo "== 1. complete tag newer than latest"
mkdir "$work/a" && cp -r "$work/ref/global_step2" "$work/ref/global_step4" "$work/a/" && echo global_step2 > "$work/a/latest"
train "$work/a" 6 --resume > "$work/a.log" 2>&1 || fail "resume: $(tail -2 "$work/a.log")"
grep -q "global_step4: complete and verified, newer than latest (global_step2)" "$work/a.log" ||
  fail "no adoption report: $(head -3 "$work/a.log")"
grep -q "resumed from .* at step 4" "$work/a.log" || fail "did not resume at step 4: $(grep resumed "$work/a.log")"
same "$work/ref/global_step6" "$work/a/global_step6" "adopted run's step 6"
echo "   adopted global_step4, resumed at step 4, step 6 equals the uninterrupted run"

echo "== 2. damaged tag newer than latest"
mkdir "$work/b" && cp -r "$work/ref/global_step2" "$work/ref/global_step4" "$work/b/" && echo global_step2 > "$work/b/latest"
f=$work/b/global_step4/state.h5
size=$(stat -c %s "$f")
truncate -s $((size / 2)) "$f"
train "$work/b" 6 --resume > "$work/b.log" 2>&1 || fail "resume: $(tail -2 "$work/b.log")"
grep -q "global_step4: damaged (.*); set aside as .*/global_step4.damaged" "$work/b.log" ||
  fail "no set-aside report: $(head -3 "$work/b.log")"
grep -q "resumed from .* at step 2" "$work/b.log" || fail "did not resume at step 2"
[ "$(stat -c %s "$work/b/global_step4.damaged/state.h5")" = $((size / 2)) ] || fail "the damaged file was not kept"
same "$work/ref/global_step6" "$work/b/global_step6" "step 6 after setting aside"
same "$work/ref/global_step4" "$work/b/global_step4" "the step 4 saved again"
echo "   set aside as global_step4.damaged (kept), resumed at step 2, steps 4 and 6 equal the uninterrupted run"

echo "== 3. leftovers of a killed prune"
mkdir "$work/c" && cp -r "$work/ref/global_step2" "$work/c/" && echo global_step2 > "$work/c/latest"
mkdir "$work/c/global_step1" "$work/c/.global_step0.pruning"
cp "$work/ref/global_step2/state.h5" "$work/c/.global_step0.pruning/"
train "$work/c" 6 --resume --set checkpoint.keep_last=2 > "$work/c.log" 2>&1 || fail "resume: $(tail -2 "$work/c.log")"
left=$(cd "$work/c" && ls -A | tr '\n' ' ')
[ "$left" = "global_step4 global_step6 latest " ] || fail "save_dir holds: $left"
echo "   save_dir holds: $left"

echo "== 4. checkpoint.tag names the saves"
train "$work/d" 6 --set checkpoint.tag='"run_{step}"' > "$work/d.log" 2>&1 || fail "tagged run: $(tail -2 "$work/d.log")"
[ -f "$work/d/run_2/state.h5" ] && [ -f "$work/d/run_4/state.h5" ] || fail "no run_2 / run_4: $(ls "$work/d")"
[ "$(cat "$work/d/latest")" = run_6 ] || fail "latest is $(cat "$work/d/latest")"
same "$work/ref/global_step6" "$work/d/run_6" "tagged run"
echo "   saves named run_2, run_4, run_6"
echo "PASS"
