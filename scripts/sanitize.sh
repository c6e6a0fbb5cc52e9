#!/usr/bin/env bash
# The CPU-rank test suites (meson suite "host": device code on CPU ranks, the
# proxy engine, the tcp and verbs wires, the soft NIC, p2p, allreduce, moe)
# under ThreadSanitizer and under AddressSanitizer + UndefinedBehaviorSanitizer
# (meson's b_sanitize), each in a CPU-only build of its own:
#
#   bash scripts/sanitize.sh [ci|full]
#
#   ci (default; scripts/test.sh runs it): every host test except those
#       listed in TSAN_CI_SKIP / ASAN_CI_SKIP below, to fit CI's time.
#   full: every host test, with every env variant, under both.
#
# SANITIZERS="tsan asan" (the default) picks the builds. BUILD_DIR (default
# build) names their directories: $BUILD_DIR-tsan, $BUILD_DIR-asan. Each leaves
# its meson test log in DIR/meson-logs/testlog.json (scripts/test.sh counts
# them). A sanitizer report fails its test (halt_on_error); no report is
# suppressed. Ends with "N passed, M failed"; exits non-zero on any failure.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
mode="${1:-ci}"
case "$mode" in ci | full) ;; *) echo "usage: $0 [ci|full]" >&2; exit 2 ;; esac
build="${BUILD_DIR:-build}"
read -r -a sanitizers <<<"${SANITIZERS:-tsan asan}"

# Left out of the ci run (minutes each under the sanitizer on 2 cores, or no
# threads to race): `bash scripts/sanitize.sh full` runs them.
#  allreduce_proxy: ~7 min under TSan, ~6 min under ASan at -O0 (the ring through
#    the proxy's descriptor round trips); allreduce (lsa) and the proxy suites stay.
#  proxy_tcp_threads: ~4 min under TSan; proxy_tcp and proxy_threads stay.
#  mlx5_prm, verbs_wire, ibgda_mlx5: single-threaded format and error-path checks.
TSAN_CI_SKIP="allreduce_proxy proxy_tcp_threads mlx5_prm verbs_wire ibgda_mlx5"
ASAN_CI_SKIP="allreduce_proxy"

export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
export ASAN_OPTIONS="${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1:print_summary=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1:print_summary=1}"

failures=()
logs=()
times=()
for san in "${sanitizers[@]}"; do
  dir="$build-$san"
  case "$san" in
    # The project's default optimization: what users compile.
    tsan) opts=(-Db_sanitize=thread -Dbuildtype=debugoptimized); skip="$TSAN_CI_SKIP" ;;
    # -O0: GCC's UBSan at -O2 takes 5x a plain compile (tests/device/proxy.cpp:
    # 131 s against 25 s); at -O0 about the same as a plain -O2 one.
    asan) opts=(-Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debug); skip="$ASAN_CI_SKIP" ;;
    *) echo "unknown sanitizer '$san' (tsan, asan)" >&2; exit 2 ;;
  esac
  [ "$mode" = full ] && skip=""
  logs+=("$san=$dir/meson-logs/testlog.json")
  rm -f "$dir/meson-logs/testlog.json"
  start=$SECONDS
  setup=(meson setup "$dir" -Dgpu=disabled -Dtests=true "${opts[@]}")
  [ -f "$dir/meson-private/coredata.dat" ] && setup=(meson setup --reconfigure "$dir" -Dgpu=disabled -Dtests=true "${opts[@]}")
  if ! "${setup[@]}"; then
    failures+=("$san: configure (meson setup $dir)")
    continue
  fi
  # The host suite's tests that run an executable of this build (not
  # headers_standalone), less the skipped ones: their names, and the targets
  # to build (only those, not the examples and benchmarks).
  mapfile -t sel < <(meson introspect --tests "$dir" | python3 -c '
import json, os, sys
d, skip = os.path.realpath(sys.argv[1]), set(sys.argv[2].split())
names, targets = [], set()
for t in json.load(sys.stdin):
    exe = os.path.realpath(t["cmd"][0])
    if "host" in [s.split(":")[-1] for s in t["suite"]] and exe.startswith(d + "/") and t["name"] not in skip:
        names.append(t["name"])
        targets.add(os.path.relpath(exe, d))
print(" ".join(sorted(targets)))
print(" ".join(names))' "$dir" "$skip")
  read -r -a targets <<<"${sel[0]:-}"
  read -r -a names <<<"${sel[1]:-}"
  if [ "${#names[@]}" = 0 ]; then
    failures+=("$san: no host tests in $dir")
    continue
  fi
  if ! ninja -C "$dir" "${targets[@]}"; then
    failures+=("$san: build (ninja -C $dir)")
    continue
  fi
  built=$((SECONDS - start))
  # Timeouts x3 under full (allreduce_proxy takes ~7 of its 10 minutes under TSan).
  mult=1
  [ "$mode" = full ] && mult=3
  if ! meson test -C "$dir" --no-rebuild --print-errorlogs --num-processes 1 --timeout-multiplier "$mult" "${names[@]}"; then
    [ -s "$dir/meson-logs/testlog.json" ] || failures+=("$san: meson test (no $dir/meson-logs/testlog.json)")
  fi
  times+=("$san: build ${built} s, ${#names[@]} tests $((SECONDS - start - built)) s")
done

for t in "${times[@]+"${times[@]}"}"; do echo "sanitizers ($mode) $t"; done
# Run by scripts/test.sh: it counts the test logs and our failures itself.
if [ -n "${GIN_SANITIZE_FAILURES:-}" ]; then
  for f in "${failures[@]+"${failures[@]}"}"; do echo "$f" >>"$GIN_SANITIZE_FAILURES"; done
  exit 0
fi
read -r passed failed skipped < <(python3 scripts/test_summary.py "${logs[@]}") ||
  { echo "could not compute the test summary" >&2; exit 1; }
for f in "${failures[@]+"${failures[@]}"}"; do
  echo "FAILED: $f" >&2
  failed=$((failed + 1))
done
echo
summary="$passed passed, $failed failed"
[ "$skipped" -gt 0 ] && summary+=", $skipped skipped"
echo "$summary"
[ "$failed" -eq 0 ]
