// tests/common/allreduce_ref.hpp — inputs and the host reference for the
// ring AllReduce tests (tests/device/allreduce.cpp on CPU ranks,
// tests/gpu/allreduce.cu on GPUs): deterministic per-(seed, rank, index)
// values, and a check with a tolerance per type.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "gin/gin.hpp"
#include "ranks.hpp"

namespace gintest::arref {

using gin::coll::BFloat16;
using gin::coll::Half;
namespace coll = gin::coll;

constexpr uint8_t kPoison = 0xAB;
constexpr size_t kHead = 48;  // data starts 48 bytes into each window (16-byte aligned): poison before it
constexpr size_t kTail = 40;  // and after it

inline uint64_t mixBits(uint64_t seed, int rank, size_t i) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ (uint64_t(rank) << 40) ^ (uint64_t(i) * 0xD1B54A32D192ED03ull);
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return x;
}

template <class T>
constexpr bool kIsFloat16 = std::is_same_v<T, coll::Half> || std::is_same_v<T, coll::BFloat16>;
template <class T>
constexpr bool kIsFloat = std::is_floating_point_v<T> || kIsFloat16<T>;

template <class T>
double toDouble(T v) {
  if constexpr (kIsFloat16<T>)
    return double(coll::toFloat(v));
  else
    return double(v);
}
template <class T>
T fromDouble(double d) {
  if constexpr (std::is_same_v<T, coll::Half>)
    return coll::toHalf(float(d));
  else if constexpr (std::is_same_v<T, coll::BFloat16>)
    return coll::toBFloat16(float(d));
  else
    return T(d);
}
// Machine epsilon of T.
template <class T>
double epsOf() {
  if constexpr (std::is_same_v<T, coll::Half>)
    return 0x1.0p-10;
  else if constexpr (std::is_same_v<T, coll::BFloat16>)
    return 0x1.0p-7;
  else
    return double(std::numeric_limits<T>::epsilon());
}

// Rank `rank`'s element i: [-1, 1] (prod: [0.5, 1.5]) for floating point,
// [-1000, 1000] (prod: one of -2, -1, 1, 2) for integers.
template <class T, class Op>
T input(uint64_t seed, int rank, size_t i) {
  const uint64_t x = mixBits(seed, rank, i);
  constexpr bool prod = std::is_same_v<Op, coll::Prod>;
  if constexpr (kIsFloat<T>) {
    const double u = double(x >> 11) * 0x1.0p-53;  // [0, 1)
    return fromDouble<T>(prod ? 0.5 + u : 2 * u - 1);
  } else {
    if (prod) {
      const T v[] = {-2, -1, 1, 2};
      return v[x % 4];
    }
    return T(int64_t(x % 2001) - 1000);
  }
}

// Against the exact result: sum within 2 n eps sum|x| (n roundings of partial
// sums; for half and bfloat16 each step rounds to 16 bits), prod within
// 4 n eps |ref| relative, min and max and integers exact.
template <class T, class Op>
void check(const T* got, int n, size_t count, uint64_t seed, const std::string& what) {
  for (size_t i = 0; i < count; ++i) {
    bool good;
    double ref, g = toDouble(got[i]);
    if constexpr (kIsFloat<T>) {
      ref = toDouble(input<T, Op>(seed, 0, i));
      double mag = std::fabs(ref);
      for (int r = 1; r < n; ++r) {
        const double x = toDouble(input<T, Op>(seed, r, i));
        if constexpr (std::is_same_v<Op, coll::Sum>) ref += x;
        if constexpr (std::is_same_v<Op, coll::Prod>) ref *= x;
        if constexpr (std::is_same_v<Op, coll::Min>) ref = std::min(ref, x);
        if constexpr (std::is_same_v<Op, coll::Max>) ref = std::max(ref, x);
        mag += std::fabs(x);
      }
      const double eps = epsOf<T>();
      const double tol = std::is_same_v<Op, coll::Prod>  ? 4.0 * n * eps * std::fabs(ref)
                         : std::is_same_v<Op, coll::Sum> ? 2.0 * n * eps * mag
                                                         : 0.0;
      good = std::fabs(g - ref) <= tol;
    } else {
      T r0 = input<T, Op>(seed, 0, i);
      for (int r = 1; r < n; ++r) r0 = Op{}(r0, input<T, Op>(seed, r, i));
      ref = double(r0);
      good = got[i] == r0;
    }
    if (!good)
      gintest::expect(false, what + ": element " + std::to_string(i) + " of " + std::to_string(count) + " is " +
                                 std::to_string(g) + ", reference " + std::to_string(ref));
  }
}

}  // namespace gintest::arref
