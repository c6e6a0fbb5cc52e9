// gin/host/verbs_wire.hpp — the proxy transport's verbs wire: the proxy engine
// carries puts out as RDMA WRITEs on rdma-core RC queue pairs, and signals as
// small two-sided messages that the receiving rank turns into CPU atomics on
// its own signal words.
//
// NOT YET RUN ON RDMA HARDWARE: it is written to the verbs API and the IB
// spec, compiled, and its logic runs end to end only over an in-process model
// of RC queue pairs (tests/host/verbs_wire_fake.cpp); no byte of it has
// crossed a real NIC. Treat it as untested on hardware until the loopback
// test in tests/host/verbs_wire.cpp passes on a machine with a device.
//
// Promises (see VerbsWire below for how each is kept):
//  - signal-after-payload per peer: a signal is applied at the receiver only
//    after every earlier put to that receiver was placed in its memory;
//  - complete() returns only when every posted work request completed, so a
//    flushed source may be reused; a failed or missing completion (dead peer,
//    retry exceeded) becomes a gin::Error within the communicator's timeout;
//  - a put or signal outside what the peer advertised is refused before
//    anything is posted (WireReject), like every other wire.
//
// Compiled only where <infiniband/verbs.h> is (GIN_WITH_VERBS); programs that
// construct a VerbsWire link -libverbs. The pure helpers in gin::verbs (GID
// choice, message splitting, signal record encoding, the failure vote) are
// always compiled, so they can be tested without rdma-core.
#pragma once

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gin/core/error.hpp"
#include "gin/host/bootstrap.hpp"
#include "gin/host/proxy.hpp"
#include "gin/host/verbs.hpp"  // GIN_WITH_VERBS, device/GID choice, registration, QP transitions, the vote

#if GIN_WITH_VERBS
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <unistd.h>
#endif

namespace gin {
namespace verbs {

// --- Pure helpers (no rdma-core needed) -------------------------------------

// Calls f(offset, len) for consecutive pieces of [0, bytes), each 1..maxChunk
// bytes; nothing for bytes == 0. One RDMA WRITE per piece.
template <class F>
void forEachChunk(uint64_t bytes, uint64_t maxChunk, F&& f) {
  for (uint64_t off = 0; off < bytes;) {
    const uint64_t len = std::min(maxChunk, bytes - off);
    f(off, len);
    off += len;
  }
}

// The 16-byte signal record a sender puts in a receiver's mailbox slot.
// Explicit little-endian bytes: nothing depends on either host's byte order
// (the trap RDMA atomics fall into on mlx5, see VerbsWire). Bytes 0..3: 'G',
// 's', version 1, ProxyAction; 4..7: signal id; 8..15: value.
inline constexpr size_t kSignalRecordBytes = 16;
struct SignalRecord {
  uint32_t id = 0;
  ProxyAction op = ProxyAction::None;
  uint64_t value = 0;
};
inline void encodeSignal(const SignalRecord& r, unsigned char out[kSignalRecordBytes]) {
  out[0] = 'G', out[1] = 's', out[2] = 1, out[3] = uint8_t(r.op);
  for (int i = 0; i < 4; ++i) out[4 + i] = uint8_t(r.id >> (8 * i));
  for (int i = 0; i < 8; ++i) out[8 + i] = uint8_t(r.value >> (8 * i));
}
// False (and *r untouched) for anything encodeSignal cannot have written.
inline bool decodeSignal(const unsigned char in[kSignalRecordBytes], SignalRecord* r) {
  if (in[0] != 'G' || in[1] != 's' || in[2] != 1) return false;
  if (in[3] != uint8_t(ProxyAction::Add) && in[3] != uint8_t(ProxyAction::Set)) return false;
  SignalRecord d;
  d.op = ProxyAction(in[3]);
  for (int i = 0; i < 4; ++i) d.id |= uint32_t(in[4 + i]) << (8 * i);
  for (int i = 0; i < 8; ++i) d.value |= uint64_t(in[8 + i]) << (8 * i);
  *r = d;
  return true;
}
// The immediate of a signal message: the low 32 bits of the per-(sender,
// receiver) message number, so the receiver notices a lost or repeated one.
inline uint32_t signalImmediate(uint64_t seq) { return uint32_t(seq); }
inline bool immediateMatches(uint32_t imm, uint64_t expectedSeq) { return imm == uint32_t(expectedSeq); }

}  // namespace verbs

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

// The wire. Threads: put/putInline/signal/complete run on the proxy engine's
// threads, one call at a time (engineMu_: the queue pairs, the send CQ and
// their counts are shared, so with several engine threads the calls take
// turns and complete() waits for every thread's work requests, which is more
// than it must); registerWindow/deregisterWindow on the thread that owns the
// Comm (they may overlap engine calls: a mutex guards the window table); one
// receiver thread of the wire's own polls the receive CQ and applies signals.
//
// Why signals are messages, not RDMA atomics: mlx5 HCAs without the
// host-endianness requester mode return an atomic's fetched value big-endian
// on little-endian hosts (libfabric PR 10935, Open MPI PR 1147; see
// ibgda_mlx5.hpp for what that mode does and does not change), and a NIC atomic is atomic only against other atomics of
// that NIC (IBV_ATOMIC_HCA), not against the CPU atomics the local wire and the kernels use on the same words. So a
// signal is a SEND WITH IMMEDIATE of a 16-byte record (inline) into a mailbox slot of the receiver, and the receiver's
// thread applies it with a CPU atomic.
//   SEND rather than RDMA WRITE WITH IMMEDIATE: both consume a pre-posted
// receive and both give the ordering below, but with SEND the receiver chose
// the slot when it posted the receive, so a slot can never be overwritten
// before it was read (with write-with-imm the sender picks the address and
// slot reuse would need a credit protocol). Back-pressure is the RC RNR
// protocol: with no receive posted the sender's NIC retries (rnr_retry 7 =
// indefinitely), and complete() turns a stall past the timeout into an error.
//   Ordering: RC executes a QP's requests in order at the responder, and a
// receive completes only after its message was placed; so the receive
// completion of a signal implies every earlier RDMA WRITE on that QP was
// placed (IBA vol. 1 ch. 9 ordering rules; what MPI rendezvous protocols
// rely on). For GPU windows the NIC's PCIe writes to GPU memory may still be
// in flight when the CQE is seen; where the GPU does not order them itself,
// the receiver calls cudaDeviceFlushGPUDirectRDMAWrites before the atomic
// (the reason NCCL flushes before it reports a receive). The engine also
// waits in complete() for the writes' acknowledgements before each signal.
class VerbsWire final : public Wire {
 public:
  // Collective over `bs` (every rank, same order). `signals`/`nSignalWords`:
  // this rank's signal words (host memory; on GPU ranks the Comm's proxy
  // signal array) that peers' signals update.
  VerbsWire(Bootstrap& bs, uint64_t* signals, uint32_t nSignalWords, VerbsWireConfig cfg = {})
      : bs_(bs),
        me_(bs.rank()),
        nRanks_(bs.nRanks()),
        signals_(signals),
        nSignalWords_(nSignalWords),
        cfg_(std::move(cfg)),
        qpOf_(size_t(nRanks_), -1) {
    if (cfg_.peers) {
      peers_ = *cfg_.peers;
    } else {
      for (int r = 0; r < nRanks_; ++r)
        if (r != me_) peers_.push_back(r);
    }
    std::string err;
    try {
      if (!peers_.empty()) openDevice(), createQueues();
    } catch (const std::exception& e) {
      err = ownText(e);
    }
    verbs::agreeOrThrow(bs_, err, "opening the RDMA device");
    connect();
    if (!qps_.empty()) recvThread_ = std::thread([this] { receiveLoop(); });
  }
  ~VerbsWire() override {
    stop_.store(true, std::memory_order_release);
    if (recvThread_.joinable()) recvThread_.join();
  }
  VerbsWire(const VerbsWire&) = delete;
  VerbsWire& operator=(const VerbsWire&) = delete;

  // Collective: register this rank's window memory (host memory with
  // ibv_reg_mr; GPU memory through dma-buf, else nvidia-peermem) and learn
  // every rank's {addr, rkey, bytes} for window `id`. The Comm calls it when
  // it creates a window, on every rank.
  void registerWindow(uint32_t id, char* base, uint64_t bytes, bool gpu) {
    Window w;
    std::string err;
    try {
      if (bytes && pd_) w.mr = registerMemory(base, bytes, gpu);
    } catch (const std::exception& e) {
      err = ownText(e);
    }
    verbs::agreeOrThrow(bs_, err, "registering window " + std::to_string(id));
    struct Ad {
      uint64_t addr, bytes;
      uint32_t rkey, pad;
    };
    std::vector<Ad> ads(static_cast<size_t>(nRanks_));
    ads[size_t(me_)] = {uint64_t(uintptr_t(base)), bytes, w.mr ? w.mr->rkey : 0, 0};
    bs_.allGather(ads.data(), sizeof(Ad));
    w.base = base;
    w.bytes = bytes;
    for (const Ad& a : ads) w.remote.push_back({a.addr, a.bytes, a.rkey});
    if (gpu) gpuWindows_.store(true, std::memory_order_release);
    std::lock_guard<std::mutex> lk(winMu_);
    windows_[id] = std::move(w);
  }
  // Local: forget window `id` and deregister its memory. Call it only when no
  // peer writes into it any more (the Comm frees windows collectively).
  void deregisterWindow(uint32_t id) {
    std::lock_guard<std::mutex> lk(winMu_);
    windows_.erase(id);
  }

  bool put(int peer, uint32_t dstWindow, uint64_t dstOffset, const void* src, uint64_t bytes,
           WireReject* why) override {
    std::lock_guard<std::mutex> engine(engineMu_);
    Qp* q = qpFor(peer, why);
    if (!q) return false;
    uint64_t raddr = 0;
    uint32_t rkey = 0, lkey = 0;
    {
      std::lock_guard<std::mutex> lk(winMu_);
      if (!target(peer, dstWindow, dstOffset, bytes, &raddr, &rkey, why)) return false;
      if (bytes) lkey = localKey(src, bytes);
    }
    const uint64_t s = uint64_t(uintptr_t(src));
    verbs::forEachChunk(bytes, maxChunk_, [&](uint64_t off, uint64_t len) {
      postSend(*q, kWrite, IBV_WR_RDMA_WRITE, s + off, uint32_t(len), lkey, 0, raddr + off, rkey, 0);
    });
    return true;
  }

  // The value bytes are copied into the WQE (IBV_SEND_INLINE): gone on return is fine.
  bool putInline(int peer, uint32_t dstWindow, uint64_t dstOffset, const void* bytes, uint64_t n,
                 WireReject* why) override {
    if (n > 8) return reject(why, dstWindow, n, 8);
    std::lock_guard<std::mutex> engine(engineMu_);
    Qp* q = qpFor(peer, why);
    if (!q) return false;
    uint64_t raddr = 0;
    uint32_t rkey = 0;
    {
      std::lock_guard<std::mutex> lk(winMu_);
      if (!target(peer, dstWindow, dstOffset, n, &raddr, &rkey, why)) return false;
    }
    if (n)
      postSend(*q, kWriteInline, IBV_WR_RDMA_WRITE, uint64_t(uintptr_t(bytes)), uint32_t(n), 0, 0, raddr, rkey,
               IBV_SEND_INLINE);
    return true;
  }

  bool signal(int peer, uint32_t id, ProxyAction op, uint64_t value, WireReject* why) override {
    std::lock_guard<std::mutex> engine(engineMu_);
    Qp* q = qpFor(peer, why);
    if (!q) return false;
    if (op != ProxyAction::Add && op != ProxyAction::Set)
      return reject(why, id, uint64_t(op), uint64_t(ProxyAction::Set));
    if (id >= q->remoteSignalWords) return reject(why, id, id, q->remoteSignalWords);
    unsigned char rec[verbs::kSignalRecordBytes];
    verbs::encodeSignal({id, op, value}, rec);
    postSend(*q, kSignal, IBV_WR_SEND_WITH_IMM, uint64_t(uintptr_t(rec)), sizeof rec, 0,
             htonl(verbs::signalImmediate(q->sendSeq++)), 0, 0, IBV_SEND_INLINE);
    return true;
  }

  // Every WR posted so far completed. Unsignaled WRs complete with the next
  // signaled one on their QP (a send queue completes in order), so a QP with
  // an unsignaled tail gets a signaled zero-length RDMA WRITE first.
  void complete() override {
    std::lock_guard<std::mutex> engine(engineMu_);
    throwAsyncError();
    for (auto& q : qps_)
      if (q->uncovered && !q->broken)
        postSend(*q, kFence, IBV_WR_RDMA_WRITE, 0, 0, 0, 0, q->fenceAddr, q->fenceRkey, 0);
    const uint64_t start = nowNs();
    for (;;) {
      bool busy = false;
      for (auto& q : qps_) busy |= q->outstanding != 0;
      if (!busy) return;
      if (!pollSend()) checkSendTimeout(start);
    }
  }

  // What the wire runs on (reports, GIN_DEBUG).
  std::string deviceName() const { return dev_.name; }
  int port() const { return dev_.port; }
  bool roce() const { return dev_.roce; }
  uint32_t gidIndex() const { return dev_.gidIndex; }

 private:
  template <class T>
  using Own = verbs::Own<T>;

  // The work-request id of every send WR: QP index, what it was (an error
  // completion carries no opcode) and how many WRs its completion retires.
  enum Kind : uint32_t { kWrite = 1, kWriteInline, kSignal, kFence };
  static const char* kindName(uint32_t k) {
    switch (k) {
      case kWrite: return "RDMA WRITE (put)";
      case kWriteInline: return "RDMA WRITE inline (putValue)";
      case kSignal: return "SEND with immediate (signal)";
      case kFence: return "zero-length RDMA WRITE (completion fence)";
    }
    return "unknown";
  }
  static uint64_t wrId(size_t qp, uint32_t kind, uint32_t retires) {
    return (uint64_t(qp) << 32) | (uint64_t(kind) << 24) | retires;
  }

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
  struct Remote {
    uint64_t addr = 0, bytes = 0;
    uint32_t rkey = 0;
  };
  struct Window {
    Own<ibv_mr> mr;
    char* base = nullptr;
    uint64_t bytes = 0;
    std::vector<Remote> remote;  // [nRanks]
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
  std::mutex engineMu_;    // put/putInline/signal/complete: one engine thread at a time
  std::mutex winMu_;
  std::map<uint32_t, Window> windows_;
  std::atomic<bool> gpuWindows_{false}, stop_{false}, asyncFailed_{false};
  std::mutex asyncMu_;
  std::string asyncError_;
  bool flushGpu_ = false;   // receiver thread: flush GPUDirect writes before applying a signal
  std::thread recvThread_;  // last: started when everything above exists, joined first

  static bool reject(WireReject* why, uint64_t id, uint64_t value, uint64_t limit) {
    if (why) *why = WireReject{id, value, limit};
    return false;
  }
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

  // --- Posting and completions (engine thread).

  Qp* qpFor(int peer, WireReject* why) {
    const int i = peer >= 0 && peer < nRanks_ ? qpOf_[size_t(peer)] : -1;
    if (i < 0) return reject(why, uint64_t(peer), uint64_t(peer), uint64_t(nRanks_)), nullptr;
    Qp* q = qps_[size_t(i)].get();
    if (q->broken) throwAsyncError(), fail("peer " + std::to_string(peer) + ": its queue pair failed earlier");
    return q;
  }

  // The peer's address for [dstOffset, dstOffset + bytes) of window `id`,
  // checked against the size it advertised. Caller holds winMu_.
  bool target(int peer, uint32_t id, uint64_t dstOffset, uint64_t bytes, uint64_t* addr, uint32_t* rkey,
              WireReject* why) const {
    const auto it = windows_.find(id);
    if (it == windows_.end()) return reject(why, id, dstOffset, 0);
    const Remote& r = it->second.remote[size_t(peer)];
    if (dstOffset > r.bytes || bytes > r.bytes - dstOffset) return reject(why, id, dstOffset + bytes, r.bytes);
    *addr = r.addr + dstOffset, *rkey = r.rkey;
    return true;
  }

  // The lkey of the registered window that holds [src, src + bytes). Caller holds winMu_.
  uint32_t localKey(const void* src, uint64_t bytes) const {
    const char* s = static_cast<const char*>(src);
    for (const auto& [id, w] : windows_)
      if (w.mr && s >= w.base && uint64_t(s - w.base) <= w.bytes && bytes <= w.bytes - uint64_t(s - w.base))
        return w.mr->lkey;
    fail("put source is not in a window registered with the verbs wire (the Comm must call registerWindow)");
  }

  // Post one send WR. Every sendDepth/4-th WR on a QP is signaled; its
  // completion retires it and the unsignaled ones before it.
  void postSend(Qp& q, Kind kind, ibv_wr_opcode opcode, uint64_t laddr, uint32_t len, uint32_t lkey, uint32_t immBe,
                uint64_t raddr, uint32_t rkey, unsigned flags) {
    const uint64_t start = nowNs();
    while (q.outstanding >= cfg_.sendDepth) {  // the send queue is full: retire some
      if (q.broken) fail("peer " + std::to_string(q.peer) + ": its queue pair failed earlier");
      if (!pollSend()) checkSendTimeout(start);
    }
    const bool signaled = kind == kFence || q.uncovered + 1 >= cfg_.sendDepth / 4;
    ibv_sge sge{laddr, len, lkey};
    ibv_send_wr wr{};
    ibv_send_wr* bad = nullptr;
    wr.wr_id = wrId(q.index, kind, signaled ? q.uncovered + 1 : 0);
    wr.sg_list = len ? &sge : nullptr;
    wr.num_sge = len ? 1 : 0;
    wr.opcode = opcode;
    wr.send_flags = flags | (signaled ? IBV_SEND_SIGNALED : 0);
    wr.imm_data = immBe;
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    if (const int e = ibv_post_send(q.qp.get(), &wr, &bad))
      fail("peer " + std::to_string(q.peer) + ": ibv_post_send(" + kindName(kind) + ") failed: " + errnoText(e));
    q.outstanding++;
    q.uncovered = signaled ? 0 : q.uncovered + 1;
  }

  // Retire what the send CQ holds; false when it was empty. An error
  // completion throws: the QP is in the error state and the peer is lost.
  bool pollSend() {
    ibv_wc wc[16];
    const int n = ibv_poll_cq(sendCq_.get(), 16, wc);
    if (n < 0) fail("ibv_poll_cq(send) failed");
    std::string err;
    for (int i = 0; i < n; ++i) {
      Qp& q = *qps_[size_t(wc[i].wr_id >> 32)];
      if (q.broken) continue;  // flushed work of a QP that already failed
      if (wc[i].status != IBV_WC_SUCCESS) {
        q.broken = true, q.outstanding = q.uncovered = 0;
        if (err.empty())
          err = "peer " + std::to_string(q.peer) + ": " + kindName(uint32_t(wc[i].wr_id >> 24) & 0xff) +
                " failed: " + ibv_wc_status_str(wc[i].status) + " (status " + std::to_string(int(wc[i].status)) +
                ", vendor error 0x" + hex(wc[i].vendor_err) + ")" +
                (wc[i].status == IBV_WC_RETRY_EXC_ERR ? "; the peer is dead or unreachable" : "");
        continue;
      }
      q.outstanding -= std::min(q.outstanding, uint32_t(wc[i].wr_id & 0xffffff));
    }
    if (!err.empty()) fail(err);
    return n > 0;
  }

  void checkSendTimeout(uint64_t start) {
    if (nowNs() - start <= cfg_.timeoutNs) return spinPause();
    std::string who;
    for (auto& q : qps_)
      if (q->outstanding) who += (who.empty() ? "" : ", ") + std::to_string(q->peer);
    fail("RDMA work to peer(s) " + who + " did not complete within " + std::to_string(cfg_.timeoutNs / 1000000) +
         " ms (no completion, not even an error: is the receiver's wire alive and posting receives?)");
  }

  static std::string hex(uint32_t v) {
    char b[16];
    std::snprintf(b, sizeof b, "%x", v);
    return b;
  }

  // --- The receiver thread: signal messages to CPU atomics.

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

  void asyncFailure(int peer, const std::string& what) {
    const std::string msg = "verbs wire: rank " + std::to_string(me_) + ": peer " + std::to_string(peer) + ": " + what;
    {
      std::lock_guard<std::mutex> lk(asyncMu_);
      if (asyncError_.empty()) asyncError_ = msg;
    }
    asyncFailed_.store(true, std::memory_order_release);
    if (cfg_.onAsyncError)
      cfg_.onAsyncError(peer, msg);
    else
      std::fprintf(stderr, "gin: %s\n", msg.c_str());
  }
  void throwAsyncError() {
    if (!asyncFailed_.load(std::memory_order_acquire)) return;
    std::lock_guard<std::mutex> lk(asyncMu_);
    throw Error(asyncError_);
  }

  void receiveLoop() {
#if GIN_WITH_CUDA
    // Flush NIC writes into GPU memory before a signal only where the GPU does
    // not already consume them in order (cudaDevAttrGPUDirectRDMAWritesOrdering).
    int ordering = 0, options = 0;
    if (cfg_.cudaDevice >= 0) {
      if (cudaSetDevice(cfg_.cudaDevice) != cudaSuccess ||
          cudaDeviceGetAttribute(&ordering, cudaDevAttrGPUDirectRDMAWritesOrdering, cfg_.cudaDevice) != cudaSuccess ||
          cudaDeviceGetAttribute(&options, cudaDevAttrGPUDirectRDMAFlushWritesOptions, cfg_.cudaDevice) != cudaSuccess)
        asyncFailure(-1, "the receiver thread cannot bind GPU " + std::to_string(cfg_.cudaDevice));
      flushGpu_ = ordering < cudaGPUDirectRDMAWritesOrderingOwner && (options & cudaFlushGPUDirectRDMAWritesOptionHost);
      if (ordering < cudaGPUDirectRDMAWritesOrderingOwner && !flushGpu_)
        std::fprintf(stderr,
                     "gin: verbs wire: rank %d: GPU %d neither orders GPUDirect RDMA writes nor supports "
                     "cudaDeviceFlushGPUDirectRDMAWrites; a kernel may see a signal before its payload\n",
                     me_, cfg_.cudaDevice);
    }
#endif
    std::vector<bool> dead(qps_.size(), false);
    uint64_t idle = 0;
    while (!stop_.load(std::memory_order_acquire)) {
      ibv_wc wc[16];
      const int n = ibv_poll_cq(recvCq_.get(), 16, wc);
      if (n < 0) return asyncFailure(-1, "ibv_poll_cq(receive) failed; signals from peers are no longer applied");
      if (n == 0) {
        ++idle;
        if (idle < 2048)
          spinPause();
        else if (idle < 2048 + 256)
          std::this_thread::yield();
        else
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        continue;
      }
      idle = 0;
      for (int i = 0; i < n; ++i) {
        const size_t qi = size_t(wc[i].wr_id >> 32);
        const uint32_t slot = uint32_t(wc[i].wr_id);
        Qp& q = *qps_[qi];
        if (dead[qi]) continue;
        if (wc[i].status != IBV_WC_SUCCESS) {
          dead[qi] = true;  // the QP is in the error state; the rest of its receives flush
          asyncFailure(q.peer, std::string("signal receive failed: ") + ibv_wc_status_str(wc[i].status) +
                                   (wc[i].status == IBV_WC_WR_FLUSH_ERR
                                        ? " (the queue pair to this peer failed; the send side names why)"
                                        : ""));
          continue;
        }
        applySignal(q, slot, wc[i]);
        try {
          postRecv(q, slot);  // the slot was read: it may take the next message
        } catch (const std::exception& e) {
          dead[qi] = true;
          asyncFailure(q.peer, e.what());
        }
      }
    }
  }

  void applySignal(Qp& q, uint32_t slot, const ibv_wc& wc) {
    const unsigned char* p = mailbox_.data() + (q.index * cfg_.recvDepth + slot) * verbs::kSignalRecordBytes;
    verbs::SignalRecord r;
    const uint64_t seq = q.recvSeq++;
    if (wc.opcode != IBV_WC_RECV || !(wc.wc_flags & IBV_WC_WITH_IMM) || wc.byte_len != verbs::kSignalRecordBytes ||
        !verbs::immediateMatches(ntohl(wc.imm_data), seq) || !verbs::decodeSignal(p, &r))
      return asyncFailure(q.peer, "malformed or out-of-order signal message #" + std::to_string(seq) + " (" +
                                      std::to_string(wc.byte_len) + " bytes); not applied");
    if (r.id >= nSignalWords_)
      return asyncFailure(q.peer, "signal id " + std::to_string(r.id) + " is past " + std::to_string(nSignalWords_) +
                                      " signal words; not applied");
#if GIN_WITH_CUDA
    // NIC writes into GPU memory may still be in flight over PCIe: make them
    // visible to the GPU before the signal says they are there.
    if (flushGpu_ && gpuWindows_.load(std::memory_order_acquire) &&
        cudaDeviceFlushGPUDirectRDMAWrites(cudaFlushGPUDirectRDMAWritesTargetCurrentDevice,
                                           cudaFlushGPUDirectRDMAWritesToOwner) != cudaSuccess)
      asyncFailure(q.peer, "cudaDeviceFlushGPUDirectRDMAWrites failed");
#endif
    if (r.op == ProxyAction::Add)
      atomicAdd<Scope::System>(signals_ + r.id, r.value, MemoryOrder::Release);
    else
      atomicStore<Scope::System>(signals_ + r.id, r.value, MemoryOrder::Release);
  }
};

#endif  // GIN_WITH_VERBS

}  // namespace gin
