#!/usr/bin/env bash
# The command-line conventions of every dsc program (docs/cli.md):
#  1. every program in BIN_DIR (apps/ and launcher/) answers --help on stdout
#     with status 0 and nothing on stderr, and --version with "NAME (dsc X.Y.Z)";
#  2. a bad option value is refused (status 2) with a message naming the
#     option and the value;
#  3. every program a message in the sources tells the user to run exists.
#   test_cli.sh BIN_DIR SOURCE_DIR
set -u
bin=$1 src=$2
fail=0
out=$(mktemp) err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT
say() { echo "FAIL: $*"; fail=1; }

n=0
for prog in "$bin"/dsc-*; do
  [ -x "$prog" ] || continue
  name=$(basename "$prog")
  n=$((n + 1))
  "$prog" --help >"$out" 2>"$err"
  rc=$?
  [ $rc -eq 0 ] || say "$name --help exits $rc"
  grep -qi "usage" "$out" || say "$name --help prints no usage on stdout"
  [ -s "$err" ] && say "$name --help writes to stderr: $(head -c 200 "$err")"
  "$prog" --version >"$out" 2>"$err"
  rc=$?
  [ $rc -eq 0 ] || say "$name --version exits $rc"
  grep -qE "^$name \(dsc [0-9]+\.[0-9]+\.[0-9]+\)$" "$out" || say "$name --version prints \"$(cat "$out")\""
  echo "$name: --help and --version ok"
done
[ $n -ge 7 ] || say "only $n programs found in $bin"

# command | expected substring of stderr
bad() {
  local want=$1
  shift
  "$@" >"$out" 2>"$err"
  local rc=$?
  if [ $rc -ne 2 ] || ! grep -qF -- "$want" "$err"; then
    say "$(basename "$1") ${*:2}: status $rc, stderr \"$(head -c 300 "$err")\", expected status 2 and \"$want\""
  else
    echo "$(basename "$1") ${*:2}: $(head -n 1 "$err")"
  fi
}
bad '--sample: "many" is not an integer' "$bin/dsc-train" job.json --sample many
bad '--temperature: -2 is outside' "$bin/dsc-train" job.json --temperature -2
bad '--estimate-memory: 0 is outside' "$bin/dsc-train" job.json --estimate-memory 0
bad 'option --metrics needs a value' "$bin/dsc-train" job.json --metrics
bad 'unknown option --bogus' "$bin/dsc-train" job.json --bogus
bad '--max-new-tokens: 0 is outside' "$bin/dsc-generate" model --prompt hi --max-new-tokens 0
bad '--top-p: "high" is not a number' "$bin/dsc-generate" model --prompt hi --top-p high
bad '--stop: "1,x" is not a list' "$bin/dsc-generate" model --prompt hi --stop 1,x
bad '--seed: "-1x" is not an integer' "$bin/dsc-generate" model --prompt hi --seed -1x
bad 'no prompt' "$bin/dsc-generate" model
bad '-n needs a positive number of ranks, got "zero"' "$bin/dsc-launch" -n zero true
bad 'M must be an integer, got "four"' "$bin/dsc-schedule" train four 2 0
bad '--k: "two" is not an integer' "$bin/dsc-moe-gate" --k two --capacity-factor 1 --min-capacity 1 x.json
bad '--capacity-factor: -1 is outside' "$bin/dsc-moe-gate" --k 2 --capacity-factor -1 --min-capacity 1 x.json
bad '--format onnx: the formats are hf' "$bin/dsc-ckpt" export ckpt --format onnx out
bad '--pp expects a positive integer, got "x"' "$bin/dsc-selfcheck" --pp x
bad 'bad value for --port: 99999' "$bin/dsc-serve" model --port 99999

# 3. programs named in messages: "... dsc-NAME ..." inside C string literals.
named=$(cd "$src" && grep -rhoE '"([^"\\]|\\.)*"' --include=*.c apps launcher core runtime kernels pipe moe zero inference \
          2>/dev/null | grep -oE '\bdsc-[a-z][a-z-]*[a-z]\b' | sort -u)
for p in $named; do
  if [ -x "$bin/$p" ]; then echo "message names $p: exists"; else say "a message names $p, which is not a program in $bin"; fi
done
exit $fail
