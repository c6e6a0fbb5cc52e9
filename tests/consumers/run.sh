#!/usr/bin/env bash
# Installs gin into a temporary prefix and builds/runs two tiny projects against
# the INSTALLED copy: tests/consumers/cmake (find_package(gin) + gin::gin) and
# tests/consumers/meson (dependency('gin') through pkg-config).
#
# Prints one line per check, "consumer <name>: PASS" or "consumer <name>: FAIL"
# (scripts/test.sh counts these), and exits non-zero if any check failed.
# Set GIN_CONSUMERS_KEEP=1 to keep the temporary directory.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/gin-consumers.XXXXXX")"
if [ "${GIN_CONSUMERS_KEEP:-0}" = 1 ]; then
  echo "consumers: keeping $tmp"
else
  trap 'rm -rf "$tmp"' EXIT
fi
prefix="$tmp/prefix"
log="$tmp/logs"
mkdir -p "$log"

failed=0
results=()
pass() { results+=("consumer $1: PASS"); echo "consumer $1: PASS"; }
fail() {
  results+=("consumer $1: FAIL"); failed=$((failed + 1))
  echo "consumer $1: FAIL" >&2
  if [ -n "${2:-}" ] && [ -f "$2" ]; then
    echo "----- $2 (last 60 lines) -----" >&2
    tail -n 60 "$2" >&2
    echo "-----" >&2
  fi
}
# step <log> <cmd...>: runs a command with its output to <log>.
step() { local l="$1"; shift; echo "+ $*" >>"$l"; "$@" >>"$l" 2>&1; }

# --- 1. install ---------------------------------------------------------------
installed=0
if step "$log/install.log" meson setup "$tmp/build" "$root" --prefix "$prefix" \
       -Dtests=false -Dgpu=disabled &&
   step "$log/install.log" meson install -C "$tmp/build" --quiet; then
  installed=1
  pass install
else
  fail install "$log/install.log"
fi

export CMAKE_PREFIX_PATH="$prefix${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
export PKG_CONFIG_PATH="$prefix/share/pkgconfig:$prefix/lib/pkgconfig:$prefix/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"

# --- 2. installed layout: headers, gin.pc include path, cmake config ---------
check_layout() {
  local l="$log/layout.log" f inc
  for f in include/gin/gin.hpp include/gin/device.hpp include/gin/core/rolling.hpp \
           share/pkgconfig/gin.pc share/cmake/gin/ginConfig.cmake share/cmake/gin/ginConfigVersion.cmake; do
    if [ ! -f "$prefix/$f" ]; then echo "missing: $prefix/$f" >>"$l"; return 1; fi
  done
  step "$l" pkg-config --print-errors --exists 'gin >= 0.1' || return 1
  step "$l" pkg-config --cflags --libs gin || return 1
  # Every -I of gin.pc must exist, and one of them must hold gin/gin.hpp.
  local ok=0
  for f in $(pkg-config --cflags-only-I gin); do
    inc="${f#-I}"
    if [ ! -d "$inc" ]; then echo "gin.pc: include dir $inc does not exist" >>"$l"; return 1; fi
    [ -f "$inc/gin/gin.hpp" ] && ok=1
  done
  if [ "$ok" != 1 ]; then
    # pkg-config drops -I/usr/include; only acceptable when that is the prefix.
    [ -f /usr/include/gin/gin.hpp ] && [ "$prefix" = /usr ] && ok=1
  fi
  [ "$ok" = 1 ] || { echo "gin.pc: no -I holds gin/gin.hpp" >>"$l"; return 1; }
  return 0
}
if [ "$installed" = 1 ] && check_layout; then pass layout; else fail layout "$log/layout.log"; fi

# --- 3. CMake consumer ---------------------------------------------------------
run_cmake() {
  local l="$log/cmake.log" b="$tmp/cmake-build"
  step "$l" cmake -S "$here/cmake" -B "$b" -DCMAKE_BUILD_TYPE=Release || return 1
  # ginConfig.cmake must have found the prefix (share/cmake/gin -> three levels
  # up) and so resolved gin::gin's include dir to <prefix>/include.
  local got want
  got="$(sed -n 's/^-- gin_INCLUDE=//p' "$l" | tail -n 1)"
  want="$(cd -P "$prefix/include" && pwd)"
  if [ "$(cd -P "$got" 2>/dev/null && pwd)" != "$want" ]; then
    echo "gin::gin include dir is '$got', expected '$want'" >>"$l"; return 1
  fi
  step "$l" cmake --build "$b" || return 1
  step "$l" "$b/app" || return 1
  grep -q "gin consumer (cmake): gin .* OK" "$l" || return 1
}
if [ "$installed" = 1 ] && run_cmake; then pass cmake; else fail cmake "$log/cmake.log"; fi

# --- 4. Meson consumer (pkg-config) -------------------------------------------
run_meson() {
  local l="$log/meson.log" b="$tmp/meson-build"
  step "$l" meson setup "$b" "$here/meson" || return 1
  step "$l" ninja -C "$b" || return 1
  step "$l" "$b/app" || return 1
  grep -q "gin consumer (meson): gin .* OK" "$l" || return 1
}
if [ "$installed" = 1 ] && run_meson; then pass meson; else fail meson "$log/meson.log"; fi

echo "consumers: $(( ${#results[@]} - failed )) passed, $failed failed"
[ "$failed" = 0 ]
