// tests/gpu/shared_cases.cuh — the rank counts of a [shared] case (ranks of
// one process sharing GPUs round-robin), for Catch2 test files.
#pragma once

#include <catch2/catch_test_macros.hpp>
#include <vector>

#include "gpu_common.cuh"

namespace gputest {

// 2, 3, 4 and 8 where that is more ranks than GPUs (so some share one), at
// most 4 per GPU and maxRanks(). A WARN for each count left out because its
// streams would get too few hardware queues (queuesFor), a SKIP when none
// is left.
inline std::vector<int> sharingRankCountsOrSkip() {
  const int gpus = gpuCount();
  std::vector<int> counts;
  for (int n : {2, 3, 4, 8}) {
    if (n <= gpus || n > 4 * gpus || n > maxRanks()) continue;
    if (queuesFor(n))
      counts.push_back(n);
    else
      WARN("skipped " << n << " ranks on " << gpus << " GPU(s): CUDA_DEVICE_MAX_CONNECTIONS=" << hardwareQueues()
                      << " gives their streams too few hardware queues");
  }
  if (counts.empty()) SKIP("no rank count shares these " << gpus << " GPU(s) within the hardware queues");
  return counts;
}

}  // namespace gputest
