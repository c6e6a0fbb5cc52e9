// gin/host/tcp_connect.hpp — how the tcp wire connects: the address it
// advertises, TcpPeer (one connection and its send/receive state), and
// tcpConnectAll, the collective that opens one checked connection per pair of
// tcp ranks (the lower rank connects, the higher accepts a hello carrying the
// communicator's token; strangers are turned away). Throws gin::Error naming
// the ranks that could not be reached within the timeout.
#pragma once

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gin/core/error.hpp"
#include "gin/core/xxh64.hpp"
#include "gin/device/transport/proxy.hpp"
#include "gin/host/bootstrap_base.hpp"
#include "gin/host/deadline.hpp"
#include "gin/host/env.hpp"
#include "gin/host/socket.hpp"
#include "gin/host/tcp_frame.hpp"

namespace gin {

namespace detail {

// The address the tcp wire advertises: GIN_PROXY_TCP_ADDR, else the one the
// bootstrap reaches the other ranks from, else loopback when every tcp peer
// is on this host, else the first non-loopback IPv4 address.
inline std::string tcpWireAddress(const Bootstrap& bs, bool peersOnOtherHosts) {
  if (auto a = env::text("GIN_PROXY_TCP_ADDR")) return *a;
  std::string a = bs.localAddress();
  if (!a.empty()) return a;
  return peersOnOtherHosts ? firstNonLoopbackIpv4() : std::string("127.0.0.1");
}

// One tcp peer of a wire: its connection, the sending side's lock and
// sequence number, its state (kOpen, kBye after its goodbye, kLost), and the
// receiver's frame in progress.
struct TcpPeer {
  static constexpr int kOpen = 0, kBye = 1, kLost = 2;
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

// What connection set-up needs to know of the wire.
struct TcpSetup {
  int rank = 0, nRanks = 0;
  uint64_t timeoutNs = 0;
  std::string me;  // the prefix of its messages
};

struct TcpCard {
  uint32_t addr;  // IPv4, network order
  uint32_t port;
  uint64_t token;
};

// One connection to `sa`, retried with backoff until `deadline`.
inline detail::Socket tcpConnectTo(const TcpSetup& w, const sockaddr_in& sa, const std::string& where,
                                   detail::Clock::time_point deadline) {
  auto backoff = std::chrono::milliseconds(5);
  int lastErr = 0;
  for (;;) {
    detail::Socket s;
    const int err = detail::connectOnce(sa, deadline, &s);
    if (err == 0) return s;
    lastErr = err;
    if (detail::Clock::now() >= deadline)
      throw Error(w.me + "could not connect to " + where + " within " + detail::secondsText(w.timeoutNs) +
                  " (last error: " + std::strerror(lastErr) +
                  "); check that the address is reachable from this host, or set GIN_PROXY_TCP_ADDR on that rank "
                  "to one that is");
    std::this_thread::sleep_for(std::min<detail::Clock::duration>(backoff, deadline - detail::Clock::now()));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
}

// Returns the port this rank listens on.
inline int tcpConnectAll(const TcpSetup& w, Bootstrap& bs, const std::string& advertise,
                         std::vector<std::unique_ptr<TcpPeer>>& peers) {
  const int rank = w.rank, nRanks = w.nRanks;
  const sockaddr_in adv = detail::resolveIpv4(advertise, 0, "tcp wire address (GIN_PROXY_TCP_ADDR)");
  detail::Socket ls = detail::tcpSocket();
  sockaddr_in any{};
  any.sin_family = AF_INET;
  any.sin_addr.s_addr = htonl(INADDR_ANY);
  if (::bind(ls.get(), reinterpret_cast<const sockaddr*>(&any), sizeof any) != 0 || ::listen(ls.get(), SOMAXCONN) != 0)
    throw Error(w.me + "cannot listen on an ephemeral TCP port: " + std::strerror(errno));
  socklen_t len = sizeof any;
  ::getsockname(ls.get(), reinterpret_cast<sockaddr*>(&any), &len);
  const int port = ntohs(any.sin_port);

  std::vector<TcpCard> cards(static_cast<size_t>(nRanks));
  std::random_device rd;
  cards[size_t(rank)] =
      TcpCard{adv.sin_addr.s_addr, uint32_t(port), (uint64_t(rd()) << 32) ^ rd() ^ uint64_t(::getpid())};
  bs.allGather(cards.data(), sizeof(TcpCard));
  const uint64_t token = cards[0].token;  // this communicator's: strangers are turned away
  for (int r = 0; r < nRanks; ++r) {
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = cards[size_t(r)].addr;
    sa.sin_port = htons(uint16_t(cards[size_t(r)].port));
    peers[size_t(r)]->where = "rank " + std::to_string(r) + " at " + detail::endpointText(sa);
  }

  const auto deadline = detail::deadlineAfter(w.timeoutNs);
  // Lower rank connects, higher rank accepts: one connection per pair.
  for (int r = rank + 1; r < nRanks; ++r) {
    TcpPeer& p = *peers[size_t(r)];
    if (!p.tcp) continue;
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = cards[size_t(r)].addr;
    sa.sin_port = htons(uint16_t(cards[size_t(r)].port));
    p.sock = tcpConnectTo(w, sa, p.where, deadline);
    TcpFrame h{};
    h.type = uint8_t(TcpFrameType::Hello);
    h.action = uint8_t(ProxyAction::None);
    h.sender = rank;
    h.window = uint32_t(r);
    h.offset = uint64_t(nRanks);
    h.value = token;
    sealTcpFrame(h, nullptr);
    if (detail::sendAll(p.sock.get(), &h, sizeof h, deadline).kind != detail::Io::Ok)
      throw Error(w.me + p.where + " closed the connection during the handshake; look at its output");
  }
  int expected = 0;
  for (int r = 0; r < rank; ++r) expected += peers[size_t(r)]->tcp;
  for (int got = 0; got < expected;) {
    if (detail::pollOne(ls.get(), POLLIN, deadline) == 0) {
      std::vector<int> missing;
      for (int r = 0; r < rank; ++r)
        if (peers[size_t(r)]->tcp && !peers[size_t(r)]->sock) missing.push_back(r);
      throw Error(w.me + detail::rankList(missing) + " never connected to " + peers[size_t(rank)]->where + " within " +
                  detail::secondsText(w.timeoutNs) +
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
                    h.headerSum == xxh64(&h, offsetof(TcpFrame, headerSum)) && h.type == uint8_t(TcpFrameType::Hello) &&
                    h.value == token && h.window == uint32_t(rank) && h.offset == uint64_t(nRanks) && r >= 0 &&
                    r < rank && peers[size_t(r)]->tcp && !peers[size_t(r)]->sock;
    if (!ok) {
      // Another job, a port scanner or a stale rank: not ours, not fatal.
      std::fprintf(stderr, "%sturned away a connection from %s: not a hello of this communicator %s\n", w.me.c_str(),
                   detail::endpointText(from).c_str(), tcpFrameText(h).c_str());
      continue;
    }
    peers[size_t(r)]->sock = std::move(s);
    ++got;
  }
  for (auto& p : peers)
    if (p->tcp) detail::setNoDelay(p->sock.get());
  return port;
}

}  // namespace detail

}  // namespace gin
