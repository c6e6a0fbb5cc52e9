// gin/host/proxy.hpp — the proxy transport, host side: ProxyEngine, the
// threads (one by default) that pop descriptors from the context rings of one
// communicator and carry them out on a Wire, and LocalWire, the wire for
// targets mapped in this process.
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
#include "gin/host/memory.hpp"
#include "gin/host/side_context.hpp"

namespace gin {

// Which wire carries proxy operations to a peer (CommConfig::proxy.wire;
// GIN_PROXY_WIRE=auto|local|tcp overrides). Auto: local for peers whose
// memory is mapped in this process (the lsa team), tcp for the others. Local:
// only mapped peers (ranks on other hosts are an error). Tcp: every other
// rank over sockets (a rank reaches itself by a copy). gin/host/tcp_wire.hpp.
enum class ProxyWire : uint8_t { Auto = 0, Local = 1, Tcp = 2, Verbs = 3 };

// Engine knobs (CommConfig::proxy). The defaults favour latency while busy and
// give the core back within ~a millisecond of going idle, which matters when
// CPU ranks and their engines outnumber the cores.
struct ProxyConfig {
  uint32_t ringSlots = 1024;  // descriptors per context ring; a power of two in [2, 2^15]
  uint32_t spinPolls = detail::IdleBackoff::kSpinPolls;    // idle passes spent spinning (pause, 2048) ...
  uint32_t yieldPolls = detail::IdleBackoff::kYieldPolls;  // ... then yielding the core (256) ...
  uint32_t sleepUs = detail::IdleBackoff::kSleepUs;        // ... then sleeping this long (50 us) between passes
  uint32_t batch = 64;        // descriptors taken from one ring before looking at the next (fairness)
  // Engine threads; ring c is consumed by thread c % threads. More than the
  // number of contexts is clamped to it. GIN_PROXY_THREADS overrides.
  uint32_t threads = 1;
  // CPUs the engine threads may run on (all of them the same list), as a
  // Linux cpulist ("0-7,16"). Empty: the CPUs local to the GPU (sysfs
  // local_cpulist) on GPU ranks, no pinning on CPU ranks. GIN_PROXY_CPUS
  // overrides; "none" turns pinning off.
  std::string cpus;
  ProxyWire wire = ProxyWire::Auto;
  // Who moves a put's payload to a peer mapped in this process (the local
  // wire): the producing threads themselves, with only the actions left to
  // the engine (1), or the engine (0). -1: the producers on GPU ranks, whose
  // engine could otherwise move GPU memory only with CUDA copies, which queue
  // behind the user's spinning kernels; the engine on CPU ranks.
  // GIN_PROXY_PRODUCER_STORES=0|1 overrides.
  int producerStores = -1;
};

// A Linux cpulist ("0-3,8,10-11") as CPU numbers; throws gin::Error naming
// `what` on anything else.
inline std::vector<int> parseCpuList(const std::string& list, const std::string& what) {
  std::vector<int> cpus;
  auto bad = [&]() -> Error {
    return Error(what + "=\"" + list + "\" is not a CPU list; write it like 0-7,16 (CPU numbers and ranges)");
  };
  size_t i = 0;
  auto number = [&]() {
    if (i >= list.size() || list[i] < '0' || list[i] > '9') throw bad();
    long v = 0;
    while (i < list.size() && list[i] >= '0' && list[i] <= '9') {
      v = v * 10 + (list[i++] - '0');
      if (v > 1 << 20) throw bad();
    }
    return int(v);
  };
  while (i < list.size()) {
    const int a = number();
    int b = a;
    if (i < list.size() && list[i] == '-') {
      ++i;
      b = number();
    }
    if (b < a) throw bad();
    for (int c = a; c <= b; ++c) cpus.push_back(c);
    if (i < list.size()) {
      if (list[i] != ',' && list[i] != '\n') throw bad();
      ++i;
    }
  }
  if (cpus.empty()) throw bad();
  return cpus;
}

// The windows of a communicator by id: what the engine resolves descriptor
// window ids against. The Comm adds and removes entries; each engine thread
// holds mutex() shared (engineLock()) while it executes a batch, so a window
// never disappears under a copy and the threads do not serialise on it.
// Network receivers (the tcp wire's thread) look windows up under
// receiveMutex() instead: an engine thread may block in a send while it holds
// mutex(), and a receiver waiting for that mutex would stop draining the
// socket its peer's engine is blocked on (a cycle). add/remove take both,
// mutex() exclusively.
class WindowDirectory {
 public:
  struct Entry {
    uint64_t bytes = 0;
    char* local = nullptr;        // this rank's buffer
    std::vector<char*> lsaBases;  // [lsaSize] every lsa member's buffer, mapped here
  };
  void add(uint32_t id, Entry e) {
    Writer w(*this);
    map_[id] = std::move(e);
  }
  void remove(uint32_t id) {
    Writer w(*this);
    map_.erase(id);
  }
  std::shared_mutex& mutex() { return mu_; }
  std::mutex& receiveMutex() { return rxMu_; }
  // mutex() shared, once no add/remove is waiting: the rwlock prefers readers,
  // and busy engine threads overlapping their batches would starve a writer.
  std::shared_lock<std::shared_mutex> engineLock() {
    while (writers_.load(std::memory_order_acquire)) std::this_thread::yield();
    return std::shared_lock<std::shared_mutex>(mu_);
  }
  // Caller holds mutex() (shared or not) or receiveMutex().
  const Entry* find(uint32_t id) const {
    auto it = map_.find(id);
    return it == map_.end() ? nullptr : &it->second;
  }

 private:
  struct Writer {
    WindowDirectory& d;
    explicit Writer(WindowDirectory& dir) : d(dir) {
      d.writers_.fetch_add(1, std::memory_order_acq_rel);
      d.mu_.lock();
      d.rxMu_.lock();
    }
    ~Writer() {
      d.rxMu_.unlock();
      d.mu_.unlock();
      d.writers_.fetch_sub(1, std::memory_order_acq_rel);
    }
  };
  std::shared_mutex mu_;
  std::mutex rxMu_;
  std::atomic<int> writers_{0};
  std::map<uint32_t, Entry> map_;
};

// Why a wire refused an operation, in the error record's terms.
struct WireReject {
  uint64_t id = 0, value = 0, limit = 0;
};

// Where the bytes go: LocalWire below, TcpWire and RoutedWire
// (gin/host/tcp_wire.hpp), VerbsWire (gin/host/verbs_wire.hpp). Both calls
// validate first and write nothing when they return false. Each engine thread
// has a Wire object of its own (which may share a network wire with the
// others, so those must take calls from several threads at once) and calls it
// with the directory's mutex() held shared; when put returns, the source has
// been consumed (the engine then counts a CounterInc).
class Wire {
 public:
  virtual ~Wire() = default;
  // `src` is this rank's window memory (device memory on GPUs).
  virtual bool put(int peer, uint32_t dstWindow, uint64_t dstOffset, const void* src, uint64_t bytes,
                   WireReject* why) = 0;
  // Like put, with the bytes (1..8) in host memory that is gone when the call
  // returns (putValue's value, carried in the descriptor).
  virtual bool putInline(int peer, uint32_t dstWindow, uint64_t dstOffset, const void* bytes, uint64_t n,
                         WireReject* why) {
    return put(peer, dstWindow, dstOffset, bytes, n, why);
  }
  virtual bool signal(int peer, uint32_t id, ProxyAction op, uint64_t value, WireReject* why) = 0;
  // Every put this object accepted so far (so: every put of the calling
  // engine thread) is complete: its bytes are at the target and its source
  // was read. Called by the engine thread before a signal or counter action
  // and before it publishes the consumer index.
  virtual void complete() {}
};

#if GIN_WITH_CUDA
// Copies into and between GPU windows for one host thread (an engine thread,
// the tcp wire's receiver): kernels of gin's side context (side_context.hpp),
// which never queue behind the user's kernels, so a kernel waiting for these
// copies cannot block them. Each thread has its own, so complete() waits for
// that thread's copies only. bind() makes the rank's GPU current for the
// thread's other CUDA calls.
class GpuCopier : public SideCopier {
 public:
  explicit GpuCopier(int device) : SideCopier(device) { bind(); }
  void bind() const { GIN_CUDA_CHECK(cudaSetDevice(device())); }
};
#endif

// Targets mapped in this process: the lsa mappings the Comm already made (peer
// windows through the directory, peer signal arrays, host addresses). A copy
// (memcpy on CPU ranks; a side-context copy with a GpuCopier, when the producers do not store themselves), then, after the
// engine's complete(), a release atomic on the peer's signal word: the signal
// cannot overtake the payload. On GPUs the signal arrays of a proxy
// communicator live in host memory, so the atomic is a CPU atomic.
class LocalWire final : public Wire {
 public:
  LocalWire(const WindowDirectory& dir, int lsaBase, std::vector<uint64_t*> peerSignals, uint32_t nSignalWords)
      : dir_(dir), lsaBase_(lsaBase), signals_(std::move(peerSignals)), nSignalWords_(nSignalWords) {}
#if GIN_WITH_CUDA
  LocalWire(const WindowDirectory& dir, int lsaBase, std::vector<uint64_t*> peerSignals, uint32_t nSignalWords,
            GpuCopier* gpu)
      : LocalWire(dir, lsaBase, std::move(peerSignals), nSignalWords) {
    gpu_ = gpu;
  }
#endif

  bool put(int peer, uint32_t dstWindow, uint64_t dstOffset, const void* src, uint64_t bytes,
           WireReject* why) override {
    char* dst = target(peer, dstWindow, dstOffset, bytes, why);
    if (!dst) return false;
    if (bytes == 0) return true;
#if GIN_WITH_CUDA
    if (gpu_) return gpu_->copy(dst, src, size_t(bytes)), true;
#endif
    std::memcpy(dst, src, size_t(bytes));
    return true;
  }

  bool putInline(int peer, uint32_t dstWindow, uint64_t dstOffset, const void* bytes, uint64_t n,
                 WireReject* why) override {
#if GIN_WITH_CUDA
    if (gpu_) {
      char* dst = target(peer, dstWindow, dstOffset, n, why);
      if (!dst) return false;
      if (n) gpu_->copyValue(dst, bytes, size_t(n));
      return true;
    }
#endif
    return put(peer, dstWindow, dstOffset, bytes, n, why);
  }

  void complete() override {
#if GIN_WITH_CUDA
    if (gpu_) gpu_->complete();
#endif
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
#if GIN_WITH_CUDA
  GpuCopier* gpu_ = nullptr;
#endif

  // The address of [dstOffset, dstOffset + bytes) of `peer`'s window, or
  // nullptr (and *why) when the peer, the window or the range is bad.
  char* target(int peer, uint32_t dstWindow, uint64_t dstOffset, uint64_t bytes, WireReject* why) const {
    const int li = peer - lsaBase_;
    if (li < 0 || li >= int(signals_.size()))
      return reject(why, uint64_t(peer), uint64_t(peer), signals_.size()), nullptr;
    const WindowDirectory::Entry* e = dir_.find(dstWindow);
    if (!e) return reject(why, dstWindow, dstOffset, 0), nullptr;
    if (dstOffset > e->bytes || bytes > e->bytes - dstOffset)
      return reject(why, dstWindow, dstOffset + bytes, e->bytes), nullptr;
    return e->lsaBases[size_t(li)] + dstOffset;
  }
  static bool reject(WireReject* why, uint64_t id, uint64_t value, uint64_t limit) {
    if (why) *why = WireReject{id, value, limit};
    return false;
  }
};

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

  // Test hook: a paused engine consumes nothing (so producers see a full ring
  // and flush times out) until resumed. Stopping drains even when paused.
  // pause(true) returns once every thread has parked, so nothing pushed after
  // it returns is consumed: a thread may be in the middle of a pass when the
  // flag goes up, and only a park that starts after it proves the pass is
  // over.
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
