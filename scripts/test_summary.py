#!/usr/bin/env python3
"""Counts what scripts/test.sh and scripts/sanitize.sh ran.

    test_summary.py [--consumers FILE] [LABEL=]TESTLOG ...

Each TESTLOG is a meson testlog.json (a missing one counts nothing: the
caller reports the step that did not write it); LABEL, when given, prefixes
the names of its failed tests ("tsan/proxy"). FILE holds tests/consumers/run.sh's
output ("consumer NAME: PASS|FAIL" lines). Prints "PASSED FAILED SKIPPED" on
stdout; the failed tests' names, and the lines around their failures, on stderr.
"""
import json
import os
import re
import sys

args = sys.argv[1:]
consumers = None
if len(args) >= 2 and args[0] == "--consumers":
    consumers, args = args[1], args[2:]

passed = failed = skipped = 0
bad = []
logs = []  # (name, output) of each failed meson test
for arg in args:
    label, _, path = arg.rpartition("=")
    prefix = label + "/" if label else ""
    if not os.path.exists(path):
        continue
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            t = json.loads(line)
            r = t.get("result", "")
            name = prefix + t.get("name", "?")
            if r in ("OK", "EXPECTEDFAIL"):
                passed += 1
            elif r == "SKIP":
                skipped += 1
            else:  # FAIL, TIMEOUT, UNEXPECTEDPASS, ERROR, INTERRUPT, ...
                failed += 1
                bad.append(f"{name} ({r})")
                logs.append((name, (t.get("stdout") or "") + (t.get("stderr") or "")))
if consumers:
    with open(consumers) as f:
        for line in f:
            m = re.match(r"^consumer (\S+): (PASS|FAIL)$", line.strip())
            if m:
                if m.group(2) == "PASS":
                    passed += 1
                else:
                    failed += 1
                    bad.append(f"consumer {m.group(1)}")
# CI keeps only the tail of the output: the lines around each failed
# assertion or sanitizer report come last, next to the summary, so a rare
# failure can be read from the CI record.
for name, out in logs[:3]:
    lines = out.splitlines()
    keep = set()
    for i, line in enumerate(lines):
        if ("FAILED" in line or "unexpected exception" in line or "error" in line.lower()
                or "Sanitizer" in line):
            keep.update(range(max(0, i - 2), min(len(lines), i + 8)))
    shown = [lines[i] for i in sorted(keep)][:60] or lines[-30:]
    print(f"--- {name}: the lines around its failures ---", file=sys.stderr)
    for line in shown:
        print("  " + line[:300], file=sys.stderr)
for b in bad:
    print(f"FAILED: {b}", file=sys.stderr)
print(passed, failed, skipped)
