#!/usr/bin/env bash
# Every public header compiles on its own, as host C++20 (and, when nvcc is
# given, as CUDA). Usage: headers.sh SRCDIR CXX [NVCC]
# Headers are checked in parallel, one job per core (HEADERS_JOBS overrides):
# under nvcc each takes 7-10 s on CI's 2 cores.
set -euo pipefail
src=$1 cxx=$2 nvcc=${3:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# check REL: compiles include/gin/REL included twice (include guards) in a
# directory of its own; prints what failed, exits non-zero on a failure.
check() {
  local rel=$1 d
  d=$(mktemp -d "$tmp/h.XXXXXX")
  printf '#include "%s"\n#include "%s"\n' "$rel" "$rel" >"$d/t.cpp"
  local fail=0
  if ! "$cxx" -std=c++20 -Wall -Wextra -Werror -fsyntax-only -I"$src/include" "$d/t.cpp" 2>"$d/err"; then
    echo "FAIL (c++): $rel"; cat "$d/err"; fail=1
  fi
  if [ -n "$nvcc" ]; then
    cp "$d/t.cpp" "$d/t.cu"
    if ! "$nvcc" -std=c++20 -arch=sm_90 -I"$src/include" -c "$d/t.cu" -o "$d/t.o" 2>"$d/err"; then
      echo "FAIL (nvcc): $rel"; cat "$d/err"; fail=1
    fi
  fi
  rm -rf "$d"
  return $fail
}
export -f check
export src cxx nvcc tmp

(cd "$src/include" && find gin -name '*.hpp' | sort) >"$tmp/list"
n=$(wc -l <"$tmp/list")
jobs=${HEADERS_JOBS:-$(nproc 2>/dev/null || echo 2)}
fail=0
xargs -P "$jobs" -I{} bash -c 'check "$1"' _ {} <"$tmp/list" || fail=1
echo "$n headers checked standalone${nvcc:+ (c++ and nvcc)}, $jobs at a time"
exit $fail
