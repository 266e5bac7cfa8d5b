#!/usr/bin/env bash
# Installs the peers of bench/peers/ by package name from PyPI into a virtual
# environment OUTSIDE the repository (default /work/.peers/venv; PEERS_DIR to
# change): llama-cpp-python (pip builds its wheel; nothing of it is checked
# out, vendored or built by a script of ours) or with --prebuilt xllamacpp,
# gguf, numpy, safetensors, and with --transformers also torch and
# transformers. Usage: setup.sh [--prebuilt] [--transformers]. Never part of the tests.
set -euo pipefail
dir=${PEERS_DIR:-/work/.peers}
python=${PYTHON:-python3}
[ -x "$dir/venv/bin/python" ] || "$python" -m venv --system-site-packages "$dir/venv"
pkgs=(gguf numpy safetensors)
# llama-cpp-python is an sdist (pip compiles llama.cpp: long on 2 cores); --prebuilt takes
# xllamacpp, a binary wheel of the same engine, instead.
if [ "${1:-}" = "--prebuilt" ]; then pkgs+=(xllamacpp); shift; else pkgs+=(llama-cpp-python); fi
[ "${1:-}" = "--transformers" ] && pkgs+=(torch transformers)
"$dir/venv/bin/pip" install "${pkgs[@]}"
echo "peers installed in $dir/venv"
