#!/usr/bin/env bash
# The README's test command: installs the dependencies, builds everything with
# gpu=auto (GPU code is compiled when nvcc is found; GPU tests skip themselves
# with exit code 77 on a machine without a GPU), runs every meson test suite,
# then the install/consumer checks (tests/consumers/run.sh).
#
# Ends with one line "N passed, M failed" (", K skipped" when any were skipped),
# counting meson's tests and the consumer checks; exits non-zero on any failure.
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

# --- summary --------------------------------------------------------------------------
read -r passed failed skipped < <(python3 - "$testlog" "$consumer_out" <<'PY'
import json, os, re, sys
testlog, consumers = sys.argv[1], sys.argv[2]
passed = failed = skipped = 0
bad = []
logs = []  # (name, output) of each failed meson test
if os.path.exists(testlog):
    with open(testlog) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            t = json.loads(line)
            r = t.get("result", "")
            if r in ("OK", "EXPECTEDFAIL"):
                passed += 1
            elif r == "SKIP":
                skipped += 1
            else:  # FAIL, TIMEOUT, UNEXPECTEDPASS, ERROR, INTERRUPT, ...
                failed += 1
                bad.append(f"{t.get('name', '?')} ({r})")
                logs.append((t.get("name", "?"), (t.get("stdout") or "") + (t.get("stderr") or "")))
with open(consumers) as f:
    for line in f:
        m = re.match(r"^consumer (\S+): (PASS|FAIL)$", line.strip())
        if m:
            if m.group(2) == "PASS":
                passed += 1
            else:
                failed += 1
                bad.append(f"consumer {m.group(1)}")
# CI keeps only the tail of this script's output: the lines around each
# failed assertion come last, next to the summary, so a rare failure can be
# read from the CI record.
for name, out in logs[:3]:
    lines = out.splitlines()
    keep = set()
    for i, line in enumerate(lines):
        if "FAILED" in line or "unexpected exception" in line or "error" in line.lower():
            keep.update(range(max(0, i - 2), min(len(lines), i + 8)))
    shown = [lines[i] for i in sorted(keep)][:60] or lines[-30:]
    print(f"--- {name}: the lines around its failures ---", file=sys.stderr)
    for line in shown:
        print("  " + line[:300], file=sys.stderr)
for b in bad:
    print(f"FAILED: {b}", file=sys.stderr)
print(passed, failed, skipped)
PY
) || { echo "could not compute the test summary" >&2; exit 1; }
for f in "${failures[@]+"${failures[@]}"}"; do
  echo "FAILED: $f" >&2
  failed=$((failed + 1))
done

echo
summary="$passed passed, $failed failed"
[ "$skipped" -gt 0 ] && summary+=", $skipped skipped"
echo "$summary"
[ "$failed" -eq 0 ]
