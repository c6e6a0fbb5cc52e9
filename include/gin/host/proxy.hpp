// gin/host/proxy.hpp — the proxy transport, host side: ProxyEngine, a thread
// that pops descriptors from every context ring of one communicator and carries
// them out on a Wire, and LocalWire, the wire for targets mapped in this
// process.
//
// Phase 1: CPU ranks only. The engine executes a ring's descriptors in ticket
// order, one at a time, so per-(context, peer) order (payload before signal,
// earlier puts before later signals) holds by construction. A descriptor the
// engine cannot carry out (unknown window, range past its end, bad signal or
// counter id) writes nothing: it is recorded in the device error record as
// Op::BadArgument and skipped.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gin/core/atomic.hpp"
#include "gin/core/clock.hpp"
#include "gin/core/error.hpp"
#include "gin/device/comm.hpp"
#include "gin/device/transport/proxy.hpp"

namespace gin {

// Which wire carries proxy operations to a peer (CommConfig::proxy.wire;
// GIN_PROXY_WIRE=auto|local|tcp overrides). Auto: local for peers whose
// memory is mapped in this process (the lsa team), tcp for the others. Local:
// only mapped peers (ranks on other hosts are an error). Tcp: every other
// rank over sockets (a rank reaches itself by a copy). gin/host/tcp_wire.hpp.
enum class ProxyWire : uint8_t { Auto = 0, Local = 1, Tcp = 2 };

// Engine knobs (CommConfig::proxy). The defaults favour latency while busy and
// give the core back within ~a millisecond of going idle, which matters when
// CPU ranks and their engines outnumber the cores.
struct ProxyConfig {
  uint32_t ringSlots = 1024;  // descriptors per context ring; a power of two >= 2
  uint32_t spinPolls = 2048;  // idle passes spent spinning (pause instruction) ...
  uint32_t yieldPolls = 256;  // ... then yielding the core ...
  uint32_t sleepUs = 50;      // ... then sleeping this long between passes
  uint32_t batch = 64;        // descriptors taken from one ring before looking at the next (fairness)
  ProxyWire wire = ProxyWire::Auto;
};

// The windows of a communicator by id: what the engine resolves descriptor
// window ids against. The Comm adds and removes entries; the engine holds the
// mutex while it executes a batch, so a window never disappears under a copy.
// Network receivers (the tcp wire's thread) look windows up under
// receiveMutex() instead: the engine may block in a send while it holds
// mutex(), and a receiver waiting for that mutex would stop draining the
// socket its peer's engine is blocked on (a cycle). add/remove take both.
class WindowDirectory {
 public:
  struct Entry {
    uint64_t bytes = 0;
    char* local = nullptr;        // this rank's buffer
    std::vector<char*> lsaBases;  // [lsaSize] every lsa member's buffer, mapped here
  };
  void add(uint32_t id, Entry e) {
    std::scoped_lock lk(mu_, rxMu_);
    map_[id] = std::move(e);
  }
  void remove(uint32_t id) {
    std::scoped_lock lk(mu_, rxMu_);
    map_.erase(id);
  }
  std::mutex& mutex() { return mu_; }
  std::mutex& receiveMutex() { return rxMu_; }
  // Caller holds mutex() or receiveMutex().
  const Entry* find(uint32_t id) const {
    auto it = map_.find(id);
    return it == map_.end() ? nullptr : &it->second;
  }

 private:
  std::mutex mu_, rxMu_;
  std::map<uint32_t, Entry> map_;
};

// Why a wire refused an operation, in the error record's terms.
struct WireReject {
  uint64_t id = 0, value = 0, limit = 0;
};

// Where the bytes go: LocalWire below, TcpWire (gin/host/tcp_wire.hpp); verbs
// later. Both calls validate first and write nothing when they return false.
// The engine calls them from its thread with the directory's mutex() held;
// when put returns, the source has been consumed (the engine then counts a
// CounterInc).
class Wire {
 public:
  virtual ~Wire() = default;
  virtual bool put(int peer, uint32_t dstWindow, uint64_t dstOffset, const void* src, uint64_t bytes,
                   WireReject* why) = 0;
  virtual bool signal(int peer, uint32_t id, ProxyAction op, uint64_t value, WireReject* why) = 0;
};

// Targets mapped in this process: the lsa mappings the Comm already made (peer
// windows through the directory, peer signal arrays). A copy, then a release
// atomic on the peer's signal word: the signal cannot overtake the payload.
class LocalWire final : public Wire {
 public:
  LocalWire(const WindowDirectory& dir, int lsaBase, std::vector<uint64_t*> peerSignals, uint32_t nSignalWords)
      : dir_(dir), lsaBase_(lsaBase), signals_(std::move(peerSignals)), nSignalWords_(nSignalWords) {}

  bool put(int peer, uint32_t dstWindow, uint64_t dstOffset, const void* src, uint64_t bytes,
           WireReject* why) override {
    const int li = peer - lsaBase_;
    if (li < 0 || li >= int(signals_.size())) return reject(why, uint64_t(peer), uint64_t(peer), signals_.size());
    const WindowDirectory::Entry* e = dir_.find(dstWindow);
    if (!e) return reject(why, dstWindow, dstOffset, 0);
    if (dstOffset > e->bytes || bytes > e->bytes - dstOffset)
      return reject(why, dstWindow, dstOffset + bytes, e->bytes);
    if (bytes) std::memcpy(e->lsaBases[size_t(li)] + dstOffset, src, size_t(bytes));
    return true;
  }

  bool signal(int peer, uint32_t id, ProxyAction op, uint64_t value, WireReject* why) override {
    const int li = peer - lsaBase_;
    if (li < 0 || li >= int(signals_.size())) return reject(why, uint64_t(peer), uint64_t(peer), signals_.size());
    if (id >= nSignalWords_) return reject(why, id, id, nSignalWords_);
    uint64_t* w = signals_[size_t(li)] + id;
    if (op == ProxyAction::Add)
      atomicAdd<Scope::System>(w, value, MemoryOrder::Release);
    else if (op == ProxyAction::Set)
      atomicStore<Scope::System>(w, value, MemoryOrder::Release);
    else
      return reject(why, id, uint64_t(op), uint64_t(ProxyAction::Set));
    return true;
  }

 private:
  const WindowDirectory& dir_;
  int lsaBase_;
  std::vector<uint64_t*> signals_;
  uint32_t nSignalWords_;
  static bool reject(WireReject* why, uint64_t id, uint64_t value, uint64_t limit) {
    if (why) *why = WireReject{id, value, limit};
    return false;
  }
};

// One communicator's proxy thread. It owns nothing it polls: the rings, the
// directory and the wire belong to the Comm, which destroys the engine first.
class ProxyEngine {
 public:
  // A context ring as the host sees it (host addresses).
  struct Ring {
    ProxyDesc* slots;
    uint64_t* consumed;
    const uint64_t* head;
    uint32_t nSlots;
  };

  // `dev` is the rank's DevComm (counters, error record, sizes); the engine
  // keeps a copy. nSignalWords: signal words a remote action may name.
  ProxyEngine(const DevComm& dev, std::vector<Ring> rings, Wire& wire, WindowDirectory& dir, uint32_t nSignalWords,
              ProxyConfig cfg)
      : dev_(dev),
        rings_(std::move(rings)),
        next_(rings_.size(), 0),
        wire_(wire),
        dir_(dir),
        nSignalWords_(nSignalWords),
        cfg_(cfg) {
    thread_ = std::thread([this] { run(); });
  }
  // Drains what is published, then joins.
  ~ProxyEngine() {
    stop_.store(true, std::memory_order_release);
    if (thread_.joinable()) thread_.join();
  }
  ProxyEngine(const ProxyEngine&) = delete;
  ProxyEngine& operator=(const ProxyEngine&) = delete;

  // Test hook: a paused engine consumes nothing (so producers see a full ring
  // and flush times out) until resumed. Stopping drains even when paused.
  // pause(true) returns once the engine has parked, so nothing pushed after
  // it returns is consumed: the engine may be in the middle of a pass when
  // the flag goes up, and only a park that starts after it proves the pass
  // is over.
  void pause(bool p) {
    const uint64_t seen = parks_.load(std::memory_order_acquire);
    paused_.store(p, std::memory_order_seq_cst);
    if (!p) return;
    while (parks_.load(std::memory_order_acquire) == seen && !done_.load(std::memory_order_acquire))
      std::this_thread::yield();
  }
  bool running() const { return !done_.load(std::memory_order_acquire); }
  uint64_t executed() const { return executed_.load(std::memory_order_relaxed); }
  uint64_t rejected() const { return rejected_.load(std::memory_order_relaxed); }

  // Wait until every ticket claimed so far on every ring has been consumed,
  // at most timeoutNs. False on timeout (or a stopped engine with work left).
  bool quiesce(uint64_t timeoutNs) const {
    const uint64_t start = nowNs();
    for (const Ring& r : rings_) {
      const uint64_t target = atomicLoad(r.head, MemoryOrder::Relaxed);
      while (!rollingLessEqual(target, atomicLoad(r.consumed, MemoryOrder::Acquire))) {
        if (nowNs() - start > timeoutNs || done_.load(std::memory_order_acquire)) return false;
        std::this_thread::yield();
      }
    }
    return true;
  }

 private:
  DevComm dev_;
  std::vector<Ring> rings_;
  std::vector<uint64_t> next_;  // per ring: next ticket to consume (only the engine thread touches it)
  Wire& wire_;
  WindowDirectory& dir_;
  uint32_t nSignalWords_;
  ProxyConfig cfg_;
  std::atomic<bool> stop_{false}, paused_{false}, done_{false};
  std::atomic<uint64_t> executed_{0}, rejected_{0}, parks_{0};
  std::thread thread_;

  void run() {
    try {
      uint64_t idle = 0;
      for (;;) {
        const bool stopping = stop_.load(std::memory_order_acquire);
        if (!stopping && paused_.load(std::memory_order_seq_cst)) {
          parks_.fetch_add(1, std::memory_order_release);
          std::this_thread::sleep_for(std::chrono::microseconds(100));
          continue;
        }
        size_t did = 0;
        {
          std::lock_guard<std::mutex> lk(dir_.mutex());
          for (size_t i = 0; i < rings_.size(); ++i) did += drain(int(i));
        }
        if (did) {
          idle = 0;
          continue;
        }
        if (stopping) break;  // nothing published is left
        ++idle;
        if (idle <= cfg_.spinPolls)
          spinPause();
        else if (idle <= uint64_t(cfg_.spinPolls) + cfg_.yieldPolls)
          std::this_thread::yield();
        else
          std::this_thread::sleep_for(std::chrono::microseconds(cfg_.sleepUs));
      }
    } catch (const std::exception& e) {
      // Nothing may escape a thread; the record makes every wait stop and
      // Comm::check() throw.
      std::fprintf(stderr, "gin: rank %d: proxy engine stopped: %s\n", dev_.rank, e.what());
      recordError(dev_, Op::ProxyEngine, -1, -1, 0, 0, 0);
    }
    done_.store(true, std::memory_order_release);
  }

  size_t drain(int ctx) {
    Ring& r = rings_[size_t(ctx)];
    uint64_t& next = next_[size_t(ctx)];
    size_t did = 0;
    while (did < cfg_.batch) {
      ProxyDesc* s = r.slots + (next & (r.nSlots - 1));
      if (atomicLoad(&s->seq, MemoryOrder::Acquire) != next + 1) break;
      const ProxyDesc d = *s;  // the producer does not touch the slot until `consumed` passes it
      execute(ctx, d);
      ++next;
      atomicStore(r.consumed, next, MemoryOrder::Release);
      ++did;
    }
    return did;
  }

  void reject(int ctx, const ProxyDesc& d, uint64_t id, uint64_t value, uint64_t limit) {
    rejected_.fetch_add(1, std::memory_order_relaxed);
    recordError(dev_, Op::BadArgument, d.peer, ctx, id, value, limit);
  }

  // Validate everything first, so a rejected descriptor writes nothing.
  void execute(int ctx, const ProxyDesc& d) {
    if (d.peer < 0 || d.peer >= dev_.nRanks) return reject(ctx, d, uint64_t(d.peer), uint64_t(d.peer), dev_.nRanks);
    const auto action = ProxyAction(d.action);
    if (action != ProxyAction::None) {
      if (action != ProxyAction::Add && action != ProxyAction::Set)
        return reject(ctx, d, d.signalId, d.action, uint64_t(ProxyAction::Set));
      if (d.signalId >= nSignalWords_) return reject(ctx, d, d.signalId, d.signalId, nSignalWords_);
    }
    if (d.counterId != kProxyNoCounter && d.counterId >= uint32_t(dev_.nCounters))
      return reject(ctx, d, d.counterId, d.counterId, uint64_t(dev_.nCounters));
    WireReject why;
    switch (ProxyOp(d.op)) {
      case ProxyOp::Put: {
        const WindowDirectory::Entry* src = dir_.find(d.srcWindow);
        if (!src) return reject(ctx, d, d.srcWindow, d.srcOffset, 0);
        if (d.srcOffset > src->bytes || d.bytes > src->bytes - d.srcOffset)
          return reject(ctx, d, d.srcWindow, d.srcOffset + d.bytes, src->bytes);
        if (!wire_.put(d.peer, d.dstWindow, d.dstOffset, src->local + d.srcOffset, d.bytes, &why))
          return reject(ctx, d, why.id, why.value, why.limit);
        break;
      }
      case ProxyOp::PutValue: {
        if (d.bytes < 1 || d.bytes > 8) return reject(ctx, d, d.dstWindow, d.bytes, 8);
        unsigned char v[8];
        for (size_t i = 0; i < 8; ++i) v[i] = static_cast<unsigned char>(d.srcOffset >> (8 * i));
        if (!wire_.put(d.peer, d.dstWindow, d.dstOffset, v, d.bytes, &why))
          return reject(ctx, d, why.id, why.value, why.limit);
        break;
      }
      case ProxyOp::Signal:
        if (action == ProxyAction::None) return reject(ctx, d, d.signalId, d.action, uint64_t(ProxyAction::Set));
        break;
      default: return reject(ctx, d, d.op, d.op, uint64_t(ProxyOp::Signal));
    }
    if (action != ProxyAction::None && !wire_.signal(d.peer, d.signalId, action, d.signalValue, &why))
      return reject(ctx, d, why.id, why.value, why.limit);
    // Local completion: the source has been read (the local wire copied it).
    if (d.counterId != kProxyNoCounter) atomicAdd<Scope::System>(dev_.counters + d.counterId, 1, MemoryOrder::Release);
    executed_.fetch_add(1, std::memory_order_relaxed);
  }
};

}  // namespace gin
