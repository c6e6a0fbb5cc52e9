// gin/host/comm.hpp — the communicator: topology, teams, transports, signals,
// counters, barriers and windows, and the DevComm handed to kernels.
//
//   gin::InProcessGroup group(4);                 // or TcpBootstrap::fromEnvironment()
//   gin::Comm comm(group.rank(r));                // collective
//   gin::Window w = comm.allocWindow(1 << 20);    // collective
//   kernel<<<...>>>(comm.devComm(), w);
//   comm.synchronize();                           // throws gin::Error on device failure
//
// Construction, allocWindow, registerWindow, deregisterWindow and destruction
// are collective: every rank calls them in the same order. Arguments are
// checked on every rank together, so a bad argument on one rank gives every
// rank a gin::Error that names it instead of a hang.
#pragma once

#include <pthread.h>
#include <sched.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gin/device/comm.hpp"
#include "gin/device/window.hpp"
#include "gin/host/abort_channel.hpp"
#include "gin/host/bootstrap.hpp"
#include "gin/host/ibgda.hpp"
#include "gin/host/memory.hpp"
#include "gin/host/proxy.hpp"
#include "gin/host/tcp_wire.hpp"
#include "gin/host/window.hpp"

// The verbs wire links -libverbs, so the Comm builds it only where the program
// asks for it: define GIN_COMM_VERBS=1 and link libibverbs (gin's Meson build
// does this for its own verbs tests). Without it GIN_PROXY_WIRE=verbs is an
// error that says so.
#ifndef GIN_COMM_VERBS
#define GIN_COMM_VERBS 0
#endif
#if GIN_COMM_VERBS
#include "gin/host/verbs_wire.hpp"
#endif

namespace gin {

enum class DeviceKind { Auto, Cpu, Gpu };

// How peers are reached. Auto: lsa for every peer load/store reaches (the
// ranks of this host), the proxy for the others (ranks on other hosts, over
// the tcp wire). Lsa: lsa only (ranks on several hosts are refused). Proxy:
// every peer through the proxy engine, lsa members included (testing,
// debugging). Ibgda: the peers of this host through GPU-posted mlx5 work
// requests, lsa members included (on the soft NIC, or on an mlx5 device
// when built with GIN_IBGDA_MLX5=1: CommConfig::ibgda).
// GIN_TRANSPORT=auto|lsa|proxy|ibgda overrides; which wire the proxy uses per
// peer: CommConfig::proxy.wire / GIN_PROXY_WIRE.
enum class TransportChoice { Auto, Lsa, Proxy, Ibgda };

struct CommConfig {
  int nContexts = 4;    // network contexts (queue pairs per peer on network transports)
  int nSignals = 256;   // signal ids 0..nSignals-1
  int nCounters = 256;  // counter ids 0..nCounters-1
  int nBarriers = 132;  // barrier indices per kind (lsa, world): one per CTA of an H100/H200
  // Bound on every device-side wait; 0 takes GIN_TIMEOUT_MS from the
  // environment, else 30 s.
  uint64_t timeoutNs = 0;
  // Auto: the GPU when one is visible (and GIN_DEVICE is not "cpu"), else CPU ranks.
  DeviceKind device = DeviceKind::Auto;
  // GPU to use; -1: LOCAL_RANK from the launcher, else this rank's index among
  // the ranks of its host (modulo the number of visible GPUs).
  int cudaDevice = -1;
  TransportChoice transport = TransportChoice::Auto;
  ProxyConfig proxy;  // rings and engine of the proxy transport
  IbgdaConfig ibgda;  // queue pairs and NIC of the ibgda transport
};

namespace detail {
inline uint64_t fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}
// Ranks with the same host id share memory. GIN_HOST_ID overrides (tests that
// pretend to be several hosts, containers that share a kernel); the value
// "netns" keeps the host's identity but adds the network namespace, so ranks
// in different namespaces of one machine count as different hosts.
inline uint64_t hostId() {
  const char* e = std::getenv("GIN_HOST_ID");
  if (e && std::string(e) != "netns") return fnv1a(std::string("env:") + e);
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  std::string id = std::string(name) + "/" + boot;
  if (e) {
    char ns[128] = {};
    const ssize_t n = ::readlink("/proc/self/ns/net", ns, sizeof ns - 1);
    if (n <= 0) throw Error("GIN_HOST_ID=netns, but /proc/self/ns/net cannot be read on this system");
    id += std::string("/") + ns;
  }
  return fnv1a(id);
}
inline uint64_t envTimeoutNs() {
  if (const char* e = std::getenv("GIN_TIMEOUT_MS")) {
    char* end = nullptr;
    const unsigned long long ms = std::strtoull(e, &end, 10);
    if (!end || *end || end == e) throw Error(std::string("GIN_TIMEOUT_MS=") + e + " is not a number of milliseconds");
    return uint64_t(ms) * 1000000ull;
  }
  return 30'000'000'000ull;
}
inline TransportChoice envTransport(TransportChoice fallback) {
  const char* e = std::getenv("GIN_TRANSPORT");
  if (!e || !*e) return fallback;
  const std::string v(e);
  if (v == "auto") return TransportChoice::Auto;
  if (v == "lsa") return TransportChoice::Lsa;
  if (v == "proxy") return TransportChoice::Proxy;
  if (v == "ibgda") return TransportChoice::Ibgda;
  throw Error("GIN_TRANSPORT=" + v + " is not one of auto, lsa, proxy, ibgda");
}
inline const char* choiceName(TransportChoice c) {
  switch (c) {
    case TransportChoice::Auto: return "auto";
    case TransportChoice::Lsa: return "lsa";
    case TransportChoice::Proxy: return "proxy";
    case TransportChoice::Ibgda: return "ibgda";
  }
  return "?";
}
inline bool envDebug() {
  const char* e = std::getenv("GIN_DEBUG");
  return e && *e && std::string(e) != "0";
}
inline const char* transportName(Transport t) {
  switch (t) {
    case Transport::None: return "none";
    case Transport::Lsa: return "lsa";
    case Transport::Proxy: return "proxy";
    case Transport::Ibgda: return "ibgda";
  }
  return "?";
}
}  // namespace detail

class Comm {
 public:
  explicit Comm(Bootstrap& bs, CommConfig cfg = {}) : bs_(bs), cfg_(cfg) {
    rank_ = bs.rank();
    nRanks_ = bs.nRanks();
    if (cfg.nContexts < 1 || cfg.nSignals < 0 || cfg.nCounters < 0 || cfg.nBarriers < 1)
      throw Error("CommConfig: nContexts and nBarriers must be >= 1, nSignals and nCounters >= 0 (got " +
                  std::to_string(cfg.nContexts) + ", " + std::to_string(cfg.nBarriers) + ", " +
                  std::to_string(cfg.nSignals) + ", " + std::to_string(cfg.nCounters) + ")");
    if (cfg.proxy.ringSlots < 2 || (cfg.proxy.ringSlots & (cfg.proxy.ringSlots - 1)) != 0 ||
        cfg.proxy.ringSlots > kProxyMaxSlots || cfg.proxy.batch < 1 || cfg.proxy.threads < 1)
      throw Error("CommConfig::proxy: ringSlots must be a power of two in [2, 2^15], batch and threads >= 1 (got " +
                  std::to_string(cfg.proxy.ringSlots) + ", " + std::to_string(cfg.proxy.batch) + ", " +
                  std::to_string(cfg.proxy.threads) + ")");
    if (cfg_.timeoutNs == 0) cfg_.timeoutNs = detail::envTimeoutNs();
    cfg_.transport = detail::envTransport(cfg_.transport);
    cfg_.proxy.wire = detail::envProxyWire(cfg_.proxy.wire);
    discover();
    // Every rank knows the host count, so all or none take part.
    if (dev_.railSize > 1) openAbortChannel();
    if (std::find(transports_.begin(), transports_.end(), uint8_t(Transport::Proxy)) != transports_.end()) {
      // Checked on every rank together, so a bad list stops all of them.
      agreeOn("proxy engine CPUs", [&] { engineCpus_ = engineCpus(); });
      agreeOn("proxy engine threads", [&] { cfg_.proxy.threads = engineThreads(); });
      agreeOn("proxy producer stores", [&] { cfg_.proxy.producerStores = producerStoresSetting(); });
    }
    buildState();
    bs_.barrier();  // every rank's signals and inboxes are zero before anyone uses them
    buildWires();   // collective: the tcp wire connects the pairs that use it
    if (dev_.proxyRings) startProxy();
    if (std::find(transports_.begin(), transports_.end(), uint8_t(Transport::Ibgda)) != transports_.end()) startIbgda();
    if (rank_ == 0 && detail::envDebug()) printTransports();
    watcher_ = std::thread([this] { watchForFailure(); });  // last: nothing may throw after it starts
  }

  ~Comm() {
    watcherStop_.store(true, std::memory_order_release);
    if (watcher_.joinable()) watcher_.join();
    // Our engine writes into peers' memory: it drains and stops before the
    // barrier that lets them free it. So does our (soft) NIC.
    engine_.reset();
    if (tcp_) tcp_->closeSend();  // its destructor waits for the peers' goodbyes: all in flight is applied
    ibgda_.reset();
    // Peers may still be writing into our memory until they too are done.
    bool peersDone = true;
    try {
      bs_.barrier();
    } catch (...) {
      peersDone = false;
    }
    if (!peersDone) {
      // A peer failed or never came: its engine or NIC (or kernel) may still
      // write into what we share. Leak it rather than free it under them.
      shared_.leak();
      teamPage_.leak();
      proxySignals_.leak();
#if GIN_WITH_CUDA
      teamRegistration_.leak();
      proxySignalsRegistration_.leak();
#endif
      for (auto& [handle, rec] : windows_) rec->buffer.leak();
      for (auto& a : userAllocs_) a->leak();
      return;
    }
  }
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const { return rank_; }
  int nRanks() const { return nRanks_; }
  int lsaRank() const { return dev_.lsaRank; }
  int lsaSize() const { return dev_.lsaSize; }
  int railRank() const { return dev_.railRank; }
  int railSize() const { return dev_.railSize; }
  bool onGpu() const { return gpu_; }
  int cudaDevice() const { return cudaDev_; }
  const CommConfig& config() const { return cfg_; }
  Bootstrap& bootstrap() const { return bs_; }
  Transport transportTo(int worldRank) const { return Transport(transports_.at(size_t(worldRank))); }
  // The proxy engine, or nullptr when no peer uses the proxy (tests pause it).
  ProxyEngine* proxyEngine() const { return engine_.get(); }
  // The wire the proxy uses to reach `worldRank`: Local or Tcp; Auto when
  // that peer is not reached through the proxy.
  ProxyWire proxyWireTo(int worldRank) const { return ProxyWire(wireOf_.at(size_t(worldRank))); }
  // The tcp wire, or nullptr when no pair of ranks uses it.
  TcpWire* tcpWire() const { return tcp_.get(); }
  // The ibgda transport (its soft NIC), or nullptr when no peer uses ibgda.
  IbgdaTransport* ibgda() const { return ibgda_.get(); }

  // What kernels receive (by value).
  const DevComm& devComm() const { return dev_; }

  // Symmetric allocation: `bytes` of zeroed memory on every rank, mapped on
  // every lsa peer. Collective; every rank passes the same size. Once it has
  // returned on one rank, that rank may put into the window on any peer at
  // once (the same holds for registerWindow).
  Window allocWindow(size_t bytes) {
    agreeOnSize("allocWindow", bytes, bytes == 0 ? "bytes must be greater than 0" : nullptr);
    auto rec = std::make_unique<WindowRecord>();
    rec->owned = true;
    rec->buffer = SharedBuffer::allocate(backing(), bytes);
    rec->local = rec->buffer.data();
    const ShareHandle h = rec->buffer.share(rec->local);
    return finishWindow(std::move(rec), bytes, h);
  }

  // Register the caller's buffer [ptr, ptr+bytes) as a window. Collective.
  // On a GPU: memory from cudaMalloc or memAlloc. On CPU ranks of one process:
  // any memory. On CPU ranks in several processes: memory from memAlloc.
  Window registerWindow(void* ptr, size_t bytes) {
    // Every local check happens before the vote, so a bad buffer on one rank
    // stops all ranks together.
    std::string problem = ptr == nullptr ? "ptr is null" : bytes == 0 ? "bytes must be greater than 0" : "";
    ShareHandle h{};
    if (problem.empty()) {
      try {
        h = shareUserRange(ptr, bytes);
      } catch (const Error& e) {
        problem = e.what();
      }
    }
    agreeOnSize("registerWindow", bytes, problem.empty() ? nullptr : problem.c_str());
    auto rec = std::make_unique<WindowRecord>();
    rec->local = static_cast<char*>(ptr);
    return finishWindow(std::move(rec), bytes, h);
  }

  // Undo allocWindow/registerWindow. Collective. The Window must not be used
  // afterwards; using it in a host call again is an error.
  void deregisterWindow(Window w) {
    auto it = windows_.find(w.dev);
    const uint32_t id = it == windows_.end() ? 0 : it->second->id;
    std::vector<uint32_t> ids(static_cast<size_t>(nRanks_));
    ids[size_t(rank_)] = id;
    bs_.allGather(ids.data(), sizeof(uint32_t));
    for (int r = 0; r < nRanks_; ++r) {
      if (ids[size_t(r)] == 0)
        throw Error("deregisterWindow: rank " + std::to_string(r) +
                    " passed a window that is not registered with this communicator (already deregistered, or "
                    "from another communicator)");
      if (ids[size_t(r)] != ids[0])
        throw Error("deregisterWindow: ranks passed different windows (rank 0 window " + std::to_string(ids[0]) +
                    ", rank " + std::to_string(r) + " window " + std::to_string(ids[size_t(r)]) +
                    "); deregister windows in the same order everywhere");
    }
    // Our engine finishes what was pushed before, so it never writes into a
    // window a peer is about to free (bounded; a stuck engine is reported
    // through the error record anyway).
    if (engine_) (void)engine_->quiesce(cfg_.timeoutNs);
    // Over tcp "consumed" means "sent": the fence waits until what peers sent
    // us has been applied (bounded; a lost peer is in the error record).
    if (tcp_) (void)tcp_->fence(cfg_.timeoutNs);
    if (ibgda_) (void)ibgda_->quiesce(cfg_.timeoutNs);
    bs_.barrier();  // nobody still writes into it
    if (ibgda_) ibgda_->removeWindow(id);
#if GIN_COMM_VERBS
    if (verbs_) verbs_->deregisterWindow(id);
#endif
    dir_.remove(id);
    windows_.erase(it);
  }
  void freeWindow(Window w) { deregisterWindow(w); }

  // Memory that registerWindow accepts on every kind of rank (GPU: cudaMalloc;
  // CPU: heap, or shared memory when lsa peers run in other processes). Local.
  void* memAlloc(size_t bytes) {
    if (bytes == 0) throw Error("memAlloc: bytes must be greater than 0");
    userAllocs_.push_back(std::make_unique<SharedBuffer>(SharedBuffer::allocate(backing(), bytes)));
    return userAllocs_.back()->data();
  }
  void memFree(void* p) {
    auto it = std::find_if(userAllocs_.begin(), userAllocs_.end(), [&](auto& b) { return b->data() == p; });
    if (it == userAllocs_.end()) throw Error("memFree: pointer was not returned by memAlloc of this communicator");
    userAllocs_.erase(it);
  }

  // Host-usable address of `offset` in this rank's part of `w` (a device
  // pointer on GPUs, for cudaMemcpy and kernel arguments).
  void* localPointer(Window w, size_t offset = 0) const {
    const WindowRecord& r = record(w, "localPointer");
    if (offset > r.bytes)
      throw Error("localPointer: offset " + std::to_string(offset) + " is past the window's " +
                  std::to_string(r.bytes) + " bytes");
    return r.local + offset;
  }
  // Host-usable address of `offset` in lsa member `lsaPeer`'s part of `w`, as
  // mapped in this process (what ncclGetLsaPointer gives): for cudaMemcpy,
  // copy-engine transfers and kernel arguments.
  void* lsaPointer(Window w, size_t offset, int lsaPeer) const {
    const WindowRecord& r = record(w, "lsaPointer");
    if (lsaPeer < 0 || lsaPeer >= int(r.lsaBases.size()))
      throw Error("lsaPointer: lsa peer " + std::to_string(lsaPeer) + " is not in [0, " +
                  std::to_string(r.lsaBases.size()) + ")");
    if (offset > r.bytes)
      throw Error("lsaPointer: offset " + std::to_string(offset) + " is past the window's " + std::to_string(r.bytes) +
                  " bytes");
    return r.lsaBases[size_t(lsaPeer)] + offset;
  }
  size_t windowBytes(Window w) const { return record(w, "windowBytes").bytes; }

  // Throw the first device-side failure, if any, as a gin::Error.
  void check() const {
    if (atomicLoad<Scope::System>(&hostRecord_->state, MemoryOrder::Acquire) == 2u) throw Error(describe(*hostRecord_));
  }
  bool hasError() const { return atomicLoad<Scope::System>(&hostRecord_->state, MemoryOrder::Acquire) != 0u; }

  // Wait for this rank's GPU work (no-op on CPU ranks), then check().
  //
  // gin's device waits give up after the timeout, so GPU work that outlives
  // it with nothing in the error record is stuck outside them (a barrier
  // some threads skip, a loop of its own) or simply runs long. synchronize
  // does not give up on it (a long kernel is not an error), but says so on
  // stderr each time the timeout passes (from twice the timeout on), naming
  // the rank, instead of waiting in silence. The bounded part covers the
  // legacy default stream and every blocking stream (work on
  // cudaStreamNonBlocking streams is waited for by the final
  // cudaDeviceSynchronize only).
  void synchronize() const {
#if GIN_WITH_CUDA
    if (gpu_) {
      GIN_CUDA_CHECK(cudaSetDevice(cudaDev_));
      cudaEvent_t done = nullptr;
      GIN_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
      cudaError_t e = cudaEventRecord(done, cudaStreamLegacy);
      const uint64_t start = nowNs();
      // First note at twice the timeout: a wait that gives up does so after
      // one timeout, and its record may land just after that.
      uint64_t nextNote = 2 * cfg_.timeoutNs;
      while (e == cudaSuccess && (e = cudaEventQuery(done)) == cudaErrorNotReady) {
        e = cudaSuccess;
        const uint64_t waited = nowNs() - start;
        if (nextNote && waited > nextNote) {
          std::fprintf(stderr,
                       "gin: rank %d: Comm::synchronize has waited %.1f s for this rank's GPU work; %s\n", rank_,
                       double(waited) * 1e-9,
                       hasError() ? "the error record is set: the kernels should stop soon"
                                  : "nothing is in the error record, so a kernel is stuck outside gin's waits (a "
                                    "__syncthreads that some threads skip, a loop of its own) or runs longer than "
                                    "the timeout");
          nextNote += cfg_.timeoutNs;
        }
        if (waited < 1'000'000)
          std::this_thread::yield();  // short work: answer quickly
        else
          std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      (void)cudaEventDestroy(done);
      if (e == cudaSuccess) e = cudaDeviceSynchronize();
      check();
      GIN_CUDA_CHECK(e);
    }
#endif
    check();
  }

  // Make the calling host thread use this communicator's GPU.
  void makeCurrent() const {
#if GIN_WITH_CUDA
    if (gpu_) GIN_CUDA_CHECK(cudaSetDevice(cudaDev_));
#endif
  }

 private:
  struct PeerInfo {
    uint64_t hostId;
    uint64_t pid;
    int32_t gpu;  // 1: GPU ranks, 0: CPU ranks
    int32_t cudaDev;
    int32_t transport;  // TransportChoice after GIN_TRANSPORT
    int32_t pad;
    char busId[32];
  };

  Bootstrap& bs_;
  CommConfig cfg_;
  int rank_ = 0, nRanks_ = 0;
  bool gpu_ = false;
  int cudaDev_ = -1;
  std::vector<PeerInfo> peers_;
  std::vector<uint8_t> transports_;
  DevComm dev_{};
  bool lsaAllSameProcess_ = true;

  SharedBuffer shared_;  // signals + barrier inboxes, mapped by lsa peers
  std::vector<PeerMapping> sharedPeers_;
  // The team abort word (DevComm::teamAbort): host memory, one page per rank,
  // mapped by every lsa member; the watcher raises every member's word once
  // this rank's error record is filled.
  SharedBuffer teamPage_;
  std::vector<PeerMapping> teamPeers_;
  std::vector<uint32_t*> teamWords_;  // [lsaSize] each member's word, mapped here
#if GIN_WITH_CUDA
  HostRegistration teamRegistration_;  // teamPage_, on GPU ranks
#endif
  AbortChannel abortChannel_;  // several hosts: failures to and from the other hosts (the watcher uses it)
  std::thread watcher_;
  std::atomic<bool> watcherStop_{false};
  DeviceTable local_;                        // shadows, counters, epochs, pointer tables
  HostMappedBuffer record_;                  // the device error record
  DeviceErrorRecord* hostRecord_ = nullptr;  // its host address
  uint32_t nextWindowId_ = 1;
  std::map<const WindowDev*, std::unique_ptr<WindowRecord>> windows_;
  std::vector<std::unique_ptr<SharedBuffer>> userAllocs_;

  // Proxy transport (only when some peer uses it). The engine is declared
  // last so it is destroyed first: it polls the rings and writes through the
  // wire and the directory.
  std::vector<uint64_t*> lsaSignalPtrs_;  // each lsa member's signal array, mapped here
  uint32_t nSignalWords_ = 0;
  HostMappedBuffer ringMem_;  // ring slots and consumer indices
  size_t ringPad_ = 0;        // to 64-byte alignment
  DeviceTable ringTable_;     // ProxyRingDev[nContexts], then the producer tickets and credit hints
  // GPU ranks with proxy peers: the engines apply signal and counter actions
  // with CPU atomics, so those words live in host memory the GPU maps (shared
  // memory between processes), not in device memory the host cannot update
  // atomically.
  SharedBuffer proxySignals_;
  std::vector<PeerMapping> proxySignalPeers_;
  HostMappedBuffer proxyCounters_;
#if GIN_WITH_CUDA
  HostRegistration proxySignalsRegistration_;  // proxySignals_, on GPU ranks
#endif
  WindowDirectory dir_;
  std::vector<int> engineCpus_;  // the engine threads' CPUs (empty: not pinned)
#if GIN_WITH_CUDA
  std::vector<std::unique_ptr<GpuCopier>> copiers_;  // [engine thread]: its copies
  std::unique_ptr<GpuCopier> hostReader_;  // host threads' reads and writes of device words (quiesce, abort flag)
  std::mutex hostReaderMu_;
#endif
  std::vector<uint8_t> wireOf_;   // per peer: ProxyWire::Local / Tcp, Auto when not proxied
  std::unique_ptr<TcpWire> tcp_;  // its receiver writes into the windows and signals above
#if GIN_COMM_VERBS
  std::unique_ptr<VerbsWire> verbs_;  // likewise (its receiver thread applies signals)
#endif
  std::vector<std::unique_ptr<Wire>> wires_;  // [engine thread]
  std::unique_ptr<ProxyEngine> engine_;
  // ibgda transport (only when some peer uses it); its NIC writes into peers'
  // memory, so it goes first too.
  std::unique_ptr<IbgdaTransport> ibgda_;

  bool sameProcess(int a, int b) const {
    return peers_[size_t(a)].hostId == peers_[size_t(b)].hostId && peers_[size_t(a)].pid == peers_[size_t(b)].pid;
  }
  bool sameProcess(int r) const { return sameProcess(r, rank_); }
  SharedBuffer::Backing backing() const {
    return gpu_                 ? SharedBuffer::Backing::Cuda
           : lsaAllSameProcess_ ? SharedBuffer::Backing::Heap
                                : SharedBuffer::Backing::Shm;
  }

  void discover() {
    // Which device: decided per rank, agreed on below.
    bool wantGpu = false;
    const char* envDev = std::getenv("GIN_DEVICE");
    const int nGpus = cudaDeviceCountOrZero();
    if (cfg_.device == DeviceKind::Gpu) {
      if (nGpus == 0)
        throw Error("CommConfig::device is Gpu but no CUDA device is visible on rank " + std::to_string(rank_));
      wantGpu = true;
    } else if (cfg_.device == DeviceKind::Auto) {
      wantGpu = nGpus > 0 && !(envDev && std::string(envDev) == "cpu");
    }

    PeerInfo me{};
    me.hostId = detail::hostId();
    me.pid = uint64_t(::getpid());
    me.gpu = wantGpu ? 1 : 0;
    me.transport = int32_t(cfg_.transport);
    peers_.assign(size_t(nRanks_), PeerInfo{});
    peers_[size_t(rank_)] = me;
    bs_.allGather(peers_.data(), sizeof(PeerInfo));

    for (int r = 0; r < nRanks_; ++r)
      if (peers_[size_t(r)].gpu != me.gpu)
        throw Error("ranks disagree on where to run: rank " + std::to_string(rank_) + " uses " +
                    (me.gpu ? "a GPU" : "CPU ranks") + ", rank " + std::to_string(r) + " uses " +
                    (peers_[size_t(r)].gpu ? "a GPU" : "CPU ranks") +
                    "; give every rank a GPU, or set GIN_DEVICE=cpu everywhere");
    gpu_ = me.gpu != 0;
    for (int r = 0; r < nRanks_; ++r)
      if (peers_[size_t(r)].transport != me.transport)
        throw Error("ranks disagree on the transport: rank " + std::to_string(rank_) + " asked for " +
                    detail::choiceName(TransportChoice(me.transport)) + ", rank " + std::to_string(r) + " for " +
                    detail::choiceName(TransportChoice(peers_[size_t(r)].transport)) +
                    "; set GIN_TRANSPORT (or CommConfig::transport) the same on every rank");

    // Nodes: ranks with the same host id, which must be numbered node by node
    // with the same count on each, so teams are arithmetic (as in NCCL).
    std::vector<int> nodeOf(size_t(nRanks_), -1);
    std::vector<uint64_t> nodeIds;
    for (int r = 0; r < nRanks_; ++r) {
      auto it = std::find(nodeIds.begin(), nodeIds.end(), peers_[size_t(r)].hostId);
      nodeOf[size_t(r)] = int(it - nodeIds.begin());
      if (it == nodeIds.end()) nodeIds.push_back(peers_[size_t(r)].hostId);
    }
    const int nNodes = int(nodeIds.size());
    const int perNode = nRanks_ / nNodes;
    bool regular = perNode * nNodes == nRanks_;
    for (int r = 0; regular && r < nRanks_; ++r) regular = nodeOf[size_t(r)] == r / perNode;
    if (!regular)
      throw Error(
          "ranks must be numbered host by host with the same number on every host (as torchrun and srun "
          "do); rank " +
          std::to_string(rank_) + " sees " + std::to_string(nNodes) + " hosts over " + std::to_string(nRanks_) +
          " ranks in another order");
    dev_.rank = rank_;
    dev_.nRanks = nRanks_;
    dev_.lsaSize = perNode;
    dev_.lsaRank = rank_ % perNode;
    dev_.railSize = nNodes;
    dev_.railRank = rank_ / perNode;
    const int lsaBase = rank_ - dev_.lsaRank;
    for (int i = 0; i < perNode; ++i) lsaAllSameProcess_ = lsaAllSameProcess_ && sameProcess(lsaBase + i);

    if (gpu_) pickGpu(nGpus, lsaBase);

    transports_.assign(size_t(nRanks_), uint8_t(Transport::None));
    const bool forceProxy = cfg_.transport == TransportChoice::Proxy;
    const bool forceIbgda = cfg_.transport == TransportChoice::Ibgda;
    // Ranks of other hosts: the proxy (its tcp wire; buildWires checks the wire reaches them).
    for (int r = 0; r < nRanks_; ++r)
      transports_[size_t(r)] = uint8_t(r < lsaBase || r >= lsaBase + perNode ? Transport::Proxy
                                       : forceProxy                          ? Transport::Proxy
                                       : forceIbgda                          ? Transport::Ibgda
                                                                             : Transport::Lsa);
    if (nNodes > 1 && forceIbgda)
      throw Error("the ranks span " + std::to_string(nNodes) +
                  " hosts, and the transport is forced to ibgda, which reaches only this host's ranks today (the "
                  "Comm does not route ibgda across hosts yet); use GIN_TRANSPORT=auto");
    if (nNodes > 1 && cfg_.transport == TransportChoice::Lsa)
      throw Error("the ranks span " + std::to_string(nNodes) +
                  " hosts, and the transport is forced to lsa (load/store), which cannot reach another host; "
                  "use GIN_TRANSPORT=auto (the proxy over tcp reaches them)");
    dev_.proxyAll = forceProxy ? 1 : 0;
    dev_.ibgdaAll = forceIbgda ? 1 : 0;
  }

  void pickGpu(int nGpus, int lsaBase) {
#if GIN_WITH_CUDA
    int dev = cfg_.cudaDevice;
    if (dev < 0) {
      const char* lr = std::getenv("LOCAL_RANK");
      // In-process groups share one environment, so LOCAL_RANK cannot tell threads apart.
      if (lr && !lsaAllSameProcess_)
        dev = std::atoi(lr);
      else
        dev = rank_ - lsaBase;
      dev %= nGpus;
    }
    if (dev >= nGpus)
      throw Error("CommConfig::cudaDevice " + std::to_string(dev) + " is out of range: " + std::to_string(nGpus) +
                  " GPUs are visible");
    cudaDev_ = dev;
    GIN_CUDA_CHECK(cudaSetDevice(dev));
    PeerInfo& me = peers_[size_t(rank_)];
    me.cudaDev = dev;
    GIN_CUDA_CHECK(cudaDeviceGetPCIBusId(me.busId, sizeof me.busId, dev));
    bs_.allGather(peers_.data(), sizeof(PeerInfo));
    // Peers in this process read our memory by pointer: enable peer access both ways.
    for (int i = 0; i < dev_.lsaSize; ++i) {
      const int r = lsaBase + i;
      if (r == rank_ || !sameProcess(r) || peers_[size_t(r)].cudaDev == dev) continue;
      int can = 0;
      GIN_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, dev, peers_[size_t(r)].cudaDev));
      if (!can)
        throw Error("GPU " + std::to_string(dev) + " cannot access GPU " + std::to_string(peers_[size_t(r)].cudaDev) +
                    " by load/store (no NVLink or PCIe peer access); gin's lsa transport needs it");
      const cudaError_t e = cudaDeviceEnablePeerAccess(peers_[size_t(r)].cudaDev, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled)
        (void)cudaGetLastError();
      else
        GIN_CUDA_CHECK(e);
    }
#else
    (void)nGpus, (void)lsaBase;
#endif
  }

  // Allgather one share handle per rank and map the lsa peers' buffers.
  std::vector<char*> exchange(const ShareHandle& mine, char* localPtr, std::vector<PeerMapping>& maps) {
    std::vector<ShareHandle> all(static_cast<size_t>(nRanks_));
    all[size_t(rank_)] = mine;
    bs_.allGather(all.data(), sizeof(ShareHandle));
    const int lsaBase = rank_ - dev_.lsaRank;
    // Heap memory cannot be mapped by another process. Every rank sees every
    // handle, so every rank reaches the same verdict and none is left waiting.
    for (int i = 0; i < dev_.lsaSize; ++i) {
      const int r = lsaBase + i;
      if (all[size_t(r)].kind != ShareHandle::Heap) continue;
      for (int j = 0; j < dev_.lsaSize; ++j)
        if (!sameProcess(r, lsaBase + j))
          throw Error("rank " + std::to_string(r) + " registered ordinary heap memory, which rank " +
                      std::to_string(lsaBase + j) +
                      " (another process) cannot map; on CPU ranks in several processes allocate window memory "
                      "with Comm::memAlloc");
    }
    std::vector<char*> bases(size_t(dev_.lsaSize), nullptr);
    for (int i = 0; i < dev_.lsaSize; ++i) {
      const int r = lsaBase + i;
      if (r == rank_) {
        bases[size_t(i)] = localPtr;
        continue;
      }
      maps.push_back(PeerMapping::map(all[size_t(r)], sameProcess(r)));
      bases[size_t(i)] = maps.back().ptr();
    }
    bs_.barrier();  // every peer has mapped: shared memory names may go
    return bases;
  }

  void buildState() {
    const size_t nS = size_t(cfg_.nSignals), nC = size_t(cfg_.nCounters), nB = size_t(cfg_.nBarriers);
    const size_t L = size_t(dev_.lsaSize);
    // Shared: signals (user ids, then one rail-barrier signal per index), then
    // 2*nB rows of lsa inbox (LsaBarrierSession rows, then BarrierSession rows).
    const size_t rowWords = (L + 15) / 16 * 16;  // 128-byte lines
    const size_t sigWords = (nS + nB + 15) / 16 * 16, inboxWords = 2 * nB * rowWords;
    shared_ = SharedBuffer::allocate(backing(), (sigWords + inboxWords) * 8);
    std::vector<char*> sharedBases = exchange(shared_.share(shared_.data()), shared_.data(), sharedPeers_);
    shared_.unlinkName();

    // Local: shadows, counters, lsa epochs (2nB), rail epochs (nB), lsa
    // signal pointers, lsa inbox pointers, peer transports.
    const size_t offShadow = 0, offCounter = offShadow + nS * 8, offLsaEpoch = offCounter + nC * 8,
                 offRailEpoch = offLsaEpoch + 2 * nB * 8, offSigPtrs = offRailEpoch + nB * 8,
                 offInboxPtrs = offSigPtrs + L * 8, offClaim = offInboxPtrs + L * 8, offTransport = offClaim + 8,
                 total = offTransport + size_t(nRanks_);
    local_ = DeviceTable(gpu_, total);
    std::vector<uint64_t*> sigPtrs(L), inboxPtrs(L);
    for (size_t i = 0; i < L; ++i) {
      sigPtrs[i] = reinterpret_cast<uint64_t*>(sharedBases[i]);
      inboxPtrs[i] = reinterpret_cast<uint64_t*>(sharedBases[i]) + sigWords;
    }
    local_.upload(offSigPtrs, sigPtrs.data(), L * 8);
    local_.upload(offInboxPtrs, inboxPtrs.data(), L * 8);
    local_.upload(offTransport, transports_.data(), transports_.size());
    lsaSignalPtrs_ = sigPtrs;
    nSignalWords_ = uint32_t(nS + nB);
    const bool proxy =
        std::find(transports_.begin(), transports_.end(), uint8_t(Transport::Proxy)) != transports_.end();
    uint64_t* signals = reinterpret_cast<uint64_t*>(shared_.data());
    uint64_t* counters = reinterpret_cast<uint64_t*>(local_.data() + offCounter);
    // The soft NIC applies ibgda signals with CPU atomics: on GPU ranks it
    // needs them in host memory too (a real NIC's atomics reach GPU memory).
    const bool softNicSignals =
        gpu_ && dev_.ibgdaAll != 0 && detail::ibgdaDevice(cfg_.ibgda.device) != IbgdaConfig::Device::Mlx5;
    if (proxy) buildRings();
    if ((proxy || softNicSignals) && gpu_) {
      // Only the proxy (or the soft NIC) touches signals then (every peer
      // goes through it: GPU ranks have no mixed mode), so the device-memory
      // signal words in `shared_` stay unused and the peers' pointers are
      // left null. Counters move to host memory only for the proxy, whose
      // engine updates them; ibgda kernels count completions themselves.
      placeProxyWordsInHostMemory(sigWords * 8, nC * 8, &signals, proxy ? &counters : nullptr);
      std::fill(sigPtrs.begin(), sigPtrs.end(), nullptr);
      local_.upload(offSigPtrs, sigPtrs.data(), L * 8);
    }

    // Error record: host memory the GPU can write (mapped pinned), so check()
    // reads it while kernels run. The claim word and the abort flag stay in
    // device memory: waits poll the flag, and a PCIe read per poll batch
    // would cost every wait about a microsecond.
    record_ = HostMappedBuffer(gpu_, sizeof(DeviceErrorRecord));
    hostRecord_ = static_cast<DeviceErrorRecord*>(record_.host());
    placeTeamAbort();

    char* base = local_.data();
    dev_.nContexts = cfg_.nContexts;
    dev_.nSignals = cfg_.nSignals;
    dev_.nCounters = cfg_.nCounters;
    dev_.nBarriers = cfg_.nBarriers;
    dev_.timeoutNs = cfg_.timeoutNs;
    dev_.peerTransport = reinterpret_cast<const uint8_t*>(base + offTransport);
    dev_.signals = signals;
    dev_.lsaSignals = reinterpret_cast<uint64_t* const*>(base + offSigPtrs);
    dev_.signalShadows = reinterpret_cast<uint64_t*>(base + offShadow);
    dev_.counters = counters;
    dev_.lsaInbox = reinterpret_cast<uint64_t*>(shared_.data()) + sigWords;
    dev_.lsaInboxRowWords = int32_t(rowWords);
    dev_.lsaInboxes = reinterpret_cast<uint64_t* const*>(base + offInboxPtrs);
    for (size_t i = 0; i < L && i < size_t(DevComm::kLsaInline); ++i) {
      dev_.lsaSignalsInline[i] = sigPtrs[i];
      dev_.lsaInboxesInline[i] = inboxPtrs[i];
    }
    dev_.lsaEpochs = reinterpret_cast<uint64_t*>(base + offLsaEpoch);
    dev_.railEpochs = reinterpret_cast<uint64_t*>(base + offRailEpoch);
    dev_.error = static_cast<DeviceErrorRecord*>(record_.device());
    dev_.errorClaim = reinterpret_cast<uint32_t*>(base + offClaim);
    dev_.abortFlag = reinterpret_cast<uint32_t*>(base + offClaim + 4);
  }

  // One ring per context: slots and the consumer index in memory the host
  // polls (mapped pinned memory on GPUs), the producer ticket counters, the
  // credit hints and the ProxyRingDev table where the producers are (device
  // memory on GPUs). Tickets and hints get a 64-byte line each.
  void buildRings() {
    const size_t nCtx = size_t(cfg_.nContexts), nSlots = cfg_.proxy.ringSlots;
    const size_t slotBytes = nCtx * nSlots * sizeof(ProxySlot), consumedAt = slotBytes;
    ringMem_ = HostMappedBuffer(gpu_, slotBytes + nCtx * 64 + 64);
    ringPad_ = (64 - reinterpret_cast<uintptr_t>(ringMem_.host()) % 64) % 64;
    const size_t headsAt = ringHeadsAt(), hintsAt = headsAt + nCtx * 64;
    ringTable_ = DeviceTable(gpu_, hintsAt + nCtx * 64);
    std::vector<ProxyRingDev> rings(nCtx);
    char* dev = static_cast<char*>(ringMem_.device()) + ringPad_;
    for (size_t i = 0; i < nCtx; ++i) {
      rings[i].slots = reinterpret_cast<ProxySlot*>(dev) + i * nSlots;
      rings[i].consumed = reinterpret_cast<uint64_t*>(dev + consumedAt + i * 64);
      rings[i].head = reinterpret_cast<uint64_t*>(ringTable_.data() + headsAt + i * 64);
      rings[i].consumedHint = reinterpret_cast<uint64_t*>(ringTable_.data() + hintsAt + i * 64);
      rings[i].nSlots = uint32_t(nSlots);
    }
    ringTable_.upload(0, rings.data(), nCtx * sizeof(ProxyRingDev));
    dev_.proxyRings = reinterpret_cast<const ProxyRingDev*>(ringTable_.data());
  }
  size_t ringHeadsAt() const { return (size_t(cfg_.nContexts) * sizeof(ProxyRingDev) + 63) / 64 * 64; }

  // Signals and counters of a GPU rank with proxy peers: host memory the GPU
  // maps. Signals are shared with the lsa peers' engines (shared memory when
  // they run in other processes); counters are this rank's own.
  void placeProxyWordsInHostMemory(size_t sigBytes, size_t counterBytes, uint64_t** signals, uint64_t** counters) {
#if GIN_WITH_CUDA
    proxySignals_ =
        SharedBuffer::allocate(lsaAllSameProcess_ ? SharedBuffer::Backing::Heap : SharedBuffer::Backing::Shm, sigBytes);
    proxySignalsRegistration_ = HostRegistration(proxySignals_.data(), sigBytes);
    *signals = reinterpret_cast<uint64_t*>(proxySignalsRegistration_.device(proxySignals_.data()));
    std::vector<char*> hostBases =
        exchange(proxySignals_.share(proxySignals_.data()), proxySignals_.data(), proxySignalPeers_);
    proxySignals_.unlinkName();
    for (size_t i = 0; i < hostBases.size(); ++i) lsaSignalPtrs_[i] = reinterpret_cast<uint64_t*>(hostBases[i]);
    if (counters) {
      proxyCounters_ = HostMappedBuffer(true, counterBytes ? counterBytes : 8);
      *counters = static_cast<uint64_t*>(proxyCounters_.device());
    }
    hostReader_ = std::make_unique<GpuCopier>(cudaDev_);
#else
    (void)sigBytes, (void)counterBytes, (void)signals, (void)counters;
    throw Error("GPU ranks need the CUDA runtime");
#endif
  }

  void startProxy() {
    const size_t nCtx = size_t(cfg_.nContexts), nSlots = cfg_.proxy.ringSlots;
    char* host = static_cast<char*>(ringMem_.host()) + ringPad_;
    const size_t headsAt = ringHeadsAt();
    std::vector<ProxyEngine::Ring> rings(nCtx);
    for (size_t i = 0; i < nCtx; ++i) {
      rings[i].slots = reinterpret_cast<ProxySlot*>(host) + i * nSlots;
      rings[i].consumed = reinterpret_cast<uint64_t*>(host + nCtx * nSlots * sizeof(ProxySlot) + i * 64);
      rings[i].head = reinterpret_cast<const uint64_t*>(ringTable_.data() + headsAt + i * 64);
      rings[i].nSlots = uint32_t(nSlots);
    }
    ProxyHooks hooks;
    auto pin = [cpus = engineCpus_] {
      if (cpus.empty()) return;
      cpu_set_t set;
      CPU_ZERO(&set);
      for (int c : cpus) CPU_SET(c, &set);
      if (const int e = pthread_setaffinity_np(pthread_self(), sizeof set, &set))
        throw Error(std::string("cannot pin the proxy engine thread: ") + std::strerror(e));
    };
    hooks.threadInit = pin;
    // One wire per engine thread: its local part (on GPUs with a copier of
    // its own, so complete() waits for that thread's copies only) and the
    // network wires, which every thread shares.
    const size_t nThreads = cfg_.proxy.threads;
    wires_.resize(nThreads);
#if GIN_WITH_CUDA
    if (gpu_) {
      for (size_t t = 0; t < nThreads; ++t) {
        copiers_.push_back(std::make_unique<GpuCopier>(cudaDev_));
        wires_[t] =
            std::make_unique<LocalWire>(dir_, rank_ - dev_.lsaRank, lsaSignalPtrs_, nSignalWords_, copiers_[t].get());
      }
      std::vector<const uint64_t*> heads;
      for (const auto& r : rings) heads.push_back(r.head);
      hooks.head = [this, heads](int ctx) {
        std::lock_guard<std::mutex> lk(hostReaderMu_);
        return hostReader_->load64(heads[size_t(ctx)]);
      };
      hooks.threadInit = [c = copiers_[0].get(), pin] {  // every copier is of the same GPU
        pin();
        c->bind();
      };
      hooks.fail = [this](Op op, int peer, int ctx, uint64_t id, uint64_t expected, uint64_t observed) {
        hostRecordError(op, peer, ctx, id, expected, observed);
      };
      hooks.counters = static_cast<uint64_t*>(proxyCounters_.host());
    }
#endif
    Wire* network[2] = {tcp_.get(), nullptr};
#if GIN_COMM_VERBS
    network[1] = verbs_.get();
#endif
    std::vector<Wire*> wires;
    for (auto& w : wires_) {
      if (!w) w = std::make_unique<LocalWire>(dir_, rank_ - dev_.lsaRank, lsaSignalPtrs_, nSignalWords_);
      if (network[0] || network[1])
        w = std::make_unique<RoutedWire>(std::move(w), network[0], network[1], wireOf_);  // tcp_wire.hpp
      wires.push_back(w.get());
    }
    engine_ = std::make_unique<ProxyEngine>(dev_, std::move(rings), std::move(wires), dir_, nSignalWords_, cfg_.proxy,
                                            std::move(hooks));
  }

  // The team abort words: a page per rank in host memory that every lsa
  // member maps (shared memory across processes), so raising them needs no
  // CUDA call and a GPU reads its own with a mapped load.
  void placeTeamAbort() {
    teamPage_ =
        SharedBuffer::allocate(lsaAllSameProcess_ ? SharedBuffer::Backing::Heap : SharedBuffer::Backing::Shm, 64);
    std::vector<char*> bases = exchange(teamPage_.share(teamPage_.data()), teamPage_.data(), teamPeers_);
    teamPage_.unlinkName();
    for (char* b : bases) teamWords_.push_back(reinterpret_cast<uint32_t*>(b));
    dev_.teamAbort = reinterpret_cast<const uint32_t*>(teamPage_.data());
#if GIN_WITH_CUDA
    if (gpu_) {
      teamRegistration_ = HostRegistration(teamPage_.data(), 64);
      dev_.teamAbort = reinterpret_cast<const uint32_t*>(teamRegistration_.device(teamPage_.data()));
    }
#endif
  }

  // The abort channel (several hosts): this rank tells every rank of the
  // other hosts, the lowest of each host first. Collective.
  void openAbortChannel() {
    const int L = dev_.lsaSize, me = dev_.railRank;
    std::vector<int> targets;
    for (int i = 0; i < L; ++i)
      for (int node = 0; node < dev_.railSize; ++node)
        if (node != me) targets.push_back(node * L + i);
    abortChannel_.open(bs_, detail::tcpWireAddress(bs_, true), targets);
  }

  // Every lsa member's team abort word to `origin` (failed rank + 1), where
  // no failure is there yet.
  void raiseTeamAbort(uint32_t origin) {
    for (uint32_t* w : teamWords_) {
      uint32_t idle = 0;
      (void)atomicCompareExchange<Scope::System>(w, idle, origin);
    }
  }

  // The watcher thread: once this rank's error record is complete (a failure
  // of its own, not a PeerFailed that another rank's failure caused), raise
  // every lsa member's team abort word to rank + 1 and tell the other hosts,
  // so their waits stop within about a millisecond (a few across hosts)
  // instead of one timeout each. Until then, a failure another host reports
  // raises this host's words the same way. Reads host memory and
  // non-blocking sockets only: never waits on CUDA.
  void watchForFailure() {
    for (;;) {
      // Read the flag first: a failure recorded just before ~Comm stops the
      // watcher is still passed on by this last look.
      const bool last = watcherStop_.load(std::memory_order_acquire);
      if (atomicLoad<Scope::System>(&hostRecord_->state, MemoryOrder::Acquire) == 2u) {
        if (Op(hostRecord_->op) != Op::PeerFailed) {
          raiseTeamAbort(uint32_t(rank_ + 1));
          abortChannel_.notify(uint32_t(rank_ + 1));  // bounded: about a second at most
        }
        return;
      }
      if (const uint32_t origin = abortChannel_.poll()) raiseTeamAbort(origin);
      if (last) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  // Whether this rank's producers store puts to its lsa members themselves
  // (DevComm::proxyLsaStores): only where every lsa member the proxy reaches
  // is on the local wire (after buildWires chose the wires).
  bool producerStores() const {
    if (!cfg_.proxy.producerStores) return false;
    for (int i = 0; i < dev_.lsaSize; ++i) {
      const int r = rank_ - dev_.lsaRank + i;
      if (transports_[size_t(r)] == uint8_t(Transport::Proxy) && wireOf_[size_t(r)] != uint8_t(ProxyWire::Local))
        return false;
    }
    return true;
  }

  // CommConfig::proxy.producerStores with GIN_PROXY_PRODUCER_STORES applied
  // and auto resolved: 0 or 1.
  int producerStoresSetting() const {
    int want = cfg_.proxy.producerStores;
    if (const char* e = std::getenv("GIN_PROXY_PRODUCER_STORES"); e && *e) {
      const std::string v = e;
      if (v != "0" && v != "1")
        throw Error("GIN_PROXY_PRODUCER_STORES=\"" + v +
                    "\": write 1 (producers store puts to peers mapped here; the engine does only the actions) or 0 "
                    "(the engine copies)");
      want = v == "1";
    }
    return want < 0 ? (gpu_ ? 1 : 0) : (want ? 1 : 0);
  }

  // Engine threads: GIN_PROXY_THREADS, else CommConfig::proxy.threads; at
  // most one per context ring (more would have nothing to consume).
  uint32_t engineThreads() const {
    uint32_t n = cfg_.proxy.threads;
    if (const char* e = std::getenv("GIN_PROXY_THREADS"); e && *e) n = parseThreadCount(e, "GIN_PROXY_THREADS");
    return std::min(n, uint32_t(cfg_.nContexts));
  }

  // The CPUs the engine threads run on (empty: not pinned). GIN_PROXY_CPUS,
  // then CommConfig::proxy.cpus, then (GPU ranks) the CPUs sysfs says are
  // local to the GPU; "none" turns pinning off. A list given by the user must
  // name CPUs this process may use; the GPU's list is narrowed to them.
  std::vector<int> engineCpus() const {
    std::string list, what;
    if (const char* e = std::getenv("GIN_PROXY_CPUS")) {
      list = e;
      what = "GIN_PROXY_CPUS";
    } else if (!cfg_.proxy.cpus.empty()) {
      list = cfg_.proxy.cpus;
      what = "CommConfig::proxy.cpus";
    }
    if (list == "none") return {};
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return {};
    auto usable = [&](int c) { return c >= 0 && c < CPU_SETSIZE && CPU_ISSET(c, &allowed); };
    if (!list.empty()) {
      std::vector<int> cpus = parseCpuList(list, what);
      for (int c : cpus)
        if (!usable(c))
          throw Error(what + "=" + list + ": CPU " + std::to_string(c) + " is not available to this process (rank " +
                      std::to_string(rank_) + "); name CPUs from its affinity mask, or use \"none\"");
      return cpus;
    }
    if (!gpu_) return {};
    std::string bus = peers_[size_t(rank_)].busId;
    for (char& ch : bus) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    std::ifstream f("/sys/bus/pci/devices/" + bus + "/local_cpulist");
    std::string local;
    if (!std::getline(f, local)) return {};
    std::vector<int> cpus;
    try {
      for (int c : parseCpuList(local, "local_cpulist"))
        if (usable(c)) cpus.push_back(c);
    } catch (const Error&) {
      return {};
    }
    return cpus;
  }

#if GIN_WITH_CUDA
  // A failure found by this rank's engine on a GPU rank: the claim word and
  // the abort flag are device memory, which the host reaches only through
  // copies. The record is written only if nobody has started one (a GPU
  // thread claiming at the same moment may interleave with it: both are
  // failures of the same run, and the first one to finish sets state 2).
  void hostRecordError(Op op, int peer, int ctx, uint64_t id, uint64_t expected, uint64_t observed) {
    DeviceErrorRecord& r = *hostRecord_;
    uint32_t idle = 0;
    if (atomicCompareExchange<Scope::System>(&r.state, idle, 1u))
      fillErrorRecord(r, op, rank_, peer, ctx, id, expected, observed);
    try {
      // Any host thread (engine, tcp receiver) may get here: one at a time.
      std::lock_guard<std::mutex> lk(hostReaderMu_);
      hostReader_->store32(dev_.abortFlag, 1u);  // waits on the GPU stop
    } catch (const Error& e) {
      std::fprintf(stderr, "gin: rank %d: could not raise the abort flag: %s\n", rank_, e.what());
    }
  }
#endif

  // Which wire carries the proxy to each peer, agreed by every rank; the tcp
  // wire when any pair of ranks uses it (collective either way).
  void buildWires() {
    std::vector<uint8_t> choice(static_cast<size_t>(nRanks_));
    choice[size_t(rank_)] = uint8_t(cfg_.proxy.wire);
    bs_.allGather(choice.data(), 1);
    for (int r = 1; r < nRanks_; ++r)
      if (choice[size_t(r)] != choice[0])
        throw Error(std::string("ranks disagree on the proxy wire: rank 0 asks for ") +
                    detail::proxyWireName(ProxyWire(choice[0])) + ", rank " + std::to_string(r) + " for " +
                    detail::proxyWireName(ProxyWire(choice[size_t(r)])) +
                    "; set CommConfig::proxy.wire / GIN_PROXY_WIRE the same everywhere");
    const auto want = ProxyWire(choice[0]);
    const bool forceProxy = cfg_.transport == TransportChoice::Proxy;
    const int L = dev_.lsaSize;
    // Pair (a, b) uses the proxy when forced or when they are on different
    // hosts; tcp when so asked, or (auto) across hosts. The same on every rank.
    auto pairWire = [&](int a, int b) {
      const bool sameHost = a / L == b / L;
      if (a == b || (sameHost && !forceProxy)) return ProxyWire::Auto;  // lsa, or a copy to oneself
      if (want == ProxyWire::Verbs) return ProxyWire::Verbs;            // never chosen by auto until it ran on hardware
      if (want == ProxyWire::Tcp || (want == ProxyWire::Auto && !sameHost)) return ProxyWire::Tcp;
      if (!sameHost)
        throw Error(
            "the proxy wire is forced to local (GIN_PROXY_WIRE/CommConfig::proxy.wire), which cannot reach "
            "rank " +
            std::to_string(b) + " on another host from rank " + std::to_string(a) + "; use auto or tcp");
      return ProxyWire::Local;
    };
    wireOf_.assign(size_t(nRanks_), uint8_t(ProxyWire::Auto));
    std::vector<uint8_t> useTcp(size_t(nRanks_), 0);
    bool anyTcp = false, anyVerbs = false, remote = false;
    for (int a = 0; a < nRanks_; ++a)
      for (int b = 0; b < nRanks_; ++b) {
        anyTcp = anyTcp || pairWire(a, b) == ProxyWire::Tcp;
        anyVerbs = anyVerbs || pairWire(a, b) == ProxyWire::Verbs;
      }
    for (int r = 0; r < nRanks_; ++r) {
      if (transports_[size_t(r)] != uint8_t(Transport::Proxy)) continue;
      const ProxyWire w = pairWire(rank_, r);
      wireOf_[size_t(r)] = uint8_t(w == ProxyWire::Auto ? ProxyWire::Local : w);
      useTcp[size_t(r)] = w == ProxyWire::Tcp;
      remote = remote || (w == ProxyWire::Tcp && r / L != rank_ / L);
    }
    dev_.proxyLsaStores = producerStores() ? 1 : 0;
    if (anyVerbs) buildVerbsWire();
    if (!anyTcp) return;
    TcpGpu gpu;
#if GIN_WITH_CUDA
    if (gpu_) {
      // Windows are device memory (staged through pinned buffers); the
      // signal words are host memory (proxySignals_) and failures take the
      // host path of the error record.
      gpu.device = cudaDev_;
      gpu.senders = int(cfg_.proxy.threads);
      gpu.fail = [this](Op op, int peer, int ctx, uint64_t id, uint64_t expected, uint64_t observed) {
        hostRecordError(op, peer, ctx, id, expected, observed);
      };
    }
#endif
    uint64_t* signals = gpu_ ? reinterpret_cast<uint64_t*>(proxySignals_.data()) : dev_.signals;
    tcp_ = std::make_unique<TcpWire>(bs_, dev_, dir_, signals, nSignalWords_, useTcp, cfg_.timeoutNs,
                                     detail::tcpWireAddress(bs_, remote), std::move(gpu));
  }

  // After buildState (signals mapped, DevComm filled): QPs, key tables, NIC.
  void startIbgda() {
    ibgda_ = std::make_unique<IbgdaTransport>(bs_, dev_, transports_, lsaSignalPtrs_, nSignalWords_, gpu_, cfg_.ibgda);
    dev_.ibgda = ibgda_->dev();
    ibgda_->onNicStopped([this](const char*) {
#if GIN_WITH_CUDA
      if (gpu_) return hostRecordError(Op::IbgdaNic, -1, -1, 0, 0, 0);
#endif
      recordError(dev_, Op::IbgdaNic, -1, -1, 0, 0, 0);
    });
  }

  // Collective when any pair uses verbs: every rank builds the wire (a rank
  // with no verbs peers opens no device but joins the collectives).
  void buildVerbsWire() {
#if GIN_COMM_VERBS
    VerbsWireConfig vc;
    std::vector<int> peers;
    for (int r = 0; r < nRanks_; ++r)
      if (wireOf_[size_t(r)] == uint8_t(ProxyWire::Verbs)) peers.push_back(r);
    vc.peers = peers;
    vc.timeoutNs = cfg_.timeoutNs;
    vc.cudaDevice = gpu_ ? cudaDev_ : -1;
    vc.onAsyncError = [this](int peer, const std::string& what) {
      std::fprintf(stderr, "gin: rank %d: verbs wire: %s\n", rank_, what.c_str());
#if GIN_WITH_CUDA
      if (gpu_) return hostRecordError(Op::ProxyEngine, peer, -1, 0, 0, 0);
#endif
      recordError(dev_, Op::ProxyEngine, peer, -1, 0, 0, 0);
    };
    uint64_t* signals = gpu_ ? reinterpret_cast<uint64_t*>(proxySignals_.data()) : dev_.signals;
    verbs_ = std::make_unique<VerbsWire>(bs_, signals, nSignalWords_, vc);
#else
    throw Error(
        "the proxy wire is set to verbs (GIN_PROXY_WIRE / CommConfig::proxy.wire), but this program was built "
        "without the verbs wire in the Comm: compile it with -DGIN_COMM_VERBS=1 and link -libverbs (rdma-core)");
#endif
  }

  void printTransports() const {
    std::string s = "gin: rank 0 transport table (" + std::to_string(nRanks_) + " ranks):";
    for (int r = 0; r < nRanks_; ++r)
      s += " " + std::to_string(r) + "=" + detail::transportName(Transport(transports_[size_t(r)]));
    if (dev_.proxyRings) {
      s += "; proxy wires:";
      for (int r = 0; r < nRanks_; ++r)
        if (wireOf_[size_t(r)] != uint8_t(ProxyWire::Auto))
          s += " " + std::to_string(r) + "=" + detail::proxyWireName(ProxyWire(wireOf_[size_t(r)]));
      s += "; " + std::to_string(cfg_.nContexts) + " rings x " + std::to_string(cfg_.proxy.ringSlots) + " slots";
      if (tcp_) s += "; tcp wire on port " + std::to_string(tcp_->port());
#if GIN_COMM_VERBS
      if (verbs_)
        s += "; verbs wire on " + verbs_->deviceName() + " port " + std::to_string(verbs_->port()) +
             (verbs_->roce() ? " (RoCE, GID index " + std::to_string(verbs_->gidIndex()) + ")" : " (InfiniBand)");
#endif
      if (gpu_) s += std::string("; GPU: ") + (dev_.proxyLsaStores ? "producers store to mapped peers" : "side-context copies") + ", signals and counters in host memory";
      s += "; " + std::to_string(cfg_.proxy.threads) + " engine thread(s)";
      s += engineCpus_.empty() ? std::string(", not pinned")
                               : ", on " + std::to_string(engineCpus_.size()) + " CPU(s) from " +
                                     std::to_string(engineCpus_.front()) + " to " + std::to_string(engineCpus_.back());
    }
    if (ibgda_)
      s += "; ibgda: " + std::to_string(cfg_.nContexts) + " QPs per peer x " +
           std::to_string(ibgda_->config().qpDepth) + " WQEs, " + ibgda_->nicName();
    std::fprintf(stderr, "%s\n", s.c_str());
  }

  // Collective: every rank learns every rank's verdict (and size); the first
  // rank with a problem names it, on every rank.
  struct Vote {
    uint64_t bytes;
    char problem[240];
  };
  std::vector<Vote> vote(const char* what, uint64_t bytes, const char* localProblem) {
    std::vector<Vote> votes(static_cast<size_t>(nRanks_));
    Vote& v = votes[size_t(rank_)];
    v.bytes = bytes;
    std::snprintf(v.problem, sizeof v.problem, "%s", localProblem ? localProblem : "");
    bs_.allGather(votes.data(), sizeof(Vote));
    for (int r = 0; r < nRanks_; ++r)
      if (votes[size_t(r)].problem[0])
        throw Error(std::string(what) + ": on rank " + std::to_string(r) + ", " + votes[size_t(r)].problem);
    return votes;
  }

  // Collective: every rank runs `step` (a local check or setup); if it threw
  // a gin::Error on any rank, every rank throws with that rank's message.
  template <class Step>
  void agreeOn(const char* what, Step&& step) {
    std::string problem;
    try {
      step();
    } catch (const Error& e) {
      problem = e.what();
    }
    (void)vote(what, 0, problem.empty() ? nullptr : problem.c_str());
  }

  // Collective argument check: every rank learns every rank's size and verdict.
  void agreeOnSize(const char* what, size_t bytes, const char* localProblem) {
    const std::vector<Vote> votes = vote(what, bytes, localProblem);
    for (int r = 1; r < nRanks_; ++r)
      if (votes[size_t(r)].bytes != votes[0].bytes)
        throw Error(std::string(what) + ": ranks disagree on the window size: rank 0 passed " +
                    std::to_string(votes[0].bytes) + " bytes, rank " + std::to_string(r) + " passed " +
                    std::to_string(votes[size_t(r)].bytes) + "; every rank must pass the same size");
  }

  ShareHandle shareUserRange(void* ptr, size_t bytes) {
    char* p = static_cast<char*>(ptr);
    for (auto& b : userAllocs_)
      if (p >= b->data() && p + bytes <= b->data() + b->bytes()) return b->share(p);
    if (gpu_) {
#if GIN_WITH_CUDA
      auto [base, allocBytes] = cudaAllocationRange(p);
      if (p + bytes > base + allocBytes)
        throw Error("registerWindow: [ptr, ptr+" + std::to_string(bytes) +
                    ") runs past the end of its cudaMalloc allocation (" +
                    std::to_string(allocBytes - size_t(p - base)) + " bytes left)");
      ShareHandle h{};
      h.kind = ShareHandle::CudaIpc;
      h.rawPtr = reinterpret_cast<uint64_t>(p);
      h.offset = uint64_t(p - base);
      h.allocBytes = allocBytes;
      cudaIpcMemHandle_t ipc;
      GIN_CUDA_CHECK(cudaIpcGetMemHandle(&ipc, base));
      std::memcpy(h.ipc, &ipc, sizeof ipc);
      return h;
#endif
    }
    ShareHandle h{};
    h.kind = ShareHandle::Heap;
    h.rawPtr = reinterpret_cast<uint64_t>(p);
    return h;  // mapping it from another process fails with a message saying to use memAlloc
  }

  Window finishWindow(std::unique_ptr<WindowRecord> rec, size_t bytes, const ShareHandle& h) {
    rec->id = nextWindowId_++;
    rec->bytes = bytes;
    std::vector<char*> bases = exchange(h, rec->local, rec->peers);
    if (rec->owned) rec->buffer.unlinkName();
    rec->publish(gpu_, dev_.lsaSize, bases);
    dir_.add(rec->id, WindowDirectory::Entry{uint64_t(bytes), rec->local, bases});
    if (ibgda_) ibgda_->addWindow(rec->id, rec->local, uint64_t(bytes), bases);
#if GIN_COMM_VERBS
    if (verbs_) verbs_->registerWindow(rec->id, rec->local, uint64_t(bytes), gpu_);  // collective
#endif
    const Window w = rec->handle();
    windows_.emplace(w.dev, std::move(rec));
    // Every rank must know the window before any rank returns: a peer's put
    // may follow at once, and a tcp receiver refuses a frame for a window it
    // has not added yet (failing the communicator). lsa, verbs and ibgda need
    // no barrier: what checks a put (the target's memory registration, or the
    // initiator's soft NIC) is set up on every rank before the exchange ends.
    if (tcp_) bs_.barrier();
    return w;
  }

  const WindowRecord& record(Window w, const char* what) const {
    auto it = windows_.find(w.dev);
    if (it == windows_.end())
      throw Error(std::string(what) +
                  ": the window is not registered with this communicator (deregistered already, or "
                  "from another communicator)");
    return *it->second;
  }
};

}  // namespace gin
