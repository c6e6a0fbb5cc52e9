// gin/host/side_context.hpp — how gin's host threads (the proxy engine, the
// tcp wire, the soft NIC, error reporting) read and write GPU memory while the
// user's kernels spin: copy kernels launched in a CUDA context of gin's own.
//
// Why not cudaMemcpyAsync on a stream of the user's context: CUDA gives a
// context CUDA_DEVICE_MAX_CONNECTIONS hardware queues (8 by default, 1 under
// Megatron-LM), streams share them, and a copy queued behind a kernel that
// waits for that very copy never runs. On an H100 (driver 580) a copy on a
// fresh non-blocking stream stalled behind a spinning kernel even with the
// default 8 queues, and so did copies from a second context and green
// contexts; a kernel launched in a second context always ran, because the GPU
// time-slices between contexts (docs/design/progress.md has the table). The
// price: while a kernel of the user's context runs, each batch waits for a
// time slice (about 2.4 ms on that H100; about 10 us when the GPU is idle).
// So gin's hot paths do not come here: producers store to mapped peers
// themselves (ProxyConfig::producerStores); this is for the paths that have
// no other way (the tcp wire's GPU windows, the soft NIC, the abort flag).
//
// One side context per GPU per process, created on first use and kept until
// the process exits (contexts are expensive to create; the driver frees it at
// exit). Each SideCopier has its own stream in it. The kernel comes as PTX
// text (side_copy_ptx.hpp), since host headers are compiled by the host
// compiler; the driver API is reached through the runtime's entry points, so
// programs need not link libcuda.
#pragma once

#include "gin/core/config.hpp"

#if GIN_WITH_CUDA
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>

#include "gin/core/error.hpp"
#include "gin/host/memory.hpp"
#include "gin/host/side_copy_ptx.hpp"

namespace gin {
namespace detail {

// The driver functions the side context uses, looked up once.
struct SideDriver {
  CUresult (*ctxCreate)(CUcontext*, CUctxCreateParams*, unsigned, CUdevice) = nullptr;  // the CUDA 12.5 ABI
  CUresult (*ctxPush)(CUcontext) = nullptr;
  CUresult (*ctxPop)(CUcontext*) = nullptr;
  CUresult (*moduleLoadData)(CUmodule*, const void*) = nullptr;
  CUresult (*moduleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*streamCreate)(CUstream*, unsigned) = nullptr;
  CUresult (*streamDestroy)(CUstream) = nullptr;
  CUresult (*streamSynchronize)(CUstream) = nullptr;
  CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                     void**, void**) = nullptr;
  CUresult (*errorString)(CUresult, const char**) = nullptr;

  static const SideDriver& get() {
    static const SideDriver d = [] {
      SideDriver s;
      // Each function with its ABI as of CUDA 12.5 (cuCtxCreate changed in
      // 11.4 and 12.5; the others as of 12.0).
      auto find = [](const char* name, auto& fn, int version = 12000) {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult q{};
        if (cudaGetDriverEntryPointByVersion(name, &p, version, cudaEnableDefault, &q) != cudaSuccess || !p ||
            q != cudaDriverEntryPointSuccess)
          throw Error(std::string("the CUDA driver has no ") + name +
                      " as of CUDA 12.5 (gin's side context needs it: update the driver to CUDA 12.5 or later)");
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
      };
      find("cuCtxCreate", s.ctxCreate, 12050);
      find("cuCtxPushCurrent", s.ctxPush);
      find("cuCtxPopCurrent", s.ctxPop);
      find("cuModuleLoadData", s.moduleLoadData);
      find("cuModuleGetFunction", s.moduleGetFunction);
      find("cuStreamCreate", s.streamCreate);
      find("cuStreamDestroy", s.streamDestroy);
      find("cuStreamSynchronize", s.streamSynchronize);
      find("cuLaunchKernel", s.launch);
      find("cuGetErrorString", s.errorString);
      return s;
    }();
    return d;
  }
  void check(CUresult r, const char* what) const {
    if (r == CUDA_SUCCESS) return;
    const char* s = nullptr;
    if (errorString) errorString(r, &s);
    throw Error(std::string("gin side context: ") + what + " failed: " + (s ? s : "unknown CUDA error"));
  }
};

// The side context of one GPU.
class SideContext {
 public:
  static SideContext& of(int device) {
    static std::mutex mu;
    static std::map<int, SideContext*> all;  // never freed: see the header comment
    std::lock_guard<std::mutex> lk(mu);
    SideContext*& c = all[device];
    if (!c) c = new SideContext(device);
    return *c;
  }
  CUcontext context() const { return ctx_; }
  CUfunction copyKernel() const { return copy_; }

 private:
  CUcontext ctx_ = nullptr;
  CUfunction copy_ = nullptr;

  explicit SideContext(int device) {
    const SideDriver& d = SideDriver::get();
    // cuCtxCreate makes the new context current; pop it so the caller's
    // current context is as it was.
    d.check(d.ctxCreate(&ctx_, nullptr, CU_CTX_SCHED_SPIN, CUdevice(device)), "cuCtxCreate");
    CUcontext popped = nullptr;
    d.check(d.ctxPop(&popped), "cuCtxPopCurrent");
    d.check(d.ctxPush(ctx_), "cuCtxPushCurrent");
    CUmodule m = nullptr;
    const CUresult r = d.moduleLoadData(&m, kSideCopyPtx);
    if (r == CUDA_SUCCESS) (void)d.moduleGetFunction(&copy_, m, "gin_side_copy");
    d.check(d.ctxPop(&popped), "cuCtxPopCurrent");
    d.check(r, "loading the copy kernel (cuModuleLoadData)");
    if (!copy_) throw Error("gin side context: the copy kernel has no gin_side_copy");
  }
};

// Makes a side context current for a scope.
struct SideScope {
  explicit SideScope(CUcontext c) { SideDriver::get().check(SideDriver::get().ctxPush(c), "cuCtxPushCurrent"); }
  ~SideScope() {
    CUcontext popped = nullptr;
    (void)SideDriver::get().ctxPop(&popped);
  }
  SideScope(const SideScope&) = delete;
  SideScope& operator=(const SideScope&) = delete;
};

}  // namespace detail

// Copies into, out of and within GPU memory for one host thread, by kernels of
// the side context: copy() queues, complete() runs what is queued and waits.
// Both ends of copy() must be reachable by a kernel: device memory of this
// process (this GPU, or a peer GPU mapped here) or pinned host memory;
// copyValue() stages plain host bytes itself. Not thread-safe: one per thread.
class SideCopier {
 public:
  static constexpr uint32_t kBatch = 64;        // copies per launch (the kernel's parameter array)
  static constexpr size_t kStageSlots = 256;    // staged values in flight before complete()
  static constexpr size_t kStageBytes = 32;     // the most copyValue stages
  explicit SideCopier(int device)
      : device_(device), side_(detail::SideContext::of(device)), stage_(true, kStageSlots * kStageBytes) {
    const auto& d = detail::SideDriver::get();
    detail::SideScope s(side_.context());
    d.check(d.streamCreate(&stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  }
  ~SideCopier() {
    if (!stream_) return;
    try {
      const auto& d = detail::SideDriver::get();
      detail::SideScope s(side_.context());
      (void)d.streamSynchronize(stream_);
      (void)d.streamDestroy(stream_);
    } catch (...) {
    }
  }
  SideCopier(const SideCopier&) = delete;
  SideCopier& operator=(const SideCopier&) = delete;

  int device() const { return device_; }
  void copy(void* dst, const void* src, size_t n) {
    if (n == 0) return;
    if (batch_.n == kBatch) launch();
    batch_.e[batch_.n++] = Entry{static_cast<char*>(dst), static_cast<const char*>(src), n};
    pending_ = true;
  }
  // Up to kStageBytes bytes from anywhere in host memory (copied out now).
  void copyValue(void* dst, const void* bytes, size_t n) {
    if (n > kStageBytes) throw Error("SideCopier::copyValue: " + std::to_string(n) + " bytes, at most 32");
    if (staged_ == kStageSlots) complete();
    char* slot = static_cast<char*>(stage_.host()) + kStageBytes * staged_++;
    std::memcpy(slot, bytes, n);
    copy(dst, slot, n);
  }
  uint64_t load64(const uint64_t* src) {
    complete();
    copy(stage_.host(), src, 8);
    complete();
    uint64_t v;
    std::memcpy(&v, stage_.host(), 8);
    return v;
  }
  void store32(uint32_t* dst, uint32_t v) {
    copyValue(dst, &v, 4);
    complete();
  }
  // Everything queued so far has landed.
  void complete() {
    if (!pending_) return;
    launch();
    const auto& d = detail::SideDriver::get();
    detail::SideScope s(side_.context());
    d.check(d.streamSynchronize(stream_), "a copy (cuStreamSynchronize)");
    pending_ = false;
    staged_ = 0;
  }

 private:
  struct Entry {
    char* dst;
    const char* src;
    unsigned long long bytes;
  };
  struct Batch {
    Entry e[kBatch];
    unsigned n;
  };
  static_assert(sizeof(Batch) == 1544, "the layout of scripts/side_copy.cu's Batch");
  int device_;
  detail::SideContext& side_;
  CUstream stream_ = nullptr;
  HostMappedBuffer stage_;
  Batch batch_{};
  size_t staged_ = 0;
  bool pending_ = false;

  void launch() {
    if (batch_.n == 0) return;
    uint64_t most = 0;
    for (unsigned i = 0; i < batch_.n; ++i) most = batch_.e[i].bytes > most ? batch_.e[i].bytes : most;
    // 256 threads x 16 bytes per block and round, at most 32 blocks per copy.
    const uint64_t want = (most + 4095) / 4096;
    const unsigned blocksX = unsigned(want < 1 ? 1 : want > 32 ? 32 : want);
    const auto& d = detail::SideDriver::get();
    detail::SideScope s(side_.context());
    void* args[] = {&batch_};
    d.check(d.launch(side_.copyKernel(), blocksX, batch_.n, 1, 256, 1, 1, 0, stream_, args, nullptr),
            "launching a copy (cuLaunchKernel)");
    batch_.n = 0;
  }
};

}  // namespace gin
#endif  // GIN_WITH_CUDA
