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

#include "gin/gin.hpp"

namespace gputest {

inline int gpuCount() { return gin::cudaDeviceCountOrZero(); }

// Meson's "skipped" exit code.
inline int skipNoGpu(const char* what) {
  std::printf("SKIP %s: no CUDA device visible\n", what);
  return 77;
}

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};
inline void expect(bool ok, const std::string& what) {
  if (!ok) throw Failure(what);
}

inline gin::CommConfig gpuConfig(uint64_t timeoutNs = 20'000'000'000ull) {
  gin::CommConfig c;
  c.device = gin::DeviceKind::Gpu;
  c.timeoutNs = timeoutNs;
  return c;
}

// One thread per GPU, each with its own Comm on GPU r.
inline void runGpus(int n, const std::function<void(gin::Comm&)>& body, gin::CommConfig cfg = gpuConfig()) {
  gin::InProcessGroup group(n);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        gin::CommConfig c = cfg;
        c.cudaDevice = r;
        gin::Comm comm(group.rank(r), c);
        body(comm);
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// Same pattern as the CPU tests: a byte from (seed, rank, index).
__host__ __device__ inline uint8_t pattern(uint64_t seed, int rank, size_t i) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ (uint64_t(rank) << 40) ^ i;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return uint8_t(x);
}

#define GPU_CHECK(call)                                                                        \
  do {                                                                                         \
    cudaError_t e_ = (call);                                                                   \
    if (e_ != cudaSuccess) throw gputest::Failure(std::string(#call) + ": " + cudaGetErrorString(e_)); \
  } while (0)

}  // namespace gputest
