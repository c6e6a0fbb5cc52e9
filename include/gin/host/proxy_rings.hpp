// gin/host/proxy_rings.hpp — the memory of the proxy's context rings: one
// ring per context, its slots and consumer index where the host polls them
// (mapped pinned memory on GPUs), its producer ticket counter and credit
// hint where the producers are (device memory on GPUs), each on a 64-byte
// line, and the ProxyRingDev table kernels read (DevComm::proxyRings).
// build() gives the device view; hostRings() the same rings as the engine
// polls them.
#pragma once

#include <cstdint>
#include <vector>

#include "gin/device/transport/proxy.hpp"
#include "gin/host/memory.hpp"
#include "gin/host/proxy.hpp"
#include "gin/host/window.hpp"

namespace gin {

class ProxyRingSet {
 public:
  // Allocates nContexts rings of nSlots slots; returns the ProxyRingDev table.
  const ProxyRingDev* build(bool gpu, size_t nContexts, size_t nSlots) {
    nCtx_ = nContexts;
    nSlots_ = nSlots;
    const size_t slotBytes = nCtx_ * nSlots_ * sizeof(ProxySlot), consumedAt = slotBytes;
    mem_ = HostMappedBuffer(gpu, slotBytes + nCtx_ * 64 + 64);
    pad_ = (64 - reinterpret_cast<uintptr_t>(mem_.host()) % 64) % 64;
    const size_t headsAt = headsOffset(), hintsAt = headsAt + nCtx_ * 64;
    table_ = DeviceTable(gpu, hintsAt + nCtx_ * 64);
    std::vector<ProxyRingDev> rings(nCtx_);
    char* dev = static_cast<char*>(mem_.device()) + pad_;
    for (size_t i = 0; i < nCtx_; ++i) {
      rings[i].slots = reinterpret_cast<ProxySlot*>(dev) + i * nSlots_;
      rings[i].consumed = reinterpret_cast<uint64_t*>(dev + consumedAt + i * 64);
      rings[i].head = reinterpret_cast<uint64_t*>(table_.data() + headsAt + i * 64);
      rings[i].consumedHint = reinterpret_cast<uint64_t*>(table_.data() + hintsAt + i * 64);
      rings[i].nSlots = uint32_t(nSlots_);
    }
    table_.upload(0, rings.data(), nCtx_ * sizeof(ProxyRingDev));
    return reinterpret_cast<const ProxyRingDev*>(table_.data());
  }

  // The rings at their host addresses (the ticket counters stay where the
  // producers are: on GPUs the engine reads them through a copier).
  std::vector<ProxyEngine::Ring> hostRings() const {
    char* host = static_cast<char*>(mem_.host()) + pad_;
    const size_t headsAt = headsOffset();
    std::vector<ProxyEngine::Ring> rings(nCtx_);
    for (size_t i = 0; i < nCtx_; ++i) {
      rings[i].slots = reinterpret_cast<ProxySlot*>(host) + i * nSlots_;
      rings[i].consumed = reinterpret_cast<uint64_t*>(host + nCtx_ * nSlots_ * sizeof(ProxySlot) + i * 64);
      rings[i].head = reinterpret_cast<const uint64_t*>(table_.data() + headsAt + i * 64);
      rings[i].nSlots = uint32_t(nSlots_);
    }
    return rings;
  }

 private:
  HostMappedBuffer mem_;  // ring slots and consumer indices
  size_t pad_ = 0;        // to 64-byte alignment
  DeviceTable table_;     // ProxyRingDev[nContexts], then the producer tickets and credit hints
  size_t nCtx_ = 0, nSlots_ = 0;

  size_t headsOffset() const { return (nCtx_ * sizeof(ProxyRingDev) + 63) / 64 * 64; }
};

}  // namespace gin
