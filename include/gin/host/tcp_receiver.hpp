// gin/host/tcp_receiver.hpp — the tcp wire's receiver: one thread per wire
// that reads every peer's connection (non-blocking, a frame state machine per
// peer), checks each frame completely before a byte of it is written, and
// applies it: payload into the window (a copy it waits for on GPUs), then the
// signal as a release atomic. A bad frame or a lost connection is recorded
// (Op::WireFrame, Op::PeerLost) and nothing more from that peer is applied.
// It never sends, so it never blocks on a peer. TcpGpu: what a GPU rank adds.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gin/core/atomic.hpp"
#include "gin/core/error.hpp"
#include "gin/core/xxh64.hpp"
#include "gin/device/comm.hpp"
#include "gin/device/transport/proxy.hpp"
#include "gin/host/memory.hpp"
#include "gin/host/socket.hpp"
#include "gin/host/tcp_connect.hpp"
#include "gin/host/tcp_frame.hpp"
#include "gin/host/window_directory.hpp"
#include "gin/host/wire.hpp"

namespace gin {

// What a GPU rank adds (TcpWire's last argument): its device, and how a
// failure reaches the error record from a host thread.
struct TcpGpu {
  int device = -1;  // -1: windows are host memory (CPU ranks)
  std::function<void(Op op, int peer, int ctx, uint64_t id, uint64_t expected, uint64_t observed)> fail;
  // Engine threads that may send at once: a staging buffer and copier each,
  // made up front (a CUDA allocation mid-run may wait behind the user's
  // kernels, which may be waiting for this very put). More senders than
  // this still work; the extra stages are made when first needed.
  int senders = 1;
};

namespace detail {

// TcpWire's receiving half, and the state both halves share (the peers, the
// lock and condition variable of fence and goodbye waits, failure reporting).
// TcpWire derives from it; it starts the receiver thread once the connections
// are up and stops it after the goodbyes.
class TcpReceiver {
 protected:
  TcpReceiver(const DevComm& dev, WindowDirectory& dir, uint64_t* signals, uint32_t nSignalWords, uint64_t timeoutNs,
              TcpGpu gpu)
      : dev_(dev),
        dir_(dir),
        signals_(signals),
        nSignalWords_(nSignalWords),
        timeoutNs_(timeoutNs),
        gpu_(std::move(gpu)) {}
  ~TcpReceiver() = default;
  TcpReceiver(const TcpReceiver&) = delete;
  TcpReceiver& operator=(const TcpReceiver&) = delete;

  using Peer = TcpPeer;
  static constexpr int kOpen = TcpPeer::kOpen, kBye = TcpPeer::kBye, kLost = TcpPeer::kLost;

  DevComm dev_;
  WindowDirectory& dir_;
  uint64_t* signals_;
  uint32_t nSignalWords_;
  uint64_t timeoutNs_;
  TcpGpu gpu_;
#if GIN_WITH_CUDA
  std::unique_ptr<GpuCopier> recvCopier_;  // the receiver thread's staging-to-device copies
  // The receiver's pinned bounce buffer: side-context copy kernels read
  // pinned memory only, and a frame's payload arrives in pageable staging.
  static constexpr size_t kRecvBounce = size_t(1) << 20;
  HostMappedBuffer recvBounce_;
#endif
  int rank_ = 0, nRanks_ = 0, port_ = 0;
  std::vector<std::unique_ptr<Peer>> peers_;
  std::mutex stateMu_;  // with stateCv_: fence and goodbye waits
  std::condition_variable stateCv_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> applied_{0}, rejected_{0};
  detail::Socket wakeRead_, wakeWrite_;
  std::thread receiver_;

  // The receiver thread, once every connection is up.
  void startReceiver() {
    int fds[2];
    if (::pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0)
      throw Error(std::string("tcp wire: cannot create the receiver's wake-up pipe: ") + std::strerror(errno));
    wakeRead_ = detail::Socket(fds[0]);
    wakeWrite_ = detail::Socket(fds[1]);
    receiver_ = std::thread([this] { receiveLoop(); });
  }
  // Wakes the receiver thread and joins it.
  void stopReceiver() {
    stop_.store(true, std::memory_order_release);
    const char b = 1;
    (void)!::write(wakeWrite_.get(), &b, 1);
    if (receiver_.joinable()) receiver_.join();
  }

  // Into this rank's window: a copy the receiver waits for on GPUs.
  void deliver(char* dst, const char* src, uint64_t n) {
#if GIN_WITH_CUDA
    if (recvCopier_) {
      char* bounce = static_cast<char*>(recvBounce_.host());
      for (uint64_t off = 0; off < n; off += kRecvBounce) {
        const size_t k = size_t(std::min<uint64_t>(n - off, kRecvBounce));
        std::memcpy(bounce, src + off, k);
        recvCopier_->copy(dst + off, bounce, k);
        recvCopier_->complete();
      }
      return;
    }
#endif
    std::memcpy(dst, src, size_t(n));
  }
  void fail(Op op, int peer, uint64_t id, uint64_t expected, uint64_t observed) {
    if (gpu_.fail)
      gpu_.fail(op, peer, -1, id, expected, observed);
    else
      recordError(dev_, op, peer, -1, id, expected, observed);
  }
  std::string me() const { return "gin: rank " + std::to_string(rank_) + ": tcp wire: "; }

  // ---- receiving ----

  void receiveLoop() {
#if GIN_WITH_CUDA
    if (gpu_.device >= 0) {
      try {
        recvCopier_ = std::make_unique<GpuCopier>(gpu_.device);  // binds this thread to the GPU
        recvBounce_ = HostMappedBuffer(true, kRecvBounce);
      } catch (const Error& e) {
        std::fprintf(stderr, "%sreceiver cannot use GPU %d: %s\n", me().c_str(), gpu_.device, e.what());
        fail(Op::ProxyEngine, -1, 0, 0, 0);
        return;
      }
    }
#endif
    std::vector<pollfd> fds;
    std::vector<int> who;
    while (!stop_.load(std::memory_order_acquire)) {
      fds.clear();
      who.clear();
      fds.push_back(pollfd{wakeRead_.get(), POLLIN, 0});
      who.push_back(-1);
      for (int r = 0; r < nRanks_; ++r) {
        Peer& p = *peers_[size_t(r)];
        if (p.tcp && p.state.load(std::memory_order_acquire) == kOpen) {
          fds.push_back(pollfd{p.sock.get(), POLLIN, 0});
          who.push_back(r);
        }
      }
      const int k = ::poll(fds.data(), fds.size(), 200);
      if (k <= 0) continue;
      for (size_t i = 1; i < fds.size(); ++i)
        if (fds[i].revents) readFrom(who[i]);
    }
  }

  // Read what is there (at most a few frames, for fairness between peers).
  void readFrom(int r) {
    Peer& p = *peers_[size_t(r)];
    for (int frames = 0; frames < 16 && p.state.load(std::memory_order_acquire) == kOpen;) {
      const bool inHeader = p.hdrGot < sizeof(TcpFrame);
      char* dst = inHeader ? reinterpret_cast<char*>(&p.hdr) + p.hdrGot : p.staging.get() + p.payGot;
      const size_t want = inHeader ? sizeof(TcpFrame) - p.hdrGot : size_t(p.hdr.length) - p.payGot;
      const ssize_t k = ::recv(p.sock.get(), dst, want, MSG_DONTWAIT);
      if (k < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        return lostInFrame(r, errno);
      }
      if (k == 0) return lostInFrame(r, 0);
      tsanHeardFromPeers();  // the sender's process may have published through shared memory (gin/core/atomic.hpp)
      if (inHeader) {
        p.hdrGot += size_t(k);
        if (p.hdrGot < sizeof(TcpFrame)) continue;
        if (!checkHeader(r)) return;
        if (p.hdr.length == 0) {
          apply(r);
          ++frames;
        } else {
          if (p.stagingBytes < p.hdr.length) {
            p.stagingBytes =
                size_t(std::min<uint64_t>(kTcpMaxPayload, std::max<uint64_t>(p.hdr.length, 2 * p.stagingBytes)));
            p.staging.reset(new char[p.stagingBytes]);
          }
          p.payGot = 0;
        }
      } else {
        p.payGot += size_t(k);
        if (p.payGot < p.hdr.length) continue;
        const uint64_t sum = xxh64(p.staging.get(), p.payGot);
        if (sum != p.hdr.payloadSum) {
          fault(r, WireFault::PayloadChecksum, sum, p.hdr.payloadSum);
          return;
        }
        apply(r);
        ++frames;
      }
    }
  }

  void lostInFrame(int r, int err) {
    Peer& p = *peers_[size_t(r)];
    const bool mid = p.hdrGot > 0;
    const uint64_t expected = !mid                          ? 0
                              : p.hdrGot < sizeof(TcpFrame) ? sizeof(TcpFrame)
                                                            : sizeof(TcpFrame) + p.hdr.length;
    const uint64_t got = !mid ? 0 : p.hdrGot < sizeof(TcpFrame) ? p.hdrGot : sizeof(TcpFrame) + p.payGot;
    std::string what =
        err == 0 ? "closed the connection without a goodbye" : std::string("failed: ") + std::strerror(err);
    if (mid)
      what += " in the middle of a frame (" + std::to_string(got) + " of " + std::to_string(expected) +
              " bytes; the partial frame was discarded)";
    lose(r, err, expected, got, what);
  }

  // Everything about the header that can be checked before reading the
  // payload, including the destination range (checked again under the lock).
  bool checkHeader(int r) {
    Peer& p = *peers_[size_t(r)];
    const TcpFrame& h = p.hdr;
    if (h.magic != kTcpFrameMagic) return fault(r, WireFault::BadMagic, h.magic, kTcpFrameMagic);
    if (h.version != kTcpWireVersion) return fault(r, WireFault::BadVersion, h.version, kTcpWireVersion);
    const uint64_t sum = xxh64(&h, offsetof(TcpFrame, headerSum));
    if (sum != h.headerSum) return fault(r, WireFault::HeaderChecksum, sum, h.headerSum);
    if (h.type < uint8_t(TcpFrameType::Data) || h.type > uint8_t(TcpFrameType::Bye))
      return fault(r, WireFault::BadType, h.type, uint8_t(TcpFrameType::Bye));
    if (h.sender != r) return fault(r, WireFault::BadSender, uint64_t(int64_t(h.sender)), uint64_t(r));
    if (h.seq != p.recvSeq + 1) return fault(r, WireFault::Sequence, h.seq, p.recvSeq + 1);
    if (h.reserved != 0) return fault(r, WireFault::Reserved, h.reserved, 0);
    if (h.length > kTcpMaxPayload) return fault(r, WireFault::Oversized, h.length, kTcpMaxPayload);
    const auto type = TcpFrameType(h.type);
    if ((type == TcpFrameType::Data) != (h.length != 0))
      return fault(r, WireFault::BadLength, h.length, type == TcpFrameType::Data ? kTcpMaxPayload : 0);
    const auto action = ProxyAction(h.action);
    const bool carriesAction = type == TcpFrameType::Data || type == TcpFrameType::Signal;
    if (action != ProxyAction::None && action != ProxyAction::Add && action != ProxyAction::Set)
      return fault(r, WireFault::BadAction, h.action, uint64_t(ProxyAction::Set));
    if ((action != ProxyAction::None && !carriesAction) ||
        (type == TcpFrameType::Signal && action == ProxyAction::None))
      return fault(r, WireFault::BadAction, h.action, h.type);
    if (action != ProxyAction::None && h.signalId >= nSignalWords_)
      return fault(r, WireFault::BadSignal, h.signalId, nSignalWords_);
    if (type == TcpFrameType::Fence && h.value != p.fencesSeen.load(std::memory_order_relaxed) + 1)
      return fault(r, WireFault::BadFence, h.value, p.fencesSeen.load(std::memory_order_relaxed) + 1);
    if (type == TcpFrameType::Data) {
      std::lock_guard<std::mutex> lk(dir_.receiveMutex());
      if (!checkRange(r, h)) return false;
    }
    return true;
  }

  bool checkRange(int r, const TcpFrame& h) {
    const WindowDirectory::Entry* e = dir_.find(h.window);
    if (!e) return fault(r, WireFault::UnknownWindow, h.window, 0);
    if (h.offset > e->bytes || h.length > e->bytes - h.offset)
      return fault(r, WireFault::OutOfBounds, h.offset + h.length, e->bytes);
    return true;
  }

  // A complete, checked frame: payload first, then the action (release), in
  // the order frames arrived.
  void apply(int r) {
    Peer& p = *peers_[size_t(r)];
    const TcpFrame& h = p.hdr;
    switch (TcpFrameType(h.type)) {
      case TcpFrameType::Data: {
        std::lock_guard<std::mutex> lk(dir_.receiveMutex());
        if (!checkRange(r, h)) return;
        try {
          deliver(dir_.find(h.window)->local + h.offset, p.staging.get(), h.length);
        } catch (const Error& e) {  // a failed GPU copy: nothing after it from this peer is applied
          std::fprintf(stderr, "%scannot copy a frame from rank %d into its window: %s\n", me().c_str(), r, e.what());
          fail(Op::ProxyEngine, r, 0, 0, 0);
          markLost(r);
          return;
        }
        break;
      }
      case TcpFrameType::Fence: {
        std::lock_guard<std::mutex> lk(stateMu_);
        p.fencesSeen.store(h.value, std::memory_order_release);
        stateCv_.notify_all();
        break;
      }
      case TcpFrameType::Bye: {
        std::lock_guard<std::mutex> lk(stateMu_);
        p.state.store(kBye, std::memory_order_release);
        stateCv_.notify_all();
        break;
      }
      default: break;
    }
    if (ProxyAction(h.action) == ProxyAction::Add)
      atomicAdd<Scope::System>(signals_ + h.signalId, h.value, MemoryOrder::Release);
    else if (ProxyAction(h.action) == ProxyAction::Set)
      atomicStore<Scope::System>(signals_ + h.signalId, h.value, MemoryOrder::Release);
    p.recvSeq = h.seq;
    p.hdrGot = 0;
    p.payGot = 0;
    applied_.fetch_add(1, std::memory_order_relaxed);
  }

  bool fault(int r, WireFault f, uint64_t value, uint64_t limit) {
    rejected_.fetch_add(1, std::memory_order_relaxed);
    const Peer& p = *peers_[size_t(r)];
    std::fprintf(stderr,
                 "%srejected a frame from %s: %s (value %llu, limit %llu); frame %s. Nothing of it was written and "
                 "nothing more from that rank will be applied; the connection is closed.\n",
                 me().c_str(), p.where.c_str(), wireFaultName(f), (unsigned long long)value, (unsigned long long)limit,
                 tcpFrameText(p.hdr).c_str());
    fail(Op::WireFrame, r, uint64_t(f), value, limit);
    markLost(r);
    return false;
  }

  void lose(int r, int err, uint64_t expected, uint64_t got, const std::string& what) {
    if (peers_[size_t(r)]->state.load(std::memory_order_acquire) != kOpen) return;
    std::fprintf(
        stderr, "%sconnection to %s %s; its process exited or crashed, or it rejected our frames: look at its output\n",
        me().c_str(), peers_[size_t(r)]->where.c_str(), what.c_str());
    fail(Op::PeerLost, r, uint64_t(err), expected, got);
    markLost(r);
  }

  // shutdown, not close: another thread may be inside send() on the socket.
  void markLost(int r) {
    Peer& p = *peers_[size_t(r)];
    std::lock_guard<std::mutex> lk(stateMu_);
    p.state.store(kLost, std::memory_order_release);
    ::shutdown(p.sock.get(), SHUT_RDWR);
    stateCv_.notify_all();
  }
};

}  // namespace detail

}  // namespace gin
