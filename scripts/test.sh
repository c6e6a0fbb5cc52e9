#!/usr/bin/env bash
# The README's test command: installs the dependencies, builds everything with
# gpu=auto (GPU code is compiled when nvcc is found; GPU tests skip themselves
# with exit code 77 on a machine without a GPU), runs every meson test suite,
# then the install/consumer checks (tests/consumers/run.sh), then the CPU-rank
# suites under ThreadSanitizer and ASan+UBSan (scripts/sanitize.sh; SANITIZE=0
# skips them, SANITIZE=full runs every host test under both).
#
# Ends with one line "N passed, M failed" (", K skipped" when any were skipped),
# counting meson's tests (the sanitizer runs' too) and the consumer checks;
# exits non-zero on any failure.
# BUILD_DIR overrides the build directory (default: build).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build="${BUILD_DIR:-build}"

# nvcc lives in /usr/local/cuda/bin, which is often not on PATH (e.g. in CI).
if [ -d /usr/local/cuda/bin ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

bash scripts/install-deps.sh

failures=()   # steps that failed outside meson's test log

# --- configure and build --------------------------------------------------------
if [ -f "$build/meson-private/coredata.dat" ]; then
  setup=(meson setup --reconfigure "$build" -Dgpu=auto -Dtests=true)
else
  setup=(meson setup "$build" -Dgpu=auto -Dtests=true)
fi
built=0
if "${setup[@]}"; then
  if ninja -C "$build"; then
    built=1
  else
    failures+=("build (ninja -C $build)")
  fi
else
  failures+=("configure (meson setup $build)")
fi

# --- meson tests ------------------------------------------------------------------
testlog="$build/meson-logs/testlog.json"
rm -f "$testlog"
if [ "$built" = 1 ]; then
  if ! meson test -C "$build" --print-errorlogs --num-processes 1; then
    # Failing tests are counted from the test log below; this catches a run
    # that failed without writing one.
    [ -s "$testlog" ] || failures+=("meson test (no $testlog)")
  fi
fi

# --- installed-package consumers ------------------------------------------------------
consumer_out="$(mktemp)"
trap 'rm -f "$consumer_out"' EXIT
if ! bash tests/consumers/run.sh 2>&1 | tee "$consumer_out"; then
  grep -q '^consumer .*: FAIL$' "$consumer_out" || failures+=("tests/consumers/run.sh")
fi

# --- the same CPU-rank suites under sanitizers ----------------------------------------------
# ThreadSanitizer and ASan+UBSan builds of their own (scripts/sanitize.sh, which
# says which tests the ci selection leaves out). SANITIZE=0 skips them,
# SANITIZE=full runs every host test under both.
san_logs=()
san_failures="$(mktemp)"
trap 'rm -f "$consumer_out" "$san_failures"' EXIT
case "${SANITIZE:-ci}" in
  0) ;;
  *)
    san_mode=ci
    [ "${SANITIZE:-ci}" = full ] && san_mode=full
    GIN_SANITIZE_FAILURES="$san_failures" BUILD_DIR="$build" bash scripts/sanitize.sh "$san_mode" ||
      failures+=("scripts/sanitize.sh $san_mode")
    while read -r f; do failures+=("sanitizers: $f"); done <"$san_failures"
    for s in ${SANITIZERS:-tsan asan}; do san_logs+=("$s=$build-$s/meson-logs/testlog.json"); done
    ;;
esac

# --- summary --------------------------------------------------------------------------
read -r passed failed skipped < <(python3 scripts/test_summary.py --consumers "$consumer_out" "$testlog" \
  "${san_logs[@]+"${san_logs[@]}"}") || { echo "could not compute the test summary" >&2; exit 1; }
for f in "${failures[@]+"${failures[@]}"}"; do
  echo "FAILED: $f" >&2
  failed=$((failed + 1))
done

echo
summary="$passed passed, $failed failed"
[ "$skipped" -gt 0 ] && summary+=", $skipped skipped"
echo "$summary"
[ "$failed" -eq 0 ]
