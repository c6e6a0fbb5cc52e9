// gin/host/soft_nic_copies.hpp — how the soft NIC's copies into device
// regions land (SoftNic::setDeviceCopy, setDeviceFlush): on GPU ranks by
// side-context kernels, on CPU ranks (test mode) queued and applied at the
// NIC's flush. IbgdaTransport (ibgda.hpp) holds one.
#pragma once

#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "gin/core/config.hpp"
#include "gin/core/error.hpp"
#include "gin/host/memory.hpp"
#include "gin/host/side_context.hpp"
#include "gin/host/soft_nic.hpp"

namespace gin::detail {

// The functions it gives the NIC point at it: it stays in place, and the NIC
// stops before it goes.
class SoftNicCopies {
 public:
  SoftNicCopies() = default;
  SoftNicCopies(const SoftNicCopies&) = delete;
  SoftNicCopies& operator=(const SoftNicCopies&) = delete;

  // Test mode for CPU ranks (GIN_SOFT_NIC_DEFERRED_COPIES=1): windows count as
  // device memory and their copies land only when the NIC flushes, as the
  // side-context copies of GPU ranks do, so the CPU suites check that the NIC
  // never completes or signals before a deferred payload has landed.
  void startDeferredHostCopies(SoftNic& nic) {
    deferred_ = true;
    nic.setDeviceCopy([this](void* dst, const void* src, size_t n, bool) {
      const char* from = static_cast<const char*>(src);
      queued_.emplace_back(static_cast<char*>(dst), std::vector<char>(from, from + n));
    });
    nic.setDeviceFlush([this] {
      for (auto& [dst, bytes] : queued_) std::memcpy(dst, bytes.data(), bytes.size());
      queued_.clear();
    });
  }

  // The soft NIC's copies for GPU ranks: kernels of gin's side context
  // (side_context.hpp), which never queue behind the user's kernels that post
  // these WQEs and wait for them. They are queued, and the NIC waits for them
  // (flush) before it writes their CQEs or applies a later WQE. No CUDA
  // runtime call of the user's context on this path: one could wait for a
  // lock that a thread blocked in cudaDeviceSynchronize holds (a rank
  // waiting for the very kernels this NIC serves).
  void startDeviceCopies(SoftNic& nic) {
#if GIN_WITH_CUDA
    GIN_CUDA_CHECK(cudaGetDevice(&cudaDevice_));
    copier_ = std::make_unique<SideCopier>(cudaDevice_);
    nic.setDeviceCopy([this](void* dst, const void* src, size_t n, bool inlineBytes) {
      if (inlineBytes)
        copier_->copyValue(dst, src, n);  // staged: the bytes are gone after the call
      else
        copier_->copy(dst, src, n);
    });
    nic.setDeviceFlush([this] { copier_->complete(); });
#else
    (void)nic;
    throw Error("GPU ranks need the CUDA runtime");
#endif
  }

  // Whether startDeferredHostCopies ran: windows count as device regions.
  bool deferred() const { return deferred_; }

 private:
  bool deferred_ = false;  // CPU ranks, test mode: windows as "device" regions with queued copies
  std::vector<std::pair<char*, std::vector<char>>> queued_;  // deferred_: copies not yet applied (NIC thread only)
#if GIN_WITH_CUDA
  std::unique_ptr<SideCopier> copier_;
  int cudaDevice_ = 0;
#endif
};

}  // namespace gin::detail
