// gin/host/bootstrap_tcp.hpp — ranks as processes on any hosts: TcpBootstrap, a
// star through rank 0, found through a UniqueId or the launcher's environment
// (detectLaunch). Frames (bootstrap_frame.hpp) are checked and every wait has a
// deadline; a failure on any rank reaches every rank with a message naming who
// and where.
#pragma once

#include "gin/core/error.hpp"
#include "gin/host/bootstrap_base.hpp"
#include "gin/host/bootstrap_frame.hpp"
#include "gin/host/deadline.hpp"
#include "gin/host/launch.hpp"
#include "gin/host/socket.hpp"
#include "gin/host/unique_id.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace gin {
// Ranks as processes, meeting at rank 0 (a star): rank 0 listens on addr:port,
// the others connect to it (retrying, since rank 0 may start last), and every
// collective is "everyone sends to rank 0, rank 0 checks and answers everyone".
// That keeps the whole protocol in one place and gives rank 0 the full picture
// when something goes wrong, which it then sends to every rank. After any
// failure the object is unusable: later calls throw the same error.
class TcpBootstrap final : public Bootstrap {
 public:
  TcpBootstrap(const UniqueId& id, int rank, int nRanks, BootstrapConfig cfg = {})
      : TcpBootstrap(detail::parseUniqueId(id), rank, nRanks, cfg) {}

  TcpBootstrap(const std::string& addr, int port, int rank, int nRanks, BootstrapConfig cfg = {})
      : rank_(rank), nRanks_(nRanks), addr_(addr), port_(port) {
    if (nRanks < 1 || nRanks > detail::kMaxRanks)
      throw Error("TcpBootstrap: nRanks is " + std::to_string(nRanks) + "; it must be at least 1");
    if (rank < 0 || rank >= nRanks)
      throw Error("TcpBootstrap: rank " + std::to_string(rank) + " is outside 0.." + std::to_string(nRanks - 1));
    timeoutNs_ = detail::bootstrapTimeoutNs(cfg);
    if (nRanks == 1) return;  // alone: nothing to meet
    if (port < 1 || port > 65535)
      throw Error("TcpBootstrap: port " + std::to_string(port) + " is outside 1..65535; set MASTER_PORT");
    if (addr.empty()) throw Error("TcpBootstrap: the rendezvous address is empty; set MASTER_ADDR");
    if (rank == 0)
      acceptPeers();
    else
      joinRoot();
  }

  // From detectLaunch(): torchrun/Slurm/Open MPI variables.
  static std::unique_ptr<TcpBootstrap> fromEnvironment(BootstrapConfig cfg = {}) {
    const LaunchInfo li = detectLaunch();
    return std::make_unique<TcpBootstrap>(li.masterAddr, li.masterPort, li.rank, li.nRanks, cfg);
  }

  TcpBootstrap(const TcpBootstrap&) = delete;
  TcpBootstrap& operator=(const TcpBootstrap&) = delete;

  int rank() const override { return rank_; }
  int nRanks() const override { return nRanks_; }
  bool sameProcessGroup() const override { return false; }
  const std::string& address() const { return addr_; }  // of the rendezvous (rank 0)
  int port() const { return port_; }

  // Our end of the connection to rank 0 (rank 0: its end of a peer's
  // connection), i.e. the interface the other ranks already reach us on.
  std::string localAddress() const override {
    const int fd = rank_ == 0 ? (peers_.size() > 1 ? peers_[1].get() : -1) : root_.get();
    if (fd < 0) return {};
    sockaddr_in sa{};
    socklen_t len = sizeof sa;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0 || sa.sin_family != AF_INET) return {};
    char buf[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &sa.sin_addr, buf, sizeof buf);
    return buf;
  }

  void allGather(void* data, size_t bytesPerRank) override {
    const size_t n = bytesPerRank;
    const uint64_t seq = begin();
    size_t total = 0;
    try {
      total = detail::gatherBytes(n, nRanks_);
      detail::checkBuffer(data, n, "allGather");
    } catch (const Error& e) {
      localFailure(detail::callText(detail::kAllGather, seq, n, -1), e.what());
    }
    if (nRanks_ == 1) return;
    char* bytes = static_cast<char*>(data);
    if (rank_ == 0) {
      collect(
          detail::kAllGather, seq, n, -1, [&](int) { return n; },
          [&](int p) -> void* { return bytes + static_cast<size_t>(p) * n; });
      answer(detail::kAllGather, seq, n, -1, [&](int) { return std::pair<const void*, size_t>{bytes, total}; });
    } else {
      call(detail::kAllGather, seq, n, -1, bytes + static_cast<size_t>(rank_) * n, n, bytes, total);
    }
  }

  void broadcast(void* data, size_t bytes, int root) override {
    const uint64_t seq = begin();
    try {
      if (root < 0 || root >= nRanks_)
        throw Error("broadcast: root " + std::to_string(root) + " is outside 0.." + std::to_string(nRanks_ - 1));
      detail::checkBuffer(data, bytes, "broadcast");
    } catch (const Error& e) {
      localFailure(detail::callText(detail::kBroadcast, seq, bytes, root), e.what());
    }
    if (nRanks_ == 1) return;
    if (rank_ == 0) {
      collect(
          detail::kBroadcast, seq, bytes, root, [&](int p) { return p == root ? bytes : size_t{0}; },
          [&](int) { return data; });
      answer(detail::kBroadcast, seq, bytes, root, [&](int p) {
        return std::pair<const void*, size_t>{data, p == root ? 0 : bytes};
      });
    } else {
      const bool isRoot = rank_ == root;
      call(detail::kBroadcast, seq, bytes, root, data, isRoot ? bytes : 0, data, isRoot ? 0 : bytes);
    }
  }

  void barrier() override {
    const uint64_t seq = begin();
    if (nRanks_ == 1) return;
    if (rank_ == 0) {
      collect(
          detail::kBarrier, seq, 0, -1, [](int) { return size_t{0}; }, [](int) -> void* { return nullptr; });
      answer(detail::kBarrier, seq, 0, -1, [](int) { return std::pair<const void*, size_t>{nullptr, 0}; });
    } else {
      call(detail::kBarrier, seq, 0, -1, nullptr, 0, nullptr, 0);
    }
  }

 private:
  using Clock = detail::Clock;
  using FrameHeader = detail::FrameHeader;

  TcpBootstrap(const std::pair<std::string, int>& where, int rank, int nRanks, BootstrapConfig cfg)
      : TcpBootstrap(where.first, where.second, rank, nRanks, cfg) {}

  std::string me() const { return "bootstrap rank " + std::to_string(rank_) + "/" + std::to_string(nRanks_) + ": "; }
  std::string where() const { return addr_ + ":" + std::to_string(port_); }
  std::string timeoutText() const { return detail::secondsText(timeoutNs_); }

  uint64_t begin() {
    if (!failure_.empty()) throw Error(me() + "unusable after an earlier failure: " + failure_);
    return ++seq_;
  }

  [[noreturn]] void fail(const std::string& why) {
    failure_ = why;
    throw Error(me() + why);
  }

  FrameHeader header(uint32_t op, uint64_t seq, uint64_t length, uint64_t size, int root) const {
    return FrameHeader{detail::kFrameMagic, op, seq, length, size, rank_, root};
  }

  // Best effort: the peer learns why instead of running into its own timeout.
  void sendAbort(int fd, const std::string& why) {
    const std::string text = why.substr(0, detail::kMaxAbortText);
    const auto deadline = detail::deadlineAfter(std::min<uint64_t>(timeoutNs_, 1'000'000'000ull));
    detail::sendFrame(fd, header(detail::kAbort, seq_, text.size(), 0, -1), text.data(), deadline);
  }

  // Rank 0 failing: tell every connected rank, then close our sending side so
  // each reads the reason followed by a clean end of stream.
  [[noreturn]] void failAll(const std::string& why) {
    for (size_t p = 1; p < peers_.size(); ++p) {
      if (!peers_[p]) continue;
      sendAbort(peers_[p].get(), why);
      ::shutdown(peers_[p].get(), SHUT_WR);
    }
    fail(why);
  }

  // A bad argument on one rank must not leave the others waiting out the timeout.
  [[noreturn]] void localFailure(const std::string& call, const std::string& what) {
    const std::string why = call + ": " + (what.rfind("gin: ", 0) == 0 ? what.substr(5) : what);
    if (rank_ == 0) failAll("rank 0 failed in " + why);
    if (root_) sendAbort(root_.get(), why);
    fail(why);
  }

  // ---- rendezvous ----

  void acceptPeers() {
    const auto deadline = detail::deadlineAfter(timeoutNs_);
    sockaddr_in sa = detail::resolveIpv4(addr_, port_, "rendezvous address");
    detail::Socket ls = detail::tcpSocket();
    const int one = 1;
    // A previous job's connections in TIME_WAIT must not block a restart on the same port.
    ::setsockopt(ls.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(ls.get(), reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0) {
      int err = errno;
      if (err == EADDRNOTAVAIL) {
        // The address names this host but is not on a local interface (NAT, DNS alias).
        sa.sin_addr.s_addr = htonl(INADDR_ANY);
        err = ::bind(ls.get(), reinterpret_cast<const sockaddr*>(&sa), sizeof sa) == 0 ? 0 : errno;
      }
      if (err != 0)
        fail("cannot listen on " + where() + ": " + std::strerror(err) +
             (err == EADDRINUSE ? "; another process (another job, or a second rank 0) holds this port: "
                                  "check RANK and pick another MASTER_PORT"
                                : "; check MASTER_ADDR/MASTER_PORT"));
    }
    if (::listen(ls.get(), std::min(nRanks_ + 16, SOMAXCONN)) != 0)
      fail("cannot listen on " + where() + ": " + std::strerror(errno));

    peers_.resize(static_cast<size_t>(nRanks_));
    std::vector<std::string> from(static_cast<size_t>(nRanks_));
    int connected = 0;
    while (connected < nRanks_ - 1) {
      if (detail::pollOne(ls.get(), POLLIN, deadline) == 0) {
        std::vector<int> missing;
        for (int p = 1; p < nRanks_; ++p)
          if (!peers_[static_cast<size_t>(p)]) missing.push_back(p);
        failAll(detail::rankList(missing) + " of " + std::to_string(nRanks_) + " never connected to " + where() +
                " within " + timeoutText() + "; check that every process started and that RANK/WORLD_SIZE agree");
      }
      sockaddr_in peer{};
      socklen_t len = sizeof peer;
      detail::Socket s(::accept4(ls.get(), reinterpret_cast<sockaddr*>(&peer), &len, SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (!s) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) continue;
        failAll(std::string("accept on ") + where() + " failed: " + std::strerror(errno));
      }
      detail::setNoDelay(s.get());
      const std::string peerText = detail::endpointText(peer);
      FrameHeader h{};
      // A process that connects and dies before saying hello is simply not counted;
      // if it was a rank, the missing-rank message will name it.
      if (detail::recvAll(s.get(), &h, sizeof h, deadline).kind != detail::Io::Ok) continue;
      if (h.magic != detail::kFrameMagic || h.op != detail::kHello)
        failAll("a process at " + peerText + " connected to the rendezvous " + where() + " but sent " +
                detail::frameText(h) + " instead of a gin bootstrap hello (magic " +
                detail::hexText(detail::kFrameMagic) + "); is another program using this port?");
      const int r = h.sender;
      std::string why;
      if (h.size != static_cast<uint64_t>(nRanks_))
        why = "rank " + std::to_string(r) + " (from " + peerText + ") was started with nRanks " +
              std::to_string(h.size) + " but rank 0 with nRanks " + std::to_string(nRanks_) +
              "; every process must be given the same WORLD_SIZE";
      else if (r == 0)
        why = "a second rank 0 (from " + peerText + ") connected to " + where() +
              "; two processes were given rank 0: check RANK";
      else if (r < 0 || r >= nRanks_)
        why = "a process at " + peerText + " claims rank " + std::to_string(r) + ", outside 1.." +
              std::to_string(nRanks_ - 1) + "; check RANK";
      else if (peers_[static_cast<size_t>(r)])
        why = "rank " + std::to_string(r) + " connected twice (from " + from[static_cast<size_t>(r)] + " and " +
              peerText + "); two processes were given the same rank: check RANK";
      if (!why.empty()) {
        sendAbort(s.get(), why);
        ::shutdown(s.get(), SHUT_WR);
        failAll(why);
      }
      peers_[static_cast<size_t>(r)] = std::move(s);
      from[static_cast<size_t>(r)] = peerText;
      ++connected;
    }
    // Everyone is here: only now do the others learn the job is complete.
    for (int p = 1; p < nRanks_; ++p) {
      const auto r = detail::sendFrame(peers_[static_cast<size_t>(p)].get(),
                                       header(detail::kWelcome, 0, 0, static_cast<uint64_t>(nRanks_), -1), nullptr,
                                       detail::deadlineAfter(timeoutNs_));
      if (r.kind != detail::Io::Ok)
        failAll("rank " + std::to_string(p) + " closed its connection during the rendezvous at " + where() + " (" +
                detail::errnoText(r.err) + "); its process exited or failed: look at its output");
    }
  }

  void joinRoot() {
    const auto deadline = detail::deadlineAfter(timeoutNs_);
    const sockaddr_in sa = detail::resolveIpv4(addr_, port_, "rendezvous address");
    int lastErr = 0;
    auto backoff = std::chrono::milliseconds(10);
    for (;;) {
      detail::Socket s;
      int err = detail::connectOnce(sa, deadline, &s);
      if (err == 0 && connectedToSelf(s.get())) err = ECONNREFUSED;
      if (err == 0) {
        root_ = std::move(s);
        break;
      }
      lastErr = err;
      if (Clock::now() >= deadline)
        fail("could not connect to rank 0 at " + where() + " within " + timeoutText() +
             " (last error: " + std::strerror(lastErr) +
             "); check that rank 0 started, that MASTER_ADDR/MASTER_PORT (or the "
             "UniqueId) point at it, and that no firewall blocks the port");
      std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - Clock::now()));
      backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
    }
    detail::setNoDelay(root_.get());
    const auto hello = header(detail::kHello, 0, 0, static_cast<uint64_t>(nRanks_), -1);
    const auto sent = detail::sendFrame(root_.get(), hello, nullptr, detail::deadlineAfter(timeoutNs_));
    if (sent.kind != detail::Io::Ok) {
      if (auto why = detail::abortReasonIfAny(root_.get(), timeoutNs_); !why.empty())
        fail("rendezvous at " + where() + " aborted by rank 0: " + why);
      fail("rank 0 at " + where() + " closed the connection during the rendezvous (" + detail::errnoText(sent.err) +
           "); look at rank 0's output");
    }
    // Rank 0 started no later than we connected and gives up one timeout after it
    // started, so twice the timeout is enough to hear its verdict either way.
    FrameHeader h{};
    const auto replyDeadline = detail::deadlineAfter(2 * timeoutNs_);
    const auto got = detail::recvAll(root_.get(), &h, sizeof h, replyDeadline);
    if (got.kind == detail::Io::Timeout)
      fail("rank 0 at " + where() + " accepted the connection but did not complete the rendezvous within " +
           detail::secondsText(2 * timeoutNs_) + "; rank 0 is stuck");
    if (got.kind == detail::Io::Closed)
      fail("rank 0 at " + where() + " closed the connection during the rendezvous (" + detail::errnoText(got.err) +
           "); it failed or exited: look at its output");
    if (h.magic == detail::kFrameMagic && h.op == detail::kAbort)
      fail("rendezvous at " + where() +
           " aborted by rank 0: " + detail::readAbortText(root_.get(), h.length, replyDeadline));
    if (h.magic != detail::kFrameMagic || h.op != detail::kWelcome || h.sender != 0 ||
        h.size != static_cast<uint64_t>(nRanks_) || h.length != 0)
      fail("expected a welcome from rank 0 at " + where() + " but received " + detail::frameText(h) +
           "; is another program using this port?");
  }

  // Connecting to a local port nobody listens on can, rarely, pair the socket with
  // itself (TCP simultaneous open); that is "not there yet", not a rendezvous.
  static bool connectedToSelf(int fd) {
    sockaddr_in a{}, b{};
    socklen_t la = sizeof a, lb = sizeof b;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &la) != 0) return false;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&b), &lb) != 0) return false;
    return a.sin_port == b.sin_port && a.sin_addr.s_addr == b.sin_addr.s_addr;
  }

  // ---- collectives, rank 0's side ----

  // One frame from every peer, taken in whatever order they come, so a dead
  // peer is noticed at once even while an earlier one is still on its way.
  template <class ExpectLen, class Dest>
  void collect(uint32_t op, uint64_t seq, uint64_t size, int root, ExpectLen expectLen, Dest dest) {
    const std::string call = detail::callText(op, seq, size, root);
    const auto deadline = detail::deadlineAfter(timeoutNs_);
    std::vector<int> pending;
    for (int p = 1; p < nRanks_; ++p) pending.push_back(p);
    std::vector<pollfd> pfds;
    while (!pending.empty()) {
      pfds.clear();
      for (int p : pending) pfds.push_back(pollfd{peers_[static_cast<size_t>(p)].get(), POLLIN, 0});
      const int r = ::poll(pfds.data(), pfds.size(), detail::msUntil(deadline));
      if (r < 0 && errno != EINTR) failAll(std::string("poll failed in ") + call + ": " + std::strerror(errno));
      if (r <= 0) {
        if (Clock::now() < deadline) continue;
        failAll(detail::rankList(pending) + " of " + std::to_string(nRanks_) + " did not join " + call + " within " +
                timeoutText() + " (rank 0 waited at " + where() +
                "); it is stuck, or calling a different collective; raise GIN_BOOTSTRAP_TIMEOUT_MS if it is just slow");
      }
      std::vector<int> still;
      for (size_t i = 0; i < pending.size(); ++i) {
        if (pfds[i].revents == 0) {
          still.push_back(pending[i]);
          continue;
        }
        receiveFrom(pending[i], op, seq, size, root, call, expectLen(pending[i]), dest(pending[i]), deadline);
      }
      pending.swap(still);
    }
  }

  void receiveFrom(int p, uint32_t op, uint64_t seq, uint64_t size, int root, const std::string& call, size_t expectLen,
                   void* dest, Clock::time_point deadline) {
    const int fd = peers_[static_cast<size_t>(p)].get();
    const std::string who = "rank " + std::to_string(p);
    auto lost = [&](const detail::IoResult& r) {
      if (r.kind == detail::Io::Timeout)
        failAll(who + " started but did not finish sending its part of " + call + " within " + timeoutText());
      failAll(who + " closed its connection during " + call + " (" + detail::errnoText(r.err) +
              "); its process exited or crashed: look at its output");
    };
    FrameHeader h{};
    if (auto r = detail::recvAll(fd, &h, sizeof h, deadline); r.kind != detail::Io::Ok) lost(r);
    if (h.magic != detail::kFrameMagic)
      failAll("rank 0 received a frame with magic " + detail::hexText(h.magic) + " from " + who + " in " + call +
              " (expected " + detail::hexText(detail::kFrameMagic) + "): the stream is corrupt or not gin's");
    if (h.op == detail::kAbort) failAll(who + " failed in " + detail::readAbortText(fd, h.length, deadline));
    if (h.op != op || h.seq != seq || h.size != size || h.root != root || h.sender != p)
      failAll(who + " called " + detail::callText(h.op, h.seq, h.size, h.root) + " while rank 0 called " + call +
              " (frame " + detail::frameText(h) +
              "); every rank must call the same collectives in the same order with the same sizes");
    if (h.length != expectLen)
      failAll(who + " sent " + std::to_string(h.length) + " payload bytes in " + call + " where rank 0 expected " +
              std::to_string(expectLen) + " (frame " + detail::frameText(h) + ")");
    if (expectLen > 0)
      if (auto r = detail::recvAll(fd, dest, expectLen, deadline); r.kind != detail::Io::Ok) lost(r);
  }

  template <class Reply>
  void answer(uint32_t op, uint64_t seq, uint64_t size, int root, Reply reply) {
    const auto deadline = detail::deadlineAfter(timeoutNs_);
    for (int p = 1; p < nRanks_; ++p) {
      const auto [payload, len] = reply(p);
      const auto r =
          detail::sendFrame(peers_[static_cast<size_t>(p)].get(), header(op, seq, len, size, root), payload, deadline);
      if (r.kind == detail::Io::Timeout)
        failAll("rank " + std::to_string(p) + " did not take the result of " + detail::callText(op, seq, size, root) +
                " within " + timeoutText() + "; it is stuck");
      if (r.kind == detail::Io::Closed)
        failAll("rank " + std::to_string(p) + " closed its connection during " + detail::callText(op, seq, size, root) +
                " (" + detail::errnoText(r.err) + "); its process exited or crashed: look at its output");
    }
  }

  // ---- collectives, the other ranks' side ----

  void call(uint32_t op, uint64_t seq, uint64_t size, int root, const void* payload, size_t len, void* replyDest,
            size_t replyLen) {
    const std::string what = detail::callText(op, seq, size, root);
    const int fd = root_.get();
    auto lost = [&](const detail::IoResult& r) {
      if (auto why = detail::abortReasonIfAny(fd, timeoutNs_); !why.empty()) fail(what + " aborted by rank 0: " + why);
      fail("lost the connection to rank 0 at " + where() + " during " + what + " (" + detail::errnoText(r.err) +
           "); rank 0's process exited or crashed: look at its output");
    };
    if (auto r = detail::sendFrame(fd, header(op, seq, len, size, root), payload, detail::deadlineAfter(timeoutNs_));
        r.kind != detail::Io::Ok) {
      if (r.kind == detail::Io::Timeout)
        fail("rank 0 at " + where() + " did not take our part of " + what + " within " + timeoutText() +
             "; rank 0 is stuck");
      lost(r);
    }
    // Rank 0 may arrive up to one timeout late and then wait one timeout for the slowest rank.
    const auto deadline = detail::deadlineAfter(2 * timeoutNs_);
    FrameHeader h{};
    auto r = detail::recvAll(fd, &h, sizeof h, deadline);
    if (r.kind == detail::Io::Timeout)
      fail("rank 0 at " + where() + " did not answer " + what + " within " + detail::secondsText(2 * timeoutNs_) +
           "; rank 0 or another rank is stuck");
    if (r.kind == detail::Io::Closed) lost(r);
    if (h.magic == detail::kFrameMagic && h.op == detail::kAbort)
      fail(what + " aborted by rank 0: " + detail::readAbortText(fd, h.length, deadline));
    if (h.magic != detail::kFrameMagic || h.op != op || h.seq != seq || h.size != size || h.root != root ||
        h.sender != 0 || h.length != replyLen) {
      const std::string why = "expected the answer to " + what + " (length " + std::to_string(replyLen) +
                              ") from rank 0 but received " + detail::frameText(h);
      sendAbort(fd, why);
      fail(why);
    }
    if (replyLen > 0)
      if (r = detail::recvAll(fd, replyDest, replyLen, deadline); r.kind != detail::Io::Ok) {
        if (r.kind == detail::Io::Timeout)
          fail("rank 0 at " + where() + " stopped sending the answer to " + what + " midway");
        lost(r);
      }
  }

  int rank_;
  int nRanks_;
  std::string addr_;
  int port_;
  uint64_t timeoutNs_ = 0;
  uint64_t seq_ = 0;
  std::string failure_;
  std::vector<detail::Socket> peers_;  // rank 0: one per rank (index 0 unused)
  detail::Socket root_;                // other ranks: the connection to rank 0
};

}  // namespace gin
