// gin/host/host_id.hpp — which host a rank is on: hostId(), the identity that
// groups ranks into hosts (topology.hpp's lsa teams; the bootstrap's
// shared-memory path, bootstrap_tcp.hpp).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>

#include "gin/core/error.hpp"
#include "gin/host/env.hpp"

namespace gin {

namespace detail {
inline uint64_t fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}
// Ranks with the same host id share memory. GIN_HOST_ID overrides (tests that
// pretend to be several hosts, containers that share a kernel); the value
// "netns" keeps the host's identity but adds the network namespace, so ranks
// in different namespaces of one machine count as different hosts.
inline uint64_t hostId() {
  const auto e = env::text("GIN_HOST_ID");
  if (e && *e != "netns") return fnv1a("env:" + *e);
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  std::string id = std::string(name) + "/" + boot;
  if (e) {
    char ns[128] = {};
    const ssize_t n = ::readlink("/proc/self/ns/net", ns, sizeof ns - 1);
    if (n <= 0) throw Error("GIN_HOST_ID=netns, but /proc/self/ns/net cannot be read on this system");
    id += std::string("/") + ns;
  }
  return fnv1a(id);
}
}  // namespace detail

}  // namespace gin
