// gin/core/xxh64.hpp — XXH64, the published xxHash 64-bit algorithm (host code):
// xxh64(data, len, seed) equals the reference implementation's XXH64 on
// little-endian hosts. Used for the tcp wire's frame checksums.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace gin {

namespace detail {
inline uint64_t xxhRotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t xxhRead64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline uint32_t xxhRead32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline constexpr uint64_t kXxhP1 = 0x9E3779B185EBCA87ull, kXxhP2 = 0xC2B2AE3D27D4EB4Full,
                          kXxhP3 = 0x165667B19E3779F9ull, kXxhP4 = 0x85EBCA77C2B2AE63ull,
                          kXxhP5 = 0x27D4EB2F165667C5ull;
inline uint64_t xxhRound(uint64_t acc, uint64_t in) { return xxhRotl(acc + in * kXxhP2, 31) * kXxhP1; }
inline uint64_t xxhMerge(uint64_t h, uint64_t v) { return (h ^ xxhRound(0, v)) * kXxhP1 + kXxhP4; }
}  // namespace detail

// XXH64 (little-endian reading, as the reference implementation on x86/ARM).
inline uint64_t xxh64(const void* data, size_t len, uint64_t seed = 0) {
  using namespace detail;
  const auto* p = static_cast<const unsigned char*>(data);
  const unsigned char* const end = p + len;
  uint64_t h;
  if (len >= 32) {
    uint64_t v1 = seed + kXxhP1 + kXxhP2, v2 = seed + kXxhP2, v3 = seed, v4 = seed - kXxhP1;
    const unsigned char* const limit = end - 32;
    do {
      v1 = xxhRound(v1, xxhRead64(p));
      v2 = xxhRound(v2, xxhRead64(p + 8));
      v3 = xxhRound(v3, xxhRead64(p + 16));
      v4 = xxhRound(v4, xxhRead64(p + 24));
      p += 32;
    } while (p <= limit);
    h = xxhRotl(v1, 1) + xxhRotl(v2, 7) + xxhRotl(v3, 12) + xxhRotl(v4, 18);
    h = xxhMerge(xxhMerge(xxhMerge(xxhMerge(h, v1), v2), v3), v4);
  } else {
    h = seed + kXxhP5;
  }
  h += uint64_t(len);
  for (; p + 8 <= end; p += 8) h = xxhRotl(h ^ xxhRound(0, xxhRead64(p)), 27) * kXxhP1 + kXxhP4;
  if (p + 4 <= end) {
    h = xxhRotl(h ^ (uint64_t(xxhRead32(p)) * kXxhP1), 23) * kXxhP2 + kXxhP3;
    p += 4;
  }
  for (; p < end; ++p) h = xxhRotl(h ^ (uint64_t(*p) * kXxhP5), 11) * kXxhP1;
  h ^= h >> 33;
  h *= kXxhP2;
  h ^= h >> 29;
  h *= kXxhP3;
  h ^= h >> 32;
  return h;
}

}  // namespace gin
