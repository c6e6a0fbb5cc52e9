// gin/core/coop.hpp — cooperative thread groups that share one operation.
//
// A coop is a set of threads that call a gin operation together: all of them
// pass the same arguments, and the operation splits the work among them
// (rank() in [0, size())) and synchronizes them with sync(). On the device:
// CoopThread (one thread), CoopTile<N> (an aligned power-of-two group of lanes of
// one warp; CoopWarp = CoopTile<32>), CoopWarpSpan (consecutive warps of a block,
// synchronized by named barrier 1+id), CoopBlock (the whole block).
//
// syncAll(v) is sync() that also returns whether v was true on every thread
// (a wait that gave up on one thread makes the whole coop see false).
//
// On CPU ranks every coop is one thread that does the whole coop's work:
// size() is 1 and sync() does nothing. That keeps the device API's meaning
// (the coop's work gets done once) in emulation.
#pragma once

#include "gin/core/config.hpp"

namespace gin {

struct CoopThread {
  GIN_HD constexpr int rank() const { return 0; }
  GIN_HD constexpr int size() const { return 1; }
  GIN_HD void sync() const {}
  GIN_HD bool syncAll(bool v) const { return v; }
};

template <int N>
struct CoopTile {
  static_assert(N >= 1 && N <= 32 && (N & (N - 1)) == 0, "CoopTile<N>: N must be a power of two <= 32");
  GIN_HD int rank() const {
#if GIN_DEVICE_CODE
    return int(threadIdx.x % 32u) % N;
#else
    return 0;
#endif
  }
  GIN_HD constexpr int size() const {
#if GIN_DEVICE_CODE
    return N;
#else
    return 1;
#endif
  }
  GIN_HD void sync() const {
#if GIN_DEVICE_CODE
    if constexpr (N > 1) {
      const unsigned lane = threadIdx.x % 32u;
      __syncwarp((~0u >> (32 - N)) << (lane & ~unsigned(N - 1)));
    }
#endif
  }
  GIN_HD bool syncAll(bool v) const {
#if GIN_DEVICE_CODE
    if constexpr (N > 1) {
      const unsigned lane = threadIdx.x % 32u;
      return __all_sync((~0u >> (32 - N)) << (lane & ~unsigned(N - 1)), v);
    }
#endif
    return v;
  }
};

using CoopWarp = CoopTile<32>;

// Warps [warp0, warp0+nWarps) of the block. `id` (0..14) names the hardware
// barrier it synchronizes on (barrier 1+id; 0 is __syncthreads'): two spans that
// are live at the same time need different ids.
struct CoopWarpSpan {
  uint32_t warp0, nWarps, id;
  GIN_HD constexpr CoopWarpSpan(int warp0_, int nWarps_, int id_)
      : warp0(uint32_t(warp0_)), nWarps(uint32_t(nWarps_)), id(uint32_t(id_)) {}
  GIN_HD int rank() const {
#if GIN_DEVICE_CODE
    return int(threadIdx.x) - 32 * int(warp0);
#else
    return 0;
#endif
  }
  GIN_HD int size() const {
#if GIN_DEVICE_CODE
    return 32 * int(nWarps);
#else
    return 1;
#endif
  }
  GIN_HD void sync() const {
#if GIN_DEVICE_CODE
    if (nWarps == 1)
      __syncwarp();
    else
      asm volatile("barrier.sync %0, %1;" ::"r"(1 + id), "r"(32 * nWarps) : "memory");
#endif
  }
  GIN_HD bool syncAll(bool v) const {
#if GIN_DEVICE_CODE
    if (nWarps == 1) return __all_sync(~0u, v);
    int all;
    asm volatile(
        "{ .reg .pred p, q;\n"
        "  setp.ne.s32 p, %1, 0;\n"
        "  barrier.red.and.pred q, %2, %3, p;\n"
        "  selp.s32 %0, 1, 0, q; }"
        : "=r"(all)
        : "r"(int(v)), "r"(1 + id), "r"(32 * nWarps)
        : "memory");
    return all != 0;
#else
    return v;
#endif
  }
};

// All threads of the block (1-D blocks; rank is threadIdx.x).
struct CoopBlock {
  GIN_HD int rank() const {
#if GIN_DEVICE_CODE
    return int(threadIdx.x);
#else
    return 0;
#endif
  }
  GIN_HD int size() const {
#if GIN_DEVICE_CODE
    return int(blockDim.x);
#else
    return 1;
#endif
  }
  GIN_HD void sync() const {
#if GIN_DEVICE_CODE
    __syncthreads();
#endif
  }
  GIN_HD bool syncAll(bool v) const {
#if GIN_DEVICE_CODE
    return __syncthreads_and(int(v)) != 0;
#else
    return v;
#endif
  }
};

// Compile-time: is this coop a single thread on every target?
template <class Coop>
inline constexpr bool kCoopIsThread = false;
template <>
inline constexpr bool kCoopIsThread<CoopThread> = true;
template <>
inline constexpr bool kCoopIsThread<CoopTile<1>> = true;

}  // namespace gin
