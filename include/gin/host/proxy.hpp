// gin/host/proxy.hpp — the proxy transport, host side: ProxyEngine, the
// threads (one by default) that pop descriptors from the context rings of one
// communicator and carry them out on a Wire (gin/host/wire.hpp; LocalWire,
// the wire for targets mapped in this process, is gin/host/local_wire.hpp).
// Includes the engine's config, window directory and wires, as it always did.
//
// Every ring has exactly one consumer thread (ring c: thread c % threads),
// which executes its descriptors in ticket order. Payloads may still be in
// flight when a put returns (GPU windows move through copy kernels of gin's
// side context, see GpuCopier); the thread calls its wire's complete() before any
// signal or counter action and before it publishes the consumer index, so
// per-(context, peer) order (payload before signal, earlier puts before later
// signals) holds and a flushed source may be reused. A descriptor the engine cannot carry out
// (unknown window, range past its end, bad signal or counter id) writes
// nothing: it is recorded in the device error record as Op::BadArgument and
// skipped.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gin/core/atomic.hpp"
#include "gin/core/clock.hpp"
#include "gin/core/error.hpp"
#include "gin/device/comm.hpp"
#include "gin/device/transport/proxy.hpp"
#include "gin/host/idle.hpp"
#include "gin/host/local_wire.hpp"
#include "gin/host/memory.hpp"
#include "gin/host/proxy_config.hpp"
#include "gin/host/side_context.hpp"
#include "gin/host/window_directory.hpp"
#include "gin/host/wire.hpp"

namespace gin {

namespace test {
struct PauseAccess;  // gin/host/test_access.hpp
}

// What differs when the producers are GPUs: the ticket counters live in
// device memory (the host reads them through `head`), the engine thread must
// bind the GPU (`threadInit`), failures are recorded through the host path
// (`fail`: the claim word and abort flag are device memory), and counters are
// advanced at their host address (`counters`). Empty members keep the CPU
// behaviour.
struct ProxyHooks {
  std::function<uint64_t(int ctx)> head;
  std::function<void()> threadInit;
  std::function<void(Op op, int peer, int ctx, uint64_t id, uint64_t expected, uint64_t observed)> fail;
  uint64_t* counters = nullptr;
};

// One communicator's proxy engine: one thread per Wire it is given (the Comm
// gives one per ProxyConfig::threads), ring c consumed by thread c % threads
// only. It owns nothing it polls: the rings, the directory and the wires
// belong to the Comm, which destroys the engine first.
class ProxyEngine {
 public:
  // A context ring as the host sees it (host addresses).
  struct Ring {
    ProxySlot* slots;
    uint64_t* consumed;
    const uint64_t* head;
    uint32_t nSlots;
  };

  // `dev` is the rank's DevComm (counters, error record, sizes); the engine
  // keeps a copy. nSignalWords: signal words a remote action may name.
  // wires: one per thread, 1 to rings.size() of them; wires[t] is used by
  // thread t only.
  ProxyEngine(const DevComm& dev, std::vector<Ring> rings, std::vector<Wire*> wires, WindowDirectory& dir,
              uint32_t nSignalWords, ProxyConfig cfg, ProxyHooks hooks = {})
      : dev_(dev),
        rings_(std::move(rings)),
        dir_(dir),
        nSignalWords_(nSignalWords),
        cfg_(cfg),
        hooks_(std::move(hooks)),
        counters_(hooks_.counters ? hooks_.counters : dev_.counters) {
    if (wires.empty() || wires.size() > std::max<size_t>(rings_.size(), 1))
      throw Error("ProxyEngine: " + std::to_string(wires.size()) + " wires (threads) for " +
                  std::to_string(rings_.size()) + " rings; give 1 to " + std::to_string(rings_.size()));
    for (size_t t = 0; t < wires.size(); ++t) {
      workers_.push_back(std::make_unique<Worker>());
      workers_.back()->wire = wires[t];
    }
    for (size_t c = 0; c < rings_.size(); ++c) workers_[c % wires.size()]->rings.push_back({c, 0});
    try {
      for (auto& w : workers_) w->thread = std::thread([this, p = w.get()] { run(*p); });
    } catch (...) {
      stopAndJoin();
      throw;
    }
  }
  // One thread, one wire.
  ProxyEngine(const DevComm& dev, std::vector<Ring> rings, Wire& wire, WindowDirectory& dir, uint32_t nSignalWords,
              ProxyConfig cfg, ProxyHooks hooks = {})
      : ProxyEngine(dev, std::move(rings), std::vector<Wire*>{&wire}, dir, nSignalWords, cfg, std::move(hooks)) {}
  // Drains what is published, then joins.
  ~ProxyEngine() { stopAndJoin(); }
  ProxyEngine(const ProxyEngine&) = delete;
  ProxyEngine& operator=(const ProxyEngine&) = delete;

  // False once any thread has stopped (after a failure all of them do).
  bool running() const { return exited_.load(std::memory_order_acquire) == 0; }
  int threadCount() const { return int(workers_.size()); }
  // Engine thread i (for inspecting its CPU affinity).
  std::thread::native_handle_type nativeHandle(int i = 0) { return workers_.at(size_t(i))->thread.native_handle(); }
  uint64_t executed() const { return sum(&Worker::executed); }
  uint64_t rejected() const { return sum(&Worker::rejected); }

  // Wait until every ticket claimed so far on every ring has been consumed,
  // at most timeoutNs. False on timeout (or a stopped engine with work left).
  bool quiesce(uint64_t timeoutNs) const {
    const uint64_t start = nowNs();
    for (size_t i = 0; i < rings_.size(); ++i) {
      const Ring& r = rings_[i];
      const uint64_t target = hooks_.head ? hooks_.head(int(i)) : atomicLoad(r.head, MemoryOrder::Relaxed);
      while (!rollingLessEqual(target, atomicLoad(r.consumed, MemoryOrder::Acquire))) {
        if (nowNs() - start > timeoutNs || !running()) return false;
        std::this_thread::yield();
      }
    }
    return true;
  }

 private:
  friend struct test::PauseAccess;

  // Test hook (test::PauseAccess): a paused engine consumes nothing (so
  // producers see a full ring and flush times out) until resumed. Stopping
  // drains even when paused. pause(true) returns once every thread has parked,
  // so nothing pushed after it returns is consumed: a thread may be in the
  // middle of a pass when the flag goes up, and only a park that starts after
  // it proves the pass is over.
  void pause(bool p) {
    std::vector<uint64_t> seen;
    for (auto& w : workers_) seen.push_back(w->parks.load(std::memory_order_acquire));
    paused_.store(p, std::memory_order_seq_cst);
    if (!p) return;
    for (size_t t = 0; t < workers_.size(); ++t)
      while (workers_[t]->parks.load(std::memory_order_acquire) == seen[t] &&
             !workers_[t]->done.load(std::memory_order_acquire))
        std::this_thread::yield();
  }

  struct RingState {
    size_t index;
    uint64_t next;  // next ticket to consume
  };
  // One thread and what only it touches; counters on lines of their own.
  struct alignas(64) Worker {
    std::thread thread;
    Wire* wire = nullptr;
    std::vector<RingState> rings;
    alignas(64) std::atomic<uint64_t> executed{0}, rejected{0}, parks{0};
    std::atomic<bool> done{false};
  };

  DevComm dev_;
  std::vector<Ring> rings_;
  WindowDirectory& dir_;
  uint32_t nSignalWords_;
  ProxyConfig cfg_;
  ProxyHooks hooks_;
  uint64_t* counters_;
  std::atomic<bool> stop_{false}, paused_{false}, failed_{false};
  std::atomic<int> exited_{0};
  std::vector<std::unique_ptr<Worker>> workers_;

  void stopAndJoin() {
    stop_.store(true, std::memory_order_release);
    for (auto& w : workers_)
      if (w->thread.joinable()) w->thread.join();
  }

  uint64_t sum(std::atomic<uint64_t> Worker::*m) const {
    uint64_t n = 0;
    for (auto& w : workers_) n += ((*w).*m).load(std::memory_order_relaxed);
    return n;
  }

  void run(Worker& w) {
    try {
      if (hooks_.threadInit) hooks_.threadInit();
      detail::IdleBackoff idle(cfg_.spinPolls, cfg_.yieldPolls, cfg_.sleepUs);
      for (;;) {
        // Another thread died: its rings are stuck and the error record has
        // stopped every wait, so this one stops too rather than carry on alone.
        if (failed_.load(std::memory_order_acquire)) break;
        const bool stopping = stop_.load(std::memory_order_acquire);
        if (!stopping && detail::parkIfPaused(paused_, w.parks)) continue;
        size_t did = 0;
        {
          auto lk = dir_.engineLock();
          for (RingState& r : w.rings) did += drain(w, r);
        }
        if (did) {
          idle.busy();
          continue;
        }
        if (stopping) break;  // nothing published is left
        idle.wait();
      }
    } catch (const std::exception& e) {
      // Nothing may escape a thread; the record makes every wait stop and
      // Comm::check() throw.
      failed_.store(true, std::memory_order_release);
      std::fprintf(stderr, "gin: rank %d: proxy engine thread %zu stopped: %s\n", dev_.rank, threadIndex(w), e.what());
      fail(Op::ProxyEngine, -1, -1, 0, 0, 0);
    }
    exited_.fetch_add(1, std::memory_order_acq_rel);
    w.done.store(true, std::memory_order_release);
  }

  size_t threadIndex(const Worker& w) const {
    for (size_t t = 0; t < workers_.size(); ++t)
      if (workers_[t].get() == &w) return t;
    return 0;
  }

  // Up to `batch` published descriptors of one ring, then one release of the
  // consumer index once everything they started is complete: a producer that
  // sees it may overwrite the slots and reuse the sources.
  size_t drain(Worker& w, RingState& rs) {
    Ring& r = rings_[rs.index];
    const int ctx = int(rs.index);
    size_t did = 0;
    while (did < cfg_.batch) {
      // The producer does not touch the slot again until `consumed` passes it.
      ProxyDesc d;
      if (!proxyUnpack(r.slots + (rs.next & (r.nSlots - 1)), rs.next, &d)) break;
      execute(w, ctx, d);
      ++rs.next;
      ++did;
    }
    if (did) {
      w.wire->complete();
      atomicStore(r.consumed, rs.next, MemoryOrder::Release);
    }
    return did;
  }

  void fail(Op op, int peer, int ctx, uint64_t id, uint64_t expected, uint64_t observed) {
    if (hooks_.fail)
      hooks_.fail(op, peer, ctx, id, expected, observed);
    else
      recordError(dev_, op, peer, ctx, id, expected, observed);
  }

  void reject(Worker& w, int ctx, const ProxyDesc& d, uint64_t id, uint64_t value, uint64_t limit) {
    w.rejected.fetch_add(1, std::memory_order_relaxed);
    fail(Op::BadArgument, d.peer, ctx, id, value, limit);
  }

  // Validate everything first, so a rejected descriptor writes nothing.
  void execute(Worker& w, int ctx, const ProxyDesc& d) {
    if (d.peer < 0 || d.peer >= dev_.nRanks) return reject(w, ctx, d, uint64_t(d.peer), uint64_t(d.peer), dev_.nRanks);
    const auto action = ProxyAction(d.action);
    if (action != ProxyAction::None) {
      if (action != ProxyAction::Add && action != ProxyAction::Set)
        return reject(w, ctx, d, d.signalId, d.action, uint64_t(ProxyAction::Set));
      if (d.signalId >= nSignalWords_) return reject(w, ctx, d, d.signalId, d.signalId, nSignalWords_);
    }
    if (d.counterId != kProxyNoCounter && d.counterId >= uint32_t(dev_.nCounters))
      return reject(w, ctx, d, d.counterId, d.counterId, uint64_t(dev_.nCounters));
    Wire& wire = *w.wire;
    WireReject why;
    switch (ProxyOp(d.op)) {
      case ProxyOp::Put: {
        const WindowDirectory::Entry* src = dir_.find(d.srcWindow);
        if (!src) return reject(w, ctx, d, d.srcWindow, d.srcOffset, 0);
        if (d.srcOffset > src->bytes || d.bytes > src->bytes - d.srcOffset)
          return reject(w, ctx, d, d.srcWindow, d.srcOffset + d.bytes, src->bytes);
        if (!wire.put(d.peer, d.dstWindow, d.dstOffset, src->local + d.srcOffset, d.bytes, &why))
          return reject(w, ctx, d, why.id, why.value, why.limit);
        break;
      }
      case ProxyOp::PutValue: {
        if (d.bytes < 1 || d.bytes > 8) return reject(w, ctx, d, d.dstWindow, d.bytes, 8);
        unsigned char v[8];
        for (size_t i = 0; i < 8; ++i) v[i] = static_cast<unsigned char>(d.srcOffset >> (8 * i));
        if (!wire.putInline(d.peer, d.dstWindow, d.dstOffset, v, d.bytes, &why))
          return reject(w, ctx, d, why.id, why.value, why.limit);
        break;
      }
      case ProxyOp::Signal:
        // Actions alone; a counter alone is a put whose payload the producer
        // stored itself (DevComm::proxyLsaStores).
        if (action == ProxyAction::None && d.counterId == kProxyNoCounter)
          return reject(w, ctx, d, d.signalId, d.action, uint64_t(ProxyAction::Set));
        break;
      default: return reject(w, ctx, d, d.op, d.op, uint64_t(ProxyOp::Signal));
    }
    // The payload (and every earlier one of this thread) lands before the
    // signal, and the source has been read before the counter moves.
    if (action != ProxyAction::None || d.counterId != kProxyNoCounter) wire.complete();
    if (action != ProxyAction::None && !wire.signal(d.peer, d.signalId, action, d.signalValue, &why))
      return reject(w, ctx, d, why.id, why.value, why.limit);
    if (d.counterId != kProxyNoCounter) atomicAdd<Scope::System>(counters_ + d.counterId, 1, MemoryOrder::Release);
    w.executed.fetch_add(1, std::memory_order_relaxed);
  }
};

}  // namespace gin
