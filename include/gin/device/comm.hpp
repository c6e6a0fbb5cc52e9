// gin/device/comm.hpp — DevComm, the communicator as a kernel sees it.
//
// Trivially copyable: pass it to kernels by value. Every pointer in it points
// to memory the executing agent can dereference (device or mapped memory on a
// GPU, ordinary or shared memory on CPU ranks). Built by gin::Comm on the host.
#pragma once

#include <type_traits>

#include "gin/core/atomic.hpp"
#include "gin/core/clock.hpp"
#include "gin/core/error.hpp"

#if !GIN_DEVICE_CODE
#include <thread>
#endif

namespace gin {

// How a peer is reached; one per world rank in DevComm::peerTransport.
enum class Transport : uint8_t { None = 0, Lsa = 1, Proxy = 2, Ibgda = 4 };

struct ProxyRingDev;  // gin/device/transport/proxy.hpp
struct IbgdaDev;      // gin/device/transport/ibgda.hpp

struct DevComm {
  int32_t rank = 0, nRanks = 0;
  // lsa team: world ranks [rank - lsaRank, rank - lsaRank + lsaSize) reach each
  // other by load/store. rail team: the ranks with this lsaRank on every node
  // (stride lsaSize); railRank is this rank's node index.
  int32_t lsaRank = 0, lsaSize = 0;
  int32_t railRank = 0, railSize = 0;
  int32_t nContexts = 0, nSignals = 0, nCounters = 0, nBarriers = 0;
  uint64_t timeoutNs = 0;  // 0: waits never give up

  const uint8_t* peerTransport = nullptr;    // [nRanks] gin::Transport
  const ProxyRingDev* proxyRings = nullptr;  // [nContexts]; nullptr when no peer uses proxy

  // Signals: remote arrival counts, in memory every lsa peer has mapped.
  uint64_t* signals = nullptr;            // [nSignals + nBarriers] this rank's
  uint64_t* const* lsaSignals = nullptr;  // [lsaSize] each lsa member's `signals`
  uint64_t* signalShadows = nullptr;      // [nSignals] local only
  uint64_t* counters = nullptr;           // [nCounters * 1] local completion counts

  // Barriers: lsaInbox[row * lsaInboxRowWords + from] holds the last epoch lsa
  // member `from` announced on barrier row `row` (rows 0..nBarriers-1: lsa
  // sessions, nBarriers..2*nBarriers-1: world sessions). Rows are padded to
  // 128-byte lines so CTAs on different barrier indices never share a line.
  int32_t lsaInboxRowWords = 0;
  // 1: every peer, lsa members included, goes through the proxy (testing and
  // debugging; CommConfig::transport = Proxy). Fills the padding before lsaInbox.
  int32_t proxyAll = 0;
  uint64_t* lsaInbox = nullptr;           // [2 * nBarriers * lsaInboxRowWords] this rank's
  uint64_t* const* lsaInboxes = nullptr;  // [lsaSize] each lsa member's lsaInbox

  // The first kLsaInline entries of lsaSignals and lsaInboxes, held in the
  // DevComm itself: a kernel reads them from parameter space, so signalling an
  // lsa peer costs no dependent global load (a wait's acquire invalidates L1).
  static constexpr int kLsaInline = 8;
  uint64_t* lsaSignalsInline[kLsaInline] = {};
  uint64_t* lsaInboxesInline[kLsaInline] = {};
  uint64_t* lsaEpochs = nullptr;   // [nBarriers] local
  uint64_t* railEpochs = nullptr;  // [nBarriers] local

  // The record lives in memory the host reads while kernels run (mapped
  // pinned memory on a GPU). Only plain stores go there: PCIe does not carry
  // system-scope atomics to host memory, so the "first writer wins" claim is an
  // atomic on errorClaim, in device memory like abortFlag, which waits poll.
  DeviceErrorRecord* error = nullptr;
  uint32_t* abortFlag = nullptr;
  uint32_t* errorClaim = nullptr;
  // Raised (to the failing rank + 1) by the host when any rank of the lsa
  // team failed; host memory (shared between the team's processes, mapped
  // into the GPU), which waits read every 256 polls, so one rank's failure
  // stops every rank's waits within about a millisecond (Op::PeerFailed).
  const uint32_t* teamAbort = nullptr;

  // ibgda transport: QPs and key tables; nullptr when no peer uses it.
  const IbgdaDev* ibgda = nullptr;
  // 1: every peer, lsa members included, goes through ibgda (testing;
  // CommConfig::transport = Ibgda).
  int32_t ibgdaAll = 0;
  // 1: a put or putValue over the proxy to an lsa member is stored by the
  // producing threads themselves (the peer's window is mapped here), and only
  // its actions travel as a descriptor. GPU ranks on the local wire: the engine
  // then needs no CUDA copy, which could queue behind the kernels that wait
  // for it (docs/host-api.md, "progress"). CommConfig::proxy.producerStores.
  int32_t proxyLsaStores = 0;
};
static_assert(std::is_trivially_copyable_v<DevComm>, "DevComm must cross to the GPU by value");

// Lsa member li's signal array / barrier inbox, mapped here.
GIN_HD GIN_INLINE uint64_t* lsaSignalsOf(const DevComm& c, int li) {
  return li < DevComm::kLsaInline ? c.lsaSignalsInline[li] : loadConst(c.lsaSignals + li);
}
GIN_HD GIN_INLINE uint64_t* lsaInboxOf(const DevComm& c, int li) {
  return li < DevComm::kLsaInline ? c.lsaInboxesInline[li] : loadConst(c.lsaInboxes + li);
}

// World rank -> index in this rank's lsa team, or -1 when not load/store reachable.
GIN_HD GIN_INLINE int lsaIndexOf(const DevComm& c, int worldRank) {
  const int i = worldRank - (c.rank - c.lsaRank);
  return (i >= 0 && i < c.lsaSize) ? i : -1;
}

// Fill the error record once (first writer wins) and raise the abort flag.
// Fill a record the caller has claimed (state 1), then publish it (state 2).
GIN_HD inline void fillErrorRecord(DeviceErrorRecord& r, Op op, int rank, int peer, int context, uint64_t id,
                                   uint64_t expected, uint64_t observed) {
  r.op = uint32_t(op);
  r.rank = rank;
  r.peer = peer;
  r.context = context;
  r.objectId = id;
  r.expected = expected;
  r.observed = observed;
  atomicStore<Scope::System>(&r.state, 2u, MemoryOrder::Release);
}

GIN_HD inline void recordError(const DevComm& c, Op op, int peer, int context, uint64_t id, uint64_t expected,
                               uint64_t observed) {
  if (c.error && c.errorClaim) {
    uint32_t idle = 0;
    // The claim word is device memory; a GPU rank's host threads (engine,
    // wires) cannot take it and claim the record's state instead (host memory,
    // which GPU atomics do not reach atomically over PCIe). A record they
    // started holds the first failure: keep it.
    if (atomicCompareExchange<Scope::Device>(c.errorClaim, idle, 1u) &&
        atomicLoad<Scope::System>(&c.error->state, MemoryOrder::Acquire) == 0u) {
      atomicStore<Scope::System>(&c.error->state, 1u, MemoryOrder::Relaxed);  // host threads read it (hasError)
      fillErrorRecord(*c.error, op, c.rank, peer, context, id, expected, observed);
    }
  }
  if (c.abortFlag) atomicStore<Scope::System>(c.abortFlag, 1u, MemoryOrder::Release);
}

GIN_HD GIN_INLINE bool aborted(const DevComm& c) {
  return c.abortFlag && atomicLoad<Scope::System>(c.abortFlag, MemoryOrder::Relaxed) != 0;
}

namespace detail {
// What a bounded wait reports if it gives up.
struct WaitWhat {
  Op op;
  int peer;
  int context;
  uint64_t id;
  uint64_t expected;
};

// Whether another rank of the team failed (DevComm::teamAbort); the first
// wait of this rank to see it records Op::PeerFailed, which stops the others.
// Inline: as a call (noinline) it made every kernel with a wait save its
// registers around the call site (the AllReduce kernel's stack frame doubled,
// +3 us per small AllReduce on 2 H200s).
GIN_HD GIN_INLINE bool peerFailed(const DevComm& c, const WaitWhat& what) {
  const uint32_t v = c.teamAbort ? atomicLoad<Scope::System>(c.teamAbort, MemoryOrder::Relaxed) : 0u;
  if (v == 0) return false;
  // v - 1 == c.rank: this rank's own failure, already in its record.
  if (int(v) - 1 != c.rank)
    recordError(c, Op::PeerFailed, int(v) - 1, what.context, uint64_t(what.op), what.id, what.expected);
  return true;
}

// How often a long wait reads the team's abort word (host memory: a PCIe
// read on GPUs), and how long a wait lasts before its first read. Per
// waiting thread: tens of thousands of threads waiting at once (every thread
// of a kernel flushing) must not fill PCIe with these reads, and a wait must
// not hold one when its condition comes: 1056 warps taking turns on 16 ibgda
// QPs (waits of tens of microseconds) posted 1.2 instead of 479 million WQEs/s
// when each wait read the word after 20 us (msg-rate, H200, docs/performance.md).
inline constexpr uint64_t kTeamCheckNs = 1'000'000;

// Spin until ready(poll()) holds. The clock and the abort flag are looked at
// every 64 polls (the clock starts then too), the team's abort word once the
// wait has lasted kTeamCheckNs and then every kTeamCheckNs, so a wait that is
// already satisfied costs one poll. On timeout the error record gets `what` and the
// last value seen; on abort (another wait, or another rank, failed) it
// returns at once. Returns whether the condition was met.
template <class Poll, class Ready>
GIN_HD bool boundedPoll(const DevComm& c, Poll poll, Ready ready, const WaitWhat& what) {
  uint64_t start = 0, teamAt = 0;
  for (uint32_t spins = 1;; ++spins) {
    const uint64_t v = poll();
    if (ready(v)) return true;
    if ((spins & 63) == 0) {
      if (aborted(c)) return false;
      const uint64_t now = nowNs();
      if (start == 0) {
        start = now;
        teamAt = now + kTeamCheckNs;  // not on the path of a short wait
      }
      if (now >= teamAt) {
        if (peerFailed(c, what)) return false;
        teamAt = now + kTeamCheckNs;
      }
      if (c.timeoutNs != 0 && now - start > c.timeoutNs) {
        recordError(c, what.op, what.peer, what.context, what.id, what.expected, v);
        return false;
      }
#if !GIN_DEVICE_CODE
      // CPU ranks often outnumber cores: give the core to the rank we wait for.
      std::this_thread::yield();
#endif
    }
  }
}

// Spin until ready(*word) holds. Polls are relaxed loads; once the condition
// holds, one load with `order` (acquire by default) pairs with the writer's
// release, which is cheaper than an acquire per poll.
template <class Ready>
GIN_HD bool boundedWait(const DevComm& c, const uint64_t* word, MemoryOrder order, Ready ready, const WaitWhat& what) {
  const bool ok = boundedPoll(
      c, [&] { return atomicLoad<Scope::System>(word, MemoryOrder::Relaxed); }, ready, what);
  if (ok && order != MemoryOrder::Relaxed && order != MemoryOrder::Release)
    (void)atomicLoad<Scope::System>(word, order);
  return ok;
}
}  // namespace detail

}  // namespace gin
