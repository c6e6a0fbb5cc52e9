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

#define GPU_CHECK(call)                                                                                \
  do {                                                                                                 \
    cudaError_t e_ = (call);                                                                           \
    if (e_ != cudaSuccess) throw gputest::Failure(std::string(#call) + ": " + cudaGetErrorString(e_)); \
  } while (0)

}  // namespace gputest
