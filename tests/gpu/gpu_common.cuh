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

inline gin::CommConfig gpuConfig(uint64_t timeoutNs = 20'000'000'000ull) {
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

// n ranks on the visible GPUs round-robin (several ranks may share one),
// each with its own non-blocking stream so ranks sharing a GPU run their
// kernels side by side: body(comm, stream).
//
// Ranks sharing a GPU must not allocate or free device or pinned memory
// (cudaMalloc, cudaFree, cudaMallocHost, ...) while another rank's kernel may
// be waiting on its proxy engine or soft NIC: those calls synchronize the
// device, so the engine's next copy queues behind the waiting kernel, which
// waits for that copy (the wait then times out). Allocate before the barrier
// that precedes a launch and free after the barrier that follows it.
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
