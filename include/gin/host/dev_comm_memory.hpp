// gin/host/dev_comm_memory.hpp — the memory behind one rank's DevComm, and
// where each part lives:
//   shared (lsa members map it)  signals (user ids, then one rail-barrier
//                                signal per index), then 2*nBarriers rows of
//                                lsa barrier inbox
//   local (DeviceTable)          signal shadows, counters, lsa and rail
//                                barrier epochs, the lsa members' signal and
//                                inbox pointers, claim word + abort flag,
//                                the per-peer transport table
//   mapped pinned host memory    the device error record (check() reads it
//                                while kernels run)
//   a host page per rank         the team abort word, mapped by every lsa member
// On GPU ranks whose signals a host thread updates (the proxy engine, the
// soft NIC), signals (and, for the proxy, counters) move to host memory the
// GPU maps. build() is collective (it maps the lsa members' parts); the
// Comm holds one DevCommMemory and destroys it after everything that writes
// into it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <vector>

#include "gin/core/atomic.hpp"
#include "gin/core/error.hpp"
#include "gin/device/comm.hpp"
#include "gin/host/bootstrap.hpp"
#include "gin/host/comm_config.hpp"
#include "gin/host/ibgda_config.hpp"
#include "gin/host/memory.hpp"
#include "gin/host/proxy.hpp"
#include "gin/host/topology.hpp"
#include "gin/host/window.hpp"

namespace gin {

class DevCommMemory {
 public:
  // Collective. Fills every DevComm field that points into this memory, and
  // the sizes (nContexts, nSignals, nCounters, nBarriers, timeoutNs).
  void build(Bootstrap& bs, const Topology& topo, const CommConfig& cfg, DevComm& dev) {
    rank_ = topo.rank;
    gpu_ = topo.gpu;
    const size_t nS = size_t(cfg.nSignals), nC = size_t(cfg.nCounters), nB = size_t(cfg.nBarriers);
    const size_t L = size_t(topo.lsaSize);
    // Shared: signals (user ids, then one rail-barrier signal per index), then
    // 2*nB rows of lsa inbox (LsaBarrierSession rows, then BarrierSession rows).
    const size_t rowWords = (L + 15) / 16 * 16;  // 128-byte lines
    const size_t sigWords = (nS + nB + 15) / 16 * 16, inboxWords = 2 * nB * rowWords;
    shared_ = SharedBuffer::allocate(topo.backing(), (sigWords + inboxWords) * 8);
    std::vector<char*> sharedBases = topo.mapLsaPeers(bs, shared_.share(shared_.data()), shared_.data(), sharedPeers_);
    shared_.unlinkName();

    // Local: shadows, counters, lsa epochs (2nB), rail epochs (nB), lsa
    // signal pointers, lsa inbox pointers, peer transports.
    const size_t offShadow = 0, offCounter = offShadow + nS * 8, offLsaEpoch = offCounter + nC * 8,
                 offRailEpoch = offLsaEpoch + 2 * nB * 8, offSigPtrs = offRailEpoch + nB * 8,
                 offInboxPtrs = offSigPtrs + L * 8, offClaim = offInboxPtrs + L * 8, offTransport = offClaim + 8,
                 total = offTransport + size_t(topo.nRanks);
    local_ = DeviceTable(gpu_, total);
    std::vector<uint64_t*> sigPtrs(L), inboxPtrs(L);
    for (size_t i = 0; i < L; ++i) {
      sigPtrs[i] = reinterpret_cast<uint64_t*>(sharedBases[i]);
      inboxPtrs[i] = reinterpret_cast<uint64_t*>(sharedBases[i]) + sigWords;
    }
    local_.upload(offSigPtrs, sigPtrs.data(), L * 8);
    local_.upload(offInboxPtrs, inboxPtrs.data(), L * 8);
    local_.upload(offTransport, topo.transports.data(), topo.transports.size());
    lsaSignalPtrs_ = sigPtrs;
    nSignalWords_ = uint32_t(nS + nB);
    const bool proxy = topo.uses(Transport::Proxy);
    uint64_t* signals = reinterpret_cast<uint64_t*>(shared_.data());
    uint64_t* counters = reinterpret_cast<uint64_t*>(local_.data() + offCounter);
    // The soft NIC applies ibgda signals with CPU atomics: on GPU ranks it
    // needs them in host memory too (a real NIC's atomics reach GPU memory).
    // (The GPU NIC's atomics, like a real NIC's, reach GPU memory.)
    const IbgdaConfig::Device nicDevice = detail::ibgdaDevice(cfg.ibgda.device);
    const bool softNicSignals =
        gpu_ && dev.ibgdaAll != 0 && nicDevice != IbgdaConfig::Device::Mlx5 && !detail::gpuNicDevice(nicDevice);
    if ((proxy || softNicSignals) && gpu_) {
      // Only the proxy (or the soft NIC) touches signals then (every peer
      // goes through it: GPU ranks have no mixed mode), so the device-memory
      // signal words in `shared_` stay unused and the peers' pointers are
      // left null. Counters move to host memory only for the proxy, whose
      // engine updates them; ibgda kernels count completions themselves.
      placeWordsInHostMemory(bs, topo, sigWords * 8, nC * 8, &signals, proxy ? &counters : nullptr);
      std::fill(sigPtrs.begin(), sigPtrs.end(), nullptr);
      local_.upload(offSigPtrs, sigPtrs.data(), L * 8);
    }
#if GIN_WITH_CUDA
    // Host threads raise the abort flag through it (hostRecordError) on every
    // GPU rank, whatever holds the signals (the GPU NIC's watcher does too).
    if (gpu_ && !hostReader_) hostReader_ = std::make_unique<GpuCopier>(topo.cudaDev);
#endif

    // Error record: host memory the GPU can write (mapped pinned), so check()
    // reads it while kernels run. The claim word and the abort flag stay in
    // device memory: waits poll the flag, and a PCIe read per poll batch
    // would cost every wait about a microsecond.
    record_ = HostMappedBuffer(gpu_, sizeof(DeviceErrorRecord));
    hostRecord_ = static_cast<DeviceErrorRecord*>(record_.host());
    placeTeamAbort(bs, topo, dev);

    char* base = local_.data();
    dev.nContexts = cfg.nContexts;
    dev.nSignals = cfg.nSignals;
    dev.nCounters = cfg.nCounters;
    dev.nBarriers = cfg.nBarriers;
    dev.timeoutNs = cfg.timeoutNs;
    dev.peerTransport = reinterpret_cast<const uint8_t*>(base + offTransport);
    dev.signals = signals;
    dev.lsaSignals = reinterpret_cast<uint64_t* const*>(base + offSigPtrs);
    dev.signalShadows = reinterpret_cast<uint64_t*>(base + offShadow);
    dev.counters = counters;
    dev.lsaInbox = reinterpret_cast<uint64_t*>(shared_.data()) + sigWords;
    dev.lsaInboxRowWords = int32_t(rowWords);
    dev.lsaInboxes = reinterpret_cast<uint64_t* const*>(base + offInboxPtrs);
    for (size_t i = 0; i < L && i < size_t(DevComm::kLsaInline); ++i) {
      dev.lsaSignalsInline[i] = sigPtrs[i];
      dev.lsaInboxesInline[i] = inboxPtrs[i];
    }
    dev.lsaEpochs = reinterpret_cast<uint64_t*>(base + offLsaEpoch);
    dev.railEpochs = reinterpret_cast<uint64_t*>(base + offRailEpoch);
    dev.error = static_cast<DeviceErrorRecord*>(record_.device());
    dev.errorClaim = reinterpret_cast<uint32_t*>(base + offClaim);
    dev.abortFlag = reinterpret_cast<uint32_t*>(base + offClaim + 4);
    abortFlag_ = dev.abortFlag;
  }

  // The error record at its host address.
  DeviceErrorRecord& hostRecord() const { return *hostRecord_; }
  // Every lsa member's team abort word, mapped here.
  const std::vector<uint32_t*>& teamWords() const { return teamWords_; }
  // Each lsa member's signal array as host threads (engines, wires) reach it.
  const std::vector<uint64_t*>& lsaSignalPtrs() const { return lsaSignalPtrs_; }
  // Signal words a remote action may name (user ids and rail-barrier signals).
  uint32_t nSignalWords() const { return nSignalWords_; }
  // This rank's signals for host threads: the host copy on GPU ranks with
  // host-memory signals, else `devSignals` (DevComm::signals).
  uint64_t* hostSignals(uint64_t* devSignals) const {
    return gpu_ ? reinterpret_cast<uint64_t*>(proxySignals_.data()) : devSignals;
  }
  // Counters at their host address on GPU ranks with proxy peers (else null).
  uint64_t* hostCounters() const { return static_cast<uint64_t*>(proxyCounters_.host()); }

  // A peer failed or never came: it may still write into what we share.
  // Leak it rather than free it under them.
  void leak() {
    shared_.leak();
    teamPage_.leak();
    proxySignals_.leak();
#if GIN_WITH_CUDA
    teamRegistration_.leak();
    proxySignalsRegistration_.leak();
#endif
  }

#if GIN_WITH_CUDA
  // Read a device word from a host thread (GPU ranks with host-memory signals).
  uint64_t readDeviceWord(const uint64_t* p) {
    std::lock_guard<std::mutex> lk(hostReaderMu_);
    return hostReader_->load64(p);
  }

  // A failure found by a host thread of this rank (engine, tcp receiver) on
  // a GPU rank: the claim word and the abort flag are device memory, which
  // the host reaches only through copies. The record is written only if
  // nobody has started one (a GPU thread claiming at the same moment may
  // interleave with it: both are failures of the same run, and the first one
  // to finish sets state 2).
  void hostRecordError(Op op, int peer, int ctx, uint64_t id, uint64_t expected, uint64_t observed) {
    DeviceErrorRecord& r = *hostRecord_;
    uint32_t idle = 0;
    if (atomicCompareExchange<Scope::System>(&r.state, idle, 1u))
      fillErrorRecord(r, op, rank_, peer, ctx, id, expected, observed);
    try {
      // Any host thread (engine, tcp receiver) may get here: one at a time.
      std::lock_guard<std::mutex> lk(hostReaderMu_);
      hostReader_->store32(abortFlag_, 1u);  // waits on the GPU stop
    } catch (const Error& e) {
      std::fprintf(stderr, "gin: rank %d: could not raise the abort flag: %s\n", rank_, e.what());
    }
  }
#endif

 private:
  int rank_ = 0;
  bool gpu_ = false;
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
  DeviceTable local_;                        // shadows, counters, epochs, pointer tables
  HostMappedBuffer record_;                  // the device error record
  DeviceErrorRecord* hostRecord_ = nullptr;  // its host address
  uint32_t* abortFlag_ = nullptr;            // DevComm::abortFlag
  std::vector<uint64_t*> lsaSignalPtrs_;     // each lsa member's signal array, mapped here
  uint32_t nSignalWords_ = 0;
  // GPU ranks with proxy peers: the engines apply signal and counter actions
  // with CPU atomics, so those words live in host memory the GPU maps (shared
  // memory between processes), not in device memory the host cannot update
  // atomically.
  SharedBuffer proxySignals_;
  std::vector<PeerMapping> proxySignalPeers_;
  HostMappedBuffer proxyCounters_;
#if GIN_WITH_CUDA
  HostRegistration proxySignalsRegistration_;  // proxySignals_, on GPU ranks
  std::unique_ptr<GpuCopier> hostReader_;      // host threads' reads and writes of device words (quiesce, abort flag)
  std::mutex hostReaderMu_;
#endif

  // Signals and counters of a GPU rank with proxy peers: host memory the GPU
  // maps. Signals are shared with the lsa peers' engines (shared memory when
  // they run in other processes); counters are this rank's own.
  void placeWordsInHostMemory(Bootstrap& bs, const Topology& topo, size_t sigBytes, size_t counterBytes,
                              uint64_t** signals, uint64_t** counters) {
#if GIN_WITH_CUDA
    proxySignals_ = SharedBuffer::allocate(topo.hostBacking(), sigBytes);
    proxySignalsRegistration_ = HostRegistration(proxySignals_.data(), sigBytes);
    *signals = reinterpret_cast<uint64_t*>(proxySignalsRegistration_.device(proxySignals_.data()));
    std::vector<char*> hostBases =
        topo.mapLsaPeers(bs, proxySignals_.share(proxySignals_.data()), proxySignals_.data(), proxySignalPeers_);
    proxySignals_.unlinkName();
    for (size_t i = 0; i < hostBases.size(); ++i) lsaSignalPtrs_[i] = reinterpret_cast<uint64_t*>(hostBases[i]);
    if (counters) {
      proxyCounters_ = HostMappedBuffer(true, counterBytes ? counterBytes : 8);
      *counters = static_cast<uint64_t*>(proxyCounters_.device());
    }
    hostReader_ = std::make_unique<GpuCopier>(topo.cudaDev);
#else
    (void)bs, (void)topo, (void)sigBytes, (void)counterBytes, (void)signals, (void)counters;
    throw Error("GPU ranks need the CUDA runtime");
#endif
  }

  // The team abort words: a page per rank in host memory that every lsa
  // member maps (shared memory across processes), so raising them needs no
  // CUDA call and a GPU reads its own with a mapped load.
  void placeTeamAbort(Bootstrap& bs, const Topology& topo, DevComm& dev) {
    teamPage_ = SharedBuffer::allocate(topo.hostBacking(), 64);
    std::vector<char*> bases = topo.mapLsaPeers(bs, teamPage_.share(teamPage_.data()), teamPage_.data(), teamPeers_);
    teamPage_.unlinkName();
    for (char* b : bases) teamWords_.push_back(reinterpret_cast<uint32_t*>(b));
    dev.teamAbort = reinterpret_cast<const uint32_t*>(teamPage_.data());
#if GIN_WITH_CUDA
    if (gpu_) {
      teamRegistration_ = HostRegistration(teamPage_.data(), 64);
      dev.teamAbort = reinterpret_cast<const uint32_t*>(teamRegistration_.device(teamPage_.data()));
    }
#endif
  }
};

}  // namespace gin
