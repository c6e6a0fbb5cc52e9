// gin/host/socket.hpp — the host's TCP helpers for slow-path channels (bootstrap,
// tcp wire, abort channel): an owned fd, IPv4 resolve and connect, and whole-buffer
// send/recv on non-blocking sockets. Every wait is bounded by a deadline; a dead
// peer becomes an IoResult to report, never a SIGPIPE.
#pragma once

#include "gin/core/error.hpp"
#include "gin/host/deadline.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

namespace gin {
namespace detail {

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { reset(); }
  Socket(Socket&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Socket& operator=(Socket&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

inline std::string errnoText(int err) { return err == 0 ? "end of stream" : std::strerror(err); }

// revents, or 0 once the deadline has passed.
inline short pollOne(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, msUntil(deadline));
    if (r > 0) return p.revents;
    if (r < 0 && errno != EINTR) return POLLERR;
    if (r == 0 && Clock::now() >= deadline) return 0;
  }
}

enum class Io { Ok, Timeout, Closed };
struct IoResult {
  Io kind;
  int err;  // errno when Closed; 0 for an orderly end of stream
};

inline IoResult sendAll(int fd, const void* buf, size_t len, Clock::time_point deadline) {
  const char* p = static_cast<const char*>(buf);
  while (len > 0) {
    // MSG_NOSIGNAL: a dead peer must become an error naming it, not a SIGPIPE.
    const ssize_t k = ::send(fd, p, len, MSG_NOSIGNAL);
    if (k > 0) {
      p += k;
      len -= static_cast<size_t>(k);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (pollOne(fd, POLLOUT, deadline) == 0) return {Io::Timeout, 0};
      continue;
    }
    return {Io::Closed, k < 0 ? errno : 0};
  }
  return {Io::Ok, 0};
}

inline IoResult recvAll(int fd, void* buf, size_t len, Clock::time_point deadline) {
  char* p = static_cast<char*>(buf);
  while (len > 0) {
    const ssize_t k = ::recv(fd, p, len, 0);
    if (k > 0) {
      p += k;
      len -= static_cast<size_t>(k);
      continue;
    }
    if (k == 0) return {Io::Closed, 0};
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (pollOne(fd, POLLIN, deadline) == 0) return {Io::Timeout, 0};
      continue;
    }
    return {Io::Closed, errno};
  }
  return {Io::Ok, 0};
}

inline void setNoDelay(int fd) {
  // Bootstrap frames are small request/answer pairs; Nagle would add 40 ms to each.
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

inline std::string endpointText(const sockaddr_in& sa) {
  char buf[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &sa.sin_addr, buf, sizeof buf);
  return std::string(buf) + ":" + std::to_string(ntohs(sa.sin_port));
}

// IPv4 only: numeric addresses skip the resolver. A host name goes through
// getaddrinfo, the one call here without a deadline of ours (the resolver's own
// timeouts bound it).
inline sockaddr_in resolveIpv4(const std::string& host, int port, const std::string& what) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &sa.sin_addr) == 1) return sa;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr)
    throw Error("cannot resolve " + what + " \"" + host + "\" to an IPv4 address (" +
                (rc != 0 ? std::string(::gai_strerror(rc)) : std::string("no address")) +
                "); use a numeric address or a name this host can resolve");
  sa.sin_addr = reinterpret_cast<const sockaddr_in*>(res->ai_addr)->sin_addr;
  ::freeaddrinfo(res);
  return sa;
}

inline std::string firstNonLoopbackIpv4() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "127.0.0.1";
  std::string found = "127.0.0.1";
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if ((i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
    char buf[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr, buf, sizeof buf);
    found = buf;
    break;
  }
  ::freeifaddrs(list);
  return found;
}

inline Socket tcpSocket() {
  Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!s) throw Error(std::string("cannot create a TCP socket: ") + std::strerror(errno));
  return s;
}

// One non-blocking connect to `sa`, waited for until `deadline`: 0 with the
// connected socket in *out, or the errno that stopped it (ETIMEDOUT when the
// deadline passed). Callers retry with their own backoff and messages.
inline int connectOnce(const sockaddr_in& sa, Clock::time_point deadline, Socket* out) {
  Socket s = tcpSocket();
  int err = 0;
  if (::connect(s.get(), reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0) {
    err = errno;
    if (err == EINPROGRESS) {
      if (pollOne(s.get(), POLLOUT, deadline) == 0) {
        err = ETIMEDOUT;
      } else {
        socklen_t len = sizeof err;
        if (::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      }
    }
  }
  if (err == 0) *out = std::move(s);
  return err;
}

}  // namespace detail
}  // namespace gin
