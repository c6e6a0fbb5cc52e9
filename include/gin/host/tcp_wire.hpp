// gin/host/tcp_wire.hpp — the proxy's network wire: TCP sockets between every
// pair of ranks that use it, framed and checked messages, and a receiver
// thread that applies peers' writes and signals into this rank's windows.
// Connection set-up: gin/host/tcp_connect.hpp; the receiver:
// gin/host/tcp_receiver.hpp; RoutedWire: gin/host/routed_wire.hpp.
//
// Promises:
//  - Frames of one sender reach a receiver over one connection and are applied
//    in order; a signal is a release atomic after the copy of every payload
//    before it, so signal-after-payload holds per (context, peer) (and more:
//    per sender).
//  - Every frame is checked completely (magic, version, header checksum,
//    sequence number, type, lengths, window bounds, signal id, payload
//    checksum) before a byte of it is written. A rejected frame writes
//    nothing, is recorded as Op::WireFrame (the fault in objectId), is printed
//    on stderr with rank, peer and what was wrong, and nothing more from that
//    peer is applied: the stream can no longer be trusted.
//  - A peer whose connection closes without a goodbye, or fails, is recorded
//    as Op::PeerLost naming it: the abort flag makes every wait of this rank
//    stop at once instead of running into the timeout.
//  - put() returns once the source has been handed to the kernel's socket
//    buffer: the engine's CounterInc then counts a consumed source.
//  - GPU windows (TcpGpu): the sender copies each chunk of the source into a
//    pinned staging buffer (a side-context copy, waited for; one buffer per engine
//    thread sending at that moment) before it sends it; the
//    receiver copies each checked payload into the window and waits for that
//    copy before it applies the frame's action, so signal-after-payload holds.
//    Failures go through TcpGpu::fail (the host path of the error record).
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gin/core/atomic.hpp"
#include "gin/core/error.hpp"
#include "gin/core/xxh64.hpp"
#include "gin/device/comm.hpp"
#include "gin/host/bootstrap_base.hpp"
#include "gin/host/deadline.hpp"
#include "gin/host/env.hpp"
#include "gin/host/proxy.hpp"
#include "gin/host/routed_wire.hpp"
#include "gin/host/socket.hpp"
#include "gin/host/tcp_connect.hpp"
#include "gin/host/tcp_frame.hpp"
#include "gin/host/tcp_receiver.hpp"

namespace gin {

// ---- the wire --------------------------------------------------------------------
//
// Threads: the proxy engine's threads send (put, signal; several at once, each
// frame whole under its connection's lock); the Comm's thread sends fences
// and goodbyes; one receiver thread per wire reads every connection. put
// returns once its frames are in the socket buffer, so complete() has nothing
// to wait for, and one engine thread's frames to a peer keep their order.
// The receiver is a thread of its own, not part of the engine's polling loop,
// because the engine blocks in send() when a peer's socket buffer is full: if
// the same thread had to drain our sockets, two engines sending to each other
// could both block forever. The receiver never sends, so it never blocks on a
// peer; it uses non-blocking reads and a per-peer frame state machine, so a
// slow peer cannot hold up the others.
class TcpWire final : public Wire, private detail::TcpReceiver {
 public:
  // Collective over `bs`: every rank builds its TcpWire at the same point.
  // useTcp[r]: this rank talks to rank r over tcp (symmetric across ranks).
  // signals: this rank's signal words (nSignalWords of them), which peers'
  // actions update. advertise: the IPv4 address (or name) peers connect to.
  TcpWire(Bootstrap& bs, const DevComm& dev, WindowDirectory& dir, uint64_t* signals, uint32_t nSignalWords,
          std::vector<uint8_t> useTcp, uint64_t timeoutNs, const std::string& advertise, TcpGpu gpu = {})
      : detail::TcpReceiver(dev, dir, signals, nSignalWords, timeoutNs, std::move(gpu)) {
#if GIN_WITH_CUDA
    if (gpu_.device >= 0)
      for (int i = 0; i < std::max(gpu_.senders, 1); ++i) stages_.push_back(newStage());
#else
    if (gpu_.device >= 0) throw Error("tcp wire: GPU windows need the CUDA runtime");
#endif
    rank_ = bs.rank();
    nRanks_ = bs.nRanks();
    peers_.resize(size_t(nRanks_));
    for (int r = 0; r < nRanks_; ++r) {
      peers_[size_t(r)] = std::make_unique<Peer>();
      peers_[size_t(r)]->tcp = r != rank_ && r < int(useTcp.size()) && useTcp[size_t(r)] != 0;
    }
    port_ = detail::tcpConnectAll({rank_, nRanks_, timeoutNs_, me()}, bs, advertise, peers_);
    startReceiver();
  }

  // Waits (bounded) for every peer's goodbye, so frames still in flight are
  // applied before the Comm frees the windows they target; then stops.
  ~TcpWire() override {
    closeSend();
    const auto deadline = detail::deadlineAfter(timeoutNs_);
    {
      std::unique_lock<std::mutex> lk(stateMu_);
      stateCv_.wait_until(lk, deadline, [&] {
        for (auto& p : peers_)
          if (p->tcp && p->state.load(std::memory_order_acquire) == kOpen) return false;
        return true;
      });
    }
    stopReceiver();
  }
  TcpWire(const TcpWire&) = delete;
  TcpWire& operator=(const TcpWire&) = delete;

  bool put(int peer, uint32_t dstWindow, uint64_t dstOffset, const void* src, uint64_t bytes,
           WireReject* why) override {
    return sendData(peer, dstWindow, dstOffset, src, bytes, why, true);
  }

  // The value is in host memory already: no staging.
  bool putInline(int peer, uint32_t dstWindow, uint64_t dstOffset, const void* bytes, uint64_t n,
                 WireReject* why) override {
    return sendData(peer, dstWindow, dstOffset, bytes, n, why, false);
  }

 private:
  // Data frames of at most kTcpMaxPayload; `stage`: src may be GPU memory.
  bool sendData(int peer, uint32_t dstWindow, uint64_t dstOffset, const void* src, uint64_t bytes, WireReject* why,
                bool stage) {
    if (!isTcpPeer(peer)) return reject(why, uint64_t(peer), uint64_t(peer), uint64_t(nRanks_));
    // Windows are symmetric (same id and size on every rank): refuse here
    // what the receiver would refuse, so the sender's record says why.
    const WindowDirectory::Entry* e = dir_.find(dstWindow);
    if (!e) return reject(why, dstWindow, dstOffset, 0);
    if (dstOffset > e->bytes || bytes > e->bytes - dstOffset)
      return reject(why, dstWindow, dstOffset + bytes, e->bytes);
    const char* s = static_cast<const char*>(src);
    StagedSource staged(*this, stage);
    for (uint64_t done = 0; done < bytes;) {
      const uint64_t n = std::min(bytes - done, kTcpMaxPayload);
      TcpFrame h = frame(TcpFrameType::Data);
      h.window = dstWindow;
      h.offset = dstOffset + done;
      h.length = n;
      if (!send(peer, h, staged.bytes(s + done, n))) return reject(why, uint64_t(peer), 0, 0);
      done += n;
    }
    return true;
  }

 public:
  bool signal(int peer, uint32_t id, ProxyAction op, uint64_t value, WireReject* why) override {
    if (!isTcpPeer(peer)) return reject(why, uint64_t(peer), uint64_t(peer), uint64_t(nRanks_));
    if (id >= nSignalWords_) return reject(why, id, id, nSignalWords_);
    if (op != ProxyAction::Add && op != ProxyAction::Set)
      return reject(why, id, uint64_t(op), uint64_t(ProxyAction::Set));
    TcpFrame h = frame(TcpFrameType::Signal);
    h.action = uint8_t(op);
    h.signalId = id;
    h.value = value;
    return send(peer, h, nullptr) || reject(why, uint64_t(peer), 0, 0);
  }

  // Collective (every rank that has tcp peers, at the same point; the Comm
  // calls it before a window is freed, after its engine went idle): send a
  // fence to every tcp peer and wait until every peer's fence has arrived.
  // Frames are applied in order, so then everything peers sent us before
  // their fence is in our memory. False on timeout or a lost peer.
  bool fence(uint64_t timeoutNs) {
    const uint64_t k = ++fences_;
    for (int r = 0; r < nRanks_; ++r) {
      if (!peers_[size_t(r)]->tcp) continue;
      TcpFrame h = frame(TcpFrameType::Fence);
      h.value = k;
      (void)send(r, h, nullptr);
    }
    std::unique_lock<std::mutex> lk(stateMu_);
    return stateCv_.wait_until(lk, detail::deadlineAfter(timeoutNs), [&] {
      for (auto& p : peers_)
        // A peer that said goodbye sends nothing more: nothing of it is in flight.
        if (p->tcp && p->state.load(std::memory_order_acquire) == kOpen &&
            p->fencesSeen.load(std::memory_order_acquire) < k)
          return false;
      return true;
    }) && lostPeers() == 0;
  }

  // Nothing more will be sent: every peer gets a goodbye, after which our
  // connection closing is not a failure. Idempotent.
  void closeSend() {
    if (closed_.exchange(true)) return;
    for (int r = 0; r < nRanks_; ++r)
      if (peers_[size_t(r)]->tcp) {
        TcpFrame h = frame(TcpFrameType::Bye);
        (void)send(r, h, nullptr);
      }
  }

  bool usesTcp(int peer) const { return isTcpPeer(peer); }
  // Whether the connection to `peer` failed (closed without goodbye, error, rejected frame).
  bool peerLost(int peer) const {
    return isTcpPeer(peer) && peers_[size_t(peer)]->state.load(std::memory_order_acquire) == kLost;
  }
  int lostPeers() const {
    int n = 0;
    for (auto& p : peers_) n += p->tcp && p->state.load(std::memory_order_acquire) == kLost;
    return n;
  }
  uint64_t framesApplied() const { return applied_.load(std::memory_order_relaxed); }
  uint64_t framesRejected() const { return rejected_.load(std::memory_order_relaxed); }
  int port() const { return port_; }

  // Test hooks: write raw bytes on the connection to `peer` (under the send
  // lock, counting `frames` sequence numbers), and the next sequence number.
  uint64_t nextSeqForTest(int peer) {
    std::lock_guard<std::mutex> lk(peers_.at(size_t(peer))->sendMu);
    return peers_[size_t(peer)]->sendSeq + 1;
  }
  bool injectForTest(int peer, const void* bytes, size_t n, uint64_t frames) {
    Peer& p = *peers_.at(size_t(peer));
    std::lock_guard<std::mutex> lk(p.sendMu);
    p.sendSeq += frames;
    iovec v{const_cast<void*>(bytes), n};
    return sendv(p, &v, 1) == 0;
  }
  // Test hook: end our sending direction to `peer` (it reads end of stream).
  void shutdownSendForTest(int peer) { ::shutdown(peers_.at(size_t(peer))->sock.get(), SHUT_WR); }

 private:
#if GIN_WITH_CUDA
  // A sender's device-to-staging copies: its own copier (a wait covers only
  // its copy) and pinned buffer. Engine threads take one for a put from the
  // free ones (the wire does not know which thread calls it).
  struct SendStage {
    std::unique_ptr<GpuCopier> copier;
    HostMappedBuffer buf;
  };
  std::mutex stagesMu_;
  std::vector<std::unique_ptr<SendStage>> stages_;  // free ones
#endif
  std::atomic<bool> closed_{false};
  uint64_t fences_ = 0;

  bool isTcpPeer(int peer) const { return peer >= 0 && peer < nRanks_ && peers_[size_t(peer)]->tcp; }

#if GIN_WITH_CUDA
  std::unique_ptr<SendStage> newStage() {
    auto st = std::make_unique<SendStage>();
    st->copier = std::make_unique<GpuCopier>(gpu_.device);
    st->buf = HostMappedBuffer(true, size_t(kTcpMaxPayload));
    return st;
  }
#endif
  // The source of one put as the socket may read it: GPU window memory
  // (`gpuSource` on a GPU rank) goes through a staging buffer held for the
  // put, one chunk at a time.
  class StagedSource {
   public:
    StagedSource(TcpWire& w, bool gpuSource) : w_(w) {
#if GIN_WITH_CUDA
      if (!gpuSource || w_.gpu_.device < 0) return;
      {
        std::lock_guard<std::mutex> lk(w_.stagesMu_);
        if (!w_.stages_.empty()) {
          st_ = std::move(w_.stages_.back());
          w_.stages_.pop_back();
        }
      }
      if (!st_) st_ = w_.newStage();
#else
      (void)gpuSource;
#endif
    }
    ~StagedSource() {
#if GIN_WITH_CUDA
      if (!st_) return;
      std::lock_guard<std::mutex> lk(w_.stagesMu_);
      w_.stages_.push_back(std::move(st_));
#endif
    }
    StagedSource(const StagedSource&) = delete;
    StagedSource& operator=(const StagedSource&) = delete;
    const char* bytes(const char* src, uint64_t n) {
#if GIN_WITH_CUDA
      if (st_) {
        st_->copier->copy(st_->buf.host(), src, size_t(n));
        st_->copier->complete();
        return static_cast<const char*>(st_->buf.host());
      }
#endif
      (void)n;
      return src;
    }

   private:
    [[maybe_unused]] TcpWire& w_;
#if GIN_WITH_CUDA
    std::unique_ptr<SendStage> st_;
#endif
  };
  static bool reject(WireReject* why, uint64_t id, uint64_t value, uint64_t limit) {
    if (why) *why = WireReject{id, value, limit};
    return false;
  }
  TcpFrame frame(TcpFrameType t) const {
    TcpFrame h{};
    h.type = uint8_t(t);
    h.action = uint8_t(ProxyAction::None);
    h.sender = rank_;
    return h;
  }

  // ---- sending ----

  // Whole frames only, under the peer's send lock, so frames never interleave.
  // Progress is bounded: a peer that takes nothing for the timeout is lost.
  bool send(int peer, TcpFrame& h, const void* payload) {
    Peer& p = *peers_[size_t(peer)];
    std::lock_guard<std::mutex> lk(p.sendMu);
    if (p.state.load(std::memory_order_acquire) == kLost) return false;
    h.seq = ++p.sendSeq;
    sealTcpFrame(h, payload);
    iovec v[2] = {{&h, sizeof h}, {const_cast<void*>(payload), size_t(h.length)}};
    const int err = sendv(p, v, h.length ? 2 : 1);
    if (err == 0) return true;
    lose(peer, err, 0, 0,
         err == ETIMEDOUT ? "took no data for " + detail::secondsText(timeoutNs_) + " (stuck or overloaded)"
                          : std::string("send failed: ") + std::strerror(err));
    return false;
  }

  // 0, or the errno that ended it (ETIMEDOUT: no progress within the timeout).
  int sendv(Peer& p, iovec* v, int n) {
    auto deadline = detail::deadlineAfter(timeoutNs_);
    while (n > 0) {
      msghdr m{};
      m.msg_iov = v;
      m.msg_iovlen = size_t(n);
      const ssize_t k = ::sendmsg(p.sock.get(), &m, MSG_NOSIGNAL);
      if (k < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return errno;
        if (detail::pollOne(p.sock.get(), POLLOUT, deadline) == 0) return ETIMEDOUT;
        continue;
      }
      deadline = detail::deadlineAfter(timeoutNs_);
      size_t left = size_t(k);
      while (n > 0 && left >= v->iov_len) {
        left -= v->iov_len;
        ++v, --n;
      }
      if (n > 0) {
        v->iov_base = static_cast<char*>(v->iov_base) + left;
        v->iov_len -= left;
      }
    }
    return 0;
  }
};

}  // namespace gin
