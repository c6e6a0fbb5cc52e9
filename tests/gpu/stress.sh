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
set -f  # the cases pass Catch2 tags like [comm]: no globbing
build="${1:-build}"
runs="${RUNS:-30}"
limit="${LIMIT:-120}"
pick="${CASES:-.}"
logdir="${LOGDIR:-$(mktemp -d)}"
mkdir -p "$logdir"
g="$build/tests/gpu"
b="$build/bench/gin-bench"

# name | environment | command. In-process ranks sharing the GPU run with the
# 32 hardware queues the test programs give themselves; "conns1" runs set
# CUDA_DEVICE_MAX_CONNECTIONS=1 (what Megatron-LM sets): there the in-process
# suites run their one-rank cases and tests/gpu/processes.cu runs 2, 3 and 4
# processes sharing the GPU (docs/design/progress.md says why); over the proxy
# it also kills a rank mid-run (and, over tcp, cuts a connection) and checks
# that every other rank stops with an error, in bounded time.
cases=(
  "ibgda-comm-1to8|GIN_TIMEOUT_MS=20000|$g/test_gpu_ibgda [comm]"
  "ibgda-conns1|CUDA_DEVICE_MAX_CONNECTIONS=1 GIN_TIMEOUT_MS=20000|$g/test_gpu_ibgda"
  "proxy-1to8|GIN_TIMEOUT_MS=20000|$g/test_gpu_proxy"
  "proxy-conns1|CUDA_DEVICE_MAX_CONNECTIONS=1 GIN_TIMEOUT_MS=20000|$g/test_gpu_proxy"
  "moe|GIN_TIMEOUT_MS=20000|$g/test_gpu_moe"
  "moe-conns1|CUDA_DEVICE_MAX_CONNECTIONS=1 GIN_TIMEOUT_MS=20000|$g/test_gpu_moe"
  "ep-buffer|GIN_TIMEOUT_MS=20000|$g/test_gpu_ep_buffer"
  "ep-buffer-conns1|CUDA_DEVICE_MAX_CONNECTIONS=1 GIN_TIMEOUT_MS=20000|$g/test_gpu_ep_buffer"
  "processes-proxy-conns1|CUDA_DEVICE_MAX_CONNECTIONS=1 GIN_TRANSPORT=proxy|$g/test_gpu_processes"
  "processes-proxy-tcp-conns1|CUDA_DEVICE_MAX_CONNECTIONS=1 GIN_TRANSPORT=proxy GIN_PROXY_WIRE=tcp|$g/test_gpu_processes"
  "lsa|GIN_TIMEOUT_MS=20000|$g/test_gpu_lsa"
  "allreduce-proxy|GIN_TRANSPORT=proxy GIN_TIMEOUT_MS=20000|$g/test_gpu_allreduce"
  "allreduce|GIN_TIMEOUT_MS=20000|$g/test_gpu_allreduce"
  "allreduce-ll|GIN_TIMEOUT_MS=20000|$g/test_gpu_allreduce [ll]"
  "signal-lat-proxy2||$b signal-lat --transport proxy --ranks 2 --no-nccl"
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
