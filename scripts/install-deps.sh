#!/usr/bin/env bash
# Installs what building and testing gin needs on Debian 12 (bookworm):
# Meson >= 1.1 and Catch2 v3 come from bookworm-backports; rdma-core (libibverbs,
# mlx5dv) is optional for the build but installed so the verbs/ibgda code compiles.
# The CUDA toolkit (nvcc, libcu++) is expected under /usr/local/cuda; without it
# the host library, tests and CPU-rank examples still build.
set -euo pipefail
need() { ! command -v "$1" >/dev/null 2>&1; }
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
if need meson || ! pkg-config --exists catch2-with-main 2>/dev/null || ! pkg-config --exists libibverbs 2>/dev/null; then
  if ! grep -rqs bookworm-backports /etc/apt/sources.list /etc/apt/sources.list.d/; then
    echo "deb http://deb.debian.org/debian bookworm-backports main" | $sudo tee /etc/apt/sources.list.d/gin-backports.list >/dev/null
  fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    -t bookworm-backports meson catch2 >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    ninja-build pkg-config cmake g++ libibverbs-dev rdma-core iproute2 >/dev/null
fi
meson --version >/dev/null
