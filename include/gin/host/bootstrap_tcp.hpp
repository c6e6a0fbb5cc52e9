// gin/host/bootstrap_tcp.hpp — ranks as processes on any hosts: TcpBootstrap, a
// star through rank 0, found through a UniqueId or the launcher's environment
// (detectLaunch). Frames (bootstrap_frame.hpp) are checked and every wait has a
// deadline; a failure on any rank reaches every rank with a message naming who
// and where. When every rank is on one host, the collectives meet in shared
// memory instead (bootstrap_shm.hpp), keeping the same checks and messages.
#pragma once

#include "gin/core/error.hpp"
#include "gin/host/bootstrap_base.hpp"
#include "gin/host/bootstrap_frame.hpp"
#include "gin/host/bootstrap_shm.hpp"
#include "gin/host/deadline.hpp"
#include "gin/host/env.hpp"
#include "gin/host/host_id.hpp"
#include "gin/host/idle.hpp"
#include "gin/host/launch.hpp"
#include "gin/host/socket.hpp"
#include "gin/host/unique_id.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

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
//
// Shared-memory path: when every rank is on one host (same hostId() and IPC
// namespace; rank 0 decides at the rendezvous, and only if every rank mapped
// its segment) and GIN_BOOTSTRAP_SHM is not 0, a collective is "publish the
// call in my slot, wait until every rank published the same call, copy".
// Calls of more than BootstrapShm::kSlotBytes per rank meet there too (so a
// mismatch is still seen), then move their data over TCP. The connections
// stay open: a waiting rank looks at them about every millisecond, so a rank
// that exits, crashes or aborts is noticed, and a rank that fails records why
// in the segment, which every waiting rank reads at once.
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
    const bool shmWanted = env::flag("GIN_BOOTSTRAP_SHM").value_or(true);
    if (nRanks == 1) return;  // alone: nothing to meet
    if (port < 1 || port > 65535)
      throw Error("TcpBootstrap: port " + std::to_string(port) + " is outside 1..65535; set MASTER_PORT");
    if (addr.empty()) throw Error("TcpBootstrap: the rendezvous address is empty; set MASTER_ADDR");
    if (rank == 0)
      acceptPeers(shmWanted ? shmKey() : std::string());
    else
      joinRoot(shmWanted ? shmKey() : std::string());
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
  // The collectives meet in shared memory (every rank on one host; GIN_BOOTSTRAP_SHM).
  bool sharedMemory() const { return static_cast<bool>(shm_); }

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
    if (shm_) {
      const bool inSlots = n <= detail::BootstrapShm::kSlotBytes;
      meet(detail::kAllGather, seq, n, -1, bytes + static_cast<size_t>(rank_) * n, inSlots ? n : 0);
      if (inSlots) {
        for (int p = 0; p < nRanks_ && n > 0; ++p)
          if (p != rank_) std::memcpy(bytes + static_cast<size_t>(p) * n, shm_.payload(p, seq), n);
        return;
      }
    }
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
    if (shm_) {
      const bool inSlots = bytes <= detail::BootstrapShm::kSlotBytes;
      meet(detail::kBroadcast, seq, bytes, root, data, inSlots && rank_ == root ? bytes : 0);
      if (inSlots) {
        if (rank_ != root && bytes > 0) std::memcpy(data, shm_.payload(root, seq), bytes);
        return;
      }
    }
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
    if (shm_) return meet(detail::kBarrier, seq, 0, -1, nullptr, 0);
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

  // Every failure is also recorded in the shared segment (the first one
  // recorded wins), so ranks waiting there stop at once.
  [[noreturn]] void fail(const std::string& why) {
    failure_ = why;
    if (shm_) shm_.markFailed(seq_, "rank " + std::to_string(rank_) + ": " + why);
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
    if (shm_) shm_.markFailed(seq_, "rank 0: " + why);
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
    if (shm_) shm_.markFailed(seq_, "rank " + std::to_string(rank_) + " failed in " + why);
    if (rank_ == 0) failAll("rank 0 failed in " + why);
    if (root_) sendAbort(root_.get(), why);
    fail(why);
  }

  // ---- rendezvous ----

  // Ranks whose keys are equal can map one POSIX shared memory segment: the
  // same host (hostId(): host name and boot id, or GIN_HOST_ID) and the same
  // IPC namespace. Empty: not this rank (unreadable, or GIN_BOOTSTRAP_SHM=0).
  static std::string shmKey() {
    char ns[128] = {};
    if (::readlink("/proc/self/ns/ipc", ns, sizeof ns - 1) <= 0) return {};
    try {
      return std::to_string(detail::hostId()) + " " + ns;
    } catch (const Error&) {
      return {};  // the communicator reports a bad GIN_HOST_ID; the bootstrap just uses TCP
    }
  }
  static constexpr uint64_t kMaxShmText = 256;  // a hello's key, a welcome's segment name

  void acceptPeers(const std::string& shmKey) {
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
    bool sameHost = true;
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
      if (h.magic != detail::kFrameMagic || h.op != detail::kHello || h.length > kMaxShmText)
        failAll("a process at " + peerText + " connected to the rendezvous " + where() + " but sent " +
                detail::frameText(h) + " instead of a gin bootstrap hello (magic " +
                detail::hexText(detail::kFrameMagic) + "); is another program using this port?");
      std::string key(h.length, '\0');
      if (detail::recvAll(s.get(), key.data(), key.size(), deadline).kind != detail::Io::Ok) continue;
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
      sameHost = sameHost && key == shmKey;
      ++connected;
    }
    if (sameHost && !shmKey.empty()) {
      try {
        shm_ = detail::BootstrapShm::create(nRanks_, port_);
      } catch (const Error&) {
        // No room in /dev/shm, or none at all: the TCP path serves.
      }
    }
    // Everyone is here: only now do the others learn the job is complete, and
    // the segment to map if there is one.
    const std::string name = shm_ ? shm_.name() : std::string();
    for (int p = 1; p < nRanks_; ++p) {
      const auto r = detail::sendFrame(peers_[static_cast<size_t>(p)].get(),
                                       header(detail::kWelcome, 0, name.size(), static_cast<uint64_t>(nRanks_), -1),
                                       name.data(), detail::deadlineAfter(timeoutNs_));
      if (r.kind != detail::Io::Ok)
        failAll("rank " + std::to_string(p) + " closed its connection during the rendezvous at " + where() + " (" +
                detail::errnoText(r.err) + "); its process exited or failed: look at its output");
    }
    if (!shm_) return;
    // Every rank says whether it mapped the segment; the name goes now, so a
    // crash from here on leaves nothing in /dev/shm; all or none use it.
    std::vector<unsigned char> mapped(static_cast<size_t>(nRanks_), 0);
    collect(
        detail::kShmCheck, 0, 1, -1, [](int) { return size_t{1}; },
        [&](int p) -> void* { return &mapped[static_cast<size_t>(p)]; });
    shm_.unlink();
    const unsigned char all = std::all_of(mapped.begin() + 1, mapped.end(), [](unsigned char m) { return m == 1; });
    answer(detail::kShmCheck, 0, 1, -1, [&](int) { return std::pair<const void*, size_t>{&all, 1}; });
    if (!all) shm_.reset();
  }

  void joinRoot(const std::string& shmKey) {
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
    const std::string key = shmKey.substr(0, kMaxShmText);
    const auto hello = header(detail::kHello, 0, key.size(), static_cast<uint64_t>(nRanks_), -1);
    const auto sent = detail::sendFrame(root_.get(), hello, key.data(), detail::deadlineAfter(timeoutNs_));
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
        h.size != static_cast<uint64_t>(nRanks_) || h.length > kMaxShmText)
      fail("expected a welcome from rank 0 at " + where() + " but received " + detail::frameText(h) +
           "; is another program using this port?");
    std::string name(h.length, '\0');
    if (const auto r = detail::recvAll(root_.get(), name.data(), name.size(), replyDeadline); r.kind != detail::Io::Ok)
      fail("rank 0 at " + where() +
           (r.kind == detail::Io::Timeout
                ? " stopped sending its welcome midway"
                : " closed the connection during the rendezvous (" + detail::errnoText(r.err) +
                      "); it failed or exited: look at its output"));
    if (name.empty()) return;
    unsigned char mapped = 0, all = 0;
    try {
      shm_ = detail::BootstrapShm::open(name, nRanks_);
      mapped = 1;
    } catch (const Error&) {
      // Another mount of /dev/shm (a container), or no room: all ranks use TCP.
    }
    call(detail::kShmCheck, 0, 1, -1, &mapped, 1, &all, 1);
    if (!all) shm_.reset();
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

  // ---- collectives in shared memory ----

  // Publish this rank's call (with `len` payload bytes) and wait until every
  // rank has published its call number `seq`; then every rank checks that the
  // calls agree, in the same order, so all of them throw the same mismatch.
  // The wait spins a few microseconds, then yields, then sleeps in short
  // steps, and stops for a failure recorded in the segment, a closed or
  // aborting connection (looked at every millisecond), or the deadline. A
  // failure recorded in this call also fails it where every rank arrived: the
  // rank that gave up (at the deadline, say) had arrived too.
  void meet(uint32_t op, uint64_t seq, uint64_t size, int root, const void* payload, size_t len) {
    shm_.arrive(rank_, detail::ShmCall{op, root, seq, size}, payload, len);
    const auto start = Clock::now();
    const auto deadline = start + std::chrono::nanoseconds(timeoutNs_);
    auto nextLook = start + kLookEvery;
    detail::IdleBackoff idle(kSpinPolls, kYieldPolls, kSleepUs);
    int missing = 0;
    while ((missing = shm_.firstMissing(seq, missing)) < nRanks_) {
      stopIfFailed(op, seq, size, root);
      idle.wait();
      const auto now = Clock::now();
      if (now >= nextLook) {
        lookAtConnections(op, seq, size, root);
        nextLook = now + kLookEvery;
      }
      if (now >= deadline && shm_.firstMissing(seq, missing) < nRanks_) {
        std::vector<int> late;
        for (int p = missing; p < nRanks_; ++p)
          if (shm_.firstMissing(seq, p) == p) late.push_back(p);
        failShared(detail::rankList(late) + " of " + std::to_string(nRanks_) + " did not join " +
                   detail::callText(op, seq, size, root) + " within " + timeoutText() + " (rank " +
                   std::to_string(rank_) +
                   " waited in shared memory); it is stuck, or calling a different collective; raise "
                   "GIN_BOOTSTRAP_TIMEOUT_MS if it is just slow");
      }
    }
    const detail::ShmCall& first = shm_.call(0, seq);
    for (int p = 0; p < nRanks_; ++p) {
      const detail::ShmCall& c = shm_.call(p, seq);
      if (c.op != first.op || c.seq != seq || c.size != first.size || c.root != first.root)
        failShared("rank " + std::to_string(p) + " called " + detail::callText(c.op, c.seq, c.size, c.root) +
                   " while rank 0 called " + detail::callText(first.op, first.seq, first.size, first.root) +
                   "; every rank must call the same collectives in the same order with the same sizes");
    }
    stopIfFailed(op, seq, size, root);
  }
  static constexpr auto kLookEvery = std::chrono::milliseconds(1);
  // About 5 us of spinning, then about a millisecond of yielding, then 20 us sleeps.
  static constexpr uint32_t kSpinPolls = 100, kYieldPolls = 1000, kSleepUs = 20;

  // A failure recorded in call `seq` or before (one recorded in a later call
  // means this one completed: the next call reports it).
  void stopIfFailed(uint32_t op, uint64_t seq, uint64_t size, int root) {
    if (auto f = shm_.failure(); f && f->seq <= seq)
      failShared(detail::callText(op, seq, size, root) + " aborted: " + f->text);
  }

  // Rank 0 tells the connected ranks too, as on the TCP path.
  [[noreturn]] void failShared(const std::string& why) {
    if (rank_ == 0) failAll(why);
    fail(why);
  }

  // While the ranks meet in shared memory nothing but an abort or the end of
  // the stream arrives on a connection, except a peer's frame of this call's
  // TCP step once it is past the meeting. A peer that is gone fails the call
  // unless the call is complete (it arrived, then exited): the next one reports it.
  enum class Line { Quiet, Frame, Abort, Closed };
  static Line peekLine(int fd, int* err) {
    FrameHeader h{};
    const ssize_t k = ::recv(fd, &h, sizeof h, MSG_PEEK | MSG_DONTWAIT);
    *err = k < 0 ? errno : 0;
    if (k < 0) return *err == EAGAIN || *err == EWOULDBLOCK || *err == EINTR ? Line::Quiet : Line::Closed;
    if (k == 0) return Line::Closed;
    if (static_cast<size_t>(k) < sizeof h) return Line::Quiet;
    return h.magic == detail::kFrameMagic && h.op == detail::kAbort ? Line::Abort : Line::Frame;
  }

  void lookAtConnections(uint32_t op, uint64_t seq, uint64_t size, int root) {
    const auto call = [&] { return detail::callText(op, seq, size, root); };
    // A failure recorded meanwhile is the cause; a peer leaving is its consequence.
    const auto complete = [&] {
      stopIfFailed(op, seq, size, root);
      return shm_.firstMissing(seq, 0) == nRanks_;
    };
    int err = 0;
    if (rank_ != 0) {
      const Line line = peekLine(root_.get(), &err);
      if (line == Line::Quiet || line == Line::Frame || complete()) return;
      if (line == Line::Abort)
        fail(call() + " aborted by rank 0: " + detail::abortReasonIfAny(root_.get(), timeoutNs_));
      fail("lost the connection to rank 0 at " + where() + " during " + call() + " (" + detail::errnoText(err) +
           "); rank 0's process exited or crashed: look at its output");
    }
    std::vector<pollfd> pfds;
    for (int p = 1; p < nRanks_; ++p) pfds.push_back(pollfd{peers_[static_cast<size_t>(p)].get(), POLLIN, 0});
    if (::poll(pfds.data(), pfds.size(), 0) <= 0) return;
    for (int p = 1; p < nRanks_; ++p) {
      const int fd = pfds[static_cast<size_t>(p - 1)].fd;
      if (pfds[static_cast<size_t>(p - 1)].revents == 0) continue;
      const Line line = peekLine(fd, &err);
      if (line == Line::Quiet || line == Line::Frame || complete()) continue;
      const std::string who = "rank " + std::to_string(p);
      if (line == Line::Abort) {
        const auto deadline = detail::deadlineAfter(std::min<uint64_t>(timeoutNs_, 1'000'000'000ull));
        FrameHeader h{};
        detail::recvAll(fd, &h, sizeof h, deadline);
        failAll(who + " failed in " + detail::readAbortText(fd, h.length, deadline));
      }
      failAll(who + " closed its connection during " + call() + " (" + detail::errnoText(err) +
              "); its process exited or crashed: look at its output");
    }
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
  detail::BootstrapShm shm_;           // mapped when the collectives meet in shared memory
};

}  // namespace gin
