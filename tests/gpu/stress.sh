#!/usr/bin/env bash
# Repeats GPU tests to find rare failures and stalls: each chosen case runs
# RUNS times (default 30) with a per-run limit (LIMIT seconds, default 120);
# a run that passes the limit counts as a stall and is killed. Prints one line
# per case: runs, passes, failures, stalls; exits non-zero on any failure or
# stall. Usage:
#   tests/gpu/stress.sh [BUILD_DIR]          (default: build)
# RUNS, LIMIT, CASES (a regex over the case names) and LOGDIR (where the output
# of failed runs is kept; default: a temp dir) tune it.
set -uo pipefail
build="${1:-build}"
runs="${RUNS:-30}"
limit="${LIMIT:-120}"
pick="${CASES:-.}"
logdir="${LOGDIR:-$(mktemp -d)}"
mkdir -p "$logdir"
g="$build/tests/gpu"
b="$build/bench/gin-bench"

# name | environment | command. Ranks sharing the GPU are threads of one
# process; "conns1" runs set CUDA_DEVICE_MAX_CONNECTIONS=1 (what Megatron-LM
# sets), so every stream of the process shares one hardware queue.
cases=(
  "ibgda-comm|GIN_TIMEOUT_MS=20000|$g/test_gpu_ibgda [comm]"
  "ibgda-comm-conns1|CUDA_DEVICE_MAX_CONNECTIONS=1 GIN_TIMEOUT_MS=20000|$g/test_gpu_ibgda [comm]"
  "proxy|GIN_TIMEOUT_MS=20000|$g/test_gpu_proxy"
  "proxy-conns1|CUDA_DEVICE_MAX_CONNECTIONS=1 GIN_TIMEOUT_MS=20000|$g/test_gpu_proxy"
  "lsa|GIN_TIMEOUT_MS=20000|$g/test_gpu_lsa"
  "lsa-as-proxy-conns1|CUDA_DEVICE_MAX_CONNECTIONS=1 GIN_TRANSPORT=proxy GIN_TIMEOUT_MS=20000|$g/test_gpu_lsa"
  "moe-proxy-conns1|CUDA_DEVICE_MAX_CONNECTIONS=1 GIN_TRANSPORT=proxy GIN_TIMEOUT_MS=20000|$g/test_gpu_moe"
  "allreduce-proxy-conns1|CUDA_DEVICE_MAX_CONNECTIONS=1 GIN_TRANSPORT=proxy GIN_TIMEOUT_MS=20000|$g/test_gpu_allreduce"
  "signal-lat-proxy-8ranks-conns1|CUDA_DEVICE_MAX_CONNECTIONS=1|$b signal-lat --transport proxy --ranks 8 --iters 200"
  "sendrecv-proxy-4ranks-conns1|CUDA_DEVICE_MAX_CONNECTIONS=1|$b sendrecv --transport proxy --ranks 4"
)

status=0
printf '%-34s %5s %6s %8s %7s\n' case runs passes failures stalls
for c in "${cases[@]}"; do
  IFS='|' read -r name envs cmd <<<"$c"
  [[ "$name" =~ $pick ]] || continue
  exe="${cmd%% *}"
  if [ ! -x "$exe" ]; then
    printf '%-34s (not built: %s)\n' "$name" "$exe"
    continue
  fi
  pass=0 fail=0 stall=0
  for ((i = 1; i <= runs; i++)); do
    log="$logdir/$name.$i.log"
    # shellcheck disable=SC2086
    env $envs timeout -s KILL "$limit" $cmd >"$log" 2>&1
    rc=$?
    if [ $rc -eq 0 ] || [ $rc -eq 77 ]; then
      pass=$((pass + 1))
      rm -f "$log"
    elif [ $rc -eq 137 ]; then
      stall=$((stall + 1))
    else
      fail=$((fail + 1))
    fi
  done
  printf '%-34s %5d %6d %8d %7d\n' "$name" "$runs" "$pass" "$fail" "$stall"
  [ $((fail + stall)) -eq 0 ] || status=1
done
echo "logs of failed and stalled runs: $logdir"
exit $status
