// gin/ep/fp8.hpp — the FP8 token format of gin::ep (DeepEP's): each token's H
// values as e4m3 (OCP E4M3FN: 1 sign, 4 exponent bits of bias 7, 3 mantissa
// bits, no infinities, largest 448) and one float scale per 128 values, the
// value being e4m3 x scale. Encoding and decoding are written out in integer
// and float arithmetic that gives the same bits on a CPU rank and a GPU (no
// hardware conversion instruction), so a CPU reference can check a GPU's
// quantization bit for bit.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "gin/core/config.hpp"

namespace gin::ep {

inline constexpr int kFp8Group = 128;         // values per scale
inline constexpr float kFp8Max = 448.0f;      // the largest e4m3 value
inline constexpr float kFp8MinAmax = 1e-4f;   // a group's |x| max is taken as at least this (DeepEP's clamp)

// f to e4m3, rounding to nearest even, saturating to +-448 (as the GPU's
// cvt.rn.satfinite.e4m3x2.f32); NaN gives NaN (0x7f with the sign).
GIN_HD inline uint8_t floatToE4m3(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  const uint8_t sign = uint8_t((u >> 24) & 0x80);
  const uint32_t mag = u & 0x7fffffffu;
  if (mag > 0x7f800000u) return uint8_t(sign | 0x7f);  // NaN
  float a;
  memcpy(&a, &mag, 4);
  if (a >= kFp8Max) return uint8_t(sign | 0x7e);  // saturate (infinities too)
  const int e = int(mag >> 23) - 127;
  if (e < -6) {
    // Subnormal: multiples of 2^-9, a x 512 exact; rint rounds to nearest
    // even (8 is the smallest normal, code 0x08, as it should be).
    return uint8_t(sign | uint8_t(rintf(a * 512.0f)));
  }
  uint32_t keep = (mag & 0x7fffffu) >> 20, rem = mag & 0xfffffu;
  if (rem > 0x80000u || (rem == 0x80000u && (keep & 1u))) ++keep;
  uint32_t code = (uint32_t(e + 7) << 3) + keep;  // a carry out of the mantissa moves the exponent up
  if (code > 0x7eu) code = 0x7eu;
  return uint8_t(sign | code);
}

GIN_HD inline float e4m3ToFloat(uint8_t b) {
  const uint32_t e = (b >> 3) & 0xfu, m = b & 7u;
  float v;
  if (e == 0xfu && m == 7u)
    v = NAN;
  else if (e == 0)
    v = float(m) * (1.0f / 512.0f);
  else
    v = ldexpf(1.0f + float(m) / 8.0f, int(e) - 7);
  return (b & 0x80) ? -v : v;
}

// One group of n <= 128 bf16 values (as uint16 bits) to e4m3: amax = the
// largest |x| (at least kFp8MinAmax), each value times 448 / amax, rounded;
// returns the scale amax / 448 (value = e4m3 x scale).
GIN_HD inline float quantizeGroup(const uint16_t* x, int n, uint8_t* out) {
  float amax = kFp8MinAmax;
  for (int i = 0; i < n; ++i) {
    const uint32_t u = uint32_t(x[i] & 0x7fffu) << 16;
    float a;
    memcpy(&a, &u, 4);
    amax = a > amax ? a : amax;
  }
  const float s = kFp8Max / amax;
  for (int i = 0; i < n; ++i) {
    const uint32_t u = uint32_t(x[i]) << 16;
    float v;
    memcpy(&v, &u, 4);
    out[i] = floatToE4m3(v * s);
  }
  return amax / kFp8Max;
}

// A token's FP8 row as it travels (and as the x window holds it): H e4m3
// bytes, then H / 128 float scales.
GIN_HD inline size_t fp8RowBytes(size_t hidden) { return hidden + hidden / kFp8Group * 4; }

// The FP8 row of bf16 token x [H] (H a multiple of 128) at `row`, groups
// first..H/128 stepping by `step` (a GPU spreads them over threads; a CPU
// rank passes 0 and 1).
GIN_HD inline void quantizeRow(const uint16_t* x, size_t hidden, char* row, size_t first, size_t step) {
  for (size_t g = first; g < hidden / kFp8Group; g += step) {
    const float scale =
        quantizeGroup(x + g * kFp8Group, kFp8Group, reinterpret_cast<uint8_t*>(row) + g * kFp8Group);
    memcpy(row + hidden + g * 4, &scale, 4);
  }
}

}  // namespace gin::ep
