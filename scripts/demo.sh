#!/usr/bin/env bash
# README command 1: install what gin needs, build it, and run the main demo
# (examples/ring_exchange) on the GPUs when there are some, else on CPU ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
if [ -f build/build.ninja ]; then meson setup --reconfigure build >/dev/null; else meson setup build >/dev/null; fi
ninja -C build examples/ring_exchange
./build/examples/ring_exchange "$@"
