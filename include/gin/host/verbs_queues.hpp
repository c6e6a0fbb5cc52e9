// gin/host/verbs_queues.hpp — the verbs wire's resources and their set-up
// (compiled only with GIN_WITH_VERBS): VerbsWireConfig, the device and port,
// protection domain, send and receive completion queues, one RC queue pair
// per peer with its signal mailbox receives posted, and connect(), the
// collective that brings every QP to RTS. detail::VerbsQueues is the base of
// VerbsWire (gin/host/verbs_wire.hpp); set-up steps throw gin::Error naming
// the rank, and the collective steps end in a vote, so all ranks fail
// together.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gin/core/error.hpp"
#include "gin/host/bootstrap.hpp"
#include "gin/host/verbs.hpp"  // GIN_WITH_VERBS, device/GID choice, registration, QP transitions, the vote
#include "gin/host/verbs_wire_format.hpp"

#if GIN_WITH_VERBS
#include <infiniband/verbs.h>
#endif

namespace gin {

#if GIN_WITH_VERBS

struct VerbsWireConfig {
  uint64_t timeoutNs = 20'000'000'000ull;  // the communicator's timeout: bounds complete() and every wait here
  // Ranks reached over verbs; unset: every other rank. May hold this rank (a
  // loopback QP). Empty: none; the rank still takes part in the collectives
  // but opens no device. Must be symmetric: a in b's list iff b in a's.
  std::optional<std::vector<int>> peers;
  std::string device;        // "name[:port]"; empty: GIN_IB_DEVICE, else first active port
  int gidIndex = -1;         // RoCE GID index; -1: GIN_IB_GID_INDEX, else automatic
  uint32_t sendDepth = 256;  // send queue depth per QP (clamped to the device)
  uint32_t recvDepth = 64;   // signal mailbox slots (pre-posted receives) per QP
  int cudaDevice = -1;       // GPU ranks: the GPU of this rank (dma-buf, GPUDirect flush)
  // A failure the receiver thread saw (bad message, failed receive). Called on
  // that thread; the default prints it. It is also thrown by the next complete().
  std::function<void(int peer, const std::string&)> onAsyncError;
};

namespace detail {

// What VerbsWire owns but its windows and its receiver thread, and the set-up
// of it. As VerbsWire's base it is destroyed after them: the windows' memory
// regions go before the protection domain, the thread stops before the QPs.
class VerbsQueues {
 protected:
  VerbsQueues(Bootstrap& bs, uint64_t* signals, uint32_t nSignalWords, VerbsWireConfig cfg)
      : bs_(bs),
        me_(bs.rank()),
        nRanks_(bs.nRanks()),
        signals_(signals),
        nSignalWords_(nSignalWords),
        cfg_(std::move(cfg)),
        qpOf_(size_t(nRanks_), -1) {}
  ~VerbsQueues() = default;
  VerbsQueues(const VerbsQueues&) = delete;
  VerbsQueues& operator=(const VerbsQueues&) = delete;

  template <class T>
  using Own = verbs::Own<T>;

  struct Qp {
    Own<ibv_qp> qp;
    int peer = -1;
    size_t index = 0;
    uint32_t psn = 0;
    uint32_t outstanding = 0;  // posted, not yet retired by a completion
    uint32_t uncovered = 0;    // posted unsignaled since the last signaled WR
    uint64_t sendSeq = 0, recvSeq = 0;
    uint32_t remoteSignalWords = 0;
    uint64_t fenceAddr = 0;
    uint32_t fenceRkey = 0;
    bool broken = false;  // an error completion: the QP is in the error state
  };
  // What ranks exchange per (rank, peer) pair to connect a QP.
  struct ConnInfo {
    uint32_t qpn, psn;
    uint16_t lid;
    uint8_t port, mtu, linkLayer, pad[3];
    uint8_t gid[16];
    uint64_t fenceAddr;
    uint32_t fenceRkey, nSignalWords;
  };

  Bootstrap& bs_;
  int me_, nRanks_;
  uint64_t* signals_;
  uint32_t nSignalWords_;
  VerbsWireConfig cfg_;
  std::vector<int> peers_;  // cfg_.peers resolved
  verbs::Port dev_;         // device, port, address (verbs.hpp)
  uint64_t maxChunk_ = 1ull << 30;
  Own<ibv_pd> pd_;
  Own<ibv_cq> sendCq_, recvCq_;
  std::vector<unsigned char> mailbox_;  // [qp][recvDepth] signal records
  Own<ibv_mr> mailboxMr_;
  std::vector<std::unique_ptr<Qp>> qps_;
  std::vector<int> qpOf_;  // [nRanks]: index into qps_, -1 for ranks not on this wire

  [[noreturn]] void fail(const std::string& what) const {
    throw Error("verbs wire: rank " + std::to_string(me_) + ": " + what);
  }
  // A setup failure's text for the vote, which names the rank itself.
  std::string ownText(const std::exception& e) const {
    return verbs::ownText(e, "verbs wire: rank " + std::to_string(me_) + ": ");
  }
  static std::string errnoText(int e) { return verbs::errnoText(e); }

  // --- Setup.

  void openDevice() {
    dev_ = verbs::openPort(verbs::envOr(cfg_.device, "GIN_IB_DEVICE"), "use GIN_PROXY_WIRE=tcp for the TCP wire");
  }

  void chooseAddress() {
    verbs::chooseAddress(dev_, cfg_.gidIndex);
    maxChunk_ = std::min<uint64_t>(dev_.portAttr.max_msg_sz ? dev_.portAttr.max_msg_sz : (1ull << 30), 1ull << 30);
  }

  void createQueues() {
    chooseAddress();
    pd_.reset(ibv_alloc_pd(dev_.ctx.get()));
    if (!pd_) fail("ibv_alloc_pd failed: " + errnoText(errno));
    for (int p : peers_) {
      if (p < 0 || p >= nRanks_ || qpOf_[size_t(p)] >= 0)
        fail("VerbsWireConfig::peers: rank " + std::to_string(p) + " is out of range or listed twice");
      qpOf_[size_t(p)] = int(qps_.size());
      qps_.push_back(std::make_unique<Qp>());
      qps_.back()->peer = p;
      qps_.back()->index = qps_.size() - 1;
    }
    const uint32_t nQp = uint32_t(std::max<size_t>(qps_.size(), 1));
    const uint32_t maxCqe = uint32_t(std::max(dev_.devAttr.max_cqe, 1));
    cfg_.sendDepth = std::min({cfg_.sendDepth, uint32_t(dev_.devAttr.max_qp_wr), maxCqe / nQp, 1u << 20});
    cfg_.recvDepth = std::min({cfg_.recvDepth, uint32_t(dev_.devAttr.max_qp_wr), maxCqe / nQp});
    if (cfg_.sendDepth < 4 || cfg_.recvDepth < 1)
      fail("the device's queues are too small for " + std::to_string(nQp) + " QPs (max_qp_wr " +
           std::to_string(dev_.devAttr.max_qp_wr) + ", max_cqe " + std::to_string(dev_.devAttr.max_cqe) + ")");
    sendCq_.reset(ibv_create_cq(dev_.ctx.get(), int(nQp * cfg_.sendDepth), nullptr, nullptr, 0));
    recvCq_.reset(ibv_create_cq(dev_.ctx.get(), int(nQp * cfg_.recvDepth), nullptr, nullptr, 0));
    if (!sendCq_ || !recvCq_) fail("ibv_create_cq failed: " + errnoText(errno));
    mailbox_.assign(size_t(nQp) * cfg_.recvDepth * verbs::kSignalRecordBytes, 0);
    mailboxMr_.reset(
        ibv_reg_mr(pd_.get(), mailbox_.data(), mailbox_.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE));
    if (!mailboxMr_) fail("ibv_reg_mr(signal mailbox) failed: " + errnoText(errno));
    std::mt19937 rng(std::random_device{}());
    for (auto& q : qps_) {
      ibv_qp_init_attr a{};
      a.send_cq = sendCq_.get();
      a.recv_cq = recvCq_.get();
      a.qp_type = IBV_QPT_RC;
      a.cap.max_send_wr = cfg_.sendDepth;
      a.cap.max_recv_wr = cfg_.recvDepth;
      a.cap.max_send_sge = a.cap.max_recv_sge = 1;
      a.cap.max_inline_data = uint32_t(verbs::kSignalRecordBytes);
      q->qp.reset(ibv_create_qp(pd_.get(), &a));
      if (!q->qp) fail("ibv_create_qp (RC, inline 16 bytes) failed: " + errnoText(errno));
      if (a.cap.max_inline_data < verbs::kSignalRecordBytes)
        fail("the device gives " + std::to_string(a.cap.max_inline_data) + " inline bytes per WR; the wire needs 16");
      q->psn = rng() & 0xffffff;
      verbs::toInit(q->qp.get(), dev_, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
                    "peer " + std::to_string(q->peer));
      // Receives go up before the QP can receive, so the first signal never meets an empty queue.
      for (uint32_t slot = 0; slot < cfg_.recvDepth; ++slot) postRecv(*q, slot);
    }
  }

  // Exchange {qpn, psn, lid, gid, port, mtu, ...} per (rank, peer) and bring
  // every QP to RTS; the vote at the end is also the barrier after which any
  // rank may send (every QP is RTS and every receive is posted).
  void connect() {
    std::vector<ConnInfo> all(size_t(nRanks_) * size_t(nRanks_));
    for (auto& q : qps_) {
      ConnInfo& c = all[size_t(me_) * size_t(nRanks_) + size_t(q->peer)];
      c.qpn = q->qp->qp_num, c.psn = q->psn, c.lid = dev_.portAttr.lid, c.port = uint8_t(dev_.port);
      c.mtu = uint8_t(dev_.portAttr.active_mtu), c.linkLayer = dev_.portAttr.link_layer;
      std::memcpy(c.gid, dev_.gid.raw, 16);
      c.fenceAddr = uint64_t(uintptr_t(mailbox_.data())), c.fenceRkey = mailboxMr_->rkey;
      c.nSignalWords = nSignalWords_;
    }
    bs_.allGather(all.data(), sizeof(ConnInfo) * size_t(nRanks_));  // rank r's row: its QPs, by peer
    std::string err;
    try {
      for (auto& q : qps_) {
        const ConnInfo& r = all[size_t(q->peer) * size_t(nRanks_) + size_t(me_)];
        if (!r.qpn)
          fail("rank " + std::to_string(q->peer) +
               " has no verbs QP for this rank (VerbsWireConfig::peers must be "
               "symmetric)");
        q->remoteSignalWords = r.nSignalWords, q->fenceAddr = r.fenceAddr, q->fenceRkey = r.fenceRkey;
        toRts(*q, r);
      }
    } catch (const std::exception& e) {
      err = ownText(e);
    }
    verbs::agreeOrThrow(bs_, err, "connecting queue pairs");
  }

  void toRts(Qp& q, const ConnInfo& r) {
    verbs::RcAddress a;
    a.qpn = r.qpn, a.psn = r.psn, a.lid = r.lid, a.mtu = r.mtu, a.linkLayer = r.linkLayer;
    std::memcpy(a.gid, r.gid, 16);
    verbs::toRts(q.qp.get(), dev_, a, q.psn, "peer " + std::to_string(q.peer));
  }

  Own<ibv_mr> registerMemory(char* base, uint64_t bytes, bool gpu) {
    return verbs::registerMemory(pd_.get(), base, bytes, gpu,
                                 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
                                 cfg_.cudaDevice);
  }

  // A mailbox slot's receive (at set-up, and by the receiver thread once it has read the slot).
  void postRecv(Qp& q, uint32_t slot) {
    unsigned char* p = mailbox_.data() + (q.index * cfg_.recvDepth + slot) * verbs::kSignalRecordBytes;
    ibv_sge sge{uint64_t(uintptr_t(p)), uint32_t(verbs::kSignalRecordBytes), mailboxMr_->lkey};
    ibv_recv_wr wr{};
    ibv_recv_wr* bad = nullptr;
    wr.wr_id = (uint64_t(q.index) << 32) | slot;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    if (const int e = ibv_post_recv(q.qp.get(), &wr, &bad))
      fail("peer " + std::to_string(q.peer) + ": ibv_post_recv failed: " + errnoText(e));
  }
};

}  // namespace detail

#endif  // GIN_WITH_VERBS

}  // namespace gin
