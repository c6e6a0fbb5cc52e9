// gin/host/ibgda.hpp — the ibgda transport, host side: the queue pairs (send
// queue, doorbell record, UAR word, completion queue), the key tables kernels
// read (IbgdaDev), and the NIC that consumes the queues. IbgdaConfig, which
// picks the NIC, is in ibgda_config.hpp.
//
// Three NICs. The soft NIC (gin/host/soft_nic.hpp), selected with
// IbgdaConfig::device = Soft or GIN_IBGDA_DEVICE=soft: a host thread, queues
// in host memory, peers whose memory is mapped in this process (the lsa
// team); on GPU ranks it reaches device-memory windows by side-context copies.
// The GPU NIC (gin/host/gpu_nic.hpp), Device::GpuSoft or
// GIN_IBGDA_DEVICE=gpu-soft, GPU ranks only: a kernel of its own consumes
// queues in GPU memory (IbgdaConfig::queues = Gpu, its default) and moves
// data with loads and stores, to lsa peers through their mapped pointers.
// A real mlx5 (ConnectX) device through rdma-core (gin/host/ibgda_mlx5.hpp),
// selected with Device::Mlx5 or GIN_IBGDA_DEVICE=mlx5 (and by Auto): it links
// -libverbs -lmlx5, so it is compiled in only where the program asks for it
// with GIN_IBGDA_MLX5=1 (as GIN_COMM_VERBS does for the verbs wire); without
// it, asking for mlx5 is a gin::Error that says so. NEVER RUN ON CONNECTX
// HARDWARE: tested only against an in-process model of libibverbs/mlx5dv.
#pragma once

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gin/device/comm.hpp"
#include "gin/device/transport/ibgda.hpp"
#include "gin/host/bootstrap.hpp"
#include "gin/host/env.hpp"
#include "gin/host/gpu_nic.hpp"
#include "gin/host/ibgda_config.hpp"
#include "gin/host/memory.hpp"
#include "gin/host/side_context.hpp"
#include "gin/host/soft_nic.hpp"
#include "gin/host/soft_nic_copies.hpp"
#include "gin/host/window.hpp"

// The mlx5 NIC links -libverbs -lmlx5: compiled in only on request.
#ifndef GIN_IBGDA_MLX5
#define GIN_IBGDA_MLX5 0
#endif
#if GIN_IBGDA_MLX5
#include "gin/host/ibgda_mlx5.hpp"
#endif

namespace gin {

class IbgdaTransport {
 public:
  // Collective over `bs`. lsaSignals: each lsa member's signal array mapped
  // here (nSignalWords words each); transports: the per-peer table.
  IbgdaTransport(Bootstrap& bs, const DevComm& dev, const std::vector<uint8_t>& transports,
                 const std::vector<uint64_t*>& lsaSignals, uint32_t nSignalWords, bool gpu, IbgdaConfig cfg)
      : bs_(bs), rank_(dev.rank), nRanks_(dev.nRanks), lsaBase_(dev.rank - dev.lsaRank), cfg_(cfg) {
    const IbgdaConfig::Device device = detail::ibgdaDevice(cfg.device);
    detail::checkIbgdaConfig(cfg);
    const IbgdaConfig::Queues queues = detail::ibgdaQueues(cfg.queues, device);
    if (detail::gpuNicDevice(device)) {
      startGpuNic(dev, transports, lsaSignals, nSignalWords, gpu, device == IbgdaConfig::Device::GpuSoftSink,
                  queues == IbgdaConfig::Queues::Host);
      return;
    }
    detail::checkIbgdaQueues(queues, device);
    if (device == IbgdaConfig::Device::Mlx5) {
#if GIN_IBGDA_MLX5
      startMlx5(dev, transports, nSignalWords, gpu, queues == IbgdaConfig::Queues::Gpu);
      return;
#else
      throw Error(
          "the ibgda transport is set to an mlx5 (ConnectX) device (GIN_IBGDA_DEVICE=mlx5, or unset), but this "
          "program was built without gin's mlx5 NIC: compile it with -DGIN_IBGDA_MLX5=1 and link -libverbs -lmlx5 "
          "(rdma-core); or set GIN_IBGDA_DEVICE=soft (CommConfig::ibgda.device = Soft) for the soft NIC, or "
          "GIN_TRANSPORT=proxy");
#endif
    }
    gpu_ = gpu;
    nic_ = std::make_unique<SoftNic>(device == IbgdaConfig::Device::SoftSink ? SoftNic::Mode::Sink
                                                                             : SoftNic::Mode::Execute);
    // GPU ranks: windows are device memory, which the soft NIC reaches by
    // side-context copies (synchronous: the payload lands before the CQE and
    // before any later WQE of the QP). The Comm keeps the signal
    // arrays in mapped host memory for it, so atomics stay CPU atomics.
    if (gpu) {
      copies_.startDeviceCopies(*nic_);
    } else if (env::flag("GIN_SOFT_NIC_DEFERRED_COPIES").value_or(false)) {
      copies_.startDeferredHostCopies(*nic_);
    }
    const size_t nCtx = size_t(dev.nContexts), nR = size_t(nRanks_), nQp = nCtx * nR, depth = cfg.qpDepth;

    // NIC-facing memory: per QP the SQ, the CQ, a line with the doorbell
    // record and the CQ doorbell record, a line for the UAR word; then the
    // atomic scratch words.
    qpBytes_ = depth * 64 * 2 + 128;
    nicMem_ = HostMappedBuffer(gpu, qpBytes_ * nQp + nQp * 8 + 64);
    char* nic = align64(static_cast<char*>(nicMem_.host()));
    char* scratch = nic + qpBytes_ * nQp;
    // The address a kernel uses for host address h of nicMem_.
    const auto onDevice = [&](char* h) {
      return static_cast<char*>(nicMem_.device()) + (h - static_cast<char*>(nicMem_.host()));
    };

    std::vector<IbgdaQpDev> qps = allocTables(nCtx, gpu);
    nic_->addLocalRegion(kScratchKey, reinterpret_cast<uint64_t>(onDevice(scratch)), nQp * 8, scratch);
    for (size_t ctx = 0; ctx < nCtx; ++ctx)
      for (size_t p = 0; p < nR; ++p) {
        const size_t i = ctx * nR + p;
        char* q = nic + i * qpBytes_;
        char* qd = onDevice(q);
        IbgdaQpDev& d = qps[i];
        layQp(d, qd, i, reinterpret_cast<uint64_t*>(qd + depth * 128 + 64), onDevice(scratch));
        if (transports[p] != uint8_t(Transport::Ibgda)) continue;
        requireLsa(p, lsaSignals.size(), "the soft NIC");
        SoftNic::Qp sq;
        sq.sq = reinterpret_cast<uint8_t*>(q);
        sq.nWqe = d.nWqe;
        sq.dbrec = reinterpret_cast<uint32_t*>(q + depth * 128);
        sq.uar = reinterpret_cast<uint64_t*>(q + depth * 128 + 64);
        sq.cq = reinterpret_cast<mlx5::Cqe64*>(q + depth * 64);
        sq.nCqe = d.nCqe;
        sq.cqDbrec = reinterpret_cast<uint32_t*>(q + depth * 128 + 8);
        sq.qpn = d.qpn;
        sq.peer = int(p);
        nic_->addQp(sq);
      }
    publishTables(qps);

    publishSignals(dev, nSignalWords, lsaSignals, [&](int p, const Advert& a, uint64_t* map) {
      nic_->addRemoteRegion(p, a.key, a.addr, a.bytes, reinterpret_cast<char*>(map));
    });
    nic_->start();
  }

  ~IbgdaTransport() {
    gnic_.reset();  // the GPU NIC's kernel ends before its queues go
    nic_.reset();  // the NIC drains and stops before the queues go (and before its copier)
#if GIN_IBGDA_MLX5
    mlx5_.reset();
#endif
  }
  IbgdaTransport(const IbgdaTransport&) = delete;
  IbgdaTransport& operator=(const IbgdaTransport&) = delete;

  const IbgdaDev* dev() const { return dev_; }
  // The soft NIC (an error on an mlx5 device: see mlx5()).
  SoftNic& nic() const {
    if (!nic_) throw Error("IbgdaTransport::nic(): this transport runs on an mlx5 device, not the soft NIC");
    return *nic_;
  }
#if GIN_IBGDA_MLX5
  Mlx5Nic* mlx5() const { return mlx5_.get(); }
#endif
  // What carries the queues, for reports.
  std::string nicName() const {
#if GIN_IBGDA_MLX5
    if (mlx5_)
      return "mlx5 " + mlx5_->deviceName() + " port " + std::to_string(mlx5_->port()) +
             (mlx5_->roce() ? " (RoCE, GID index " + std::to_string(mlx5_->gidIndex()) + ")" : " (InfiniBand)") +
             ", queues in host memory";
#endif
    if (gnic_)
      return "GPU NIC (" + std::to_string(gnic_->ctas()) + " CTAs" + (gnic_->sink() ? ", sink" : "") +
             "), queues in " + (gpuQueues_.data() ? "GPU memory" : "mapped host memory");
    return nic_ && nic_->mode() == SoftNic::Mode::Sink ? "soft NIC (sink)" : "soft NIC";
  }
  const IbgdaConfig& config() const { return cfg_; }
  // Whether a soft NIC (the host thread or the GPU NIC) carries the queues,
  // and the WQEs it has completed without error so far (0 on an mlx5
  // device, which does not count them).
  bool softNic() const { return nic_ != nullptr || gnic_ != nullptr; }
  // The GPU NIC, or null.
  GpuNic* gpuNic() const { return gnic_.get(); }
  // What to do if the soft NIC stops on an error (no-op on the mlx5 NIC).
  void onNicStopped(SoftNic::Stopped f) {
    if (nic_) nic_->setOnStop(std::move(f));
    if (gnic_) gnic_->setOnStop([f](const std::string& why) { f(why.c_str()); });
  }
  uint64_t nicExecuted() const { return nic_ ? nic_->executed() : gnic_ ? gnic_->executed() : 0; }

  // The key this rank's NIC gives window `id` (0: the signal array). Keys are
  // per rank in a real NIC; the soft NIC's are deterministic but still checked.
  static uint32_t keyOf(uint32_t id) { return 0x00a00007u + (id << 8); }

  // A window was registered (collective): local key for our buffer, remote
  // keys of every peer's, the NIC's regions for both.
  void addWindow(uint32_t id, char* local, uint64_t bytes, const std::vector<char*>& lsaBases) {
#if GIN_IBGDA_MLX5
    if (mlx5_) return addWindowMlx5(id, local, bytes);
#endif
    const uint32_t slot = id % cfg_.maxWindows;
    std::vector<Advert> ads = exchange(Advert{reinterpret_cast<uint64_t>(local), keyOf(id), bytes});
    if (live_.size() < cfg_.maxWindows) live_.assign(cfg_.maxWindows, 0);
    if (live_[slot] != 0)
      throw Error("the ibgda transport holds at most CommConfig::ibgda.maxWindows = " +
                  std::to_string(cfg_.maxWindows) + " windows at once (window " + std::to_string(live_[slot]) +
                  " still holds slot " + std::to_string(slot) + "); raise it or deregister windows");
    live_[slot] = id;
    addRegion(-1, keyOf(id), reinterpret_cast<uint64_t>(local), bytes, local);
    std::vector<IbgdaRemoteKey> rem(static_cast<size_t>(nRanks_));
    for (int p = 0; p < nRanks_; ++p) {
      rem[size_t(p)] = IbgdaRemoteKey{ads[size_t(p)].addr, ads[size_t(p)].key, 0};
      const int li = p - lsaBase_;
      if (li >= 0 && li < int(lsaBases.size()))
        addRegion(p, ads[size_t(p)].key, ads[size_t(p)].addr, ads[size_t(p)].bytes, lsaBases[size_t(li)]);
    }
    table_.upload(tablePad_ + offWinRemote_ + size_t(slot) * size_t(nRanks_) * sizeof(IbgdaRemoteKey), rem.data(),
                  rem.size() * sizeof(IbgdaRemoteKey));
    const IbgdaWindowKey k{id, keyOf(id)};
    table_.upload(tablePad_ + offWin_ + slot * sizeof(IbgdaWindowKey), &k, sizeof k);
  }

  // After every rank stopped using window `id` (the Comm quiesced and barriered).
  void removeWindow(uint32_t id) {
    const uint32_t slot = id % cfg_.maxWindows;
    if (slot >= live_.size() || live_[slot] != id) return;
    live_[slot] = 0;
    const IbgdaWindowKey k{0, 0};
    table_.upload(tablePad_ + offWin_ + slot * sizeof(IbgdaWindowKey), &k, sizeof k);
#if GIN_IBGDA_MLX5
    if (mlx5_) return mlx5_->removeWindow(id);
#endif
    if (gnic_) {
      gnic_->removeRegion(-1, keyOf(id));
      for (int p = 0; p < nRanks_; ++p) gnic_->removeRegion(p, keyOf(id));
      return;
    }
    nic_->removeLocalRegion(keyOf(id));
    for (int p = 0; p < nRanks_; ++p) nic_->removeRemoteRegion(p, keyOf(id));
  }

  // Every WQE posted so far has been consumed by the NIC (bounded). On an
  // mlx5 device and the GPU NIC the host cannot see that (completions are
  // the ranks' threads' to poll): true; ranks flush before they deregister a
  // window.
  bool quiesce(uint64_t timeoutNs) const { return nic_ ? nic_->quiesce(timeoutNs) : true; }

 private:
  struct Advert {
    uint64_t addr;
    uint32_t key;
    uint32_t pad = 0;
    uint64_t bytes;
    Advert() = default;
    Advert(uint64_t a, uint32_t k, uint64_t b) : addr(a), key(k), bytes(b) {}
  };
  static constexpr uint32_t kScratchKey = 0x00500003u;

  Bootstrap& bs_;
  int rank_, nRanks_, lsaBase_;
  IbgdaConfig cfg_;
  size_t qpBytes_ = 0, tablePad_ = 0, offWin_ = 0, offWinRemote_ = 0, offQps_ = 0, offDev_ = 0, offSigRemote_ = 0;
  HostMappedBuffer nicMem_;
  DeviceTable gpuQueues_;  // the GPU NIC's queues in GPU memory
  HostMappedBuffer uars_;  // the GPU NIC's UAR words
  std::unique_ptr<GpuNic> gnic_;
  DeviceTable table_;
  char* base_ = nullptr;
  const IbgdaDev* dev_ = nullptr;
  std::vector<uint32_t> live_;  // window id per slot, 0: free
  std::unique_ptr<SoftNic> nic_;
  bool gpu_ = false;
  bool nicOnGpu_ = false;  // the GPU NIC: GPU-scope doorbells and CQEs (IbgdaDev::nicOnGpu)
  // The soft NIC's copies into device regions (soft_nic_copies.hpp).
  detail::SoftNicCopies copies_;
#if GIN_IBGDA_MLX5
  std::unique_ptr<Mlx5Nic> mlx5_;
#endif

  // QP i's NIC-facing words in the block at q (the addresses kernels use),
  // its UAR word and its scratch word (in the block at `scratch`).
  void layQp(IbgdaQpDev& d, char* q, size_t i, uint64_t* uar, char* scratch) const {
    const size_t depth = cfg_.qpDepth;
    d.sq = reinterpret_cast<uint8_t*>(q);
    d.cq = reinterpret_cast<mlx5::Cqe64*>(q + depth * 64);
    d.dbrec = reinterpret_cast<uint32_t*>(q + depth * 128);
    d.cqDbrec = reinterpret_cast<uint32_t*>(q + depth * 128 + 8);
    d.uar = uar;
    d.scratchAddr = reinterpret_cast<uint64_t>(scratch + i * 8);
    d.scratchLkey = kScratchKey;
    d.qpn = qpnOf(i);
  }
  // The soft NICs reach only peers whose memory is mapped here.
  void requireLsa(size_t p, size_t nLsa, const char* nic) const {
    if (int(p) < lsaBase_ || int(p) >= lsaBase_ + int(nLsa))
      throw Error(std::string(nic) + " reaches only peers whose memory is mapped here (the lsa team); rank " +
                  std::to_string(p) + " is not one");
  }
  // Signal arrays: every rank advertises (address, key, size) of its own;
  // add(peer, advert, map) gives the NIC each lsa member's, through the
  // mapping the Comm made; the key table gets every rank's.
  template <class Add>
  void publishSignals(const DevComm& dev, uint32_t nSignalWords, const std::vector<uint64_t*>& lsaSignals, Add add) {
    const size_t nR = size_t(nRanks_);
    std::vector<Advert> ads = exchange(Advert{reinterpret_cast<uint64_t>(dev.signals), keyOf(0), nSignalWords * 8ull});
    std::vector<IbgdaRemoteKey> sig(nR);
    for (size_t p = 0; p < nR; ++p) {
      sig[p] = IbgdaRemoteKey{ads[p].addr, ads[p].key, 0};
      const int li = int(p) - lsaBase_;
      if (li >= 0 && li < int(lsaSignals.size())) add(int(p), ads[p], lsaSignals[size_t(li)]);
    }
    table_.upload(tablePad_ + offSigRemote_, sig.data(), nR * sizeof(IbgdaRemoteKey));
  }

  // A region of the soft NIC or the GPU NIC (peer -1: a local key).
  void addRegion(int peer, uint32_t key, uint64_t addr, uint64_t bytes, char* map) {
    if (gnic_) return gnic_->addRegion(peer, key, addr, bytes, map);
    if (peer < 0) return nic_->addLocalRegion(key, addr, bytes, map, gpu_ || copies_.deferred());
    nic_->addRemoteRegion(peer, key, addr, bytes, map, gpu_ || copies_.deferred());
  }

  // The GPU NIC: queues in GPU memory (or mapped host memory), UAR words in
  // mapped host memory (what its watcher polls), the same key tables.
  void startGpuNic(const DevComm& dev, const std::vector<uint8_t>& transports,
                   const std::vector<uint64_t*>& lsaSignals, uint32_t nSignalWords, bool gpu, bool sink,
                   bool queuesOnHost) {
#if GIN_WITH_CUDA
    if (!gpu)
      throw Error("GIN_IBGDA_DEVICE=gpu-soft (the GPU NIC) runs on GPU ranks only; CPU ranks use soft");
    if (const auto conns = env::raw("CUDA_DEVICE_MAX_CONNECTIONS"); conns && std::atoi(conns->c_str()) == 1)
      throw Error(
          "the GPU NIC (GIN_IBGDA_DEVICE=gpu-soft) does not run with CUDA_DEVICE_MAX_CONNECTIONS=1: after an idle "
          "spell its kernel starts again while the program's kernels wait for it, and with one hardware queue that "
          "launch waits behind them (measured: docs/design/gpu-nic.md). Use GIN_IBGDA_DEVICE=soft (the host soft "
          "NIC runs under any setting) or GIN_TRANSPORT=proxy, or raise CUDA_DEVICE_MAX_CONNECTIONS");
    gpu_ = true;
    nicOnGpu_ = true;
    int cudaDevice = 0;
    GIN_CUDA_CHECK(cudaGetDevice(&cudaDevice));
    const size_t nCtx = size_t(dev.nContexts), nR = size_t(nRanks_), nQp = nCtx * nR, depth = cfg_.qpDepth;
    qpBytes_ = depth * 64 * 2 + 128;
    const size_t bytes = qpBytes_ * nQp + nQp * 8;
    // Every CQE invalid with owner 1 before the NIC starts.
    std::vector<char> image(bytes, 0);
    for (size_t i = 0; i < nQp; ++i)
      for (size_t e = 0; e < depth; ++e) image[i * qpBytes_ + depth * 64 + e * 64 + 63] = char(mlx5::kCqeInitOpOwn);
    char* nic = nullptr;
    if (queuesOnHost) {
      nicMem_ = HostMappedBuffer(true, bytes);
      std::memcpy(nicMem_.host(), image.data(), bytes);
      nic = static_cast<char*>(nicMem_.device());
    } else {
      gpuQueues_ = DeviceTable(true, bytes);
      gpuQueues_.upload(0, image.data(), bytes);
      nic = gpuQueues_.data();
    }
    uars_ = HostMappedBuffer(true, nQp * 8);
    char* scratch = nic + qpBytes_ * nQp;
    std::vector<IbgdaQpDev> qps = allocTables(nCtx, gpu);
    std::vector<GpuNic::QpDesc> descs;
    for (size_t ctx = 0; ctx < nCtx; ++ctx)
      for (size_t p = 0; p < nR; ++p) {
        const size_t i = ctx * nR + p;
        char* q = nic + i * qpBytes_;
        IbgdaQpDev& d = qps[i];
        layQp(d, q, i, static_cast<uint64_t*>(uars_.device()) + i, scratch);
        if (transports[p] != uint8_t(Transport::Ibgda)) continue;
        requireLsa(p, lsaSignals.size(), "the GPU NIC");
        gpunic::Qp g{d.sq, d.dbrec, d.cq, d.cqDbrec, d.nWqe, d.nCqe, d.qpn, int32_t(p)};
        descs.push_back(GpuNic::QpDesc{g, static_cast<const uint64_t*>(uars_.host()) + i});
      }
    publishTables(qps);
    GpuNic::Config gc;
    gc.ctas = int(env::integer("GIN_IBGDA_GPU_NIC_CTAS").value_or(cfg_.gpuNicCtas));
    gc.idleExitUs = uint64_t(env::integer("GIN_IBGDA_GPU_NIC_IDLE_US").value_or(int64_t(cfg_.gpuNicIdleUs)));
    gc.sink = sink;
    gc.startTimeoutNs = dev.timeoutNs;
    gnic_ = std::make_unique<GpuNic>(cudaDevice, std::move(descs), cfg_.maxWindows * unsigned(nR + 1) + unsigned(nR) + 1,
                                     gc);
    gnic_->addRegion(-1, kScratchKey, reinterpret_cast<uint64_t>(scratch), nQp * 8, scratch);
    publishSignals(dev, nSignalWords, lsaSignals, [&](int p, const Advert& a, uint64_t* map) {
      gnic_->addRegion(p, a.key, a.addr, a.bytes, map);
    });
    gnic_->start();
#else
    (void)dev, (void)transports, (void)lsaSignals, (void)nSignalWords, (void)gpu, (void)sink, (void)queuesOnHost;
    throw Error("the GPU NIC needs the CUDA runtime");
#endif
  }

#if GIN_IBGDA_MLX5
  // The mlx5 device's QPs, then the same key tables the soft NIC path fills
  // (the device code cannot tell the two apart). Every ibgda peer, lsa
  // member or not, gets a QP.
  void startMlx5(const DevComm& dev, const std::vector<uint8_t>& transports, uint32_t nSignalWords, bool gpu,
                 bool devx) {
    std::vector<bool> wanted(transports.size());
    for (size_t p = 0; p < transports.size(); ++p) wanted[p] = transports[p] == uint8_t(Transport::Ibgda);
    Mlx5Nic::Config mc;
    mc.qpDepth = cfg_.qpDepth;
    mc.gpu = gpu;
    mc.devx = devx;
    mlx5_ = std::make_unique<Mlx5Nic>(bs_, dev.nContexts, wanted, reinterpret_cast<char*>(dev.signals),
                                      uint64_t(nSignalWords) * 8, mc);
    // A WRITE longer than the max_msg_sz of the sending or the receiving
    // port fails (error CQE): split puts at the smallest of every rank's port
    // instead (0: the port reported no limit). Collective, like the NIC's
    // setup above, which every rank passed or none did.
    std::vector<uint32_t> maxMsg(size_t(nRanks_), 0);
    maxMsg[size_t(rank_)] = mlx5_->maxMessageBytes();
    bs_.allGather(maxMsg.data(), sizeof(uint32_t));
    for (const uint32_t m : maxMsg)
      if (m != 0 && m < cfg_.maxWqeBytes) cfg_.maxWqeBytes = m;
    const size_t nCtx = size_t(dev.nContexts), nR = size_t(nRanks_);
    std::vector<IbgdaQpDev> qps = allocTables(nCtx, gpu);
    for (size_t ctx = 0; ctx < nCtx; ++ctx)
      for (size_t p = 0; p < nR; ++p) {
        IbgdaQpDev& d = qps[ctx * nR + p];
        const Mlx5Nic::Queues* q = mlx5_->queues(int(ctx), int(p));
        if (!q) continue;
        d.sq = q->sq, d.dbrec = q->dbrec, d.uar = q->uar, d.cq = q->cq, d.cqDbrec = q->cqDbrec;
        d.qpn = q->qpn, d.nWqe = q->nWqe, d.nCqe = q->nCqe;
        d.scratchAddr = mlx5_->scratchAddr(int(ctx), int(p));
        d.scratchLkey = mlx5_->scratchLkey();
      }
    publishTables(qps);
    table_.upload(tablePad_ + offSigRemote_, mlx5_->signalRemotes().data(), nR * sizeof(IbgdaRemoteKey));
  }

  void addWindowMlx5(uint32_t id, char* local, uint64_t bytes) {
    const uint32_t slot = id % cfg_.maxWindows;
    if (live_.size() < cfg_.maxWindows) live_.assign(cfg_.maxWindows, 0);
    // The same verdict on every rank (same ids, same slots), before the collective.
    if (live_[slot] != 0)
      throw Error("the ibgda transport holds at most CommConfig::ibgda.maxWindows = " +
                  std::to_string(cfg_.maxWindows) + " windows at once (window " + std::to_string(live_[slot]) +
                  " still holds slot " + std::to_string(slot) + "); raise it or deregister windows");
    std::vector<IbgdaRemoteKey> rem;
    const uint32_t lkey = mlx5_->addWindow(id, local, bytes, &rem);
    live_[slot] = id;
    table_.upload(tablePad_ + offWinRemote_ + size_t(slot) * size_t(nRanks_) * sizeof(IbgdaRemoteKey), rem.data(),
                  rem.size() * sizeof(IbgdaRemoteKey));
    const IbgdaWindowKey k{id, lkey};
    table_.upload(tablePad_ + offWin_ + slot * sizeof(IbgdaWindowKey), &k, sizeof k);
  }
#endif

  // The tables kernels read (producer state, counter side tables, QP table,
  // IbgdaDev, window keys), in one device (or, on CPU ranks, host) block:
  // allocate it and return the QP table with every entry's producer state,
  // counter side table and depth filled in (queues: the caller's).
  std::vector<IbgdaQpDev> allocTables(size_t nCtx, bool gpu) {
    const size_t nR = size_t(nRanks_), nQp = nCtx * nR, depth = cfg_.qpDepth;
    const size_t offState = 0, offCounterOf = offState + nQp * sizeof(IbgdaQpState);
    offQps_ = offCounterOf + nQp * depth * 4;
    offDev_ = (offQps_ + nQp * sizeof(IbgdaQpDev) + 63) / 64 * 64;
    offWin_ = offDev_ + 64;
    offWinRemote_ = offWin_ + cfg_.maxWindows * sizeof(IbgdaWindowKey);
    offSigRemote_ = offWinRemote_ + size_t(cfg_.maxWindows) * nR * sizeof(IbgdaRemoteKey);
    table_ = DeviceTable(gpu, offSigRemote_ + nR * sizeof(IbgdaRemoteKey) + 64);
    base_ = align64(table_.data());
    tablePad_ = size_t(base_ - table_.data());
    std::vector<IbgdaQpDev> qps(nQp);
    const std::vector<uint32_t> noCounter(depth, kIbgdaNoCounter);
    for (size_t i = 0; i < nQp; ++i) {
      IbgdaQpDev& d = qps[i];
      d.state = reinterpret_cast<IbgdaQpState*>(base_ + offState) + i;
      d.counterOf = reinterpret_cast<uint32_t*>(base_ + offCounterOf) + i * depth;
      d.nWqe = d.nCqe = uint32_t(depth);
      table_.upload(tablePad_ + offCounterOf + i * depth * 4, noCounter.data(), depth * 4);
    }
    return qps;
  }
  // Upload the QP table and the IbgdaDev that points at the tables.
  void publishTables(const std::vector<IbgdaQpDev>& qps) {
    table_.upload(tablePad_ + offQps_, qps.data(), qps.size() * sizeof(IbgdaQpDev));
    IbgdaDev id{};
    id.qps = reinterpret_cast<IbgdaQpDev*>(base_ + offQps_);
    id.windows = reinterpret_cast<IbgdaWindowKey*>(base_ + offWin_);
    id.windowRemotes = reinterpret_cast<IbgdaRemoteKey*>(base_ + offWinRemote_);
    id.signalRemotes = reinterpret_cast<IbgdaRemoteKey*>(base_ + offSigRemote_);
    id.maxWindows = cfg_.maxWindows;
    id.maxWqeBytes = cfg_.maxWqeBytes;
    id.deferDoorbell = cfg_.deferDoorbell ? 1 : 0;
    id.nicOnGpu = nicOnGpu_ ? 1 : 0;
    table_.upload(tablePad_ + offDev_, &id, sizeof id);
    dev_ = reinterpret_cast<const IbgdaDev*>(base_ + offDev_);
  }

  static char* align64(char* p) { return p + (64 - reinterpret_cast<uintptr_t>(p) % 64) % 64; }
  uint32_t qpnOf(size_t i) const { return uint32_t(0x100 + i) & 0xffffffu; }

  std::vector<Advert> exchange(const Advert& mine) {
    std::vector<Advert> all(static_cast<size_t>(nRanks_));
    all[size_t(rank_)] = mine;
    bs_.allGather(all.data(), sizeof(Advert));
    return all;
  }
};

}  // namespace gin
