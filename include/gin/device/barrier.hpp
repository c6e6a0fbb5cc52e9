// gin/device/barrier.hpp — barrier sessions a kernel opens on one barrier index.
//
//   { gin::LsaBarrierSession<gin::CoopBlock> bar(gin::CoopBlock{}, devComm, blockIdx.x);
//     bar.sync(gin::CoopBlock{}); }
//
// Each index is an independent barrier (for example one per CTA, up to
// CommConfig::nBarriers); two live sessions must not share an index. A session
// cannot be copied. arrive() releases the coop's earlier writes to the peers;
// wait() returns once every peer has arrived at the same episode and acquires
// their writes; sync() is arrive()+wait(). Waits are bounded: a peer that never
// arrives is named in the error record (op lsaBarrier/worldBarrier, id = index,
// expected = episode, observed = the peer's last episode).
//
// lsa: each member stores its episode number into every peer's inbox slot
// (one store per peer, no atomics), and polls its own inbox row.
// world: lsa barrier, then (across nodes) signals to the rail peers, then lsa
// barrier again, so one node's ranks all know the other nodes arrived.
#pragma once

#include "gin/device/net.hpp"

namespace gin {

template <class Coop>
class LsaBarrierSession {
 public:
  GIN_HD LsaBarrierSession(Coop coop, const DevComm& comm, uint32_t index)
      : LsaBarrierSession(coop, comm, index, index, Op::LsaBarrier) {}
  GIN_HD ~LsaBarrierSession() {
    // Every thread stores the same value, so no thread can read a stale epoch
    // when the coop opens the next session on this index.
    if (valid_) volatileStore(c_.lsaEpochs + row_, epoch_);
  }
  LsaBarrierSession(const LsaBarrierSession&) = delete;
  LsaBarrierSession& operator=(const LsaBarrierSession&) = delete;

  GIN_HD void arrive(Coop coop, MemoryOrder order = MemoryOrder::Release) {
    if (!valid_) return;
    coop.sync();  // the coop's writes happen before any thread announces
    epoch_ += 1;
    const MemoryOrder o =
        (order == MemoryOrder::Relaxed || order == MemoryOrder::Acquire) ? MemoryOrder::Relaxed : MemoryOrder::Release;
    const int n = c_.lsaSize, me = c_.lsaRank;
    for (int i = coop.rank(); i < n; i += coop.size())
      if (i != me) atomicStore<Scope::System>(lsaInboxOf(c_, i) + size_t(row_) * c_.lsaInboxRowWords + me, epoch_, o);
  }

  GIN_HD bool wait(Coop coop, MemoryOrder order = MemoryOrder::Acquire) {
    if (!valid_) return false;
    const MemoryOrder o =
        (order == MemoryOrder::Relaxed || order == MemoryOrder::Release) ? MemoryOrder::Relaxed : MemoryOrder::Acquire;
    const int n = c_.lsaSize, me = c_.lsaRank;
    const uint64_t* row = c_.lsaInbox + size_t(row_) * c_.lsaInboxRowWords;
    bool ok = true;
    for (int i = coop.rank(); i < n; i += coop.size()) {
      if (i == me) continue;
      const uint64_t want = epoch_;
      ok &= detail::boundedWait(
          c_, row + i, o, [&](uint64_t v) { return rollingLessEqual(want, v); },
          detail::WaitWhat{op_, c_.rank - me + i, -1, index_, want});
      if (!ok) break;
    }
    return coop.syncAll(ok);
  }

  GIN_HD bool sync(Coop coop, MemoryOrder order = MemoryOrder::AcqRel) {
    arrive(coop, order);
    return wait(coop, order);
  }

 private:
  template <class, unsigned>
  friend class BarrierSession;
  const DevComm& c_;
  uint32_t index_, row_;
  uint64_t epoch_ = 0;
  Op op_;
  bool valid_;

  GIN_HD LsaBarrierSession(Coop, const DevComm& comm, uint32_t index, uint32_t row, Op op)
      : c_(comm), index_(index), row_(row), op_(op), valid_(index < uint32_t(comm.nBarriers)) {
    if (valid_)
      epoch_ = volatileLoad(c_.lsaEpochs + row_);
    else
      recordError(comm, Op::BadArgument, -1, -1, index, index, uint64_t(comm.nBarriers));
  }
};

// A barrier over every rank of the communicator. Backends: the transports
// its rail round may take, as for Net<Backends> (default all, declared in
// net.hpp); that round goes over lsa or the proxy, never ibgda.
template <class Coop, unsigned Backends>
class BarrierSession {
 public:
  GIN_HD BarrierSession(Coop coop, const DevComm& comm, uint32_t index)
      : lsa_(coop, comm, index, uint32_t(comm.nBarriers) + index, Op::WorldBarrier), c_(comm), index_(index) {
    if (lsa_.valid_ && comm.railSize > 1) railEpoch_ = volatileLoad(comm.railEpochs + index);
  }
  GIN_HD ~BarrierSession() {
    if (lsa_.valid_ && c_.railSize > 1) volatileStore(c_.railEpochs + index_, railEpoch_);
  }
  BarrierSession(const BarrierSession&) = delete;
  BarrierSession& operator=(const BarrierSession&) = delete;

  GIN_HD void arrive(Coop coop, MemoryOrder order = MemoryOrder::Release) {
    if (c_.railSize <= 1) return lsa_.arrive(coop, order);
    // Across nodes: the node gathers first, then each rank tells its rail peers.
    if (!lsa_.sync(coop, MemoryOrder::AcqRel)) return;
    railEpoch_ += 1;
    Net<Backends> net(c_, 0);
    const Team rail = teamRail(c_);
    for (int i = coop.rank(); i < rail.nRanks; i += coop.size())
      if (i != rail.rank) net.barrierSignal(rail, i, index_);
  }

  GIN_HD bool wait(Coop coop, MemoryOrder order = MemoryOrder::Acquire) {
    if (c_.railSize <= 1) return lsa_.wait(coop, order);
    bool ok = true;
    if (coop.rank() == 0) {
      uint64_t* sig = c_.signals + c_.nSignals + index_;
      const uint64_t want = railEpoch_ * uint64_t(c_.railSize - 1);
      ok = detail::boundedWait(
          c_, sig, MemoryOrder::Acquire, [&](uint64_t v) { return rollingLessEqual(want, v); },
          detail::WaitWhat{Op::RailBarrier, -1, -1, index_, want});
    }
    ok = coop.syncAll(ok);
    // Second lsa round: nobody on this node leaves before all rail peers arrived.
    return lsa_.sync(coop, order) && ok;
  }

  GIN_HD bool sync(Coop coop, MemoryOrder order = MemoryOrder::AcqRel) {
    arrive(coop, order);
    return wait(coop, order);
  }

 private:
  LsaBarrierSession<Coop> lsa_;
  const DevComm& c_;
  uint32_t index_;
  uint64_t railEpoch_ = 0;
};

}  // namespace gin
