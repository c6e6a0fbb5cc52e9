// gin/host/abort_channel.hpp — carries one rank's failure to the ranks of the
// communicator's other hosts, which the team abort words (shared memory, one
// host) cannot reach.
//
// Each rank of a communicator that spans several hosts listens on a small TCP
// port; open() swaps the addresses in one bootstrap allgather. The Comm's
// watcher thread calls notify() once, when its rank's own failure is recorded,
// and poll() every tick; poll() returns the failing rank + 1 of a valid
// message, which the watcher writes into its lsa team's abort words. Neither
// call throws or waits without a bound (notify: about a second in all, peers
// that are gone or never answer are skipped), and only the watcher thread
// calls them. A message carries a token agreed in open(), so one meant for
// another communicator (a stale port reused) is ignored.
#pragma once

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gin/core/error.hpp"
#include "gin/host/bootstrap.hpp"

namespace gin {

class AbortChannel {
 public:
  // Collective over `bs` (every rank calls it, or none): listen on an
  // ephemeral port of every interface, advertised as `advertise` (IPv4), and
  // learn the listeners of the ranks in `targets` (the ranks notify() tells,
  // in that order). A rank that cannot listen makes every rank throw.
  void open(Bootstrap& bs, const std::string& advertise, const std::vector<int>& targets) {
    nRanks_ = bs.nRanks();
    Card mine{};
    std::string problem;
    try {
      const sockaddr_in adv = detail::resolveIpv4(advertise, 0, "abort channel address (GIN_PROXY_TCP_ADDR)");
      detail::Socket ls = detail::tcpSocket();
      sockaddr_in any{};
      any.sin_family = AF_INET;
      any.sin_addr.s_addr = htonl(INADDR_ANY);
      socklen_t len = sizeof any;
      if (::bind(ls.get(), reinterpret_cast<const sockaddr*>(&any), sizeof any) != 0 ||
          ::listen(ls.get(), SOMAXCONN) != 0 || ::getsockname(ls.get(), reinterpret_cast<sockaddr*>(&any), &len) != 0)
        throw Error(std::string("cannot listen on an ephemeral TCP port: ") + std::strerror(errno));
      std::random_device rd;
      mine = Card{adv.sin_addr.s_addr, uint32_t(ntohs(any.sin_port)),
                  (uint64_t(rd()) << 32) ^ rd() ^ uint64_t(::getpid())};
      listener_ = std::move(ls);
    } catch (const Error& e) {
      problem = e.what();
      mine = Card{};  // port 0: tells every rank this one failed
    }
    std::vector<Card> cards(static_cast<size_t>(nRanks_));
    cards[size_t(bs.rank())] = mine;
    bs.allGather(cards.data(), sizeof(Card));
    if (!problem.empty()) throw Error("abort channel: rank " + std::to_string(bs.rank()) + ": " + problem);
    for (int r = 0; r < nRanks_; ++r)
      if (cards[size_t(r)].port == 0)
        throw Error("abort channel: rank " + std::to_string(r) + " could not open its listener; see its message");
    token_ = cards[0].token;
    for (int r : targets) {
      sockaddr_in sa{};
      sa.sin_family = AF_INET;
      sa.sin_addr.s_addr = cards[size_t(r)].addr;
      sa.sin_port = htons(uint16_t(cards[size_t(r)].port));
      targets_.push_back(sa);
    }
    pending_.reserve(kMaxPending);  // poll() never allocates
  }

  bool active() const { return bool(listener_); }

  // Tells every target that rank origin - 1 failed. Connects to at most
  // kInFlight targets at a time; gives up on the rest after about a second.
  void notify(uint32_t origin) noexcept {
    if (!active()) return;
    try {
      const Message m{kMagic, origin, token_};
      const auto deadline = detail::Clock::now() + std::chrono::seconds(1);
      std::vector<detail::Socket> live;
      std::vector<pollfd> fds;
      size_t next = 0;
      while ((next < targets_.size() || !live.empty()) && detail::Clock::now() < deadline) {
        while (next < targets_.size() && live.size() < kInFlight) {
          const sockaddr_in& sa = targets_[next++];
          detail::Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
          if (!s) continue;
          if (::connect(s.get(), reinterpret_cast<const sockaddr*>(&sa), sizeof sa) == 0)
            (void)::send(s.get(), &m, sizeof m, MSG_NOSIGNAL | MSG_DONTWAIT);
          else if (errno == EINPROGRESS)
            live.push_back(std::move(s));
        }
        fds.clear();
        for (const detail::Socket& s : live) fds.push_back(pollfd{s.get(), POLLOUT, 0});
        if (fds.empty()) continue;
        if (::poll(fds.data(), nfds_t(fds.size()), std::min(detail::msUntil(deadline), 50)) < 0 && errno != EINTR)
          break;
        for (size_t i = fds.size(); i-- > 0;) {
          if (fds[i].revents == 0) continue;
          int err = 0;
          socklen_t len = sizeof err;
          if (::getsockopt(fds[i].fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0)
            (void)::send(fds[i].fd, &m, sizeof m, MSG_NOSIGNAL | MSG_DONTWAIT);  // 16 bytes into an empty buffer
          live.erase(live.begin() + std::ptrdiff_t(i));  // closes it; the kernel still delivers what was sent
        }
      }
    } catch (...) {  // out of memory: the other hosts stop at their own timeout
    }
  }

  // Accepts and reads what has arrived, without waiting. Returns the failed
  // rank + 1 of a valid message, else 0. Malformed or foreign messages and
  // connections that send nothing for a second are dropped.
  uint32_t poll() noexcept {
    if (!active()) return 0;
    while (pending_.size() < kMaxPending) {
      const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) break;
      pending_.push_back(Pending{detail::Socket(fd), detail::Clock::now() + std::chrono::seconds(1), 0, {}});
    }
    uint32_t origin = 0;
    for (size_t i = pending_.size(); i-- > 0;) {
      Pending& p = pending_[i];
      const ssize_t k = ::recv(p.sock.get(), p.bytes + p.got, sizeof(Message) - p.got, 0);
      if (k > 0) p.got += size_t(k);
      const bool more = k > 0 || (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR));
      if (p.got == sizeof(Message)) {
        Message m;
        std::memcpy(&m, p.bytes, sizeof m);
        if (m.magic == kMagic && m.token == token_ && m.origin >= 1 && m.origin <= uint32_t(nRanks_) && !origin)
          origin = m.origin;
      } else if (more && detail::Clock::now() < p.deadline) {
        continue;
      }
      pending_.erase(pending_.begin() + std::ptrdiff_t(i));
    }
    return origin;
  }

 private:
  struct Card {
    uint32_t addr;  // IPv4, network order
    uint32_t port;  // 0: this rank could not listen
    uint64_t token;
  };
  struct Message {  // host byte order, like the bootstrap's frames
    uint32_t magic;
    uint32_t origin;  // failed rank + 1
    uint64_t token;   // rank 0's card: this communicator
  };
  struct Pending {
    detail::Socket sock;
    detail::Clock::time_point deadline;
    size_t got;
    char bytes[sizeof(Message)];
  };
  static constexpr uint32_t kMagic = 0x41424e47;  // "GNBA" in memory on little-endian hosts
  static constexpr size_t kInFlight = 64;         // connects at once (file descriptors)
  static constexpr size_t kMaxPending = 16;       // accepted, not yet read

  int nRanks_ = 0;
  uint64_t token_ = 0;
  detail::Socket listener_;
  std::vector<sockaddr_in> targets_;
  std::vector<Pending> pending_;
};

}  // namespace gin
