// gin/host/gpu_nic.hpp — the GPU NIC: a software mlx5 send-queue consumer that
// runs on the GPU (a few warps of a kernel of its own), for queue pairs whose
// send queues, doorbell records and CQs are in GPU memory
// (IbgdaConfig::queues = Gpu). Selected with IbgdaConfig::device = GpuSoft or
// GIN_IBGDA_DEVICE=gpu-soft (gpu-soft-sink: completes without executing). A
// test and development device written for this project, not a ConnectX model:
// it lets the ibgda device code run at GPU speed, and measures the posting
// path without PCIe in the way. No ConnectX hardware was available to test
// gin against.
//
// What it does, per QP, in WQE order: reads the WQEs the doorbell record
// announces, checks each with the soft NICs' one parser (mlx5::decodeWqe),
// resolves keys and ranges against its regions (a bad one gets ConnectX's
// error CQE and stops the QP, as on the host soft NIC), runs RDMA WRITE
// (gather, inline), fetch-add, compare-and-swap and NOP into the target
// (this GPU's memory, or a peer GPU's through the pointer mapped here), and
// writes the CQE last with release, owner bit flipped per pass.
//
// How it runs (the rule it needs; docs/design/gpu-nic.md says why): the
// kernel starts when the NIC is created, on a non-blocking stream of its own,
// before any kernel that posts to it, and stays while there is work. After
// `idleExitUs` without work it ends, so context-wide synchronization
// (cudaDeviceSynchronize, cudaFree) of the program returns; a host thread
// watches the QPs' UAR words (mapped host memory: a real UAR is a PCIe
// write too) and launches it again when a doorbell rings for work it has not
// consumed. A relaunch that does not start within the timeout (CUDA's
// hardware queues blocked behind the program's waiting kernels, or SMs full)
// is reported through onStop, so the waits on its work fail with that error
// instead of timing out in silence. idleExitUs = 0: the kernel stays until
// the NIC is destroyed (context-wide synchronization then waits for that).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gin/core/atomic.hpp"
#include "gin/core/clock.hpp"
#include "gin/core/error.hpp"
#include "gin/device/mlx5/wqe.hpp"
#include "gin/host/gpu_nic_kernel.hpp"
#include "gin/host/idle.hpp"
#include "gin/host/memory.hpp"
#include "gin/host/side_context.hpp"
#include "gin/host/window.hpp"

#if GIN_WITH_CUDA
namespace gin {

class GpuNic {
 public:
  struct Config {
    int ctas = 2;                  // CTAs of 4 warps; each warp serves QPs i, i + warps, ...
    bool sink = false;             // complete every WQE without running it (a CQE where it asks for one)
    uint64_t idleExitUs = 10000;   // end the kernel after this long without work (0: never)
    uint64_t startTimeoutNs = 0;   // how long a (re)launch may take to start (0: 20 s)
  };
  // A QP: its NIC-facing memory (device addresses), and the host address of its UAR word.
  struct QpDesc {
    gpunic::Qp qp;
    const uint64_t* uarHost;
  };
  using Stopped = std::function<void(const std::string& why)>;

  GpuNic(int device, std::vector<QpDesc> qps, unsigned maxRegions, Config cfg)
      : device_(device), cfg_(cfg), descs_(std::move(qps)) {
    if (!gpunic::launcher)
      throw Error(
          "the GPU NIC (GIN_IBGDA_DEVICE=gpu-soft) runs a kernel, which only translation units compiled by nvcc "
          "carry: create the communicator from a .cu file, or use GIN_IBGDA_DEVICE=soft");
    if (cfg_.ctas < 1 || cfg_.ctas > 1024)
      throw Error("the GPU NIC's CTA count must be in [1, 1024] (got " + std::to_string(cfg_.ctas) + ")");
    if (cfg_.startTimeoutNs == 0) cfg_.startTimeoutNs = 20'000'000'000ull;
    const size_t nQ = descs_.size();
    nSlots_ = 16;
    while (nSlots_ < 2 * maxRegions + 2) nSlots_ *= 2;
    regions_.assign(nSlots_, gpunic::Region{});
    const int warps = cfg_.ctas * gpunic::kThreads / 32;
    host_ = HostMappedBuffer(true, sizeof(gpunic::Control) + nQ * 8 + size_t(warps) * 16 + 64);
    char* h = static_cast<char*>(host_.host());
    char* d = static_cast<char*>(host_.device());
    ctl_ = reinterpret_cast<gpunic::Control*>(h);
    consumed_ = reinterpret_cast<unsigned*>(h + sizeof(gpunic::Control));
    failed_ = consumed_ + nQ;
    counts_ = reinterpret_cast<unsigned long long*>(h + sizeof(gpunic::Control) + nQ * 8);
    // Device memory: the QP table, their states, the grid state, the regions.
    const size_t offSt = nQ * sizeof(gpunic::Qp), offGrid = offSt + nQ * sizeof(gpunic::QpState),
                 offReg = (offGrid + sizeof(gpunic::GridState) + 63) / 64 * 64;
    table_ = DeviceTable(true, offReg + nSlots_ * sizeof(gpunic::Region));
    std::vector<gpunic::Qp> qv(nQ);
    for (size_t i = 0; i < nQ; ++i) qv[i] = descs_[i].qp;
    if (nQ) table_.upload(0, qv.data(), nQ * sizeof(gpunic::Qp));
    regionsDev_ = reinterpret_cast<gpunic::Region*>(table_.data() + offReg);
    p_.qps = reinterpret_cast<const gpunic::Qp*>(table_.data());
    p_.st = reinterpret_cast<gpunic::QpState*>(table_.data() + offSt);
    p_.grid = reinterpret_cast<gpunic::GridState*>(table_.data() + offGrid);
    p_.consumed = reinterpret_cast<unsigned*>(d + sizeof(gpunic::Control));
    p_.failed = p_.consumed + nQ;
    p_.counts = reinterpret_cast<unsigned long long*>(d + sizeof(gpunic::Control) + nQ * 8);
    p_.ctl = reinterpret_cast<gpunic::Control*>(d);
    p_.nQps = int(nQ);
    p_.regions = regionsDev_;
    p_.nSlots = nSlots_;
    p_.sink = cfg_.sink ? 1u : 0u;
    p_.idleExitNs = cfg_.idleExitUs * 1000ull;
    int lo = 0, hi = 0;
    GIN_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    GIN_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, hi));
    copier_ = std::make_unique<SideCopier>(device_);
  }
  ~GpuNic() {
    try {
      stop();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "gin: stopping the GPU NIC: %s\n", e.what());
    }
    if (stream_) (void)cudaStreamDestroy(stream_);
  }
  GpuNic(const GpuNic&) = delete;
  GpuNic& operator=(const GpuNic&) = delete;

  bool sink() const { return cfg_.sink; }
  int ctas() const { return cfg_.ctas; }
  size_t nQps() const { return descs_.size(); }

  // Regions: (peer, key) -> [addr, addr + bytes) at device address `map`;
  // peer -1 for local keys. Before the first WQE that names them.
  void addRegion(int peer, uint32_t key, uint64_t addr, uint64_t bytes, void* map) {
    std::lock_guard<std::mutex> lk(mu_);
    unsigned h = gpunic::regionSlot(peer, key, nSlots_), reuse = ~0u;
    for (unsigned k = 0; k < nSlots_; ++k, h = (h + 1) & (nSlots_ - 1)) {
      gpunic::Region& r = regions_[h];
      if (r.state == gpunic::kLive && r.key == key && r.peer == peer) {
        reuse = h;
        break;
      }
      if (r.state != gpunic::kLive && reuse == ~0u) reuse = h;
      if (r.state == gpunic::kEmpty) break;
    }
    if (reuse == ~0u) throw Error("the GPU NIC's region table is full (" + std::to_string(nSlots_) + " slots)");
    regions_[reuse] = gpunic::Region{addr, bytes, reinterpret_cast<uintptr_t>(map), key, peer, gpunic::kLive, 0};
    publish(reuse);
  }
  void removeRegion(int peer, uint32_t key) {
    std::lock_guard<std::mutex> lk(mu_);
    unsigned h = gpunic::regionSlot(peer, key, nSlots_);
    for (unsigned k = 0; k < nSlots_; ++k, h = (h + 1) & (nSlots_ - 1)) {
      gpunic::Region& r = regions_[h];
      if (r.state == gpunic::kEmpty) return;
      if (r.state == gpunic::kLive && r.key == key && r.peer == peer) {
        r.state = gpunic::kRemoved;
        return publish(h);
      }
    }
  }

  // What to do if a (re)launch does not start in time (the Comm records it).
  void setOnStop(Stopped f) {
    std::lock_guard<std::mutex> lk(mu_);
    onStop_ = std::move(f);
  }

  // Launch the kernel (bounded wait for it to start), then the watcher.
  void start() {
    if (watcher_.joinable()) return;
    GIN_CUDA_CHECK(cudaSetDevice(device_));
    std::string why;
    if (!launch(&why)) throw Error(why);
    watcher_ = std::thread([this] { watch(); });
  }
  void stop() {
    if (stopped_) return;
    stopped_ = true;
    quit_.store(true, std::memory_order_release);
    if (watcher_.joinable()) watcher_.join();
    atomicStore(&ctl_->stop, 1u, MemoryOrder::Release);
    if (launched_) GIN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  // WQEs completed without error so far, and with an error (each warp
  // publishes its totals before the CQEs they count).
  uint64_t executed() const { return sumCounts(0); }
  uint64_t errors() const { return sumCounts(1); }
  // Whether the kernel is running now, and how many times it was launched.
  bool running() const { return running_.load(std::memory_order_acquire); }
  unsigned launches() const { return epoch_; }

 private:
  int device_;
  Config cfg_;
  std::vector<QpDesc> descs_;
  unsigned nSlots_ = 0;
  std::vector<gpunic::Region> regions_;  // the host's copy, under mu_
  HostMappedBuffer host_;
  DeviceTable table_;
  gpunic::Region* regionsDev_ = nullptr;
  gpunic::Control* ctl_ = nullptr;
  unsigned* consumed_ = nullptr;
  unsigned* failed_ = nullptr;
  unsigned long long* counts_ = nullptr;
  gpunic::Params p_{};
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<SideCopier> copier_;  // region updates: never queued behind the program's kernels
  std::mutex mu_;
  Stopped onStop_;
  std::thread watcher_;
  std::atomic<bool> quit_{false}, running_{false};
  unsigned epoch_ = 0;
  bool launched_ = false, stopped_ = false;

  uint64_t sumCounts(int k) const {
    uint64_t s = 0;
    const int warps = cfg_.ctas * gpunic::kThreads / 32;
    for (int w = 0; w < warps; ++w) s += atomicLoad(counts_ + 2 * w + k, MemoryOrder::Relaxed);
    return s;
  }

  // Copy region slot h into the kernel's table (a side-context copy: it runs
  // while the program's kernels spin, whatever its streams).
  void publish(unsigned h) {
    copier_->copy(regionsDev_ + h, stageRegion(regions_[h]), sizeof(gpunic::Region));
    copier_->complete();
  }
  const void* stageRegion(const gpunic::Region& r) {
    if (!stage_.host()) stage_ = HostMappedBuffer(true, sizeof(gpunic::Region));
    std::memcpy(stage_.host(), &r, sizeof r);
    return stage_.host();
  }
  HostMappedBuffer stage_;

  // Launch epoch + 1 and wait (bounded) until every CTA started.
  bool launch(std::string* why) {
    p_.epoch = ++epoch_;
    const cudaError_t e = gpunic::launcher(p_, cfg_.ctas, stream_);
    if (e != cudaSuccess) {
      *why = std::string("launching the GPU NIC's kernel failed: ") + cudaGetErrorString(e);
      return false;
    }
    launched_ = true;
    running_.store(true, std::memory_order_release);
    const uint64_t t0 = nowNs();
    // cudaStreamQuery hands the launch to the GPU: the driver may hold
    // launches back until the next call that flushes them, and nothing else
    // may come (the NIC's kernel is the only work on its stream).
    uint32_t polls = 0;
    while (atomicLoad(&ctl_->startedEpoch, MemoryOrder::Acquire) != p_.epoch) {
      if (polls++ % 1024 == 0) (void)cudaStreamQuery(stream_);
      if (nowNs() - t0 > cfg_.startTimeoutNs) {
        *why = "the GPU NIC's kernel (" + std::to_string(cfg_.ctas) + " CTAs of " +
               std::to_string(gpunic::kThreads) + " threads) did not start within " +
               std::to_string(cfg_.startTimeoutNs / 1000000) +
               " ms: the GPU is full, or its launch waits in a CUDA hardware queue behind kernels that wait for it "
               "(CUDA_DEVICE_MAX_CONNECTIONS, ranks sharing the GPU: docs/design/gpu-nic.md). Use "
               "GIN_IBGDA_DEVICE=soft, or GIN_IBGDA_GPU_NIC_IDLE_US=0 (the kernel stays)";
        return false;
      }
      std::this_thread::yield();
    }
    return true;
  }

  // Whether QP i has a rung doorbell for WQEs the kernel has not consumed.
  bool pending(size_t i) const {
    if (atomicLoad(failed_ + i, MemoryOrder::Acquire)) return false;
    const uint64_t uar = atomicLoad(descs_[i].uarHost, MemoryOrder::Acquire);
    if (uar == 0) return false;
    mlx5::CtrlSeg c{};
    std::memcpy(&c, &uar, 8);
    return uint16_t(mlx5::ctrlWqeIndex(c) + 1) != uint16_t(atomicLoad(consumed_ + i, MemoryOrder::Acquire));
  }

  void watch() {
    try {
      (void)cudaSetDevice(device_);
      detail::IdleBackoff idle(256, 64, 20);
      while (!quit_.load(std::memory_order_acquire)) {
        if (running_.load(std::memory_order_relaxed)) {
          if (atomicLoad(&ctl_->exitedEpoch, MemoryOrder::Acquire) == epoch_) {
            running_.store(false, std::memory_order_release);
            continue;  // check for doorbells it missed at once
          }
          idle.wait();
          continue;
        }
        bool any = false;
        for (size_t i = 0; i < descs_.size() && !any; ++i) any = pending(i);
        if (!any) {
          idle.wait();
          continue;
        }
        idle.busy();
        std::string why;
        if (!launch(&why)) {
          Stopped tell;
          {
            std::lock_guard<std::mutex> lk(mu_);
            tell = onStop_;
          }
          std::fprintf(stderr, "gin: %s\n", why.c_str());
          if (tell) tell(why);
          return;
        }
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "gin: the GPU NIC's watcher stopped: %s\n", e.what());
    }
  }
};

}  // namespace gin
#endif  // GIN_WITH_CUDA
