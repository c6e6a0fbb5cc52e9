// gin/host/window.hpp — what the host keeps for each registered window: the
// local buffer (owned or the user's), the mappings of every lsa peer's buffer,
// and the WindowDev table kernels read through gin::Window.
#pragma once

#include <cstring>
#include <vector>

#include "gin/device/window.hpp"
#include "gin/host/memory.hpp"

namespace gin {

// Memory that the agent running the device API reads: device memory on a GPU,
// heap memory on CPU ranks. Filled from the host with upload().
class DeviceTable {
 public:
  DeviceTable() = default;
  DeviceTable(bool gpu, size_t bytes) : gpu_(gpu), bytes_(bytes) {
    if (gpu_) {
#if GIN_WITH_CUDA
      void* p = nullptr;
      GIN_CUDA_CHECK(cudaMalloc(&p, bytes));
      GIN_CUDA_CHECK(cudaMemset(p, 0, bytes));
      ptr_ = static_cast<char*>(p);
#endif
    } else {
      ptr_ = static_cast<char*>(std::calloc(1, bytes ? bytes : 1));
      if (!ptr_) throw Error("out of host memory allocating " + std::to_string(bytes) + " bytes");
    }
  }
  DeviceTable(DeviceTable&& o) noexcept { *this = std::move(o); }
  DeviceTable& operator=(DeviceTable&& o) noexcept {
    if (this != &o) {
      release();
      gpu_ = o.gpu_;
      bytes_ = std::exchange(o.bytes_, 0);
      ptr_ = std::exchange(o.ptr_, nullptr);
    }
    return *this;
  }
  ~DeviceTable() { release(); }

  char* data() const { return ptr_; }
  void upload(size_t offset, const void* src, size_t bytes) {
    if (gpu_) {
#if GIN_WITH_CUDA
      GIN_CUDA_CHECK(cudaMemcpy(ptr_ + offset, src, bytes, cudaMemcpyHostToDevice));
#endif
    } else {
      std::memcpy(ptr_ + offset, src, bytes);
    }
  }

 private:
  bool gpu_ = false;
  size_t bytes_ = 0;
  char* ptr_ = nullptr;
  void release() {
    if (!ptr_) return;
#if GIN_WITH_CUDA
    if (gpu_) (void)cudaFree(ptr_);
#endif
    if (!gpu_) std::free(ptr_);
    ptr_ = nullptr;
  }
};

struct WindowRecord {
  uint32_t id = 0;
  size_t bytes = 0;
  char* local = nullptr;
  bool owned = false;   // allocWindow (true) or registerWindow (false)
  SharedBuffer buffer;  // when owned
  std::vector<PeerMapping> peers;
  std::vector<char*> lsaBases;  // [lsaSize] each lsa member's part, mapped here
  DeviceTable table;            // WindowDev followed by lsaBases[lsaSize]

  Window handle() const { return Window{reinterpret_cast<const WindowDev*>(table.data())}; }

  // Build the WindowDev table from the lsa peer addresses.
  void publish(bool gpu, int lsaSize, const std::vector<char*>& bases) {
    lsaBases = bases;
    const size_t head = (sizeof(WindowDev) + 15) / 16 * 16;
    table = DeviceTable(gpu, head + sizeof(char*) * size_t(lsaSize));
    WindowDev d{};
    d.localBase = local;
    d.bytes = bytes;
    d.id = id;
    d.lsaSize = lsaSize;
    d.lsaBases = reinterpret_cast<char* const*>(table.data() + head);
    table.upload(0, &d, sizeof d);
    table.upload(head, lsaBases.data(), sizeof(char*) * lsaBases.size());
  }
};

}  // namespace gin
