// tests/gpu/gpu_common.cuh — helpers for the GPU suite: run N GPUs as N ranks
// (threads of this process) or find out there are no GPUs and skip.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "../common/ranks.hpp"

namespace gputest {

// Load every kernel when the CUDA context is created (unless the environment
// already chose). With lazy loading (CUDA's default), loading a module while
// a kernel spins waiting on a gin host thread (proxy engine, soft NIC) may
// synchronize like an allocation does (see runRanksOnStreams). Runs before
// main, so before any CUDA call.
inline const bool kEagerModuleLoading = [] {
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  return true;
}();

inline int gpuCount() { return gin::cudaDeviceCountOrZero(); }

// Meson's "skipped" exit code.
inline int skipNoGpu(const char* what) {
  std::printf("SKIP %s: no CUDA device visible\n", what);
  return 77;
}

using gintest::expect;
using gintest::Failure;
using gintest::pattern;

// The bound on the suite's waits: GIN_TIMEOUT_MS when set (tests/gpu/sanitize.sh
// raises it, instrumented kernels run 10-100x slower), else 20 s. Cases that
// expect a wait to fail pass their own short bound.
inline uint64_t suiteTimeoutNs() {
  const char* e = std::getenv("GIN_TIMEOUT_MS");
  const unsigned long long ms = e && *e ? std::strtoull(e, nullptr, 10) : 0;
  return ms ? ms * 1'000'000ull : 20'000'000'000ull;
}

inline gin::CommConfig gpuConfig(uint64_t timeoutNs = suiteTimeoutNs()) {
  gin::CommConfig c;
  c.device = gin::DeviceKind::Gpu;
  c.timeoutNs = timeoutNs;
  return c;
}

// One thread per GPU, each with its own Comm on GPU r.
inline void runGpus(int n, const std::function<void(gin::Comm&)>& body, gin::CommConfig cfg = gpuConfig()) {
  gintest::runRankThreads(
      n,
      [&](int r) {
        gin::CommConfig c = cfg;
        c.cudaDevice = r;
        return c;
      },
      body);
}

// CUDA's hardware queues (docs/design/progress.md). gin's own progress needs
// none of the user's, but a test that runs several ranks in one process,
// each launching kernels that wait for the other ranks' kernels, needs each
// rank's stream in a queue of its own: with fewer queues, a launch that
// depends on a rank's waiting kernel (its next kernel on the same stream)
// holds up every launch behind it in the shared queue, another rank's
// included, and the ranks wait for each other until the timeout. That is
// CUDA's rule for any program, not gin's; with CUDA_DEVICE_MAX_CONNECTIONS=1
// (Megatron-LM) run one rank per process, as tests/gpu/processes.cu does.
// Enough queues is not a guarantee either: CUDA hands them out round-robin as
// streams are created, so once a process has created more streams than it
// has queues (cases before, NICs' streams), two live streams can share one.
// A case whose ranks post in one kernel and wait in the next therefore
// launches every rank's posting kernel before any waiting one (a bootstrap
// barrier between them), which no queue sharing can deadlock.
inline int hardwareQueues() {
  const char* e = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  return e && *e ? std::atoi(e) : 8;
}
// Whether n ranks of this process (round-robin on the GPUs) each get a queue
// for their stream, with one left for the default stream.
inline bool queuesFor(int n) {
  const int perGpu = (n + gpuCount() - 1) / gpuCount();
  return perGpu == 1 || hardwareQueues() >= perGpu + 1;
}
// GIN_GPU_TEST_MAX_RANKS: the most in-process ranks a case runs (default: all
// it lists). tests/gpu/sanitize.sh lowers it for the slowest tools.
inline int maxRanks() {
  const char* e = std::getenv("GIN_GPU_TEST_MAX_RANKS");
  return e && *e ? std::atoi(e) : 1 << 30;
}
// First thing in main(): unless the caller chose, give the process CUDA's
// maximum of 32 queues, so the in-process cases run up to 8 ranks per GPU.
inline void widenQueues() { ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0); }

// n ranks on the visible GPUs round-robin (several ranks may share one),
// each with its own non-blocking stream so ranks sharing a GPU run their
// kernels side by side: body(comm, stream).
//
// Ranks sharing a GPU allocate before the barrier that precedes a launch and
// free after the barrier that follows it: cudaMalloc and cudaFree synchronize
// the device, so one rank's free would wait for another rank's kernel.
inline void runRanksOnStreams(int n, const std::function<void(gin::Comm&, cudaStream_t)>& body, gin::CommConfig cfg) {
  const int gpus = gpuCount();
  gintest::runRankThreads(
      n,
      [&](int r) {
        gin::CommConfig c = cfg;
        c.cudaDevice = r % gpus;
        return c;
      },
      [&](gin::Comm& comm) {
        cudaStream_t st = nullptr;
        if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess)
          throw Failure("cudaStreamCreateWithFlags failed");
        try {
          body(comm, st);
        } catch (...) {
          cudaStreamDestroy(st);
          throw;
        }
        cudaStreamDestroy(st);
      });
}

#define GPU_CHECK(call)                                                                                \
  do {                                                                                                 \
    cudaError_t e_ = (call);                                                                           \
    if (e_ != cudaSuccess) throw gputest::Failure(std::string(#call) + ": " + cudaGetErrorString(e_)); \
  } while (0)

}  // namespace gputest
