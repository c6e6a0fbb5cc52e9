// gin/core/clock.hpp — a nanosecond clock that reads the same way on host and
// device, for the deadlines that bound every wait.
#pragma once

#include "gin/core/config.hpp"

#if !GIN_DEVICE_CODE
#include <chrono>
#endif

namespace gin {

// Nanoseconds from an arbitrary origin (per process on the host, per GPU on the
// device): only differences are meaningful.
GIN_HD GIN_INLINE uint64_t nowNs() {
#if GIN_DEVICE_CODE
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#else
  return uint64_t(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
#endif
}

// Let a spinning thread yield its issue slot (device) or its core (host).
GIN_HD GIN_INLINE void spinPause() {
#if GIN_DEVICE_CODE
  __nanosleep(32);
#elif defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace gin
