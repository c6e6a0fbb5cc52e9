// gin/device/transport/proxy.hpp — the proxy transport, device side: a thread
// describes an operation in a fixed-size descriptor and pushes it into its
// context's ring; a host proxy thread (gin/host/proxy.hpp) pops it and carries
// it out on a wire.
//
// On GPUs the slots and the consumer index live in mapped pinned host memory
// (the host polls them without crossing PCIe), and the producer ticket counter
// and a cached copy of the consumer index live in device memory (producers
// claim tickets and check credits without crossing PCIe). On CPU ranks all of
// it is ordinary memory; the code is the same.
//
// One ring per context, shared by every peer: a single FIFO per context keeps
// per-(context, peer) order for free (the engine runs it in ticket order), and
// the host pays one poll per context instead of one per (context, peer).
#pragma once

#include <cstring>
#include <type_traits>

#include "gin/core/atomic.hpp"
#include "gin/core/rolling.hpp"
#include "gin/device/comm.hpp"

namespace gin {

enum class ProxyOp : uint8_t { Put = 1, PutValue = 2, Signal = 3 };
enum class ProxyAction : uint8_t { None = 0, Add = 1, Set = 2 };

inline constexpr uint32_t kProxyNoCounter = ~uint32_t(0);

// One operation. 64 bytes: one cache line, four 16-byte stores on a GPU.
// `seq` is written last with release order and equals ticket + 1 when the
// descriptor in the slot is complete, so the consumer never reads a half
// written one and a stale descriptor from the previous lap never matches.
struct alignas(64) ProxyDesc {
  uint8_t op;      // ProxyOp
  uint8_t action;  // ProxyAction: remote action after the payload
  uint8_t pad0[2];
  int32_t peer;        // world rank
  uint32_t dstWindow;  // WindowDev::id
  uint32_t srcWindow;  // WindowDev::id (Put)
  uint64_t dstOffset;
  uint64_t srcOffset;  // Put: offset in srcWindow; PutValue: the value's bytes
  uint64_t bytes;      // Put: any; PutValue: 1..8; Signal: 0
  uint64_t signalValue;
  uint32_t signalId;
  uint32_t counterId;  // kProxyNoCounter: none
  uint64_t seq;        // ticket + 1, written last
};
static_assert(sizeof(ProxyDesc) == 64, "a proxy descriptor is one 64-byte line");
static_assert(std::is_trivially_copyable_v<ProxyDesc>);

// A context's ring as the producers see it.
struct ProxyRingDev {
  ProxyDesc* slots;        // [nSlots] (mapped pinned host memory on GPUs)
  uint64_t* head;          // next ticket; producers fetch-add it (device memory on GPUs)
  uint64_t* consumed;      // descriptors the host has finished; host writes with release
  uint64_t* consumedHint;  // [2]: a recent value of *consumed, and its refresher's lock (device memory on GPUs)
  uint32_t nSlots;         // power of two
  uint32_t pad;
};
static_assert(std::is_trivially_copyable_v<ProxyRingDev>);

namespace proxy {

// The consumer index as producers see it: a copy in device memory (the hint,
// word 0 of its line) that one producer at a time refreshes from the host's
// index (word 1 is that producer's lock). Thousands of waiting producers then
// poll device memory, and at most one PCIe read per ring is in flight, so
// waiting producers cannot starve the engine or each other. Acquire: a value
// seen here was read from the host's release (the refresher's acquire, then
// its release of the hint), so the host finished with every slot before it.
// Waits (bounded) until ready(value) holds.
template <class Ready>
GIN_HD bool waitForConsumer(const DevComm& c, const ProxyRingDev* ring, Ready ready, const detail::WaitWhat& what) {
  uint64_t* hint = loadConst(&ring->consumedHint);
  uint64_t* lock = hint + 1;
  const uint64_t* consumed = loadConst(&ring->consumed);
  return detail::boundedPoll(
      c,
      [&] {
        uint64_t v = atomicLoad<Scope::Device>(hint, MemoryOrder::Acquire);
        if (ready(v)) return v;
        uint64_t idle = 0;
        if (atomicCompareExchange<Scope::Device>(lock, idle, uint64_t(1), MemoryOrder::Acquire)) {
          const uint64_t fresh = atomicLoad<Scope::System>(consumed, MemoryOrder::Acquire);
          // Only lock holders write the hint, so it never moves backwards.
          if (rollingLess(v, fresh)) {
            atomicStore<Scope::Device>(hint, fresh, MemoryOrder::Release);
            v = fresh;
          }
          atomicStore<Scope::Device>(lock, uint64_t(0), MemoryOrder::Release);
        }
        return v;
      },
      ready, what);
}

// Push one descriptor into context `ctx`'s ring: claim a ticket, wait (bounded)
// for its slot to be free, fill it, publish it. Any number of threads may push
// at once. Returns false if the wait gave up (error record: Op::ProxyFull);
// the claimed ticket is then never published, so the ring stays stuck behind
// it — the communicator is already failed at that point.
GIN_HD inline bool push(const DevComm& c, int ctx, const ProxyDesc& d) {
  const ProxyRingDev* ring = c.proxyRings + ctx;
  ProxyDesc* slots = loadConst(&ring->slots);
  uint64_t* head = loadConst(&ring->head);
  const uint64_t n = loadConst(&ring->nSlots);
  const uint64_t ticket = atomicFetchAdd<Scope::Device>(head, uint64_t(1), MemoryOrder::Relaxed);
  // The slot is free once fewer than nSlots descriptors are ahead of us. The
  // unsigned difference is exact across 2^64 wrap (consumed never passes an
  // unpublished ticket, so it is at most `ticket`). While the ring has room
  // the first look at the hint answers, with no PCIe read.
  if (!waitForConsumer(
          c, ring, [&](uint64_t v) { return ticket - v < n; },
          detail::WaitWhat{Op::ProxyFull, d.peer, ctx, ticket, ticket - n + 1}))
    return false;
  ProxyDesc* s = slots + (ticket & (n - 1));
  // Three 16-byte stores and one 8-byte store (the slot is 64-byte aligned),
  // then the sequence word.
  uint64_t w[8];
  static_assert(sizeof(w) == sizeof(ProxyDesc));
  std::memcpy(w, &d, sizeof(w));
  w[0] &= ~(uint64_t(0xffff) << 16);  // pad0
  uint64_t* out = reinterpret_cast<uint64_t*>(s);
#if GIN_DEVICE_CODE
  reinterpret_cast<ulonglong2*>(out)[0] = make_ulonglong2(w[0], w[1]);
  reinterpret_cast<ulonglong2*>(out)[1] = make_ulonglong2(w[2], w[3]);
  reinterpret_cast<ulonglong2*>(out)[2] = make_ulonglong2(w[4], w[5]);
  out[6] = w[6];
#else
  for (int i = 0; i < 7; ++i) out[i] = w[i];
#endif
  // Release at system scope: the descriptor (and the caller's source data)
  // is visible to the host before the sequence word says the slot is valid.
  atomicStore<Scope::System>(&s->seq, ticket + 1, MemoryOrder::Release);
  return true;
}

// Wait (bounded) until the host has consumed every descriptor whose ticket was
// claimed on context `ctx` before this call. Op::ProxyFlush on timeout.
GIN_HD inline bool waitConsumed(const DevComm& c, int ctx, MemoryOrder order) {
  (void)order;  // the wait always acquires (see waitForConsumer)
  const ProxyRingDev* ring = c.proxyRings + ctx;
  const uint64_t target = atomicLoad<Scope::Device>(loadConst(&ring->head), MemoryOrder::Relaxed);
  return waitForConsumer(
      c, ring, [&](uint64_t v) { return rollingLessEqual(target, v); },
      detail::WaitWhat{Op::ProxyFlush, -1, ctx, 0, target});
}

}  // namespace proxy
}  // namespace gin
