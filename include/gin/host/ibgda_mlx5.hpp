// gin/host/ibgda_mlx5.hpp — the ibgda transport on a real mlx5 (ConnectX)
// NIC: the host side that opens the device, creates one CQ and one RC QP per
// (context, peer), registers the signal array and the windows, maps the queues
// into the GPU and connects the QPs, collectively over the Bootstrap (every
// failure is voted, so every rank throws the same gin::Error).
//
// Two placements of the queues: where libmlx5 puts them (host memory, made
// with ibv_create_qp and mapped into the GPU), or in the rank's own memory
// (GPU memory on GPU ranks) as DEVX objects: umem registrations, a UAR per
// context, and CQs and QPs created and moved to RTS by firmware commands
// (gin/host/mlx5_devx.hpp), as NVSHMEM's IBGDA does.
//
// Not run on ConnectX hardware: none was available. Written to rdma-core 44
// and the mlx5 PRM, it compiles and its whole set-up runs only against an
// in-process model of libibverbs/mlx5dv (DEVX included) whose hardware is
// gin's soft NIC (tests/common/fake_verbs.hpp, tests/host/ibgda_mlx5_fake.cpp).
// What it does step by step, and why signal words stay little-endian under
// NIC atomics: docs/design/ibgda.md.
#pragma once

#include <algorithm>
#include <bit>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gin/device/mlx5/prm.hpp"
#include "gin/device/transport/ibgda.hpp"
#include "gin/host/bootstrap.hpp"
#include "gin/host/memory.hpp"
#include "gin/host/mlx5_devx.hpp"
#include "gin/host/verbs.hpp"

#ifndef GIN_WITH_MLX5
#if GIN_WITH_VERBS && __has_include(<infiniband/mlx5dv.h>)
#define GIN_WITH_MLX5 1
#else
#define GIN_WITH_MLX5 0
#endif
#endif

#if GIN_WITH_MLX5
#include <infiniband/mlx5dv.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>
#endif

namespace gin {
namespace mlx5nic {

// How far apart two devices are in the PCI tree, from their sysfs paths
// (/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0): the components of each
// below their deepest common ancestor, summed. INT_MAX when either is unknown.
inline int pciDistance(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return INT_MAX;
  auto split = [](const std::string& s) {
    std::vector<std::string> parts;
    size_t i = 0;
    while (i < s.size()) {
      const size_t j = s.find('/', i);
      const size_t e = j == std::string::npos ? s.size() : j;
      if (e > i) parts.push_back(s.substr(i, e - i));
      i = e + 1;
    }
    return parts;
  };
  const std::vector<std::string> x = split(a), y = split(b);
  size_t c = 0;
  while (c < x.size() && c < y.size() && x[c] == y[c]) ++c;
  return int(x.size() - c + y.size() - c);
}

}  // namespace mlx5nic

#if GIN_WITH_MLX5

class Mlx5Nic {
 public:
  struct Config {
    uint32_t qpDepth = 256;
    std::string device;  // "name[:port]"; empty: GIN_IB_DEVICE, else the mlx5 device nearest the GPU
    int gidIndex = -1;   // RoCE GID index; -1: GIN_IB_GID_INDEX, else automatic
    bool gpu = false;    // GPU rank: map the queues into the GPU, windows are GPU memory
    int cudaDevice = -1;
    // Queues as DEVX objects on the rank's own memory (GPU memory on GPU
    // ranks; host memory on CPU ranks, which is how the tests reach it).
    bool devx = false;
  };
  // One QP's NIC-facing memory as the ranks' threads reach it (device
  // pointers on GPU ranks, host pointers on CPU ranks), and its host view.
  struct Queues {
    uint8_t* sq = nullptr;
    uint32_t* dbrec = nullptr;
    uint64_t* uar = nullptr;
    mlx5::Cqe64* cq = nullptr;
    uint32_t* cqDbrec = nullptr;
    uint32_t qpn = 0, nWqe = 0, nCqe = 0;
  };

  // Collective. qp per (ctx, peer) for every peer with wanted[peer]; the
  // signal array [signals, signals + signalBytes) is registered for remote
  // atomics. Throws the same gin::Error on every rank when any rank fails.
  Mlx5Nic(Bootstrap& bs, int nContexts, const std::vector<bool>& wanted, char* signals, uint64_t signalBytes,
          Config cfg)
      : bs_(bs), me_(bs.rank()), nRanks_(bs.nRanks()), nCtx_(nContexts), cfg_(std::move(cfg)) {
    qps_.resize(size_t(nCtx_) * size_t(nRanks_));
    std::string err;
    try {
      open();
      createQueues(wanted);
      const int sigAccess =
          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
      signalMr_ = verbs::registerMemory(pd_.get(), signals, signalBytes, cfg_.gpu, sigAccess, cfg_.cudaDevice);
    } catch (const std::exception& e) {
      err = verbs::ownText(e);
    }
    verbs::agreeOrThrow(bs_, err, "setting up the mlx5 NIC", kWho);
    // Signal arrays: (address, rkey, bytes) of every rank.
    signalRemotes_.assign(size_t(nRanks_), IbgdaRemoteKey{});
    signalRemotes_[size_t(me_)] = IbgdaRemoteKey{uint64_t(uintptr_t(signals)), signalMr_->rkey, 0};
    bs_.allGather(signalRemotes_.data(), sizeof(IbgdaRemoteKey));
    connect();
  }

  ~Mlx5Nic() {
    // The GPU no longer touches the queues (the Comm is done with kernels):
    // unmap them while libmlx5 still holds the memory, then tear down in
    // dependency order.
    unmapAll();
    for (Qp& q : qps_) q.qp.reset(), q.devxQp.reset();
    for (Qp& q : qps_) q.cq.reset(), q.devxCq.reset();
    devx_.reset();
    windows_.clear();
    signalMr_.reset();
    scratchMr_.reset();
    scratch_ = HostMappedBuffer();
    pd_.reset();
    dev_.ctx.reset();
  }
  Mlx5Nic(const Mlx5Nic&) = delete;
  Mlx5Nic& operator=(const Mlx5Nic&) = delete;

  // The queues of (ctx, peer), or nullptr when that peer has no QP.
  const Queues* queues(int ctx, int peer) const {
    const Qp& q = qps_.at(size_t(ctx) * size_t(nRanks_) + size_t(peer));
    return q.live ? &q.view : nullptr;
  }
  // Where fetch-adds of QP (ctx, peer) leave the old value (nobody reads it).
  uint64_t scratchAddr(int ctx, int peer) const {
    return uint64_t(uintptr_t(scratch_.host())) + (size_t(ctx) * size_t(nRanks_) + size_t(peer)) * 8;
  }
  uint32_t scratchLkey() const { return scratchMr_ ? scratchMr_->lkey : 0; }
  const std::vector<IbgdaRemoteKey>& signalRemotes() const { return signalRemotes_; }

  // Collective: register this rank's window memory and learn every rank's
  // (address, rkey). Returns the local key and the remote keys [nRanks].
  uint32_t addWindow(uint32_t id, char* base, uint64_t bytes, std::vector<IbgdaRemoteKey>* remotes) {
    verbs::Own<ibv_mr> mr;
    std::string err;
    try {
      mr = verbs::registerMemory(pd_.get(), base, bytes, cfg_.gpu,
                                 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
                                 cfg_.cudaDevice);
    } catch (const std::exception& e) {
      err = verbs::ownText(e);
    }
    verbs::agreeOrThrow(bs_, err, "registering window " + std::to_string(id), kWho);
    remotes->assign(size_t(nRanks_), IbgdaRemoteKey{});
    (*remotes)[size_t(me_)] = IbgdaRemoteKey{uint64_t(uintptr_t(base)), mr->rkey, 0};
    bs_.allGather(remotes->data(), sizeof(IbgdaRemoteKey));
    const uint32_t lkey = mr->lkey;
    windows_[id] = std::move(mr);
    return lkey;
  }
  // Local: after every peer stopped writing into window `id`.
  void removeWindow(uint32_t id) { windows_.erase(id); }

  const std::string& deviceName() const { return dev_.name; }
  // The port's largest message (ibv_port_attr::max_msg_sz), 0 when it reports none.
  uint32_t maxMessageBytes() const { return dev_.portAttr.max_msg_sz; }
  int port() const { return dev_.port; }
  bool devx() const { return cfg_.devx; }
  bool roce() const { return dev_.roce; }
  uint32_t gidIndex() const { return dev_.gidIndex; }

 private:
  static constexpr const char* kWho = "ibgda (mlx5)";
  struct DevxDel {
    void operator()(mlx5dv_devx_obj* p) const { mlx5dv_devx_obj_destroy(p); }
    void operator()(mlx5dv_devx_umem* p) const { mlx5dv_devx_umem_dereg(p); }
    void operator()(mlx5dv_devx_uar* p) const { mlx5dv_devx_free_uar(p); }
  };
  template <class T>
  using DevxOwn = std::unique_ptr<T, DevxDel>;
  struct Qp {
    verbs::Own<ibv_cq> cq;
    verbs::Own<ibv_qp> qp;
    DevxOwn<mlx5dv_devx_obj> devxCq, devxQp;  // queues = DEVX: these instead
    uint32_t psn = 0;
    bool live = false;
    Queues view;
  };
  // DEVX placement: one allocation holds every QP's send queue and CQ (each
  // on a 4 KiB boundary) and then the doorbell records (64 bytes apart),
  // registered as one umem; one UAR per context.
  struct DevxMemory {
    void* base = nullptr;  // 4 KiB-aligned start inside the allocation
    void* alloc = nullptr;
    size_t bytes = 0;
    bool gpu = false;
    DevxOwn<mlx5dv_devx_umem> umem;
    std::vector<DevxOwn<mlx5dv_devx_uar>> uars;  // [ctx]
    ~DevxMemory() {
      umem.reset();
      uars.clear();
#if GIN_WITH_CUDA
      if (gpu && alloc) (void)cudaFree(alloc), (void)cudaGetLastError();
#endif
      if (!gpu) std::free(alloc);
    }
  };

  Bootstrap& bs_;
  int me_, nRanks_, nCtx_;
  Config cfg_;
  verbs::Port dev_;
  verbs::Own<ibv_pd> pd_;
  std::unique_ptr<DevxMemory> devx_;  // before qps_: a throwing constructor destroys the QPs first
  std::vector<Qp> qps_;               // [ctx * nRanks + peer]
  HostMappedBuffer scratch_;
  verbs::Own<ibv_mr> scratchMr_, signalMr_;
  std::map<uint32_t, verbs::Own<ibv_mr>> windows_;
  std::vector<IbgdaRemoteKey> signalRemotes_;
  uint32_t pdn_ = 0, eqn_ = 0;
  // GPU ranks: registered page runs, host base -> (bytes, device base).
  struct Run {
    size_t bytes;
    char* device;
  };
  std::map<uintptr_t, Run> runs_;

  [[noreturn]] static void fail(const std::string& what) { throw Error(what); }

  // The sysfs path of the GPU's PCI function ("" when unknown or a CPU rank).
  std::string gpuSysfsPath() const {
#if GIN_WITH_CUDA
    if (!cfg_.gpu) return "";
    int d = cfg_.cudaDevice;
    if (d < 0 && cudaGetDevice(&d) != cudaSuccess) return (void)cudaGetLastError(), "";
    char bus[32] = {};
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, d) != cudaSuccess) return (void)cudaGetLastError(), "";
    std::string b = bus;
    for (char& ch : b) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    return realPath("/sys/bus/pci/devices/" + b);
#else
    return "";
#endif
  }
  static std::string realPath(const std::string& p) {
    char buf[PATH_MAX];
    return ::realpath(p.c_str(), buf) ? std::string(buf) : std::string();
  }

  void open() {
    const std::string gpuPath = gpuSysfsPath();
    verbs::DeviceOrder order = [&](ibv_device** list, int n) {
      std::vector<std::pair<int, int>> c;  // (distance, index)
      for (int i = 0; i < n; ++i)
        if (mlx5dv_is_supported(list[i]))
          c.emplace_back(mlx5nic::pciDistance(gpuPath, realPath(std::string(list[i]->ibdev_path) + "/device")), i);
      std::stable_sort(c.begin(), c.end(), [](auto& x, auto& y) { return x.first < y.first; });
      std::vector<int> idx;
      for (auto& [d, i] : c) idx.push_back(i);
      return idx;
    };
    dev_ = verbs::openPort(verbs::envOr(cfg_.device, "GIN_IB_DEVICE"),
                           "use GIN_TRANSPORT=proxy, or GIN_IBGDA_DEVICE=soft for the soft NIC", "mlx5", order);
    verbs::chooseAddress(dev_, cfg_.gidIndex);
    if (dev_.devAttr.atomic_cap == IBV_ATOMIC_NONE)
      fail(dev_.name +
           " reports no RDMA atomics (IBV_ATOMIC_NONE: mlx5_ib says so when the HCA is not in the "
           "host-endianness atomic mode); gin's SignalInc/SignalAdd over ibgda are RDMA fetch-adds. Use "
           "GIN_TRANSPORT=proxy");
  }

  void createQueues(const std::vector<bool>& wanted) {
    pd_.reset(ibv_alloc_pd(dev_.ctx.get()));
    if (!pd_) fail("ibv_alloc_pd(" + dev_.name + ") failed: " + verbs::errnoText(errno));
    const uint32_t depth = cfg_.qpDepth;
    if (depth > uint32_t(dev_.devAttr.max_qp_wr) || depth > uint32_t(dev_.devAttr.max_cqe))
      fail("CommConfig::ibgda.qpDepth " + std::to_string(depth) + " is more than " + dev_.name + " allows (max_qp_wr " +
           std::to_string(dev_.devAttr.max_qp_wr) + ", max_cqe " + std::to_string(dev_.devAttr.max_cqe) + ")");
    const size_t nQp = qps_.size();
    scratch_ = HostMappedBuffer(cfg_.gpu, nQp * 8 + 8);
    scratchMr_ = verbs::registerMemory(pd_.get(), static_cast<char*>(scratch_.host()), nQp * 8 + 8, false,
                                       IBV_ACCESS_LOCAL_WRITE, cfg_.cudaDevice);
    if (cfg_.devx) return createQueuesDevx(wanted);
    std::mt19937 rng(std::random_device{}());
    for (int ctx = 0; ctx < nCtx_; ++ctx)
      for (int p = 0; p < nRanks_; ++p) {
        if (!wanted[size_t(p)]) continue;
        Qp& q = qps_[size_t(ctx) * size_t(nRanks_) + size_t(p)];
        const std::string what = "context " + std::to_string(ctx) + ", peer " + std::to_string(p);
        // The CQ: 64-byte CQEs whatever MLX5_CQE_SIZE says (the device code parses 64).
        ibv_cq_init_attr_ex ca{};
        ca.cqe = depth;
        mlx5dv_cq_init_attr ma{};
        ma.comp_mask = MLX5DV_CQ_INIT_ATTR_MASK_CQE_SIZE;
        ma.cqe_size = 64;
        ibv_cq_ex* cqx = mlx5dv_create_cq(dev_.ctx.get(), &ca, &ma);
        if (!cqx)
          fail("mlx5dv_create_cq(" + std::to_string(depth) + " CQEs) for " + what +
               " failed: " + verbs::errnoText(errno));
        q.cq.reset(ibv_cq_ex_to_cq(cqx));
        // The QP: every WQE gin posts is one 64-byte basic block (at most
        // ctrl + raddr + atomic + data, or 8 bytes inline), so the send
        // queue is exactly qpDepth WQEBBs. No receive queue: gin posts no
        // SEND and no WRITE_IMM.
        ibv_qp_init_attr qa{};
        qa.send_cq = q.cq.get();
        qa.recv_cq = q.cq.get();
        qa.qp_type = IBV_QPT_RC;
        qa.sq_sig_all = 0;
        qa.cap.max_send_wr = depth;
        qa.cap.max_recv_wr = 0;
        qa.cap.max_send_sge = 1;
        qa.cap.max_recv_sge = 0;
        qa.cap.max_inline_data = kIbgdaMaxInline;
        q.qp.reset(ibv_create_qp(pd_.get(), &qa));
        if (!q.qp)
          fail("ibv_create_qp(RC, " + std::to_string(depth) + " WQEs) for " + what +
               " failed: " + verbs::errnoText(errno));
        mlx5dv_qp dq{};
        mlx5dv_cq dc{};
        mlx5dv_obj obj{};
        obj.qp.in = q.qp.get();
        obj.qp.out = &dq;
        obj.cq.in = q.cq.get();
        obj.cq.out = &dc;
        if (const int e = mlx5dv_init_obj(&obj, MLX5DV_OBJ_QP | MLX5DV_OBJ_CQ))
          fail("mlx5dv_init_obj(QP, CQ) for " + what + " failed: " + verbs::errnoText(e));
        checkGeometry(dq, dc, what);
        q.psn = rng() & 0xffffff;
        Queues& v = q.view;
        v.qpn = q.qp->qp_num;
        v.nWqe = dq.sq.wqe_cnt;
        v.nCqe = dc.cqe_cnt;
        v.sq = reinterpret_cast<uint8_t*>(map(dq.sq.buf, size_t(dq.sq.wqe_cnt) * dq.sq.stride, false));
        v.dbrec = reinterpret_cast<uint32_t*>(map(dq.dbrec, 8, false));
        v.uar = reinterpret_cast<uint64_t*>(map(dq.bf.reg, 8, true));
        v.cq = reinterpret_cast<mlx5::Cqe64*>(map(dc.buf, size_t(dc.cqe_cnt) * dc.cqe_size, false));
        v.cqDbrec = reinterpret_cast<uint32_t*>(map(dc.dbrec, 8, false));
        verbs::toInit(
            q.qp.get(), dev_,
            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC, what);
        q.live = true;
      }
  }

  // ---- DEVX placement ----

  static constexpr size_t kPage = 4096, kDbrStride = 64;
  static size_t pageUp(size_t n) { return (n + kPage - 1) & ~(kPage - 1); }
  size_t sqBytes() const { return size_t(cfg_.qpDepth) * mlx5::kSendWqeBB; }
  size_t cqBytes() const { return size_t(cfg_.qpDepth) * sizeof(mlx5::Cqe64); }  // nCqe = qpDepth
  size_t blockBytes() const { return pageUp(sqBytes()) + pageUp(cqBytes()); }
  size_t dbrOffset(size_t i) const { return blockBytes() * qps_.size() + 2 * kDbrStride * i; }  // QP's; CQ's + 64

  static uint32_t log2u(uint64_t v) { return uint32_t(std::bit_width(v) - 1); }  // v >= 1

  // Firmware status and syndrome of a failed DEVX command, for the error text.
  static std::string devxText(int err, const uint8_t* out) {
    char buf[64];
    std::snprintf(buf, sizeof buf, " (status 0x%x, syndrome 0x%x)", unsigned(mlx5cmd::getField(out, mlx5cmd::kStatus)),
                  unsigned(mlx5cmd::getField(out, mlx5cmd::kSyndrome)));
    return verbs::errnoText(err) + buf;
  }

  // The queue memory (GPU memory on GPU ranks) with every CQE invalid and
  // owned by software, zeroed doorbell records; one umem over it.
  void allocDevxMemory() {
    devx_ = std::make_unique<DevxMemory>();
    DevxMemory& m = *devx_;
    m.gpu = cfg_.gpu;
    m.bytes = dbrOffset(qps_.size());
    std::vector<uint8_t> image(m.bytes, 0);
    for (size_t i = 0; i < qps_.size(); ++i)
      for (uint32_t e = 0; e < cfg_.qpDepth; ++e)
        image[blockBytes() * i + pageUp(sqBytes()) + e * sizeof(mlx5::Cqe64) + mlx5::kCqeOpOwn] = mlx5::kCqeInitOpOwn;
    if (m.gpu) {
#if GIN_WITH_CUDA
      if (cfg_.cudaDevice >= 0) GIN_CUDA_CHECK(cudaSetDevice(cfg_.cudaDevice));
      GIN_CUDA_CHECK(cudaMalloc(&m.alloc, m.bytes + kPage));
      m.base = reinterpret_cast<void*>((uintptr_t(m.alloc) + kPage - 1) & ~uintptr_t(kPage - 1));
      GIN_CUDA_CHECK(cudaMemcpy(m.base, image.data(), m.bytes, cudaMemcpyHostToDevice));
#else
      fail("a GPU rank, but gin was built without the CUDA runtime");
#endif
    } else {
      m.alloc = std::aligned_alloc(kPage, pageUp(m.bytes));
      if (!m.alloc) fail("out of host memory for the ibgda queues (" + std::to_string(m.bytes) + " bytes)");
      m.base = m.alloc;
      std::memcpy(m.base, image.data(), m.bytes);
    }
    // The NIC writes CQEs and reads WQEs and doorbell records here.
    const uint32_t access = IBV_ACCESS_LOCAL_WRITE;
    std::string dmabufWhy;
#if GIN_WITH_CUDA
    if (m.gpu) {
      // dma-buf first (no kernel module needed); addr is then the offset in the dma-buf.
      uint64_t offset = 0;
      const int fd = verbs::dmabufFd(static_cast<char*>(m.base), cfg_.cudaDevice, &offset, &dmabufWhy);
      if (fd >= 0) {
        mlx5dv_devx_umem_in in{};
        in.addr = reinterpret_cast<void*>(uintptr_t(offset));
        in.size = m.bytes;
        in.access = access;
        in.pgsz_bitmap = kPage;
        in.comp_mask = MLX5DV_UMEM_MASK_DMABUF;
        in.dmabuf_fd = fd;
        m.umem.reset(mlx5dv_devx_umem_reg_ex(dev_.ctx.get(), &in));
        const int e = errno;
        ::close(fd);
        if (!m.umem) dmabufWhy = "mlx5dv_devx_umem_reg_ex(dma-buf): " + verbs::errnoText(e);
      }
    }
#endif
    if (!m.umem) m.umem.reset(mlx5dv_devx_umem_reg(dev_.ctx.get(), m.base, m.bytes, access));
    if (!m.umem)
      fail("mlx5dv_devx_umem_reg(" + std::to_string(m.bytes) + " bytes of " + (m.gpu ? "GPU" : "host") +
           " memory for the ibgda queues) failed: " + verbs::errnoText(errno) +
           (m.gpu ? " (dma-buf: " + (dmabufWhy.empty() ? std::string("not tried") : dmabufWhy) +
                        "; without dma-buf GPU memory needs nvidia-peermem)"
                  : "") +
           "; GIN_IBGDA_QUEUES=host keeps the queues where libmlx5 puts them");
    for (int ctx = 0; ctx < nCtx_; ++ctx) {
      m.uars.emplace_back(mlx5dv_devx_alloc_uar(dev_.ctx.get(), MLX5DV_UAR_ALLOC_TYPE_NC));
      if (!m.uars.back())
        fail("mlx5dv_devx_alloc_uar(non-cached) for context " + std::to_string(ctx) +
             " failed: " + verbs::errnoText(errno) + "; is this device's firmware DEVX-capable?");
    }
  }

  void createQueuesDevx(const std::vector<bool>& wanted) {
    mlx5dv_pd dpd{};
    mlx5dv_obj po{};
    po.pd.in = pd_.get();
    po.pd.out = &dpd;
    if (const int e = mlx5dv_init_obj(&po, MLX5DV_OBJ_PD)) fail("mlx5dv_init_obj(PD) failed: " + verbs::errnoText(e));
    pdn_ = dpd.pdn;
    if (const int e = mlx5dv_devx_query_eqn(dev_.ctx.get(), 0, &eqn_))
      fail("mlx5dv_devx_query_eqn(0) on " + dev_.name + " failed: " + verbs::errnoText(e) +
           " (DEVX needs a device opened with DEVX support: mlx5_ib with user-space DEVX, rdma-core 24 or newer)");
    allocDevxMemory();
    DevxMemory& m = *devx_;
    const uint32_t umem = m.umem->umem_id, logDepth = log2u(cfg_.qpDepth);
    char* base = static_cast<char*>(m.base);
    std::mt19937 rng(std::random_device{}());
    for (int ctx = 0; ctx < nCtx_; ++ctx)
      for (int p = 0; p < nRanks_; ++p) {
        if (!wanted[size_t(p)]) continue;
        const size_t i = size_t(ctx) * size_t(nRanks_) + size_t(p);
        Qp& q = qps_[i];
        const std::string what = "context " + std::to_string(ctx) + ", peer " + std::to_string(p);
        mlx5dv_devx_uar* uar = m.uars[size_t(ctx)].get();
        const size_t sqAt = blockBytes() * i, cqAt = sqAt + pageUp(sqBytes()), dbrAt = dbrOffset(i);
        uint8_t out[mlx5cmd::kOutBytes] = {};
        const mlx5cmd::In cin =
            mlx5cmd::createCq(logDepth, {umem, cqAt}, {umem, dbrAt + kDbrStride}, uar->page_id, eqn_);
        q.devxCq.reset(mlx5dv_devx_obj_create(dev_.ctx.get(), cin.data(), cin.size(), out, sizeof out));
        if (!q.devxCq) fail("DEVX CREATE_CQ for " + what + " failed: " + devxText(errno, out));
        const uint32_t cqn = uint32_t(mlx5cmd::getField(out, mlx5cmd::cq::kCqn));
        std::memset(out, 0, sizeof out);
        const mlx5cmd::In qin = mlx5cmd::createQp(pdn_, cqn, logDepth, {umem, sqAt}, {umem, dbrAt}, uar->page_id);
        q.devxQp.reset(mlx5dv_devx_obj_create(dev_.ctx.get(), qin.data(), qin.size(), out, sizeof out));
        if (!q.devxQp) fail("DEVX CREATE_QP for " + what + " failed: " + devxText(errno, out));
        q.psn = rng() & 0xffffff;
        Queues& v = q.view;
        v.qpn = uint32_t(mlx5cmd::getField(out, mlx5cmd::qp::kQpn));
        v.nWqe = v.nCqe = cfg_.qpDepth;
        v.sq = reinterpret_cast<uint8_t*>(base + sqAt);
        v.cq = reinterpret_cast<mlx5::Cqe64*>(base + cqAt);
        v.dbrec = reinterpret_cast<uint32_t*>(base + dbrAt);
        v.cqDbrec = reinterpret_cast<uint32_t*>(base + dbrAt + kDbrStride);
        v.uar = reinterpret_cast<uint64_t*>(map(uar->reg_addr, 8, true));  // the doorbell register
        devxModify(q, mlx5cmd::rst2Init(v.qpn, uint32_t(dev_.port)), "RST2INIT", what);
        q.live = true;
      }
  }

  void devxModify(Qp& q, const mlx5cmd::In& in, const char* step, const std::string& what) {
    uint8_t out[mlx5cmd::kOutBytes] = {};
    if (mlx5dv_devx_obj_modify(q.devxQp.get(), in.data(), in.size(), out, sizeof out))
      fail(std::string("DEVX ") + step + "_QP for " + what + " failed: " + devxText(errno, out) +
           (dev_.roce && std::string(step) == "INIT2RTR" ? "; on RoCE check GIN_IB_GID_INDEX (show_gids)" : ""));
  }

  // INIT -> RTR -> RTS towards r, the same connection verbs::toRts makes.
  // RoCE: the peer's MAC comes from an address handle (libmlx5 resolves it).
  void devxToRts(Qp& q, const verbs::RcAddress& r, const std::string& what) {
    if (r.linkLayer != dev_.portAttr.link_layer)
      fail(what + " is on a different link layer (InfiniBand vs Ethernet)");
    mlx5cmd::Path p;
    p.remoteQpn = r.qpn;
    p.rcvPsn = r.psn;
    p.mtu = uint32_t(std::min<int>(dev_.portAttr.active_mtu, r.mtu));
    p.logMsgMax = dev_.portAttr.max_msg_sz ? log2u(dev_.portAttr.max_msg_sz) : 30;
    p.logRraMax = log2u(uint64_t(verbs::rcRdAtomics(dev_.devAttr.max_qp_rd_atom)));
    p.minRnrNak = verbs::kRcMinRnrTimer;
    p.port = uint32_t(dev_.port);
    if (dev_.roce) {
      ibv_ah_attr aa{};
      aa.is_global = 1;
      std::memcpy(aa.grh.dgid.raw, r.gid, 16);
      aa.grh.sgid_index = uint8_t(dev_.gidIndex);
      aa.grh.hop_limit = verbs::kRcHopLimit;
      aa.port_num = uint8_t(dev_.port);
      std::unique_ptr<ibv_ah, int (*)(ibv_ah*)> ah(ibv_create_ah(pd_.get(), &aa), ibv_destroy_ah);
      if (!ah)
        fail("ibv_create_ah (to learn the MAC of " + what + ") failed: " + verbs::errnoText(errno) +
             "; on RoCE check GIN_IB_GID_INDEX (show_gids)");
      mlx5dv_ah dah{};
      mlx5dv_obj o{};
      o.ah.in = ah.get();
      o.ah.out = &dah;
      if (const int e = mlx5dv_init_obj(&o, MLX5DV_OBJ_AH)) fail("mlx5dv_init_obj(AH) failed: " + verbs::errnoText(e));
      p.grh = true;
      std::memcpy(p.rmac, dah.av->rmac, 6);
      std::memcpy(p.rgid, r.gid, 16);
      p.srcAddrIndex = dev_.gidIndex;
      p.hopLimit = verbs::kRcHopLimit;
      p.udpSport = 0xc000u | ((q.view.qpn ^ r.qpn) & 0x3fffu);  // RoCE v2 source port: entropy for ECMP
    } else {
      p.rlid = r.lid;
    }
    devxModify(q, mlx5cmd::init2Rtr(q.view.qpn, p), "INIT2RTR", what);
    const uint32_t logSraMax = log2u(uint64_t(verbs::rcRdAtomics(dev_.devAttr.max_qp_init_rd_atom)));
    devxModify(q,
               mlx5cmd::rtr2Rts(q.view.qpn, q.psn, logSraMax, verbs::kRcTimeout, verbs::kRcRetry, verbs::kRcRnrRetry),
               "RTR2RTS", what);
  }

  // What the device code assumes of the queues (gin/device/transport/ibgda.hpp).
  void checkGeometry(const mlx5dv_qp& dq, const mlx5dv_cq& dc, const std::string& what) const {
    std::string bad;
    if (dq.sq.stride != mlx5::kSendWqeBB) bad += "send queue stride " + std::to_string(dq.sq.stride) + " (need 64); ";
    if (dq.sq.wqe_cnt != cfg_.qpDepth)
      bad += "send queue of " + std::to_string(dq.sq.wqe_cnt) +
             " WQEBBs (need exactly qpDepth = " + std::to_string(cfg_.qpDepth) + "); ";
    if (dc.cqe_size != sizeof(mlx5::Cqe64)) bad += "CQE size " + std::to_string(dc.cqe_size) + " (need 64); ";
    if (dc.cqe_cnt < cfg_.qpDepth || (dc.cqe_cnt & (dc.cqe_cnt - 1)))
      bad += "CQ of " + std::to_string(dc.cqe_cnt) + " entries (need a power of two >= qpDepth); ";
    if (!dq.sq.buf || !dq.dbrec || !dq.bf.reg || !dc.buf || !dc.dbrec) bad += "a null queue address; ";
    if (!bad.empty())
      fail("the queues libmlx5 made for " + what + " on " + dev_.name +
           " do not fit gin's device code: " + bad.substr(0, bad.size() - 2));
  }

  // The address a rank's threads use for [p, p+bytes): p itself on CPU
  // ranks; on GPU ranks the mapping of the page run that holds it, registered
  // once (libmlx5 packs doorbell records, and UARs, several to a page).
  void* map(void* p, size_t bytes, bool io) {
    if (!cfg_.gpu) return p;
#if GIN_WITH_CUDA
    const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
    const uintptr_t a = uintptr_t(p) & ~(page - 1), b = (uintptr_t(p) + bytes + page - 1) & ~(page - 1);
    auto holder = [&](uintptr_t x) -> std::map<uintptr_t, Run>::iterator {
      auto it = runs_.upper_bound(x);
      if (it == runs_.begin()) return runs_.end();
      --it;
      return x < it->first + it->second.bytes ? it : runs_.end();
    };
    for (uintptr_t x = a; x < b;) {  // register every page run not yet registered
      if (holder(x) != runs_.end()) {
        x += page;
        continue;
      }
      uintptr_t e = x + page;
      while (e < b && holder(e) == runs_.end()) e += page;
      unsigned flags = cudaHostRegisterMapped | cudaHostRegisterPortable | (io ? cudaHostRegisterIoMemory : 0u);
      if (const cudaError_t r = cudaHostRegister(reinterpret_cast<void*>(x), e - x, flags); r != cudaSuccess) {
        (void)cudaGetLastError();
        fail(std::string("cudaHostRegister(") + (io ? "the UAR page, IoMemory" : "a queue buffer") + ", " +
             std::to_string(e - x) + " bytes) failed: " + cudaGetErrorString(r) +
             (io ? ". The GPU must be able to write the NIC's doorbell page (its BAR): the NVIDIA driver allows "
                   "that with the registry setting PeerMappingOverride=1 (options nvidia "
                   "NVreg_RegistryDwords=\"PeerMappingOverride=1;\"), and the GPU and the NIC must be allowed "
                   "peer-to-peer over PCIe; otherwise use GIN_TRANSPORT=proxy"
                 : ""));
      }
      void* d = nullptr;
      GIN_CUDA_CHECK(cudaHostGetDevicePointer(&d, reinterpret_cast<void*>(x), 0));
      runs_[x] = Run{e - x, static_cast<char*>(d)};
      x = e;
    }
    auto it = holder(uintptr_t(p));
    return it->second.device + (uintptr_t(p) - it->first);
#else
    (void)bytes, (void)io;
    fail("a GPU rank, but gin was built without the CUDA runtime");
#endif
  }
  void unmapAll() {
#if GIN_WITH_CUDA
    for (auto& [host, run] : runs_) (void)cudaHostUnregister(reinterpret_cast<void*>(host));
    (void)cudaGetLastError();
#endif
    runs_.clear();
  }

  // Exchange every QP's address and bring it to RTS; the vote at the end is
  // also the barrier after which any rank may post.
  void connect() {
    const size_t row = size_t(nCtx_) * size_t(nRanks_);  // per rank: [ctx][peer]
    std::vector<verbs::RcAddress> all(row * size_t(nRanks_));
    for (int ctx = 0; ctx < nCtx_; ++ctx)
      for (int p = 0; p < nRanks_; ++p) {
        const Qp& q = qps_[size_t(ctx) * size_t(nRanks_) + size_t(p)];
        if (q.live)
          all[size_t(me_) * row + size_t(ctx) * size_t(nRanks_) + size_t(p)] =
              verbs::localAddress(dev_, q.view.qpn, q.psn);
      }
    bs_.allGather(all.data(), sizeof(verbs::RcAddress) * row);
    std::string err;
    try {
      for (int ctx = 0; ctx < nCtx_; ++ctx)
        for (int p = 0; p < nRanks_; ++p) {
          Qp& q = qps_[size_t(ctx) * size_t(nRanks_) + size_t(p)];
          if (!q.live) continue;
          const verbs::RcAddress& r = all[size_t(p) * row + size_t(ctx) * size_t(nRanks_) + size_t(me_)];
          const std::string what = "context " + std::to_string(ctx) + ", peer " + std::to_string(p);
          if (!r.qpn) fail("rank " + std::to_string(p) + " has no ibgda QP towards this rank (" + what + ")");
          if (cfg_.devx)
            devxToRts(q, r, what);
          else
            verbs::toRts(q.qp.get(), dev_, r, q.psn, what);
        }
    } catch (const std::exception& e) {
      err = verbs::ownText(e);
    }
    verbs::agreeOrThrow(bs_, err, "connecting queue pairs", kWho);
  }
};

#endif  // GIN_WITH_MLX5

}  // namespace gin
