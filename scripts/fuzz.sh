#!/usr/bin/env bash
# Builds the libFuzzer harnesses (fuzz/, clang, in build-fuzz/ or $DSC_FUZZ_BUILD_DIR)
# and runs each for SECONDS seconds (default 20), one after the other, on a corpus
# seeded from the test fixtures (kept and grown in build-fuzz/corpus/). Any crash,
# sanitizer report, leak, input slower than 10 s or over 2 GiB fails the script;
# the input is saved as build-fuzz/artifacts/<harness>-crash-* (rerun one with
# build-fuzz/fuzz_<harness> FILE). Prints each harness's executions and coverage.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-20}
build=${DSC_FUZZ_BUILD_DIR:-$root/build-fuzz}
"$root/scripts/deps.sh"
cmake -S "$root/fuzz" -B "$build" -DCMAKE_C_COMPILER=clang >"$build.cmake.log" 2>&1 ||
  { cat "$build.cmake.log"; exit 1; }
cmake --build "$build" -j"$(nproc)"

# ---- seed corpora: the fixtures the unit tests read, and a few made here ----
fixtures=$root/tests/inference/fixtures
seed() { mkdir -p "$build/corpus/$1"; cp -n "${@:2}" "$build/corpus/$1/" 2>/dev/null || true; }
seed safetensors "$fixtures"/hf/*/ref.safetensors
printf '\x55\0\0\0\0\0\0\0{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"format":"pt"}}\0\0\x80\x3f\0\0\0\x40' \
  >"$build/corpus/safetensors/tiny.safetensors"
printf '{"metadata":{},"weight_map":{"model.embed_tokens.weight":"model-00001-of-00002.safetensors","model.norm.weight":"model-00002-of-00002.safetensors"}}' \
  >"$build/corpus/safetensors/index.json"
seed tokenizer "$fixtures"/*_bpe.json
for d in "$fixtures"/hf/*/; do seed hf_config "$d/config.json" && mv -f "$build/corpus/hf_config/config.json" "$build/corpus/hf_config/$(basename "$d").json"; done
seed config "$root"/configs/*.json "$root"/tests/checkpoint/resume.json
{ cat "$root/configs/main.json"; printf '\0model.seq_len=1024\0train_micro_batch_size_per_gpu=4\0moe.k=1'; } \
  >"$build/corpus/config/main_with_sets.json"
mkdir -p "$build/corpus/token_file"
printf 'DTOK\1\0\0\0\2\0\0\0\0\1\0\0\x0a\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\1\0\2\0\3\0\4\0\5\0\6\0\7\0\x08\0\x09\0\x0a\0' \
  >"$build/corpus/token_file/u16.tok"
printf 'DTOK\1\0\0\0\4\0\0\0\0\0\0\0\3\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\1\0\0\0\xff\xff\0\0\0\0\1\0' \
  >"$build/corpus/token_file/u32.tok"

# ---- run -----------------------------------------------------------------------
mkdir -p "$build/artifacts"
for h in safetensors tokenizer hf_config config token_file; do
  echo "== fuzz_$h: ${seconds} s"
  log=$build/fuzz_$h.log
  if ! "$build/fuzz_$h" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="$build/artifacts/$h-" "$build/corpus/$h" >"$log" 2>&1; then
    tail -n 60 "$log"
    echo "fuzz_$h FAILED: see $log and $build/artifacts/" >&2
    exit 1
  fi
  grep -E "^#[0-9]+.*(DONE|pulse)" "$log" | tail -n 1
  grep -E "stat::number_of_executed_units" "$log"
done
