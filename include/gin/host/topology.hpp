// gin/host/topology.hpp — who the ranks of a communicator are and how they
// reach each other: host ids, processes and GPUs of every rank, the teams
// (world; lsa = the ranks of one host; rail = the same local index on every
// host), the transport to each peer, and mapping the lsa members' memory.
//
//   Topology t = Topology::discover(bs, cfg);   // collective; cfg resolved
//   t.transports[r]                             // Transport to world rank r
//
// Ranks must be numbered host by host with the same count per host (as
// torchrun and srun do): discover throws gin::Error on every rank otherwise,
// and when ranks disagree on the device or the transport.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gin/core/error.hpp"
#include "gin/device/comm.hpp"
#include "gin/host/bootstrap.hpp"
#include "gin/host/comm_config.hpp"
#include "gin/host/env.hpp"
#include "gin/host/host_id.hpp"
#include "gin/host/memory.hpp"

namespace gin {

#if GIN_WITH_CUDA
namespace detail {
// Enables access from `dev` (current) to `peer` once per process: a second
// cudaDeviceEnablePeerAccess fails with "already enabled", and clearing that
// error is itself an error report under compute-sanitizer (one per Comm made
// after the first). Where the program enabled it before gin did, that one
// error is cleared here; a program that disables it again, or resets the
// device, between communicators must enable it itself.
inline void enablePeerAccess(int dev, int peer) {
  static std::mutex mu;
  static std::set<std::pair<int, int>> done;
  std::lock_guard<std::mutex> lk(mu);
  if (done.count({dev, peer})) return;
  const cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled)
    (void)cudaGetLastError();
  else
    GIN_CUDA_CHECK(e);
  done.insert({dev, peer});
}
}  // namespace detail
#endif

struct Topology {
  // What every rank tells the others (allGathered as raw bytes).
  struct PeerInfo {
    uint64_t hostId;
    uint64_t pid;
    int32_t gpu;  // 1: GPU ranks, 0: CPU ranks
    int32_t cudaDev;
    int32_t transport;  // TransportChoice after GIN_TRANSPORT
    int32_t pad;
    char busId[32];
  };

  int rank = 0, nRanks = 0;
  int lsaRank = 0, lsaSize = 0;             // this rank's index on its host, ranks per host
  int railRank = 0, railSize = 0;           // this rank's host, number of hosts
  bool gpu = false;                         // GPU ranks (every rank agrees)
  int cudaDev = -1;                         // this rank's GPU
  bool lsaAllSameProcess = true;            // every lsa member runs in this process
  bool proxyAll = false, ibgdaAll = false;  // the transport is forced for every peer
  std::vector<PeerInfo> peers;              // [nRanks]
  std::vector<uint8_t> transports;          // [nRanks] Transport per peer

  int lsaBase() const { return rank - lsaRank; }
  bool sameProcess(int a, int b) const {
    return peers[size_t(a)].hostId == peers[size_t(b)].hostId && peers[size_t(a)].pid == peers[size_t(b)].pid;
  }
  bool sameProcess(int r) const { return sameProcess(r, rank); }
  bool uses(Transport t) const {
    return std::find(transports.begin(), transports.end(), uint8_t(t)) != transports.end();
  }
  // Where window and signal memory lives: device memory, the heap (every lsa
  // member in this process) or shared memory (lsa members in other processes).
  SharedBuffer::Backing backing() const { return gpu ? SharedBuffer::Backing::Cuda : hostBacking(); }
  // Host memory every lsa member can map.
  SharedBuffer::Backing hostBacking() const {
    return lsaAllSameProcess ? SharedBuffer::Backing::Heap : SharedBuffer::Backing::Shm;
  }

  // Collective: exchange host ids, processes and devices, form the teams,
  // choose the transports and (GPU ranks) pick and bind this rank's GPU.
  static Topology discover(Bootstrap& bs, const CommConfig& cfg) {
    Topology t;
    t.rank = bs.rank();
    t.nRanks = bs.nRanks();
    t.discoverPeers(bs, cfg);
    return t;
  }

  // Collective: allgather one share handle per rank and map the lsa peers'
  // buffers (appended to `maps`); returns every lsa member's base as mapped
  // here, `localPtr` for this rank.
  std::vector<char*> mapLsaPeers(Bootstrap& bs, const ShareHandle& mine, char* localPtr,
                                 std::vector<PeerMapping>& maps) const {
    std::vector<ShareHandle> all(static_cast<size_t>(nRanks));
    all[size_t(rank)] = mine;
    bs.allGather(all.data(), sizeof(ShareHandle));
    const int base = lsaBase();
    // Heap memory cannot be mapped by another process. Every rank sees every
    // handle, so every rank reaches the same verdict and none is left waiting.
    for (int i = 0; i < lsaSize; ++i) {
      const int r = base + i;
      if (all[size_t(r)].kind != ShareHandle::Heap) continue;
      for (int j = 0; j < lsaSize; ++j)
        if (!sameProcess(r, base + j))
          throw Error("rank " + std::to_string(r) + " registered ordinary heap memory, which rank " +
                      std::to_string(base + j) +
                      " (another process) cannot map; on CPU ranks in several processes allocate window memory "
                      "with Comm::memAlloc");
    }
    std::vector<char*> bases(size_t(lsaSize), nullptr);
    for (int i = 0; i < lsaSize; ++i) {
      const int r = base + i;
      if (r == rank) {
        bases[size_t(i)] = localPtr;
        continue;
      }
      maps.push_back(PeerMapping::map(all[size_t(r)], sameProcess(r)));
      bases[size_t(i)] = maps.back().ptr();
    }
    bs.barrier();  // every peer has mapped: shared memory names may go
    return bases;
  }

 private:
  void discoverPeers(Bootstrap& bs, const CommConfig& cfg) {
    // Which device: decided per rank, agreed on below.
    bool wantGpu = false;
    const bool envCpu = env::choice("GIN_DEVICE") == "cpu";
    const int nGpus = cudaDeviceCountOrZero();
    if (cfg.device == DeviceKind::Gpu) {
      if (nGpus == 0)
        throw Error("CommConfig::device is Gpu but no CUDA device is visible on rank " + std::to_string(rank));
      wantGpu = true;
    } else if (cfg.device == DeviceKind::Auto) {
      wantGpu = nGpus > 0 && !envCpu;
    }

    PeerInfo me{};
    me.hostId = detail::hostId();
    me.pid = uint64_t(::getpid());
    me.gpu = wantGpu ? 1 : 0;
    me.transport = int32_t(cfg.transport);
    peers.assign(size_t(nRanks), PeerInfo{});
    peers[size_t(rank)] = me;
    bs.allGather(peers.data(), sizeof(PeerInfo));

    for (int r = 0; r < nRanks; ++r)
      if (peers[size_t(r)].gpu != me.gpu)
        throw Error("ranks disagree on where to run: rank " + std::to_string(rank) + " uses " +
                    (me.gpu ? "a GPU" : "CPU ranks") + ", rank " + std::to_string(r) + " uses " +
                    (peers[size_t(r)].gpu ? "a GPU" : "CPU ranks") +
                    "; give every rank a GPU, or set GIN_DEVICE=cpu everywhere");
    gpu = me.gpu != 0;
    for (int r = 0; r < nRanks; ++r)
      if (peers[size_t(r)].transport != me.transport)
        throw Error("ranks disagree on the transport: rank " + std::to_string(rank) + " asked for " +
                    detail::choiceName(TransportChoice(me.transport)) + ", rank " + std::to_string(r) + " for " +
                    detail::choiceName(TransportChoice(peers[size_t(r)].transport)) +
                    "; set GIN_TRANSPORT (or CommConfig::transport) the same on every rank");

    // Nodes: ranks with the same host id, which must be numbered node by node
    // with the same count on each, so teams are arithmetic (as in NCCL).
    std::vector<int> nodeOf(size_t(nRanks), -1);
    std::vector<uint64_t> nodeIds;
    for (int r = 0; r < nRanks; ++r) {
      auto it = std::find(nodeIds.begin(), nodeIds.end(), peers[size_t(r)].hostId);
      nodeOf[size_t(r)] = int(it - nodeIds.begin());
      if (it == nodeIds.end()) nodeIds.push_back(peers[size_t(r)].hostId);
    }
    const int nNodes = int(nodeIds.size());
    const int perNode = nRanks / nNodes;
    bool regular = perNode * nNodes == nRanks;
    for (int r = 0; regular && r < nRanks; ++r) regular = nodeOf[size_t(r)] == r / perNode;
    if (!regular)
      throw Error(
          "ranks must be numbered host by host with the same number on every host (as torchrun and srun "
          "do); rank " +
          std::to_string(rank) + " sees " + std::to_string(nNodes) + " hosts over " + std::to_string(nRanks) +
          " ranks in another order");
    lsaSize = perNode;
    lsaRank = rank % perNode;
    railSize = nNodes;
    railRank = rank / perNode;
    const int base = lsaBase();
    for (int i = 0; i < perNode; ++i) lsaAllSameProcess = lsaAllSameProcess && sameProcess(base + i);

    if (gpu) pickGpu(bs, cfg, nGpus);

    transports.assign(size_t(nRanks), uint8_t(Transport::None));
    const bool forceProxy = cfg.transport == TransportChoice::Proxy;
    const bool forceIbgda = cfg.transport == TransportChoice::Ibgda;
    // Ranks of other hosts: the proxy (its tcp wire; the proxy transport checks the wire reaches them).
    for (int r = 0; r < nRanks; ++r)
      transports[size_t(r)] = uint8_t(r < base || r >= base + perNode ? Transport::Proxy
                                      : forceProxy                    ? Transport::Proxy
                                      : forceIbgda                    ? Transport::Ibgda
                                                                      : Transport::Lsa);
    if (nNodes > 1 && forceIbgda)
      throw Error("the ranks span " + std::to_string(nNodes) +
                  " hosts, and the transport is forced to ibgda, which reaches only this host's ranks today (the "
                  "Comm does not route ibgda across hosts yet); use GIN_TRANSPORT=auto");
    if (nNodes > 1 && cfg.transport == TransportChoice::Lsa)
      throw Error("the ranks span " + std::to_string(nNodes) +
                  " hosts, and the transport is forced to lsa (load/store), which cannot reach another host; "
                  "use GIN_TRANSPORT=auto (the proxy over tcp reaches them)");
    proxyAll = forceProxy;
    ibgdaAll = forceIbgda;
  }

  void pickGpu(Bootstrap& bs, const CommConfig& cfg, int nGpus) {
#if GIN_WITH_CUDA
    int dev = cfg.cudaDevice;
    if (dev < 0) {
      const auto lr = env::integer("LOCAL_RANK", 0, env::kMaxRanks);
      // In-process groups share one environment, so LOCAL_RANK cannot tell threads apart.
      if (lr && !lsaAllSameProcess)
        dev = int(*lr);
      else
        dev = lsaRank;
      dev %= nGpus;
    }
    if (dev >= nGpus)
      throw Error("CommConfig::cudaDevice " + std::to_string(dev) + " is out of range: " + std::to_string(nGpus) +
                  " GPUs are visible");
    cudaDev = dev;
    GIN_CUDA_CHECK(cudaSetDevice(dev));
    PeerInfo& me = peers[size_t(rank)];
    me.cudaDev = dev;
    GIN_CUDA_CHECK(cudaDeviceGetPCIBusId(me.busId, sizeof me.busId, dev));
    bs.allGather(peers.data(), sizeof(PeerInfo));
    // Peers in this process read our memory by pointer: enable peer access both ways.
    for (int i = 0; i < lsaSize; ++i) {
      const int r = lsaBase() + i;
      if (r == rank || !sameProcess(r) || peers[size_t(r)].cudaDev == dev) continue;
      int can = 0;
      GIN_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, dev, peers[size_t(r)].cudaDev));
      if (!can)
        throw Error("GPU " + std::to_string(dev) + " cannot access GPU " + std::to_string(peers[size_t(r)].cudaDev) +
                    " by load/store (no NVLink or PCIe peer access); gin's lsa transport needs it");
      detail::enablePeerAccess(dev, peers[size_t(r)].cudaDev);
    }
#else
    (void)bs, (void)cfg, (void)nGpus;
#endif
  }
};

}  // namespace gin
