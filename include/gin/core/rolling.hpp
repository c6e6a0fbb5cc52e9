// gin/core/rolling.hpp — wrap-around ("rolling") comparison of signal and
// counter values, so a wait keeps working when a 64-bit (or narrower) value
// wraps: x is always rolling-less than x+1.
#pragma once

#include "gin/core/config.hpp"

namespace gin {

// Mask of the low `bits` bits (1..64).
GIN_HD constexpr uint64_t rollingMask(int bits) { return ~uint64_t(0) >> (64 - bits); }

// a <= b in rolling order on `bits` bits: b is at most half the range ahead of a.
GIN_HD constexpr bool rollingLessEqual(uint64_t a, uint64_t b, int bits = 64) {
  const uint64_t m = rollingMask(bits);
  return ((b - a) & m) <= (m >> 1);
}

GIN_HD constexpr bool rollingLess(uint64_t a, uint64_t b, int bits = 64) {
  return a != b && rollingLessEqual(a, b, bits) && ((a ^ b) & rollingMask(bits)) != 0;
}

}  // namespace gin
