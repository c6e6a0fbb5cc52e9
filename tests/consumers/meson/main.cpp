// Consumer check: builds against an INSTALLED gin found via pkg-config (dependency('gin')).
#include "gin/core/rolling.hpp"
#include "gin/device.hpp"
#include "gin/gin.hpp"

#include <cstdint>
#include <cstdio>

static_assert(gin::rollingLessEqual(1, 2));
static_assert(gin::rollingLessEqual(5, 5));
static_assert(!gin::rollingLessEqual(2, 1));
static_assert(gin::rollingLessEqual(~uint64_t(0), 0));  // wraps: max <= 0
static_assert(gin::rollingLess(0xff, 0x00, 8));         // 8-bit wrap
static_assert(gin::kVersionMajor == GIN_VERSION_MAJOR);

int main() {
  volatile uint64_t a = ~uint64_t(0) - 1, b = 3;  // runtime, not constant-folded
  if (!gin::rollingLess(a, b) || gin::rollingLess(b, a)) {
    std::printf("gin consumer (meson): rolling comparison FAILED\n");
    return 1;
  }
  std::printf("gin consumer (meson): gin %d.%d.%d OK\n", gin::kVersionMajor, gin::kVersionMinor, gin::kVersionPatch);
  return 0;
}
