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
// always compiled, so they can be tested without rdma-core: message splitting
// and the signal record are gin/host/verbs_wire_format.hpp, GID choice and the
// vote gin/host/verbs.hpp. The device, its queues and their set-up:
// gin/host/verbs_queues.hpp.
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
#include "gin/host/verbs_queues.hpp"
#include "gin/host/verbs_wire_format.hpp"

#if GIN_WITH_VERBS
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <unistd.h>
#endif

namespace gin {

#if GIN_WITH_VERBS

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
class VerbsWire final : public Wire, private detail::VerbsQueues {
 public:
  // Collective over `bs` (every rank, same order). `signals`/`nSignalWords`:
  // this rank's signal words (host memory; on GPU ranks the Comm's proxy
  // signal array) that peers' signals update.
  VerbsWire(Bootstrap& bs, uint64_t* signals, uint32_t nSignalWords, VerbsWireConfig cfg = {})
      : detail::VerbsQueues(bs, signals, nSignalWords, std::move(cfg)) {
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
  std::mutex engineMu_;  // put/putInline/signal/complete: one engine thread at a time
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
