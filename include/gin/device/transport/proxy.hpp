// gin/device/transport/proxy.hpp — the proxy transport, device side: a thread
// describes an operation in a fixed-size descriptor and pushes it into its
// context's ring; a host proxy thread (gin/host/proxy.hpp) pops it and carries
// it out on a wire.
//
// Phase 1: the rings live in ordinary memory and the producers are CPU ranks.
// The layout is the one GPUs will use (slots and consumer index in mapped
// pinned host memory, the producer ticket counter in device memory), so the
// device code below needs no change when GPU rings arrive.
//
// One ring per context, shared by every peer: a single FIFO per context keeps
// per-(context, peer) order for free (the engine runs it in ticket order), and
// the host pays one poll per context instead of one per (context, peer).
#pragma once

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
  ProxyDesc* slots;    // [nSlots] (mapped pinned host memory on GPUs)
  uint64_t* head;      // next ticket; producers fetch-add it (device memory on GPUs)
  uint64_t* consumed;  // descriptors the host has finished; host writes with release
  uint32_t nSlots;     // power of two
  uint32_t pad;
};
static_assert(std::is_trivially_copyable_v<ProxyRingDev>);

namespace proxy {

// Push one descriptor into context `ctx`'s ring: claim a ticket, wait (bounded)
// for its slot to be free, fill it, publish it. Any number of threads may push
// at once. Returns false if the wait gave up (error record: Op::ProxyFull);
// the claimed ticket is then never published, so the ring stays stuck behind
// it — the communicator is already failed at that point.
GIN_HD inline bool push(const DevComm& c, int ctx, const ProxyDesc& d) {
  const ProxyRingDev* ring = c.proxyRings + ctx;
  ProxyDesc* slots = loadConst(&ring->slots);
  uint64_t* head = loadConst(&ring->head);
  const uint64_t* consumed = loadConst(&ring->consumed);
  const uint64_t n = loadConst(&ring->nSlots);
  const uint64_t ticket = atomicFetchAdd<Scope::Device>(head, uint64_t(1), MemoryOrder::Relaxed);
  // The slot is free once fewer than nSlots descriptors are ahead of us. The
  // unsigned difference is exact across 2^64 wrap (consumed never passes an
  // unpublished ticket, so it is at most `ticket`). Acquire: the host finished
  // reading the slot before we overwrite it.
  const bool ok = detail::boundedWait(
      c, consumed, MemoryOrder::Acquire, [&](uint64_t v) { return ticket - v < n; },
      detail::WaitWhat{Op::ProxyFull, d.peer, ctx, ticket, ticket - n + 1});
  if (!ok) return false;
  ProxyDesc* s = slots + (ticket & (n - 1));
  s->op = d.op;
  s->action = d.action;
  s->pad0[0] = s->pad0[1] = 0;
  s->peer = d.peer;
  s->dstWindow = d.dstWindow;
  s->srcWindow = d.srcWindow;
  s->dstOffset = d.dstOffset;
  s->srcOffset = d.srcOffset;
  s->bytes = d.bytes;
  s->signalValue = d.signalValue;
  s->signalId = d.signalId;
  s->counterId = d.counterId;
  // Release at system scope: the descriptor (and the caller's source data)
  // is visible to the host before the sequence word says the slot is valid.
  atomicStore<Scope::System>(&s->seq, ticket + 1, MemoryOrder::Release);
  return true;
}

// Wait (bounded) until the host has consumed every descriptor whose ticket was
// claimed on context `ctx` before this call. Op::ProxyFlush on timeout.
GIN_HD inline bool waitConsumed(const DevComm& c, int ctx, MemoryOrder order) {
  const ProxyRingDev* ring = c.proxyRings + ctx;
  const uint64_t target = atomicLoad<Scope::Device>(loadConst(&ring->head), MemoryOrder::Relaxed);
  return detail::boundedWait(
      c, loadConst(&ring->consumed), order, [&](uint64_t v) { return rollingLessEqual(target, v); },
      detail::WaitWhat{Op::ProxyFlush, -1, ctx, 0, target});
}

}  // namespace proxy
}  // namespace gin
