// gin/host/local_wire.hpp — LocalWire, the proxy's wire for targets mapped in
// this process: a copy into the peer's window, then (after complete()) a
// release atomic on its signal word, so a signal never overtakes its payload.
#pragma once

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "gin/core/atomic.hpp"
#include "gin/device/transport/proxy.hpp"
#include "gin/host/window_directory.hpp"
#include "gin/host/wire.hpp"

namespace gin {

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

}  // namespace gin
