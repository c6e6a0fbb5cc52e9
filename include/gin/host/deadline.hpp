// gin/host/deadline.hpp — the host's deadlines: every slow-path wait (bootstrap,
// sockets) ends at a steady-clock time point, and says its timeout in seconds.
#pragma once

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <string>

namespace gin {
namespace detail {

using Clock = std::chrono::steady_clock;

inline std::string secondsText(uint64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(ns) / 1e9);
  return buf;
}

inline Clock::time_point deadlineAfter(uint64_t ns) {
  return Clock::now() + std::chrono::nanoseconds(static_cast<int64_t>(ns));
}

inline int msUntil(Clock::time_point deadline) {
  const auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  // Round up so poll() never returns a hair before the deadline and spins.
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<int64_t>(ms, INT_MAX));
}

}  // namespace detail
}  // namespace gin
