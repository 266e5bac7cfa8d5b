#!/usr/bin/env bash
# Installs the Debian packages dsc needs when they are missing. As root it runs
# apt-get; as another user it prints the exact apt-get line and fails.
set -euo pipefail
packages=(cmake build-essential pkg-config libopenmpi-dev openmpi-bin libhdf5-openmpi-dev hdf5-tools
          libcmocka-dev libopenblas-dev libcjson-dev libmicrohttpd-dev curl iproute2 clang clang-format libclang-rt-14-dev
          python3-venv)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
line="apt-get install -y ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  echo "dsc needs these Debian packages; as root run:" >&2
  echo "  apt-get update && $line" >&2
  exit 1
fi
echo "== installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q "${missing[@]}"
