#!/usr/bin/env bash
# bench/run_all.sh — run the gin-bench ops with --json, then bench/plot.py on
# the reports (see docs/performance.md).
#
#   bench/run_all.sh [-b BIN] [-o RESULTS] [-p PNGDIR] [-x PREFIX] [OP...] [-- GIN-BENCH ARGS...]
#
#   -b BIN      gin-bench to run (default build/bench/gin-bench)
#   -o RESULTS  directory for the JSON reports and the text output (default bench-results/DATE)
#   -p PNGDIR   directory for the PNG files (default RESULTS; `-p docs` for the committed figures,
#               from GPU runs only)
#   -x PREFIX   PNG file name prefix (e.g. h100-; default none)
#   OP...       ops to run (default: put-bw signal-lat barrier msg-rate allreduce sendrecv moe)
#   -- ARGS     passed to every op (e.g. -- --emulate --ranks 3, or -- --ranks 2)
#
# An op that cannot run on this machine (put-bw and signal-lat need 2 GPUs)
# or fails is reported and skipped; the others still run and are plotted. The
# exit status is 1 if any op failed. PYTHON picks the interpreter for the plot
# (default python3; it needs matplotlib).
set -u -o pipefail  # an op's status survives the tee
cd "$(dirname "$0")/.." || exit 2

bin=build/bench/gin-bench
results="bench-results/$(date +%Y%m%d-%H%M%S)"
pngdir=""
prefix=""
ops=()
while [ $# -gt 0 ]; do
  case "$1" in
    -b) bin="$2"; shift 2 ;;
    -o) results="$2"; shift 2 ;;
    -p) pngdir="$2"; shift 2 ;;
    -x) prefix="$2"; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    --) shift; break ;;
    -*) echo "run_all.sh: unknown option $1" >&2; exit 2 ;;
    *) ops+=("$1"); shift ;;
  esac
done
extra=("$@")
[ ${#ops[@]} -eq 0 ] && ops=(put-bw signal-lat barrier msg-rate allreduce sendrecv moe)
[ -z "$pngdir" ] && pngdir="$results"
[ -x "$bin" ] || { echo "run_all.sh: $bin is not built (ninja -C build bench/gin-bench)" >&2; exit 2; }
mkdir -p "$results"

# What the figures were measured on, next to them.
{
  date -u
  uname -a
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv
  command -v nvidia-smi >/dev/null && nvidia-smi topo -m
  echo "gin-bench args: ${extra[*]:-(none)}"
  git log -1 --oneline 2>/dev/null
} > "$results/machine.txt" 2>&1

failed=()
jsons=()
for op in "${ops[@]}"; do
  echo "== gin-bench $op ${extra[*]:-}"
  if "$bin" "$op" "${extra[@]}" --json "$results/$op.json" 2>&1 | tee "$results/$op.txt" &&
     [ -s "$results/$op.json" ]; then
    jsons+=("$results/$op.json")
    continue
  fi
  echo "run_all.sh: gin-bench $op failed or could not run here (see $results/$op.txt)" >&2
  failed+=("$op")
done

if [ ${#jsons[@]} -gt 0 ]; then
  "${PYTHON:-python3}" bench/plot.py -o "$pngdir" --prefix "$prefix" "${jsons[@]}" || failed+=(plot)
fi
echo "reports: $results; plots: $pngdir"
if [ ${#failed[@]} -gt 0 ]; then
  echo "run_all.sh: not completed: ${failed[*]}" >&2
  exit 1
fi
