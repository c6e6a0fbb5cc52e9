// gin/host/comm.hpp — the communicator: what a user calls to set up gin and
// hand a DevComm to kernels: construction, windows, memory, errors.
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
//
// The parts it is built from: comm_config.hpp (CommConfig, environment),
// topology.hpp (teams, transport per peer), dev_comm_memory.hpp (signals,
// counters, barriers, error record), proxy_transport.hpp and ibgda.hpp (one
// host piece per network transport), failure_watcher.hpp (team abort),
// agree.hpp (collective argument checks). Tests reach the transports'
// internals through gin/host/test_access.hpp.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gin/device/comm.hpp"
#include "gin/device/window.hpp"
#include "gin/host/agree.hpp"
#include "gin/host/bootstrap.hpp"
#include "gin/host/comm_config.hpp"
#include "gin/host/dev_comm_memory.hpp"
#include "gin/host/error_text.hpp"
#include "gin/host/failure_watcher.hpp"
#include "gin/host/ibgda.hpp"
#include "gin/host/memory.hpp"
#include "gin/host/proxy.hpp"
#include "gin/host/proxy_transport.hpp"
#include "gin/host/topology.hpp"
#include "gin/host/window.hpp"

namespace gin {

namespace test {
struct CommAccess;  // gin/host/test_access.hpp
}

class Comm {
 public:
  explicit Comm(Bootstrap& bs, CommConfig cfg = {})
      : bs_(bs), cfg_(detail::resolveCommConfig(cfg)), topo_(Topology::discover(bs, cfg_)) {
    dev_.rank = topo_.rank;
    dev_.nRanks = topo_.nRanks;
    dev_.lsaSize = topo_.lsaSize;
    dev_.lsaRank = topo_.lsaRank;
    dev_.railSize = topo_.railSize;
    dev_.railRank = topo_.railRank;
    dev_.proxyAll = topo_.proxyAll ? 1 : 0;
    dev_.ibgdaAll = topo_.ibgdaAll ? 1 : 0;
    // Every rank knows the host count, so all or none take part.
    if (dev_.railSize > 1) watcher_.openChannel(bs_, dev_);
    const bool proxy = topo_.uses(Transport::Proxy);
    if (proxy) proxy_.configure(bs_, topo_, cfg_);
    if (proxy) proxy_.buildRings(topo_, cfg_, dev_);
    mem_.build(bs_, topo_, cfg_, dev_);
    bs_.barrier();  // every rank's signals and inboxes are zero before anyone uses them
    proxy_.buildWires(bs_, topo_, cfg_, dev_, dir_, mem_);  // collective: the tcp wire connects the pairs that use it
    if (dev_.proxyRings) proxy_.start(topo_, cfg_, dev_, dir_, mem_);
    if (topo_.uses(Transport::Ibgda)) startIbgda();
    if (rank() == 0 && detail::envDebug()) printTransports();
    watcher_.start(rank(), &mem_.hostRecord(), mem_.teamWords());  // last: nothing may throw after it starts
  }

  ~Comm() {
    watcher_.stop();
    // Our engine writes into peers' memory: it drains and stops before the
    // barrier that lets them free it. So does our (soft) NIC.
    proxy_.stop();
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
      mem_.leak();
      for (auto& [handle, rec] : windows_) rec->buffer.leak();
      for (auto& a : userAllocs_) a->leak();
      return;
    }
  }
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const { return topo_.rank; }
  int nRanks() const { return topo_.nRanks; }
  int lsaRank() const { return dev_.lsaRank; }
  int lsaSize() const { return dev_.lsaSize; }
  int railRank() const { return dev_.railRank; }
  int railSize() const { return dev_.railSize; }
  bool onGpu() const { return topo_.gpu; }
  int cudaDevice() const { return topo_.cudaDev; }
  const CommConfig& config() const { return cfg_; }
  Bootstrap& bootstrap() const { return bs_; }
  Transport transportTo(int worldRank) const { return Transport(topo_.transports.at(size_t(worldRank))); }
  // The wire the proxy uses to reach `worldRank`: Local or Tcp; Auto when
  // that peer is not reached through the proxy.
  ProxyWire proxyWireTo(int worldRank) const { return proxy_.wireTo(worldRank); }

  // What kernels receive (by value).
  const DevComm& devComm() const { return dev_; }

  // Symmetric allocation: `bytes` of zeroed memory on every rank, mapped on
  // every lsa peer. Collective; every rank passes the same size. Once it has
  // returned on one rank, that rank may put into the window on any peer at
  // once (the same holds for registerWindow).
  Window allocWindow(size_t bytes) {
    detail::agreeOnSize(bs_, "allocWindow", bytes, bytes == 0 ? "bytes must be greater than 0" : nullptr);
    auto rec = std::make_unique<WindowRecord>();
    rec->owned = true;
    rec->buffer = SharedBuffer::allocate(topo_.backing(), bytes);
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
    detail::agreeOnSize(bs_, "registerWindow", bytes, problem.empty() ? nullptr : problem.c_str());
    auto rec = std::make_unique<WindowRecord>();
    rec->local = static_cast<char*>(ptr);
    return finishWindow(std::move(rec), bytes, h);
  }

  // Undo allocWindow/registerWindow. Collective. The Window must not be used
  // afterwards; using it in a host call again is an error.
  void deregisterWindow(Window w) {
    auto it = windows_.find(w.dev);
    const uint32_t id = it == windows_.end() ? 0 : it->second->id;
    std::vector<uint32_t> ids(static_cast<size_t>(nRanks()));
    ids[size_t(rank())] = id;
    bs_.allGather(ids.data(), sizeof(uint32_t));
    for (int r = 0; r < nRanks(); ++r) {
      if (ids[size_t(r)] == 0)
        throw Error("deregisterWindow: rank " + std::to_string(r) +
                    " passed a window that is not registered with this communicator (already deregistered, or "
                    "from another communicator)");
      if (ids[size_t(r)] != ids[0])
        throw Error("deregisterWindow: ranks passed different windows (rank 0 window " + std::to_string(ids[0]) +
                    ", rank " + std::to_string(r) + " window " + std::to_string(ids[size_t(r)]) +
                    "); deregister windows in the same order everywhere");
    }
    // Nothing of ours still writes into it (bounded; a stuck engine or NIC
    // or a lost peer is reported through the error record anyway).
    proxy_.quiesce(cfg_.timeoutNs);
    if (ibgda_) (void)ibgda_->quiesce(cfg_.timeoutNs);
    bs_.barrier();  // nobody still writes into it
    if (ibgda_) ibgda_->removeWindow(id);
    proxy_.removeWindow(id);
    dir_.remove(id);
    windows_.erase(it);
  }
  void freeWindow(Window w) { deregisterWindow(w); }

  // Memory that registerWindow accepts on every kind of rank (GPU: cudaMalloc;
  // CPU: heap, or shared memory when lsa peers run in other processes). Local.
  void* memAlloc(size_t bytes) {
    if (bytes == 0) throw Error("memAlloc: bytes must be greater than 0");
    userAllocs_.push_back(std::make_unique<SharedBuffer>(SharedBuffer::allocate(topo_.backing(), bytes)));
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
    if (atomicLoad<Scope::System>(&mem_.hostRecord().state, MemoryOrder::Acquire) == 2u)
      throw Error(describe(mem_.hostRecord()));
  }
  bool hasError() const { return atomicLoad<Scope::System>(&mem_.hostRecord().state, MemoryOrder::Acquire) != 0u; }

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
    if (topo_.gpu) {
      GIN_CUDA_CHECK(cudaSetDevice(topo_.cudaDev));
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
          std::fprintf(stderr, "gin: rank %d: Comm::synchronize has waited %.1f s for this rank's GPU work; %s\n",
                       rank(), double(waited) * 1e-9,
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
    if (topo_.gpu) GIN_CUDA_CHECK(cudaSetDevice(topo_.cudaDev));
#endif
  }

 private:
  friend struct test::CommAccess;

  Bootstrap& bs_;
  CommConfig cfg_;  // resolved: environment applied, engine settings in use
  Topology topo_;
  DevComm dev_{};
  DevCommMemory mem_;       // what dev_ points to; everything below writes into it
  FailureWatcher watcher_;  // reads mem_'s error record; stopped first
  uint32_t nextWindowId_ = 1;
  std::map<const WindowDev*, std::unique_ptr<WindowRecord>> windows_;
  std::vector<std::unique_ptr<SharedBuffer>> userAllocs_;
  WindowDirectory dir_;
  // The network transports, declared last so they are destroyed first: they
  // write into the windows and signals above.
  ProxyTransport proxy_;                   // rings, wires and engine (inert when no peer uses the proxy)
  std::unique_ptr<IbgdaTransport> ibgda_;  // only when some peer uses ibgda

  // After the DevComm memory is built (signals mapped): QPs, key tables, NIC.
  void startIbgda() {
    ibgda_ = std::make_unique<IbgdaTransport>(bs_, dev_, topo_.transports, mem_.lsaSignalPtrs(), mem_.nSignalWords(),
                                              topo_.gpu, cfg_.ibgda);
    dev_.ibgda = ibgda_->dev();
    ibgda_->onNicStopped([this](const char*) {
#if GIN_WITH_CUDA
      if (topo_.gpu) return mem_.hostRecordError(Op::IbgdaNic, -1, -1, 0, 0, 0);
#endif
      recordError(dev_, Op::IbgdaNic, -1, -1, 0, 0, 0);
    });
  }

  // GIN_DEBUG: the environment (gin/host/env.hpp), the resolved config, and
  // the transport (and proxy wire) chosen for each peer.
  void printTransports() const {
    std::string s = env::describe("gin: rank 0 ");
    s += "gin: rank 0 " + detail::describeConfig(cfg_) + (topo_.gpu ? "; GPU " + std::to_string(topo_.cudaDev) : "; CPU ranks") + "\n";
    s += "gin: rank 0 transport table (" + std::to_string(nRanks()) + " ranks):";
    for (int r = 0; r < nRanks(); ++r)
      s += " " + std::to_string(r) + "=" + detail::transportName(Transport(topo_.transports[size_t(r)]));
    if (dev_.proxyRings) s += proxy_.describe(topo_, cfg_, dev_);
    if (ibgda_)
      s += "; ibgda: " + std::to_string(cfg_.nContexts) + " QPs per peer x " +
           std::to_string(ibgda_->config().qpDepth) + " WQEs, " + ibgda_->nicName();
    std::fprintf(stderr, "%s\n", s.c_str());
  }

  ShareHandle shareUserRange(void* ptr, size_t bytes) {
    char* p = static_cast<char*>(ptr);
    for (auto& b : userAllocs_)
      if (p >= b->data() && p + bytes <= b->data() + b->bytes()) return b->share(p);
    if (topo_.gpu) {
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
    std::vector<char*> bases = topo_.mapLsaPeers(bs_, h, rec->local, rec->peers);
    if (rec->owned) rec->buffer.unlinkName();
    rec->publish(topo_.gpu, dev_.lsaSize, bases);
    dir_.add(rec->id, WindowDirectory::Entry{uint64_t(bytes), rec->local, bases});
    if (ibgda_) ibgda_->addWindow(rec->id, rec->local, uint64_t(bytes), bases);
    proxy_.addWindow(rec->id, rec->local, uint64_t(bytes), topo_.gpu);  // collective with the verbs wire
    const Window w = rec->handle();
    windows_.emplace(w.dev, std::move(rec));
    // Every rank must know the window before any rank returns: a peer's put
    // may follow at once, and a tcp receiver refuses a frame for a window it
    // has not added yet (failing the communicator). lsa, verbs and ibgda need
    // no barrier: what checks a put (the target's memory registration, or the
    // initiator's soft NIC) is set up on every rank before the exchange ends.
    if (proxy_.windowNeedsBarrier()) bs_.barrier();
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
