// gin/device/transport/lsa.hpp — the load/store transport: the coop copies the
// payload straight into the peer's mapped window, then one thread releases a
// signal update with a system-scope atomic on the peer's signal word.
//
// Nothing is left in flight when a call returns, so flush has nothing to wait
// for and local completion (CounterInc) is immediate.
#pragma once

#include <cstring>
#include <type_traits>

#include "gin/core/atomic.hpp"
#include "gin/core/coop.hpp"
#include "gin/device/action.hpp"
#include "gin/device/window.hpp"

namespace gin::lsa {

namespace detail {
// Copy n units of V; each thread moves kUnroll units per round, all loads
// before the stores, so several loads are in flight (NVLink needs many
// outstanding bytes). Full rounds run unpredicated; the last, partial round
// loads what is left at once (a 14 KiB copy by 256 threads, 3.5 units each,
// is one round, not one unit per load latency). One predicated loop for
// every round instead cost the 16-block ring AllReduce a third of its
// bandwidth on 2 H200s (200 against 309 GB/s busBw at 1 GiB, 2026-11-25).
template <class V, class Coop>
GIN_HD GIN_INLINE void copyUnits(Coop coop, V* dst, const V* src, size_t n) {
  constexpr int kUnroll = 4;
  const size_t stride = size_t(coop.size());
  size_t i = size_t(coop.rank());
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    V v[kUnroll];
    GIN_UNROLL
    for (int u = 0; u < kUnroll; ++u) v[u] = src[i + u * stride];
    GIN_UNROLL
    for (int u = 0; u < kUnroll; ++u) dst[i + u * stride] = v[u];
  }
  if (i < n) {
    V v[kUnroll - 1];
    GIN_UNROLL
    for (int u = 0; u < kUnroll - 1; ++u)
      if (i + u * stride < n) v[u] = src[i + u * stride];
    GIN_UNROLL
    for (int u = 0; u < kUnroll - 1; ++u)
      if (i + u * stride < n) dst[i + u * stride] = v[u];
  }
}

template <class V, class Coop>
GIN_HD GIN_INLINE void copyAligned(Coop coop, char* dst, const char* src, size_t bytes) {
  // dst and src agree modulo sizeof(V): copy a byte head, a V body, a byte tail.
  size_t head = (sizeof(V) - (uintptr_t(dst) % sizeof(V))) % sizeof(V);
  if (head > bytes) head = bytes;
  const size_t nUnits = (bytes - head) / sizeof(V);
  const size_t tailStart = head + nUnits * sizeof(V);
  for (size_t i = size_t(coop.rank()); i < head; i += size_t(coop.size())) dst[i] = src[i];
  copyUnits(coop, reinterpret_cast<V*>(dst + head), reinterpret_cast<const V*>(src + head), nUnits);
  for (size_t i = tailStart + size_t(coop.rank()); i < bytes; i += size_t(coop.size())) dst[i] = src[i];
}
}  // namespace detail

// All threads of `coop` copy `bytes` from src to dst together: 16-byte vectors
// when the two addresses agree modulo 16, narrower when they agree less; any
// size and alignment is correct. Returns before any coop.sync().
template <class Coop>
GIN_HD GIN_INLINE void coopCopy(Coop coop, void* dstv, const void* srcv, size_t bytes) {
  char* dst = static_cast<char*>(dstv);
  const char* src = static_cast<const char*>(srcv);
#if GIN_DEVICE_CODE
  const uintptr_t mis = uintptr_t(dst) ^ uintptr_t(src);
  if ((mis & 15) == 0)
    detail::copyAligned<uint4>(coop, dst, src, bytes);
  else if ((mis & 7) == 0)
    detail::copyAligned<uint64_t>(coop, dst, src, bytes);
  else if ((mis & 3) == 0)
    detail::copyAligned<uint32_t>(coop, dst, src, bytes);
  else
    detail::copyUnits<char>(coop, dst, src, bytes);
#else
  (void)coop;
  if (bytes) std::memcpy(dst, src, bytes);
#endif
}

// Store a value of at most 8 bytes at a peer address (one store, not torn for
// naturally aligned sizes 1, 2, 4, 8).
template <class T>
GIN_HD GIN_INLINE void storeValue(T* dst, T value) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "putValue takes a value of at most 8 bytes");
  if ((uintptr_t(dst) % sizeof(T)) == 0) {
    volatileStore(dst, value);
  } else {
    const char* s = reinterpret_cast<const char*>(&value);
    char* d = reinterpret_cast<char*>(dst);
    for (size_t i = 0; i < sizeof(T); ++i) d[i] = s[i];
  }
}

// Signal operations on a peer's signal word. `release` says whether earlier
// writes of the calling coop must become visible first (the usual case);
// false when the caller already released at system scope.
GIN_HD GIN_INLINE void signalAdd(uint64_t* peerSignal, uint64_t value, bool release) {
  atomicAdd<Scope::System>(peerSignal, value, release ? MemoryOrder::Release : MemoryOrder::Relaxed);
}
GIN_HD GIN_INLINE void signalSet(uint64_t* peerSignal, uint64_t value, bool release) {
  atomicStore<Scope::System>(peerSignal, value, release ? MemoryOrder::Release : MemoryOrder::Relaxed);
}

// After `coop` wrote (a put's payload) or wants published (a signal's data):
// one thread applies the remote action with a system-scope release covering
// the whole coop's writes (ordered by the coop.sync before it), then the local
// action. Without a payload (wrote false) a caller that already released at
// system scope gets a relaxed signal. Nothing at all, no sync, without actions.
template <class Coop, class Acts>
GIN_HD GIN_INLINE void applyActions(const DevComm& c, int ctx, int li, Coop coop, const Acts& acts, bool wrote,
                                    Scope alreadyReleased) {
  if constexpr (Acts::kAny) {
    coop.sync();
    if (coop.rank() == 0) {
      const bool release = wrote || alreadyReleased != Scope::System;
      acts.visit(
          c, ctx,
          [&](RemoteOp op, uint32_t signal, uint64_t value) {
            uint64_t* peerSignal = lsaSignalsOf(c, li) + signal;
            if (op == RemoteOp::Add)
              signalAdd(peerSignal, value, release);
            else
              signalSet(peerSignal, value, release);
          },
          [&](uint32_t counter) { atomicAdd<Scope::System>(c.counters + counter, 1, MemoryOrder::Release); });
    }
  } else {
    (void)c, (void)ctx, (void)li, (void)coop, (void)acts, (void)wrote, (void)alreadyReleased;
  }
}

// The lsa backend of Net (gin/device/net.hpp): calls to lsa member `li` on
// context `ctx`. Same primitives as proxy::Backend and ibgda::Backend.
struct Backend {
  const DevComm& c;
  int ctx;
  int li;  // -1 for the per-context calls (flush, progress)

  // Lsa members go over lsa unless a network transport is forced for every
  // peer (DevComm::ibgdaAll, proxyAll); the barrier's rail round
  // (railBarrier) yields only to a forced proxy. Every Net reads this, also
  // one compiled without the proxy: on a proxy-forced communicator the lsa
  // path is not set up (GPU ranks keep their signals in host memory), so that
  // Net must record NoTransport rather than take it.
  GIN_HD static bool forced(const DevComm& c, bool railBarrier) {
    return (!railBarrier && c.ibgdaAll != 0) || c.proxyAll != 0;
  }

  template <class Coop, class Acts>
  GIN_HD GIN_INLINE void put(Coop coop, Window dst, size_t dstOffset, Window src, size_t srcOffset, size_t bytes,
                             const Acts& acts, Scope alreadyReleased) const {
    coopCopy(coop, lsaPointer(dst, dstOffset, li), localPointer(src, srcOffset), bytes);
    applyActions(c, ctx, li, coop, acts, /*wrote=*/true, alreadyReleased);
  }
  template <class T, class Coop, class Acts>
  GIN_HD GIN_INLINE void putValue(Coop coop, Window dst, size_t dstOffset, T value, const Acts& acts,
                                  Scope alreadyReleased) const {
    if (coop.rank() == 0) storeValue(static_cast<T*>(lsaPointer(dst, dstOffset, li)), value);
    applyActions(c, ctx, li, coop, acts, /*wrote=*/true, alreadyReleased);
  }
  template <class Coop, class Acts>
  GIN_HD GIN_INLINE void signal(Coop coop, const Acts& acts, Scope alreadyReleased) const {
    applyActions(c, ctx, li, coop, acts, /*wrote=*/false, alreadyReleased);
  }
  // The barrier's rail round: add 1 to word `id` (past the user's signals), with release.
  GIN_HD GIN_INLINE void barrierSignal(uint32_t id) const { signalAdd(lsaSignalsOf(c, li) + id, 1, true); }
  // Nothing in flight: the sources are reusable when a call returns.
  template <class Coop>
  GIN_HD GIN_INLINE bool flush(Coop, MemoryOrder, bool ok) const {
    return ok;
  }
  GIN_HD GIN_INLINE void progress() const {}
};

}  // namespace gin::lsa
