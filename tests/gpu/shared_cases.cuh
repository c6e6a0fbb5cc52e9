// tests/gpu/shared_cases.cuh — the rank counts of a [shared] case (ranks of
// one process sharing GPUs round-robin), for Catch2 test files:
// gputest::sharingRankCounts with a WARN for each count left out for want of
// hardware queues, and a SKIP when none is left.
#pragma once

#include <catch2/catch_test_macros.hpp>
#include <vector>

#include "gpu_common.cuh"

namespace gputest {

inline std::vector<int> sharingRankCountsOrSkip() {
  const int gpus = gpuCount();
  std::vector<int> tooFewQueues;
  const std::vector<int> counts = sharingRankCounts(tooFewQueues);
  for (int n : tooFewQueues)
    WARN("skipped " << n << " ranks on " << gpus << " GPU(s): CUDA_DEVICE_MAX_CONNECTIONS=" << hardwareQueues()
                    << " gives their streams too few hardware queues");
  if (counts.empty()) SKIP("no rank count shares these " << gpus << " GPU(s) within the hardware queues");
  return counts;
}

}  // namespace gputest
