#!/usr/bin/env bash
# Installs the peers of bench/peers/ by package name from PyPI into a virtual
# environment OUTSIDE the repository (default /work/.peers/venv; PEERS_DIR to
# change): llama-cpp-python (pip builds its wheel; nothing of it is checked
# out, vendored or built by a script of ours), gguf, numpy, safetensors, and
# with --transformers also torch and transformers. Never part of the tests.
set -euo pipefail
dir=${PEERS_DIR:-/work/.peers}
python=${PYTHON:-python3}
[ -x "$dir/venv/bin/python" ] || "$python" -m venv --system-site-packages "$dir/venv"
pkgs=(llama-cpp-python gguf numpy safetensors)
[ "${1:-}" = "--transformers" ] && pkgs+=(torch transformers)
"$dir/venv/bin/pip" install "${pkgs[@]}"
echo "peers installed in $dir/venv"
