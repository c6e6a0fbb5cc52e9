// gin/host/unique_id.hpp — UniqueId, like ncclUniqueId: 128 opaque bytes naming
// the rendezvous (address and free port) of a TcpBootstrap. One process calls
// makeUniqueId() and ships the bytes to the others; a damaged id is a gin::Error.
#pragma once

#include "gin/core/error.hpp"
#include "gin/host/env.hpp"
#include "gin/host/socket.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <string>
#include <system_error>
#include <utility>

namespace gin {
namespace detail {
inline constexpr const char* kUniqueIdPrefix = "gin-bootstrap-v1 ";
}  // namespace detail

// 128 opaque bytes like ncclUniqueId: the address and port of the rendezvous.
struct UniqueId {
  char bytes[128];
};

// Picks this host's address (first non-loopback IPv4, else 127.0.0.1; env GIN_BOOTSTRAP_ADDR overrides)
// and a free TCP port (bind to port 0, read it back). Call on one process and ship the bytes to the others.
inline UniqueId makeUniqueId() {
  const auto envAddr = env::text("GIN_BOOTSTRAP_ADDR");
  const std::string addr = envAddr ? *envAddr : detail::firstNonLoopbackIpv4();
  sockaddr_in sa = detail::resolveIpv4(addr, 0, "GIN_BOOTSTRAP_ADDR");
  detail::Socket s = detail::tcpSocket();
  if (::bind(s.get(), reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0) {
    const int err = errno;
    if (err != EADDRNOTAVAIL)
      throw Error("makeUniqueId: cannot bind a TCP port on " + addr + ": " + std::strerror(err) +
                  "; set GIN_BOOTSTRAP_ADDR to an address of this host");
    // A name of this host that is not on a local interface (NAT): rank 0 will listen on all.
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    if (::bind(s.get(), reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0)
      throw Error(std::string("makeUniqueId: cannot bind a TCP port: ") + std::strerror(errno));
  }
  socklen_t len = sizeof sa;
  if (::getsockname(s.get(), reinterpret_cast<sockaddr*>(&sa), &len) != 0)
    throw Error(std::string("makeUniqueId: getsockname failed: ") + std::strerror(errno));
  UniqueId id{};
  const int n = std::snprintf(id.bytes, sizeof id.bytes, "%s%s %d", detail::kUniqueIdPrefix, addr.c_str(),
                              static_cast<int>(ntohs(sa.sin_port)));
  if (n < 0 || static_cast<size_t>(n) >= sizeof id.bytes)
    throw Error("makeUniqueId: address \"" + addr + "\" is too long for a UniqueId; use a numeric address");
  return id;
}

namespace detail {
inline std::pair<std::string, int> parseUniqueId(const UniqueId& id) {
  const char* end = static_cast<const char*>(std::memchr(id.bytes, '\0', sizeof id.bytes));
  const std::string text(id.bytes, end ? static_cast<size_t>(end - id.bytes) : 0);
  const std::string prefix = kUniqueIdPrefix;
  const size_t space = text.rfind(' ');
  if (end == nullptr || text.rfind(prefix, 0) != 0 || space == std::string::npos || space < prefix.size() + 1)
    throw Error(
        "TcpBootstrap: the UniqueId was not made by makeUniqueId() (or was damaged in transit); "
        "ship all 128 bytes from the process that called makeUniqueId()");
  const std::string addr = text.substr(prefix.size(), space - prefix.size());
  const std::string portText = text.substr(space + 1);
  int port = 0;
  auto [p, ec] = std::from_chars(portText.data(), portText.data() + portText.size(), port);
  if (ec != std::errc() || p != portText.data() + portText.size() || port < 1 || port > 65535)
    throw Error("TcpBootstrap: the UniqueId holds a bad port \"" + portText + "\"; it was damaged in transit");
  return {addr, port};
}
}  // namespace detail

}  // namespace gin
