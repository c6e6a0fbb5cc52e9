#!/usr/bin/env bash
# Times nvcc on what gin's users compile (issue 13's compile-time goals):
#   (a) bench/compile_time/user_kernel.cu with one transport (Net<kBackendLsa>)
#   (b) the same kernel with every transport (Net<kBackendAll>)
#   (a'), (b') the same two including gin/device.hpp alone (a kernel-only
#       unit; the host set-up compiled in another)
#   (c) with --tus BUILD: every .cu translation unit of a configured meson
#       build (tests, examples, bench), one at a time, with the build's own
#       command line (compile_commands.json), so the times are not inflated by
#       a parallel build. Slow: the largest units take many minutes.
# With --ninja-log BUILD it instead lists the compile steps of BUILD's last
# build from its .ninja_log (wall time of each step; inflated when ninja ran
# several at once, which it says).
#
#   bash bench/compile_time.sh [--reps N] [--tus BUILD] [--ninja-log BUILD]
#
# Each (a)/(b) line: best wall seconds of N runs (default 3), then nvcc's
# per-phase split of the best run (cudafe++ and gcc: the host side; cicc and
# ptxas: the device side). NVCC (default nvcc, then /usr/local/cuda/bin/nvcc)
# and NVCC_FLAGS (default -O2 -arch=sm_90) may be set.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
nvcc="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
read -r -a flags <<<"${NVCC_FLAGS:--O2 -arch=sm_90}"
reps=3 tus="" ninja_log=""
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) reps="$2"; shift 2 ;;
    --tus) tus="$2"; shift 2 ;;
    --ninja-log) ninja_log="$2"; shift 2 ;;
    *) echo "usage: $0 [--reps N] [--tus BUILD] [--ninja-log BUILD]" >&2; exit 2 ;;
  esac
done
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

if [ -n "$ninja_log" ]; then
  python3 - "$ninja_log" <<'EOF'
import sys, os
d = sys.argv[1]
last = {}
for line in open(os.path.join(d, ".ninja_log")):
    if line.startswith("#"): continue
    s, e, _, out, _ = line.rstrip("\n").split("\t")
    last[out] = (int(s), int(e))
steps = sorted(((e - s) / 1000, out) for out, (s, e) in last.items() if out.endswith(".o"))
if not steps: sys.exit("no compile steps in " + d + "/.ninja_log")
# How many steps overlapped on average: total step time over the span.
span = (max(e for s, e in last.values()) - min(s for s, e in last.values())) / 1000
print(f"# {len(steps)} compile steps of {d}; sum {sum(t for t, _ in steps):.0f} s over a {span:.0f} s build "
      f"(about {sum(t for t, _ in steps) / max(span, 1):.1f} at once: each time below is inflated by sharing the cores)")
for t, out in reversed(steps): print(f"{t:8.1f} s  {out}")
EOF
  exit 0
fi

# One nvcc run of FILE with extra args; prints "wall host device" seconds.
time_one() {
  local csv="$tmp/t.csv" t0 t1
  rm -f "$csv"
  t0=$(date +%s.%N)
  "$nvcc" "$@" --time "$csv" -o "$tmp/out.o"
  t1=$(date +%s.%N)
  python3 - "$csv" "$t0" "$t1" <<'EOF'
import csv, sys
host = dev = 0.0
for row in csv.reader(open(sys.argv[1])):
    if len(row) < 8 or row[7].strip() != "ms": continue
    phase, ms = row[1].strip(), float(row[6])
    if phase.startswith("cudafe") or phase == "gcc (compiling)" or phase == "gcc (preprocessing 4)": host += ms
    elif phase.startswith("cicc") or phase.startswith("ptxas") or phase == "gcc (preprocessing 1)": dev += ms
print(f"{float(sys.argv[3]) - float(sys.argv[2]):.2f} {host / 1000:.2f} {dev / 1000:.2f}")
EOF
}

best_of() {  # label, nvcc args...
  local label="$1" best="" line
  shift
  for _ in $(seq "$reps"); do
    line="$(time_one "$@")"
    if [ -z "$best" ] || awk -v a="${line%% *}" -v b="${best%% *}" 'BEGIN { exit !(a < b) }'; then
      best="$line"
    fi
  done
  read -r wall host dev <<<"$best"
  printf '%-44s %6.2f s  (host side %.2f s, device side %.2f s)\n' "$label" "$wall" "$host" "$dev"
}

echo "# $("$nvcc" --version | tail -1); ${flags[*]}; $(nproc) cores; best of $reps"
common=(-std=c++20 --expt-relaxed-constexpr -Xcompiler=-pthread -Iinclude "${flags[@]}" -c bench/compile_time/user_kernel.cu)
best_of "(a) user kernel, one transport (lsa)" "${common[@]}"
best_of "(b) user kernel, every transport" "${common[@]}" -DGIN_CT_BACKENDS=gin::kBackendAll
best_of "(a') (a) including gin/device.hpp only" "${common[@]}" -DGIN_CT_DEVICE_ONLY
best_of "(b') (b) including gin/device.hpp only" "${common[@]}" -DGIN_CT_DEVICE_ONLY -DGIN_CT_BACKENDS=gin::kBackendAll

if [ -n "$tus" ]; then
  [ -f "$tus/compile_commands.json" ] || { echo "no $tus/compile_commands.json (configure it with meson first)" >&2; exit 2; }
  python3 - "$tus" <<'EOF' >"$tmp/cmds"
import json, shlex, sys
for e in json.load(open(sys.argv[1] + "/compile_commands.json")):
    if e["file"].endswith(".cu"):
        print(e["directory"] + "\t" + e["file"] + "\t" + e["command"])
EOF
  while IFS=$'\t' read -r dir file cmd; do
    t0=$(date +%s.%N)
    if (cd "$dir" && eval "$cmd" >/dev/null 2>&1); then
      t1=$(date +%s.%N)
      printf '%8.1f s  %s\n' "$(python3 -c "print($t1 - $t0)")" "$file"
    else
      printf '  FAILED  %s\n' "$file"
    fi
  done <"$tmp/cmds"
fi
