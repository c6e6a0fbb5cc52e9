// gin/host/memory.hpp — memory that lsa peers can map, and the handles that
// let them map it.
//
// Three kinds of backing, chosen by where the ranks run:
//  - GPU: cudaMalloc'd device memory, exported with a CUDA IPC handle to peers
//    in other processes; peers in this process use the pointer directly (peer
//    access enabled between the devices).
//  - CPU ranks in one process: ordinary heap memory, shared by pointer.
//  - CPU ranks in several processes of one host: a POSIX shared memory
//    segment, mapped by name.
// Every resource is owned by an RAII object; nothing is global.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "gin/core/error.hpp"
#include "gin/host/shm_segment.hpp"

#if GIN_WITH_CUDA
#include <cuda.h>
#include <cuda_runtime_api.h>
#endif

namespace gin {

#if GIN_WITH_CUDA
namespace detail {
inline void cudaCheck(cudaError_t e, const char* what, const char* file, int line) {
  if (e != cudaSuccess) {
    throw Error(std::string(what) + " failed: " + cudaGetErrorString(e) + " (" + file + ":" + std::to_string(line) +
                ")");
  }
}
}  // namespace detail
#define GIN_CUDA_CHECK(call) ::gin::detail::cudaCheck((call), #call, __FILE__, __LINE__)
#endif

// Is there a usable CUDA device? False without the runtime or without a GPU.
inline int cudaDeviceCountOrZero() {
#if GIN_WITH_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

#if GIN_WITH_CUDA
// The cudaMalloc allocation that contains `p`: IPC handles name allocations,
// so a window inside one is shared as (allocation handle, offset). Uses the
// driver's cuMemGetAddressRange through the runtime's entry-point lookup, so
// programs need not link libcuda.
inline std::pair<char*, size_t> cudaAllocationRange(const void* p) {
  // Ask what the pointer is first: the driver's range query on host memory
  // fails, and a failing API call is an error to compute-sanitizer.
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess || a.type != cudaMemoryTypeDevice) {
    (void)cudaGetLastError();  // clear it: not the caller's error
    throw Error("registerWindow: the pointer is not device memory from cudaMalloc (or Comm::memAlloc) on this GPU");
  }
  using Fn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  GIN_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &q));
  if (!fn || q != cudaDriverEntryPointSuccess) throw Error("the CUDA driver has no cuMemGetAddressRange");
  CUdeviceptr base = 0;
  size_t bytes = 0;
  if (reinterpret_cast<Fn>(fn)(&base, &bytes, CUdeviceptr(reinterpret_cast<uintptr_t>(p))) != CUDA_SUCCESS)
    throw Error("registerWindow: the pointer is not device memory from cudaMalloc (or Comm::memAlloc) on this GPU");
  return {reinterpret_cast<char*>(uintptr_t(base)), bytes};
}
#endif

#if GIN_WITH_CUDA
// Host memory registered with the GPU (mapped, portable) for as long as this
// lives; declare it after the buffer it registers, so it goes first. leak()
// keeps the registration (the buffer is being leaked too).
class HostRegistration {
 public:
  HostRegistration() = default;
  HostRegistration(void* p, size_t bytes) {
    GIN_CUDA_CHECK(cudaHostRegister(p, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable));
    p_ = p;
  }
  HostRegistration(HostRegistration&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  HostRegistration& operator=(HostRegistration&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
    }
    return *this;
  }
  ~HostRegistration() { release(); }
  // The device address of a registered host address.
  template <class T>
  T* device(T* host) const {
    void* d = nullptr;
    GIN_CUDA_CHECK(cudaHostGetDevicePointer(&d, const_cast<std::remove_const_t<T>*>(host), 0));
    return static_cast<T*>(d);
  }
  void leak() { p_ = nullptr; }

 private:
  void* p_ = nullptr;
  void release() {
    if (p_) (void)cudaHostUnregister(p_);
    p_ = nullptr;
  }
};
#endif

// Zeroed host memory the device can also write: mapped pinned memory on a GPU
// (host() and device() are two addresses of it), plain heap memory on CPU ranks.
class HostMappedBuffer {
 public:
  HostMappedBuffer() = default;
  HostMappedBuffer(bool gpu, size_t bytes) : gpu_(gpu) {
    if (gpu_) {
#if GIN_WITH_CUDA
      void* p = nullptr;
      GIN_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
      host_ = p;
      std::memset(p, 0, bytes);
      GIN_CUDA_CHECK(cudaHostGetDevicePointer(&device_, p, 0));
#else
      throw Error("mapped host memory requested, but this program was built without the CUDA runtime");
#endif
    } else {
      host_ = device_ = std::calloc(1, bytes);
      if (!host_) throw Error("out of host memory allocating " + std::to_string(bytes) + " bytes");
    }
  }
  HostMappedBuffer(HostMappedBuffer&& o) noexcept { *this = std::move(o); }
  HostMappedBuffer& operator=(HostMappedBuffer&& o) noexcept {
    if (this != &o) {
      release();
      gpu_ = o.gpu_;
      host_ = std::exchange(o.host_, nullptr);
      device_ = std::exchange(o.device_, nullptr);
    }
    return *this;
  }
  ~HostMappedBuffer() { release(); }
  void* host() const { return host_; }
  void* device() const { return device_; }

 private:
  bool gpu_ = false;
  void* host_ = nullptr;
  void* device_ = nullptr;
  void release() {
    if (!host_) return;
#if GIN_WITH_CUDA
    if (gpu_) (void)cudaFreeHost(host_);
#endif
    if (!gpu_) std::free(host_);
    host_ = device_ = nullptr;
  }
};

// Where a buffer lives and how a peer maps it. Fixed size, so it travels
// through Bootstrap::allGather.
struct ShareHandle {
  enum Kind : uint32_t { Heap = 1, Shm = 2, CudaIpc = 3 } kind;
  uint32_t pad = 0;
  uint64_t rawPtr;      // valid in the owner's process
  uint64_t offset;      // of the buffer inside the shared allocation
  uint64_t allocBytes;  // size of the shared allocation
  char shmName[64];
  unsigned char ipc[64];  // cudaIpcMemHandle_t
};

// One peer's buffer mapped into this process (or just borrowed by pointer).
class PeerMapping {
 public:
  PeerMapping() = default;
  // `sameProcess`: the owner runs in this process, so rawPtr is valid here.
  static PeerMapping map(const ShareHandle& h, bool sameProcess) {
    PeerMapping m;
    if (sameProcess) {
      m.ptr_ = reinterpret_cast<char*>(h.rawPtr);
      return m;
    }
    switch (h.kind) {
      case ShareHandle::Shm:
        m.shm_ = ShmSegment::open(h.shmName, h.allocBytes);
        m.ptr_ = static_cast<char*>(m.shm_.data()) + h.offset;
        return m;
      case ShareHandle::CudaIpc: {
#if GIN_WITH_CUDA
        cudaIpcMemHandle_t ipc;
        static_assert(sizeof(ipc) <= sizeof(h.ipc));
        std::memcpy(&ipc, h.ipc, sizeof(ipc));
        void* base = nullptr;
        GIN_CUDA_CHECK(cudaIpcOpenMemHandle(&base, ipc, cudaIpcMemLazyEnablePeerAccess));
        m.ipcBase_ = base;
        m.ptr_ = static_cast<char*>(base) + h.offset;
        return m;
#else
        throw Error("a peer shared GPU memory, but this program was built without the CUDA runtime");
#endif
      }
      case ShareHandle::Heap:
        throw Error(
            "a peer in another process registered ordinary heap memory, which this process cannot map; "
            "on CPU ranks in several processes allocate window memory with Comm::memAlloc");
    }
    throw Error("unknown memory share handle kind " + std::to_string(uint32_t(h.kind)));
  }
  PeerMapping(PeerMapping&& o) noexcept { *this = std::move(o); }
  PeerMapping& operator=(PeerMapping&& o) noexcept {
    if (this != &o) {
      release();
      ptr_ = std::exchange(o.ptr_, nullptr);
      shm_ = std::move(o.shm_);
      ipcBase_ = std::exchange(o.ipcBase_, nullptr);
    }
    return *this;
  }
  ~PeerMapping() { release(); }
  char* ptr() const { return ptr_; }

 private:
  char* ptr_ = nullptr;
  ShmSegment shm_;
  void* ipcBase_ = nullptr;
  void release() {
#if GIN_WITH_CUDA
    if (ipcBase_) (void)cudaIpcCloseMemHandle(ipcBase_);
#endif
    ipcBase_ = nullptr;
    ptr_ = nullptr;
  }
};

// A buffer this rank owns and can share: device memory, heap or shm.
class SharedBuffer {
 public:
  enum class Backing { Heap, Shm, Cuda };
  SharedBuffer() = default;
  static SharedBuffer allocate(Backing b, size_t bytes) {
    SharedBuffer s;
    s.backing_ = b;
    s.bytes_ = bytes;
    switch (b) {
      case Backing::Heap: {
        // 4 KiB alignment: vector copies and cache lines never straddle a buffer start.
        const size_t rounded = (bytes + 4095) / 4096 * 4096;
        s.ptr_ = static_cast<char*>(std::aligned_alloc(4096, rounded));
        if (!s.ptr_) throw Error("out of host memory allocating " + std::to_string(bytes) + " bytes");
        std::memset(s.ptr_, 0, rounded);
        break;
      }
      case Backing::Shm:
        s.shm_ = ShmSegment::create(bytes);
        s.ptr_ = static_cast<char*>(s.shm_.data());
        break;
      case Backing::Cuda:
#if GIN_WITH_CUDA
      {
        void* p = nullptr;
        GIN_CUDA_CHECK(cudaMalloc(&p, bytes));
        s.ptr_ = static_cast<char*>(p);
        GIN_CUDA_CHECK(cudaMemset(p, 0, bytes));
        GIN_CUDA_CHECK(cudaDeviceSynchronize());
        break;
      }
#else
        throw Error("GPU memory requested, but this program was built without the CUDA runtime");
#endif
    }
    return s;
  }
  SharedBuffer(SharedBuffer&& o) noexcept { *this = std::move(o); }
  SharedBuffer& operator=(SharedBuffer&& o) noexcept {
    if (this != &o) {
      release();
      backing_ = o.backing_;
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
      shm_ = std::move(o.shm_);
    }
    return *this;
  }
  ~SharedBuffer() { release(); }

  char* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  Backing backing() const { return backing_; }
  // Handle for the sub-range [p, p+...) of this buffer.
  ShareHandle share(const void* p) const {
    ShareHandle h{};
    h.rawPtr = reinterpret_cast<uint64_t>(p);
    h.offset = uint64_t(static_cast<const char*>(p) - ptr_);
    h.allocBytes = bytes_;
    switch (backing_) {
      case Backing::Heap: h.kind = ShareHandle::Heap; break;
      case Backing::Shm:
        h.kind = ShareHandle::Shm;
        std::snprintf(h.shmName, sizeof h.shmName, "%s", shm_.name().c_str());
        break;
      case Backing::Cuda:
#if GIN_WITH_CUDA
      {
        h.kind = ShareHandle::CudaIpc;
        cudaIpcMemHandle_t ipc;
        GIN_CUDA_CHECK(cudaIpcGetMemHandle(&ipc, ptr_));
        std::memcpy(h.ipc, &ipc, sizeof ipc);
      }
#endif
      break;
    }
    return h;
  }
  void unlinkName() { shm_.unlink(); }
  // Forget the memory without freeing it: for a communicator torn down after
  // a failure, whose in-process peers may still write into it (freeing heap
  // memory under them would corrupt the heap; freeing device memory would
  // wait for their kernels).
  void leak() {
    if (backing_ != Backing::Shm) ptr_ = nullptr;
  }

 private:
  Backing backing_ = Backing::Heap;
  char* ptr_ = nullptr;
  size_t bytes_ = 0;
  ShmSegment shm_;
  void release() {
    if (!ptr_) return;
    if (backing_ == Backing::Heap) std::free(ptr_);
#if GIN_WITH_CUDA
    if (backing_ == Backing::Cuda) (void)cudaFree(ptr_);
#endif
    ptr_ = nullptr;
  }
};

}  // namespace gin
