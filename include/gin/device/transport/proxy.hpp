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
#include "gin/core/coop.hpp"
#include "gin/core/rolling.hpp"
#include "gin/device/action.hpp"
#include "gin/device/comm.hpp"
#include "gin/device/transport/lsa.hpp"
#include "gin/device/window.hpp"

namespace gin {

enum class ProxyOp : uint8_t { Put = 1, PutValue = 2, Signal = 3 };
enum class ProxyAction : uint8_t { None = 0, Add = 1, Set = 2 };
static_assert(uint8_t(ProxyAction::Add) == uint8_t(RemoteOp::Add) &&
                  uint8_t(ProxyAction::Set) == uint8_t(RemoteOp::Set),
              "a descriptor carries Action::remote as it is");

inline constexpr uint32_t kProxyNoCounter = kNoCounter;

// One operation, as the engine reads it back from its slot.
struct ProxyDesc {
  uint8_t op;          // ProxyOp
  uint8_t action;      // ProxyAction: remote action after the payload
  int32_t peer;        // world rank
  uint32_t dstWindow;  // WindowDev::id
  uint32_t srcWindow;  // WindowDev::id (Put)
  uint64_t dstOffset;
  uint64_t srcOffset;  // Put: offset in srcWindow; PutValue: the value's bytes
  uint64_t bytes;      // Put: < 2^48; PutValue: 1..8; Signal: 0
  uint64_t signalValue;
  uint32_t signalId;
  uint32_t counterId;  // kProxyNoCounter: none
};
static_assert(std::is_trivially_copyable_v<ProxyDesc>);

inline constexpr uint64_t kProxyMaxBytes = (uint64_t(1) << 48) - 1;  // one descriptor's put
inline constexpr uint32_t kProxyMaxSlots = 1u << 15;                 // the tags are 16 bits

// A ring slot: one 64-byte line, written by a GPU as four 16-byte stores
// (chunk k = words 2k, 2k+1). Every chunk carries the same 16-bit tag, the low
// bits of ticket + 1, in the low bits of its first word, so the consumer
// accepts the slot once all four chunks carry its ticket's tag: no chunk can
// be half written (a 16-byte aligned store arrives as one PCIe write, applied
// to the line at once; on CPU ranks the tag word is stored after its
// partner with release) and a chunk left from an earlier lap carries a tag
// nSlots (< 2^16) smaller. Rings start zeroed at ticket 0, so slot i is
// first used by ticket i < 2^15, whose tag is not 0. The producer needs no
// fence between the stores and the flag, which on a GPU would wait for the
// slot's PCIe writes.
//   w0: tag | op << 16 | action << 24 | uint32(peer) << 32    w1: dstOffset
//   w2: tag | dstWindow << 16                                  w3: srcOffset
//   w4: tag | bytes << 16 (48 bits)                            w5: signalValue
//   w6: tag | srcWindow << 16                                  w7: signalId | counterId << 32
struct alignas(64) ProxySlot {
  uint64_t w[8];
};
static_assert(sizeof(ProxySlot) == 64, "a proxy slot is one 64-byte line");

GIN_HD inline uint16_t proxyTag(uint64_t ticket) { return uint16_t(ticket + 1); }

GIN_HD inline void proxyPack(const ProxyDesc& d, uint16_t tag, uint64_t w[8]) {
  w[0] = tag | uint64_t(d.op) << 16 | uint64_t(d.action) << 24 | uint64_t(uint32_t(d.peer)) << 32;
  w[1] = d.dstOffset;
  w[2] = tag | uint64_t(d.dstWindow) << 16;
  w[3] = d.srcOffset;
  w[4] = tag | (d.bytes & kProxyMaxBytes) << 16;
  w[5] = d.signalValue;
  w[6] = tag | uint64_t(d.srcWindow) << 16;
  w[7] = uint64_t(d.signalId) | uint64_t(d.counterId) << 32;
}

// The consumer's read of slot `s` for ticket `ticket`: false while any chunk
// lacks the ticket's tag. Each tag word is loaded with acquire before its
// partner word.
GIN_HD inline bool proxyUnpack(const ProxySlot* s, uint64_t ticket, ProxyDesc* d) {
  const uint16_t tag = proxyTag(ticket);
  uint64_t w[8];
  // The last chunk first: a producer stores the chunks in order, so when it
  // is here the others usually are, and a line still arriving is not re-read
  // once per chunk.
  for (int k : {3, 0, 1, 2}) {
    w[2 * k] = atomicLoad<Scope::System>(&s->w[2 * k], MemoryOrder::Acquire);
    if (uint16_t(w[2 * k]) != tag) return false;
    w[2 * k + 1] = atomicLoad<Scope::System>(&s->w[2 * k + 1], MemoryOrder::Relaxed);
  }
  d->op = uint8_t(w[0] >> 16);
  d->action = uint8_t(w[0] >> 24);
  d->peer = int32_t(uint32_t(w[0] >> 32));
  d->dstOffset = w[1];
  d->dstWindow = uint32_t(w[2] >> 16);
  d->srcOffset = w[3];
  d->bytes = w[4] >> 16;
  d->signalValue = w[5];
  d->srcWindow = uint32_t(w[6] >> 16);
  d->signalId = uint32_t(w[7]);
  d->counterId = uint32_t(w[7] >> 32);
  return true;
}

// A context's ring as the producers see it.
struct ProxyRingDev {
  ProxySlot* slots;        // [nSlots] (mapped pinned host memory on GPUs)
  uint64_t* head;          // next ticket; producers fetch-add it (device memory on GPUs)
  uint64_t* consumed;      // descriptors the host has finished; host writes with release
  uint64_t* consumedHint;  // [2]: a recent value of *consumed, and its refresher's lock (device memory on GPUs)
  uint32_t nSlots;         // power of two, at most kProxyMaxSlots
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
// for its slot to be free, fill it. Any number of threads may push at once.
// release: first make the calling thread's earlier writes (and, after a coop
// sync, its coop's) visible at system scope, for a put's source or the data a
// signal publishes; a caller that already released passes false. Returns false
// if the wait gave up (error record: Op::ProxyFull); the claimed ticket is then
// never filled, so the ring stays stuck behind it — the communicator is
// already failed at that point.
GIN_HD inline bool push(const DevComm& c, int ctx, const ProxyDesc& d, bool release) {
  const ProxyRingDev* ring = c.proxyRings + ctx;
  ProxySlot* slots = loadConst(&ring->slots);
  uint64_t* head = loadConst(&ring->head);
  const uint64_t n = loadConst(&ring->nSlots);
  const uint64_t ticket = atomicFetchAdd<Scope::Device>(head, uint64_t(1), MemoryOrder::Relaxed);
  // The slot is free once fewer than nSlots descriptors are ahead of us. The
  // unsigned difference is exact across 2^64 wrap (consumed never passes an
  // unfilled ticket, so it is at most `ticket`). While the ring has room
  // the first look at the hint answers, with no PCIe read.
  if (!waitForConsumer(
          c, ring, [&](uint64_t v) { return ticket - v < n; },
          detail::WaitWhat{Op::ProxyFull, d.peer, ctx, ticket, ticket - n + 1}))
    return false;
  uint64_t w[8];
  proxyPack(d, proxyTag(ticket), w);
  uint64_t* out = slots[ticket & (n - 1)].w;
  if (release) fence<Scope::System>();
#if GIN_DEVICE_CODE
  // Four 16-byte system-scope stores (write-through to host memory), no fence
  // after them: the tags say when the slot is complete.
  for (int k = 0; k < 4; ++k)
    asm volatile("st.relaxed.sys.global.v2.u64 [%0], {%1, %2};" ::"l"(out + 2 * k), "l"(w[2 * k]), "l"(w[2 * k + 1])
                 : "memory");
#else
  for (int k = 0; k < 4; ++k) {
    atomicStore<Scope::System>(out + 2 * k + 1, w[2 * k + 1], MemoryOrder::Relaxed);
    atomicStore<Scope::System>(out + 2 * k, w[2 * k], MemoryOrder::Release);
  }
#endif
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

// The proxy backend of Net (gin/device/net.hpp): calls to world rank `peer`
// on context `ctx`, as descriptors in the context's ring. The coop's writes
// (a put's source, the data a signal publishes) are ordered before the push
// by a coop sync; one thread pushes, with a system-scope fence first unless
// the caller already released at system scope.
struct Backend {
  const DevComm& c;
  int ctx;
  int peer;  // world rank; -1 for the per-context calls (flush, progress)

  GIN_HD static bool reaches(const DevComm& c, int world) {
    return c.proxyRings != nullptr && loadConst(c.peerTransport + world) == uint8_t(Transport::Proxy);
  }

  template <class Coop, class Acts>
  GIN_HD void put(Coop coop, Window dst, size_t dstOffset, Window src, size_t srcOffset, size_t bytes, const Acts& acts,
                  Scope alreadyReleased) const {
    if (const int li = storeIndex(); li >= 0) {
      lsa::coopCopy(coop, lsaPointer(dst, dstOffset, li), localPointer(src, srcOffset), bytes);
      pushActions(coop, acts);
      return;
    }
    ProxyDesc d = desc(ProxyOp::Put, acts.resolve(c, ctx));
    d.dstWindow = loadConst(&dst.dev->id);
    d.dstOffset = dstOffset;
    d.srcWindow = loadConst(&src.dev->id);
    d.srcOffset = srcOffset;
    d.bytes = bytes;
    if (bytes > kProxyMaxBytes) {
      recordError(c, Op::BadArgument, peer, ctx, d.dstWindow, bytes, kProxyMaxBytes);
      return;
    }
    push(coop, d, alreadyReleased);
  }
  template <class T, class Coop, class Acts>
  GIN_HD void putValue(Coop coop, Window dst, size_t dstOffset, T value, const Acts& acts,
                       Scope alreadyReleased) const {
    if (const int li = storeIndex(); li >= 0) {
      if (coop.rank() == 0) lsa::storeValue(static_cast<T*>(lsaPointer(dst, dstOffset, li)), value);
      pushActions(coop, acts);
      return;
    }
    ProxyDesc d = desc(ProxyOp::PutValue, acts.resolve(c, ctx));
    d.dstWindow = loadConst(&dst.dev->id);
    d.dstOffset = dstOffset;
    // Carried inline: byte i of the value in bits 8i..8i+7 (what the host unpacks).
    const unsigned char* vb = reinterpret_cast<const unsigned char*>(&value);
    d.srcOffset = 0;
    for (size_t i = 0; i < sizeof(T); ++i) d.srcOffset |= uint64_t(vb[i]) << (8 * i);
    d.bytes = sizeof(T);
    push(coop, d, alreadyReleased);
  }
  template <class Coop, class Acts>
  GIN_HD void signal(Coop coop, const Acts& acts, Scope alreadyReleased) const {
    const ProxyDesc d = desc(ProxyOp::Signal, acts.resolve(c, ctx));
    // No action (None, or a bad id already recorded): nothing to carry.
    if (d.action != uint8_t(ProxyAction::None)) push(coop, d, alreadyReleased);
  }
  // The barrier's rail round: add 1 to word `id` (past the user's signals).
  GIN_HD void barrierSignal(uint32_t id) const {
    push(CoopThread{}, desc(ProxyOp::Signal, Action{RemoteOp::Add, id, 1, kNoCounter}),
         Scope::Thread);  // a barrier releases
  }
  // Wait until the host has consumed every descriptor claimed on this context
  // so far (by any coop: one counter per ring is cheaper than per-coop
  // bookkeeping, and the promise is stronger). Op::ProxyFlush on timeout.
  template <class Coop>
  GIN_HD bool flush(Coop coop, MemoryOrder order, bool ok) const {
    if (c.proxyRings != nullptr && ctx >= 0) {
      if (coop.rank() == 0) ok = ok && waitConsumed(c, ctx, order);
      ok = coop.syncAll(ok);
    }
    return ok;
  }
  GIN_HD void progress() const {}

 private:
  // The lsa index of a proxy peer whose window this rank stores into itself
  // (DevComm::proxyLsaStores), else -1.
  GIN_HD int storeIndex() const { return c.proxyLsaStores != 0 ? lsaIndexOf(c, peer) : -1; }
  GIN_HD ProxyDesc desc(ProxyOp op, const Action& a) const {
    ProxyDesc d{};
    d.op = uint8_t(op);
    d.peer = peer;
    d.action = uint8_t(a.remote);
    d.signalId = a.signal;
    d.signalValue = a.value;
    d.counterId = a.counter;
    return d;
  }
  // After the producers stored a put's payload themselves: its actions alone,
  // as one descriptor (the push's system-scope release orders the coop's
  // stores before the engine's signal). Nothing to push without actions.
  template <class Coop, class Acts>
  GIN_HD void pushActions(Coop coop, const Acts& acts) const {
    if constexpr (Acts::kAny) {
      const ProxyDesc d = desc(ProxyOp::Signal, acts.resolve(c, ctx));
      if (d.action != uint8_t(ProxyAction::None) || d.counterId != kProxyNoCounter)
        push(coop, d, Scope::Thread);  // always: the coop's own stores are not released yet
    } else {
      (void)coop, (void)acts;
    }
  }
  template <class Coop>
  GIN_HD void push(Coop coop, const ProxyDesc& d, Scope alreadyReleased) const {
    coop.sync();
    if (coop.rank() == 0) (void)proxy::push(c, ctx, d, alreadyReleased != Scope::System);
  }
};

}  // namespace proxy
}  // namespace gin
