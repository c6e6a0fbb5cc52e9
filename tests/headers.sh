#!/usr/bin/env bash
# Every public header compiles on its own, as host C++20 (and, when nvcc is
# given, as CUDA). Usage: headers.sh SRCDIR CXX [NVCC]
set -euo pipefail
src=$1 cxx=$2 nvcc=${3:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
n=0
while IFS= read -r h; do
  rel=${h#"$src/include/"}
  printf '#include "%s"\n#include "%s"\n' "$rel" "$rel" >"$tmp/t.cpp"
  n=$((n + 1))
  if ! "$cxx" -std=c++20 -Wall -Wextra -Werror -fsyntax-only -I"$src/include" "$tmp/t.cpp" 2>"$tmp/err"; then
    echo "FAIL (c++): $rel"; cat "$tmp/err"; fail=1
  fi
  if [ -n "$nvcc" ]; then
    cp "$tmp/t.cpp" "$tmp/t.cu"
    if ! "$nvcc" -std=c++20 -arch=sm_90 -I"$src/include" -c "$tmp/t.cu" -o "$tmp/t.o" 2>"$tmp/err"; then
      echo "FAIL (nvcc): $rel"; cat "$tmp/err"; fail=1
    fi
  fi
done < <(find "$src/include/gin" -name '*.hpp' | sort)
echo "$n headers checked standalone${nvcc:+ (c++ and nvcc)}"
exit $fail
