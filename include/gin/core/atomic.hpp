// gin/core/atomic.hpp — scoped atomic loads, stores and read-modify-writes.
//
// One spelling for host and device: the memory order and the scope are explicit
// at every call. On the device the common cases go straight to PTX
// (ld.acquire.sys, st.release.sys, red.release.sys.add, fence.acq_rel.*); the rest
// goes through cuda::atomic_ref. On the host std::atomic_ref carries them and the
// scope is irrelevant (every host thread shares one coherence domain).
#pragma once

#include "gin/core/config.hpp"

#if GIN_DEVICE_CODE
#include <cuda/atomic>
#else
#include <atomic>
#endif

// GIN_TSAN: 1 when host code is built with ThreadSanitizer (GCC or clang).
#if !GIN_DEVICE_CODE && defined(__SANITIZE_THREAD__)
#define GIN_TSAN 1
#elif !GIN_DEVICE_CODE && defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define GIN_TSAN 1
#endif
#endif
#ifndef GIN_TSAN
#define GIN_TSAN 0
#endif
#if GIN_TSAN
#include <sanitizer/tsan_interface.h>
#endif

namespace gin {

enum class Scope : int { Thread = 0, Block = 1, Device = 2, System = 3 };
enum class MemoryOrder : int { Relaxed = 0, Acquire = 1, Release = 2, AcqRel = 3, SeqCst = 4 };

namespace detail {
#if !GIN_DEVICE_CODE
inline constexpr std::memory_order toStd(MemoryOrder o) {
  switch (o) {
    case MemoryOrder::Relaxed: return std::memory_order_relaxed;
    case MemoryOrder::Acquire: return std::memory_order_acquire;
    case MemoryOrder::Release: return std::memory_order_release;
    case MemoryOrder::AcqRel: return std::memory_order_acq_rel;
    case MemoryOrder::SeqCst: return std::memory_order_seq_cst;
  }
  return std::memory_order_seq_cst;
}
// A load may not be release and a store may not be acquire: widen or narrow to
// the nearest legal order so a caller's "acquire" on a store means "relaxed".
inline constexpr std::memory_order loadOrder(MemoryOrder o) {
  return o == MemoryOrder::Release  ? std::memory_order_relaxed
         : o == MemoryOrder::AcqRel ? std::memory_order_acquire
                                    : toStd(o);
}
inline constexpr std::memory_order storeOrder(MemoryOrder o) {
  return o == MemoryOrder::Acquire  ? std::memory_order_relaxed
         : o == MemoryOrder::AcqRel ? std::memory_order_release
                                    : toStd(o);
}

#if GIN_TSAN
// ThreadSanitizer does not model std::atomic_thread_fence, so the publications
// gin builds on fences (fence<System>() then relaxed signals: allreduce's
// releaseAll, a caller's `alreadyReleased = Scope::System`; relaxed polls then
// a fence) look like races to it although C++ orders them ([atomics.fences]).
// Under TSan only, each host thread tells it what its fences do:
//  - release side: after a fence, the thread's relaxed stores and
//    read-modify-writes are performed as release (they then carry the writes
//    made before the fence, and also the few made between the fence and them),
//    until the thread's next acquire load, i.e. until it moves on to wait for
//    something; a relaxed publication with no fence before it is still reported;
//  - acquire side: a fence acquires at the word the thread last loaded relaxed
//    (the poll that ended just before it).
struct TsanFenceState {
  bool releasing = false;
  const void* lastRelaxedLoad = nullptr;
};
inline thread_local TsanFenceState tsanFenceState;
inline void tsanFence() {
  TsanFenceState& t = tsanFenceState;
  if (t.lastRelaxedLoad != nullptr) __tsan_acquire(const_cast<void*>(t.lastRelaxedLoad));
  t.lastRelaxedLoad = nullptr;
  t.releasing = true;
}
inline MemoryOrder tsanLoad(const void* p, MemoryOrder o) {
  if (o == MemoryOrder::Relaxed || o == MemoryOrder::Release)
    tsanFenceState.lastRelaxedLoad = p;
  else
    tsanFenceState.releasing = false;
  return o;
}
// A store or read-modify-write after a fence: at least release.
inline MemoryOrder tsanWrite(MemoryOrder o) {
  if (!tsanFenceState.releasing) return o;
  return o == MemoryOrder::Relaxed ? MemoryOrder::Release : o == MemoryOrder::Acquire ? MemoryOrder::AcqRel : o;
}
#endif
#else
__device__ __forceinline__ constexpr cuda::memory_order toCuda(MemoryOrder o) {
  return o == MemoryOrder::Relaxed   ? cuda::memory_order_relaxed
         : o == MemoryOrder::Acquire ? cuda::memory_order_acquire
         : o == MemoryOrder::Release ? cuda::memory_order_release
         : o == MemoryOrder::AcqRel  ? cuda::memory_order_acq_rel
                                     : cuda::memory_order_seq_cst;
}
template <Scope S>
struct CudaScope;
template <>
struct CudaScope<Scope::Thread> {
  static constexpr auto value = cuda::thread_scope_thread;
};
template <>
struct CudaScope<Scope::Block> {
  static constexpr auto value = cuda::thread_scope_block;
};
template <>
struct CudaScope<Scope::Device> {
  static constexpr auto value = cuda::thread_scope_device;
};
template <>
struct CudaScope<Scope::System> {
  static constexpr auto value = cuda::thread_scope_system;
};

// PTX fast paths for the 64-bit signal/counter/epoch words gin polls and bumps.
#define GIN_PTX_LD(name, qual)                                               \
  __device__ __forceinline__ uint64_t name(const uint64_t* p) {              \
    uint64_t v;                                                              \
    asm volatile("ld." qual ".u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"); \
    return v;                                                                \
  }
GIN_PTX_LD(ldAcquireSys, "acquire.sys")
GIN_PTX_LD(ldAcquireGpu, "acquire.gpu")
GIN_PTX_LD(ldRelaxedSys, "relaxed.sys")
GIN_PTX_LD(ldVolatile, "volatile")
#undef GIN_PTX_LD
#define GIN_PTX_ST(name, qual)                                             \
  __device__ __forceinline__ void name(uint64_t* p, uint64_t v) {          \
    asm volatile("st." qual ".u64 [%0], %1;" ::"l"(p), "l"(v) : "memory"); \
  }
GIN_PTX_ST(stReleaseSys, "release.sys")
GIN_PTX_ST(stReleaseGpu, "release.gpu")
GIN_PTX_ST(stRelaxedSys, "relaxed.sys")
GIN_PTX_ST(stVolatile, "volatile")
#undef GIN_PTX_ST
#define GIN_PTX_RED(name, qual)                                                 \
  __device__ __forceinline__ void name(uint64_t* p, uint64_t v) {               \
    asm volatile("red." qual ".add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory"); \
  }
GIN_PTX_RED(redReleaseSys, "release.sys")
GIN_PTX_RED(redRelaxedSys, "relaxed.sys")
GIN_PTX_RED(redReleaseGpu, "release.gpu")
GIN_PTX_RED(redRelaxedGpu, "relaxed.gpu")
#undef GIN_PTX_RED
#endif
// ThreadSanitizer sees no ordering through memory shared between processes.
// It does order every socket send before every later receive in the process
// (one sync object for all sockets), which gave the bootstrap's TCP
// collectives their edge to whatever arrives from a peer that saw them. The
// bootstrap's shared-memory collectives (host/bootstrap_shm.hpp) publish with
// atomics instead, so they release here, and a receiver of frames from other
// processes (host/tcp_receiver.hpp) acquires here: a write made before a
// collective happens before one made for a peer that saw it. No-ops without TSan
// (and in nvcc's device pass, which parses the host code that calls them).
#if GIN_TSAN
inline char tsanCrossProcess;
inline void tsanPublishToPeers() { __tsan_release(&tsanCrossProcess); }
inline void tsanHeardFromPeers() { __tsan_acquire(&tsanCrossProcess); }
#else
inline void tsanPublishToPeers() {}
inline void tsanHeardFromPeers() {}
#endif
}  // namespace detail

// Fence with acquire+release semantics at scope S.
template <Scope S = Scope::System>
GIN_HD GIN_INLINE void fence() {
#if GIN_DEVICE_CODE
  if constexpr (S == Scope::System)
    asm volatile("fence.acq_rel.sys;" ::: "memory");
  else if constexpr (S == Scope::Device)
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
  else if constexpr (S == Scope::Block)
    asm volatile("fence.acq_rel.cta;" ::: "memory");
#elif GIN_TSAN
  // The same full fence (both become __tsan_atomic_thread_fence, which fences
  // but records nothing), spelled so GCC does not warn that TSan ignores it
  // (-Wtsan, at every atomic_thread_fence); tsanFence() tells TSan what it orders.
  if constexpr (S != Scope::Thread) {
    __sync_synchronize();
    detail::tsanFence();
  }
#else
  if constexpr (S != Scope::Thread) std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

template <Scope S = Scope::System, class T>
GIN_HD GIN_INLINE T atomicLoad(const T* p, MemoryOrder order = MemoryOrder::Acquire) {
#if GIN_DEVICE_CODE
  if constexpr (sizeof(T) == 8 && (S == Scope::System || S == Scope::Device)) {
    const uint64_t* q = reinterpret_cast<const uint64_t*>(p);
    uint64_t v;
    const bool acq = order != MemoryOrder::Relaxed && order != MemoryOrder::Release;
    if constexpr (S == Scope::System)
      v = acq ? detail::ldAcquireSys(q) : detail::ldRelaxedSys(q);
    else
      v = acq ? detail::ldAcquireGpu(q) : detail::ldRelaxedSys(q);
    return __builtin_bit_cast(T, v);
  } else {
    cuda::atomic_ref<T, detail::CudaScope<S>::value> r(*const_cast<T*>(p));
    return r.load(order == MemoryOrder::Relaxed ? cuda::memory_order_relaxed : cuda::memory_order_acquire);
  }
#else
#if GIN_TSAN
  order = detail::tsanLoad(p, order);
#endif
  return std::atomic_ref<T>(*const_cast<T*>(p)).load(detail::loadOrder(order));
#endif
}

template <Scope S = Scope::System, class T>
GIN_HD GIN_INLINE void atomicStore(T* p, T v, MemoryOrder order = MemoryOrder::Release) {
#if GIN_DEVICE_CODE
  if constexpr (sizeof(T) == 8 && (S == Scope::System || S == Scope::Device)) {
    uint64_t* q = reinterpret_cast<uint64_t*>(p);
    const uint64_t u = __builtin_bit_cast(uint64_t, v);
    const bool rel = order != MemoryOrder::Relaxed && order != MemoryOrder::Acquire;
    if constexpr (S == Scope::System)
      rel ? detail::stReleaseSys(q, u) : detail::stRelaxedSys(q, u);
    else
      rel ? detail::stReleaseGpu(q, u) : detail::stRelaxedSys(q, u);
  } else {
    cuda::atomic_ref<T, detail::CudaScope<S>::value> r(*p);
    r.store(v, order == MemoryOrder::Relaxed ? cuda::memory_order_relaxed : cuda::memory_order_release);
  }
#else
#if GIN_TSAN
  order = detail::tsanWrite(order);
#endif
  std::atomic_ref<T>(*p).store(v, detail::storeOrder(order));
#endif
}

// Add without returning the old value (PTX `red`: the issuing thread need not wait).
template <Scope S = Scope::System>
GIN_HD GIN_INLINE void atomicAdd(uint64_t* p, uint64_t v, MemoryOrder order = MemoryOrder::Release) {
#if GIN_DEVICE_CODE
  const bool rel = order != MemoryOrder::Relaxed && order != MemoryOrder::Acquire;
  if constexpr (S == Scope::System)
    rel ? detail::redReleaseSys(p, v) : detail::redRelaxedSys(p, v);
  else if constexpr (S == Scope::Device)
    rel ? detail::redReleaseGpu(p, v) : detail::redRelaxedGpu(p, v);
  else {
    cuda::atomic_ref<uint64_t, detail::CudaScope<S>::value> r(*p);
    r.fetch_add(v, detail::toCuda(order));
  }
#else
#if GIN_TSAN
  order = detail::tsanWrite(order);
#endif
  std::atomic_ref<uint64_t>(*p).fetch_add(v, detail::toStd(order));
#endif
}

template <Scope S = Scope::System, class T>
GIN_HD GIN_INLINE T atomicFetchAdd(T* p, T v, MemoryOrder order = MemoryOrder::AcqRel) {
#if GIN_DEVICE_CODE
  cuda::atomic_ref<T, detail::CudaScope<S>::value> r(*p);
  return r.fetch_add(v, detail::toCuda(order));
#else
#if GIN_TSAN
  order = detail::tsanWrite(order);
#endif
  return std::atomic_ref<T>(*p).fetch_add(v, detail::toStd(order));
#endif
}

template <Scope S = Scope::System, class T>
GIN_HD GIN_INLINE bool atomicCompareExchange(T* p, T& expected, T desired, MemoryOrder order = MemoryOrder::AcqRel) {
#if GIN_DEVICE_CODE
  cuda::atomic_ref<T, detail::CudaScope<S>::value> r(*p);
  return r.compare_exchange_strong(expected, desired, detail::toCuda(order));
#else
#if GIN_TSAN
  order = detail::tsanWrite(order);
#endif
  return std::atomic_ref<T>(*p).compare_exchange_strong(expected, desired, detail::toStd(order));
#endif
}

// Read a word that does not change while kernels run (the communicator's
// tables: peer pointers, transports, window bounds). On the device it goes
// through the read-only data path (ld.global.nc), which the acquire loads of
// waits do not invalidate, so a signal after a wait does not pay an L2 round
// trip per table entry.
template <class T>
GIN_HD GIN_INLINE T loadConst(const T* p) {
#if GIN_DEVICE_CODE
  static_assert(sizeof(T) == 1 || sizeof(T) == 4 || sizeof(T) == 8, "loadConst: 1, 4 or 8 byte words");
  if constexpr (sizeof(T) == 8) {
    return __builtin_bit_cast(T, __ldg(reinterpret_cast<const unsigned long long*>(p)));
  } else if constexpr (sizeof(T) == 4) {
    return __builtin_bit_cast(T, __ldg(reinterpret_cast<const unsigned int*>(p)));
  } else {
    return __builtin_bit_cast(T, __ldg(reinterpret_cast<const unsigned char*>(p)));
  }
#else
  return *p;
#endif
}

// Plain volatile accesses, for where a fence already ordered things (a poll
// loop followed by one acquire fence costs less than an acquire per iteration).
template <class T>
GIN_HD GIN_INLINE T volatileLoad(const T* p) {
  return *static_cast<const volatile T*>(p);
}
template <class T>
GIN_HD GIN_INLINE void volatileStore(T* p, T v) {
  *static_cast<volatile T*>(p) = v;
}

}  // namespace gin
