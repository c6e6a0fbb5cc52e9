// gin/host/proxy_transport.hpp — the host side of the proxy transport as a
// Comm holds it: the context rings, the wires (local, tcp, verbs) chosen per
// peer, the engine threads (count, CPUs, GPU copiers) and the ProxyEngine.
// The Comm drives it in this order, every step on every rank:
//   configure (collective, when a peer uses the proxy) -> buildRings (when a
//   peer uses the proxy) -> buildWires (collective, always) -> start (when a
//   peer uses the proxy) ... quiesce / addWindow / removeWindow ... stop.
// The engine is declared last so it is destroyed first: it polls the rings
// and writes through the wires and the window directory.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "gin/core/error.hpp"
#include "gin/device/comm.hpp"
#include "gin/host/agree.hpp"
#include "gin/host/bootstrap.hpp"
#include "gin/host/comm_config.hpp"
#include "gin/host/cpu_pinning.hpp"
#include "gin/host/dev_comm_memory.hpp"
#include "gin/host/env.hpp"
#include "gin/host/proxy.hpp"
#include "gin/host/proxy_rings.hpp"
#include "gin/host/tcp_wire.hpp"
#include "gin/host/topology.hpp"

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

class ProxyTransport {
 public:
  // Collective: the engine's CPUs, thread count and producer stores, checked
  // on every rank together, so a bad setting stops all of them. Writes the
  // settings in use back into `cfg.proxy`.
  void configure(Bootstrap& bs, const Topology& topo, CommConfig& cfg) {
    detail::agreeOn(bs, "proxy engine CPUs", [&] {
      engineCpus_ = detail::engineCpus(cfg.proxy, topo.rank, topo.gpu, topo.peers[size_t(topo.rank)].busId);
    });
    detail::agreeOn(bs, "proxy engine threads", [&] { cfg.proxy.threads = engineThreads(cfg); });
    detail::agreeOn(bs, "proxy producer stores",
                    [&] { cfg.proxy.producerStores = producerStoresSetting(cfg, topo.gpu); });
  }

  // Local: the rings' memory; fills DevComm::proxyRings.
  void buildRings(const Topology& topo, const CommConfig& cfg, DevComm& dev) {
    dev.proxyRings = rings_.build(topo.gpu, size_t(cfg.nContexts), cfg.proxy.ringSlots);
  }

  // Which wire carries the proxy to each peer, agreed by every rank; the tcp
  // (and verbs) wire when any pair of ranks uses it (collective either way).
  // After the DevComm memory is built; sets DevComm::proxyLsaStores.
  void buildWires(Bootstrap& bs, const Topology& topo, const CommConfig& cfg, DevComm& dev, WindowDirectory& dir,
                  DevCommMemory& mem) {
    const int nRanks = topo.nRanks, rank = topo.rank;
    std::vector<uint8_t> choice(static_cast<size_t>(nRanks));
    choice[size_t(rank)] = uint8_t(cfg.proxy.wire);
    bs.allGather(choice.data(), 1);
    for (int r = 1; r < nRanks; ++r)
      if (choice[size_t(r)] != choice[0])
        throw Error(std::string("ranks disagree on the proxy wire: rank 0 asks for ") +
                    detail::proxyWireName(ProxyWire(choice[0])) + ", rank " + std::to_string(r) + " for " +
                    detail::proxyWireName(ProxyWire(choice[size_t(r)])) +
                    "; set CommConfig::proxy.wire / GIN_PROXY_WIRE the same everywhere");
    const auto want = ProxyWire(choice[0]);
    const bool forceProxy = cfg.transport == TransportChoice::Proxy;
    const int L = topo.lsaSize;
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
    wireOf_.assign(size_t(nRanks), uint8_t(ProxyWire::Auto));
    std::vector<uint8_t> useTcp(size_t(nRanks), 0);
    bool anyTcp = false, anyVerbs = false, remote = false;
    for (int a = 0; a < nRanks; ++a)
      for (int b = 0; b < nRanks; ++b) {
        anyTcp = anyTcp || pairWire(a, b) == ProxyWire::Tcp;
        anyVerbs = anyVerbs || pairWire(a, b) == ProxyWire::Verbs;
      }
    for (int r = 0; r < nRanks; ++r) {
      if (topo.transports[size_t(r)] != uint8_t(Transport::Proxy)) continue;
      const ProxyWire w = pairWire(rank, r);
      wireOf_[size_t(r)] = uint8_t(w == ProxyWire::Auto ? ProxyWire::Local : w);
      useTcp[size_t(r)] = w == ProxyWire::Tcp;
      remote = remote || (w == ProxyWire::Tcp && r / L != rank / L);
    }
    dev.proxyLsaStores = producerStores(topo, cfg) ? 1 : 0;
    if (anyVerbs) buildVerbsWire(bs, topo, cfg, dev, mem);
    if (!anyTcp) return;
    TcpGpu gpu;
#if GIN_WITH_CUDA
    if (topo.gpu) {
      // Windows are device memory (staged through pinned buffers); the
      // signal words are host memory and failures take the host path of the
      // error record.
      gpu.device = topo.cudaDev;
      gpu.senders = int(cfg.proxy.threads);
      gpu.fail = [&mem](Op op, int peer, int ctx, uint64_t id, uint64_t expected, uint64_t observed) {
        mem.hostRecordError(op, peer, ctx, id, expected, observed);
      };
    }
#endif
    tcp_ = std::make_unique<TcpWire>(bs, dev, dir, mem.hostSignals(dev.signals), mem.nSignalWords(), useTcp,
                                     cfg.timeoutNs, detail::tcpWireAddress(bs, remote), std::move(gpu));
  }

  // Starts the engine threads: one wire each (its local part, on GPUs with
  // a copier of its own, so complete() waits for that thread's copies only,
  // and the network wires, which every thread shares).
  void start(const Topology& topo, const CommConfig& cfg, const DevComm& dev, WindowDirectory& dir,
             DevCommMemory& mem) {
    std::vector<ProxyEngine::Ring> rings = rings_.hostRings();
    ProxyHooks hooks;
    auto pin = [cpus = engineCpus_] { detail::pinThisThread(cpus); };
    hooks.threadInit = pin;
    const size_t nThreads = cfg.proxy.threads;
    const int lsaBase = topo.lsaBase();
    wires_.resize(nThreads);
#if GIN_WITH_CUDA
    if (topo.gpu) {
      for (size_t t = 0; t < nThreads; ++t) {
        copiers_.push_back(std::make_unique<GpuCopier>(topo.cudaDev));
        wires_[t] =
            std::make_unique<LocalWire>(dir, lsaBase, mem.lsaSignalPtrs(), mem.nSignalWords(), copiers_[t].get());
      }
      std::vector<const uint64_t*> heads;
      for (const auto& r : rings) heads.push_back(r.head);
      hooks.head = [&mem, heads](int ctx) { return mem.readDeviceWord(heads[size_t(ctx)]); };
      hooks.threadInit = [c = copiers_[0].get(), pin] {  // every copier is of the same GPU
        pin();
        c->bind();
      };
      hooks.fail = [&mem](Op op, int peer, int ctx, uint64_t id, uint64_t expected, uint64_t observed) {
        mem.hostRecordError(op, peer, ctx, id, expected, observed);
      };
      hooks.counters = mem.hostCounters();
    }
#endif
    Wire* network[2] = {tcp_.get(), nullptr};
#if GIN_COMM_VERBS
    network[1] = verbs_.get();
#endif
    std::vector<Wire*> wires;
    for (auto& w : wires_) {
      if (!w) w = std::make_unique<LocalWire>(dir, lsaBase, mem.lsaSignalPtrs(), mem.nSignalWords());
      if (network[0] || network[1])
        w = std::make_unique<RoutedWire>(std::move(w), network[0], network[1], wireOf_);  // tcp_wire.hpp
      wires.push_back(w.get());
    }
    engine_ = std::make_unique<ProxyEngine>(dev, std::move(rings), std::move(wires), dir, mem.nSignalWords(), cfg.proxy,
                                            std::move(hooks));
  }

  // The engine, or nullptr when no peer uses the proxy; the tcp wire, or
  // nullptr when no pair of ranks uses it.
  ProxyEngine* engine() const { return engine_.get(); }
  TcpWire* tcp() const { return tcp_.get(); }
  // The wire to `worldRank`: Local, Tcp or Verbs; Auto when not proxied.
  ProxyWire wireTo(int worldRank) const { return ProxyWire(wireOf_.at(size_t(worldRank))); }

  // Bounded waits before a window goes: our engine finishes what was pushed
  // before, so it never writes into a window a peer is about to free; over
  // tcp "consumed" means "sent", so the fence waits until what peers sent us
  // has been applied. A stuck engine or a lost peer is in the error record.
  void quiesce(uint64_t timeoutNs) {
    if (engine_) (void)engine_->quiesce(timeoutNs);
    if (tcp_) (void)tcp_->fence(timeoutNs);
  }
  // Collective where the verbs wire is in use.
  void addWindow(uint32_t id, char* local, uint64_t bytes, bool gpu) {
#if GIN_COMM_VERBS
    if (verbs_) verbs_->registerWindow(id, local, bytes, gpu);  // collective
#else
    (void)id, (void)local, (void)bytes, (void)gpu;
#endif
  }
  void removeWindow(uint32_t id) {
#if GIN_COMM_VERBS
    if (verbs_) verbs_->deregisterWindow(id);
#else
    (void)id;
#endif
  }
  // Whether a new window needs a barrier before use: a tcp receiver refuses
  // a frame for a window it has not added yet.
  bool windowNeedsBarrier() const { return tcp_ != nullptr; }

  // Our engine writes into peers' memory: it drains and stops before the
  // barrier that lets them free it. The tcp wire's destructor then waits for
  // the peers' goodbyes: all in flight is applied.
  void stop() {
    engine_.reset();
    if (tcp_) tcp_->closeSend();
  }

  // GIN_DEBUG's description: wires per peer, rings, engine threads.
  std::string describe(const Topology& topo, const CommConfig& cfg, const DevComm& dev) const {
    std::string s = "; proxy wires:";
    for (int r = 0; r < topo.nRanks; ++r)
      if (wireOf_[size_t(r)] != uint8_t(ProxyWire::Auto))
        s += " " + std::to_string(r) + "=" + detail::proxyWireName(ProxyWire(wireOf_[size_t(r)]));
    s += "; " + std::to_string(cfg.nContexts) + " rings x " + std::to_string(cfg.proxy.ringSlots) + " slots";
    if (tcp_) s += "; tcp wire on port " + std::to_string(tcp_->port());
#if GIN_COMM_VERBS
    if (verbs_)
      s += "; verbs wire on " + verbs_->deviceName() + " port " + std::to_string(verbs_->port()) +
           (verbs_->roce() ? " (RoCE, GID index " + std::to_string(verbs_->gidIndex()) + ")" : " (InfiniBand)");
#endif
    if (topo.gpu)
      s += std::string("; GPU: ") + (dev.proxyLsaStores ? "producers store to mapped peers" : "side-context copies") +
           ", signals and counters in host memory";
    s += "; " + std::to_string(cfg.proxy.threads) + " engine thread(s)";
    s += engineCpus_.empty() ? std::string(", not pinned")
                             : ", on " + std::to_string(engineCpus_.size()) + " CPU(s) from " +
                                   std::to_string(engineCpus_.front()) + " to " + std::to_string(engineCpus_.back());
    return s;
  }

 private:
  ProxyRingSet rings_;
  std::vector<int> engineCpus_;  // the engine threads' CPUs (empty: not pinned)
#if GIN_WITH_CUDA
  std::vector<std::unique_ptr<GpuCopier>> copiers_;  // [engine thread]: its copies
#endif
  std::vector<uint8_t> wireOf_;   // per peer: ProxyWire::Local / Tcp / Verbs, Auto when not proxied
  std::unique_ptr<TcpWire> tcp_;  // its receiver writes into the windows and signals
#if GIN_COMM_VERBS
  std::unique_ptr<VerbsWire> verbs_;  // likewise (its receiver thread applies signals)
#endif
  std::vector<std::unique_ptr<Wire>> wires_;  // [engine thread]
  std::unique_ptr<ProxyEngine> engine_;

  // Engine threads: GIN_PROXY_THREADS, else CommConfig::proxy.threads; at
  // most one per context ring (more would have nothing to consume).
  static uint32_t engineThreads(const CommConfig& cfg) {
    uint32_t n = cfg.proxy.threads;
    if (auto e = env::integer("GIN_PROXY_THREADS")) n = uint32_t(*e);
    return std::min(n, uint32_t(cfg.nContexts));
  }

  // CommConfig::proxy.producerStores with GIN_PROXY_PRODUCER_STORES applied
  // and auto resolved: 0 or 1.
  static int producerStoresSetting(const CommConfig& cfg, bool gpu) {
    int want = cfg.proxy.producerStores;
    if (auto e = env::flag("GIN_PROXY_PRODUCER_STORES")) want = *e;
    return want < 0 ? (gpu ? 1 : 0) : (want ? 1 : 0);
  }

  // Whether this rank's producers store puts to its lsa members themselves
  // (DevComm::proxyLsaStores): only where every lsa member the proxy reaches
  // is on the local wire (after buildWires chose the wires).
  bool producerStores(const Topology& topo, const CommConfig& cfg) const {
    if (!cfg.proxy.producerStores) return false;
    for (int i = 0; i < topo.lsaSize; ++i) {
      const int r = topo.lsaBase() + i;
      if (topo.transports[size_t(r)] == uint8_t(Transport::Proxy) && wireOf_[size_t(r)] != uint8_t(ProxyWire::Local))
        return false;
    }
    return true;
  }

  // Collective when any pair uses verbs: every rank builds the wire (a rank
  // with no verbs peers opens no device but joins the collectives).
  void buildVerbsWire(Bootstrap& bs, const Topology& topo, const CommConfig& cfg, DevComm& dev, DevCommMemory& mem) {
#if GIN_COMM_VERBS
    VerbsWireConfig vc;
    std::vector<int> peers;
    for (int r = 0; r < topo.nRanks; ++r)
      if (wireOf_[size_t(r)] == uint8_t(ProxyWire::Verbs)) peers.push_back(r);
    vc.peers = peers;
    vc.timeoutNs = cfg.timeoutNs;
    vc.cudaDevice = topo.gpu ? topo.cudaDev : -1;
    vc.onAsyncError = [rank = topo.rank, gpu = topo.gpu, &dev, &mem](int peer, const std::string& what) {
      std::fprintf(stderr, "gin: rank %d: verbs wire: %s\n", rank, what.c_str());
#if GIN_WITH_CUDA
      if (gpu) return mem.hostRecordError(Op::ProxyEngine, peer, -1, 0, 0, 0);
#endif
      recordError(dev, Op::ProxyEngine, peer, -1, 0, 0, 0);
    };
    verbs_ = std::make_unique<VerbsWire>(bs, mem.hostSignals(dev.signals), mem.nSignalWords(), vc);
#else
    (void)bs, (void)topo, (void)cfg, (void)dev, (void)mem;
    throw Error(
        "the proxy wire is set to verbs (GIN_PROXY_WIRE / CommConfig::proxy.wire), but this program was built "
        "without the verbs wire in the Comm: compile it with -DGIN_COMM_VERBS=1 and link -libverbs (rdma-core)");
#endif
  }
};

}  // namespace gin
