// gin/host/tcp_wire.hpp — the proxy's network wire: TCP sockets between every
// pair of ranks that use it, framed and checked messages, and a receiver
// thread that applies peers' writes and signals into this rank's windows.
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
#include "gin/host/socket.hpp"
#include "gin/host/tcp_frame.hpp"

namespace gin {

namespace detail {
inline ProxyWire envProxyWire(ProxyWire fallback) {
  const auto v = env::choice("GIN_PROXY_WIRE");
  if (!v) return fallback;
  if (*v == "local") return ProxyWire::Local;
  if (*v == "tcp") return ProxyWire::Tcp;
  if (*v == "verbs") return ProxyWire::Verbs;
  return ProxyWire::Auto;
}
inline const char* proxyWireName(ProxyWire w) {
  switch (w) {
    case ProxyWire::Auto: return "auto";
    case ProxyWire::Local: return "local";
    case ProxyWire::Tcp: return "tcp";
    case ProxyWire::Verbs: return "verbs";
  }
  return "?";
}
// The address the tcp wire advertises: GIN_PROXY_TCP_ADDR, else the one the
// bootstrap reaches the other ranks from, else loopback when every tcp peer
// is on this host, else the first non-loopback IPv4 address.
inline std::string tcpWireAddress(const Bootstrap& bs, bool peersOnOtherHosts) {
  if (auto a = env::text("GIN_PROXY_TCP_ADDR")) return *a;
  std::string a = bs.localAddress();
  if (!a.empty()) return a;
  return peersOnOtherHosts ? firstNonLoopbackIpv4() : std::string("127.0.0.1");
}
}  // namespace detail

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

class TcpWire final : public Wire {
 public:
  // Collective over `bs`: every rank builds its TcpWire at the same point.
  // useTcp[r]: this rank talks to rank r over tcp (symmetric across ranks).
  // signals: this rank's signal words (nSignalWords of them), which peers'
  // actions update. advertise: the IPv4 address (or name) peers connect to.
  TcpWire(Bootstrap& bs, const DevComm& dev, WindowDirectory& dir, uint64_t* signals, uint32_t nSignalWords,
          std::vector<uint8_t> useTcp, uint64_t timeoutNs, const std::string& advertise, TcpGpu gpu = {})
      : dev_(dev),
        dir_(dir),
        signals_(signals),
        nSignalWords_(nSignalWords),
        timeoutNs_(timeoutNs),
        gpu_(std::move(gpu)) {
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
    connectAll(bs, advertise);
    int fds[2];
    if (::pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0)
      throw Error(std::string("tcp wire: cannot create the receiver's wake-up pipe: ") + std::strerror(errno));
    wakeRead_ = detail::Socket(fds[0]);
    wakeWrite_ = detail::Socket(fds[1]);
    receiver_ = std::thread([this] { receiveLoop(); });
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
    stop_.store(true, std::memory_order_release);
    const char b = 1;
    (void)!::write(wakeWrite_.get(), &b, 1);
    if (receiver_.joinable()) receiver_.join();
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
  static constexpr int kOpen = 0, kBye = 1, kLost = 2;

  struct Peer {
    bool tcp = false;
    detail::Socket sock;
    std::string where;  // "rank 3 at 10.0.0.2:41234"
    std::mutex sendMu;
    uint64_t sendSeq = 0;  // under sendMu
    std::atomic<int> state{kOpen};
    std::atomic<uint64_t> fencesSeen{0};
    // Receiver thread only: the frame being read.
    TcpFrame hdr{};
    size_t hdrGot = 0;
    std::unique_ptr<char[]> staging;  // grows to the largest payload seen (at most kTcpMaxPayload)
    size_t stagingBytes = 0;
    size_t payGot = 0;
    uint64_t recvSeq = 0;
  };

  DevComm dev_;
  WindowDirectory& dir_;
  uint64_t* signals_;
  uint32_t nSignalWords_;
  uint64_t timeoutNs_;
  TcpGpu gpu_;
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
  std::unique_ptr<GpuCopier> recvCopier_;           // the receiver thread's staging-to-device copies
  // The receiver's pinned bounce buffer: side-context copy kernels read
  // pinned memory only, and a frame's payload arrives in pageable staging.
  static constexpr size_t kRecvBounce = size_t(1) << 20;
  HostMappedBuffer recvBounce_;
#endif
  int rank_ = 0, nRanks_ = 0, port_ = 0;
  std::vector<std::unique_ptr<Peer>> peers_;
  std::mutex stateMu_;  // with stateCv_: fence and goodbye waits
  std::condition_variable stateCv_;
  std::atomic<bool> stop_{false}, closed_{false};
  std::atomic<uint64_t> applied_{0}, rejected_{0};
  uint64_t fences_ = 0;
  detail::Socket wakeRead_, wakeWrite_;
  std::thread receiver_;

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
  std::string me() const { return "gin: rank " + std::to_string(rank_) + ": tcp wire: "; }

  // ---- connection setup ----

  struct Card {
    uint32_t addr;  // IPv4, network order
    uint32_t port;
    uint64_t token;
  };

  void connectAll(Bootstrap& bs, const std::string& advertise) {
    const sockaddr_in adv = detail::resolveIpv4(advertise, 0, "tcp wire address (GIN_PROXY_TCP_ADDR)");
    detail::Socket ls = detail::tcpSocket();
    sockaddr_in any{};
    any.sin_family = AF_INET;
    any.sin_addr.s_addr = htonl(INADDR_ANY);
    if (::bind(ls.get(), reinterpret_cast<const sockaddr*>(&any), sizeof any) != 0 ||
        ::listen(ls.get(), SOMAXCONN) != 0)
      throw Error(me() + "cannot listen on an ephemeral TCP port: " + std::strerror(errno));
    socklen_t len = sizeof any;
    ::getsockname(ls.get(), reinterpret_cast<sockaddr*>(&any), &len);
    port_ = ntohs(any.sin_port);

    std::vector<Card> cards(static_cast<size_t>(nRanks_));
    std::random_device rd;
    cards[size_t(rank_)] =
        Card{adv.sin_addr.s_addr, uint32_t(port_), (uint64_t(rd()) << 32) ^ rd() ^ uint64_t(::getpid())};
    bs.allGather(cards.data(), sizeof(Card));
    const uint64_t token = cards[0].token;  // this communicator's: strangers are turned away
    for (int r = 0; r < nRanks_; ++r) {
      sockaddr_in sa{};
      sa.sin_family = AF_INET;
      sa.sin_addr.s_addr = cards[size_t(r)].addr;
      sa.sin_port = htons(uint16_t(cards[size_t(r)].port));
      peers_[size_t(r)]->where = "rank " + std::to_string(r) + " at " + detail::endpointText(sa);
    }

    const auto deadline = detail::deadlineAfter(timeoutNs_);
    // Lower rank connects, higher rank accepts: one connection per pair.
    for (int r = rank_ + 1; r < nRanks_; ++r) {
      Peer& p = *peers_[size_t(r)];
      if (!p.tcp) continue;
      sockaddr_in sa{};
      sa.sin_family = AF_INET;
      sa.sin_addr.s_addr = cards[size_t(r)].addr;
      sa.sin_port = htons(uint16_t(cards[size_t(r)].port));
      p.sock = connectTo(sa, p.where, deadline);
      TcpFrame h = frame(TcpFrameType::Hello);
      h.window = uint32_t(r);
      h.offset = uint64_t(nRanks_);
      h.value = token;
      sealTcpFrame(h, nullptr);
      if (detail::sendAll(p.sock.get(), &h, sizeof h, deadline).kind != detail::Io::Ok)
        throw Error(me() + p.where + " closed the connection during the handshake; look at its output");
    }
    int expected = 0;
    for (int r = 0; r < rank_; ++r) expected += peers_[size_t(r)]->tcp;
    for (int got = 0; got < expected;) {
      if (detail::pollOne(ls.get(), POLLIN, deadline) == 0) {
        std::vector<int> missing;
        for (int r = 0; r < rank_; ++r)
          if (peers_[size_t(r)]->tcp && !peers_[size_t(r)]->sock) missing.push_back(r);
        throw Error(me() + detail::rankList(missing) + " never connected to " + peers_[size_t(rank_)]->where +
                    " within " + detail::secondsText(timeoutNs_) +
                    "; check that this address is reachable from those ranks (a firewall, or the wrong interface: "
                    "set GIN_PROXY_TCP_ADDR to an address of this host they can reach)");
      }
      sockaddr_in from{};
      socklen_t fl = sizeof from;
      detail::Socket s(::accept4(ls.get(), reinterpret_cast<sockaddr*>(&from), &fl, SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (!s) continue;
      TcpFrame h{};
      const auto helloDeadline = std::min(deadline, detail::deadlineAfter(2'000'000'000ull));
      if (detail::recvAll(s.get(), &h, sizeof h, helloDeadline).kind != detail::Io::Ok) continue;
      const int r = h.sender;
      const bool ok = h.magic == kTcpFrameMagic && h.version == kTcpWireVersion &&
                      h.headerSum == xxh64(&h, offsetof(TcpFrame, headerSum)) &&
                      h.type == uint8_t(TcpFrameType::Hello) && h.value == token && h.window == uint32_t(rank_) &&
                      h.offset == uint64_t(nRanks_) && r >= 0 && r < rank_ && peers_[size_t(r)]->tcp &&
                      !peers_[size_t(r)]->sock;
      if (!ok) {
        // Another job, a port scanner or a stale rank: not ours, not fatal.
        std::fprintf(stderr, "%sturned away a connection from %s: not a hello of this communicator %s\n", me().c_str(),
                     detail::endpointText(from).c_str(), tcpFrameText(h).c_str());
        continue;
      }
      peers_[size_t(r)]->sock = std::move(s);
      ++got;
    }
    for (auto& p : peers_)
      if (p->tcp) detail::setNoDelay(p->sock.get());
  }

  detail::Socket connectTo(const sockaddr_in& sa, const std::string& where, detail::Clock::time_point deadline) {
    auto backoff = std::chrono::milliseconds(5);
    int lastErr = 0;
    for (;;) {
      detail::Socket s;
      const int err = detail::connectOnce(sa, deadline, &s);
      if (err == 0) return s;
      lastErr = err;
      if (detail::Clock::now() >= deadline)
        throw Error(me() + "could not connect to " + where + " within " + detail::secondsText(timeoutNs_) +
                    " (last error: " + std::strerror(lastErr) +
                    "); check that the address is reachable from this host, or set GIN_PROXY_TCP_ADDR on that rank "
                    "to one that is");
      std::this_thread::sleep_for(std::min<detail::Clock::duration>(backoff, deadline - detail::Clock::now()));
      backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
    }
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

// The engine's wire when some peers are reached by a copy and others over a
// network wire (tcp, verbs).
class RoutedWire final : public Wire {
 public:
  // kinds[r]: ProxyWire::Local, Tcp or Verbs for each peer the proxy reaches;
  // tcp and verbs may be null when no peer uses them.
  RoutedWire(std::unique_ptr<Wire> local, Wire* tcp, Wire* verbs, std::vector<uint8_t> kinds)
      : local_(std::move(local)), tcp_(tcp), verbs_(verbs), kinds_(std::move(kinds)) {}
  bool put(int peer, uint32_t dstWindow, uint64_t dstOffset, const void* src, uint64_t bytes,
           WireReject* why) override {
    return pick(peer).put(peer, dstWindow, dstOffset, src, bytes, why);
  }
  bool putInline(int peer, uint32_t dstWindow, uint64_t dstOffset, const void* bytes, uint64_t n,
                 WireReject* why) override {
    return pick(peer).putInline(peer, dstWindow, dstOffset, bytes, n, why);
  }
  bool signal(int peer, uint32_t id, ProxyAction op, uint64_t value, WireReject* why) override {
    return pick(peer).signal(peer, id, op, value, why);
  }
  // Every wire: the engine's "everything before is complete" covers every peer.
  void complete() override {
    local_->complete();
    if (tcp_) tcp_->complete();
    if (verbs_) verbs_->complete();
  }

 private:
  std::unique_ptr<Wire> local_;
  Wire* tcp_;
  Wire* verbs_;
  std::vector<uint8_t> kinds_;
  Wire& pick(int peer) {
    const auto k = peer >= 0 && size_t(peer) < kinds_.size() ? ProxyWire(kinds_[size_t(peer)]) : ProxyWire::Local;
    if (k == ProxyWire::Tcp && tcp_) return *tcp_;
    if (k == ProxyWire::Verbs && verbs_) return *verbs_;
    return *local_;
  }
};

}  // namespace gin
