// gin/host/proxy_config.hpp — the proxy engine's knobs (CommConfig::proxy):
// which wire reaches a peer (ProxyWire), ring size, idle back-off, threads and
// their CPUs (ProxyConfig), and parseCpuList for the cpulists they name.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gin/core/error.hpp"
#include "gin/host/idle.hpp"

namespace gin {

// Which wire carries proxy operations to a peer (CommConfig::proxy.wire;
// GIN_PROXY_WIRE=auto|local|tcp overrides). Auto: local for peers whose
// memory is mapped in this process (the lsa team), tcp for the others. Local:
// only mapped peers (ranks on other hosts are an error). Tcp: every other
// rank over sockets (a rank reaches itself by a copy). gin/host/tcp_wire.hpp.
enum class ProxyWire : uint8_t { Auto = 0, Local = 1, Tcp = 2, Verbs = 3 };

// Engine knobs (CommConfig::proxy). The defaults favour latency while busy and
// give the core back within ~a millisecond of going idle, which matters when
// CPU ranks and their engines outnumber the cores.
struct ProxyConfig {
  uint32_t ringSlots = 1024;  // descriptors per context ring; a power of two in [2, 2^15]
  uint32_t spinPolls = detail::IdleBackoff::kSpinPolls;    // idle passes spent spinning (pause, 2048) ...
  uint32_t yieldPolls = detail::IdleBackoff::kYieldPolls;  // ... then yielding the core (256) ...
  uint32_t sleepUs = detail::IdleBackoff::kSleepUs;        // ... then sleeping this long (50 us) between passes
  uint32_t batch = 64;        // descriptors taken from one ring before looking at the next (fairness)
  // Engine threads; ring c is consumed by thread c % threads. More than the
  // number of contexts is clamped to it. GIN_PROXY_THREADS overrides.
  uint32_t threads = 1;
  // CPUs the engine threads may run on (all of them the same list), as a
  // Linux cpulist ("0-7,16"). Empty: the CPUs local to the GPU (sysfs
  // local_cpulist) on GPU ranks, no pinning on CPU ranks. GIN_PROXY_CPUS
  // overrides; "none" turns pinning off.
  std::string cpus;
  ProxyWire wire = ProxyWire::Auto;
  // Who moves a put's payload to a peer mapped in this process (the local
  // wire): the producing threads themselves, with only the actions left to
  // the engine (1), or the engine (0). -1: the producers on GPU ranks, whose
  // engine could otherwise move GPU memory only with CUDA copies, which queue
  // behind the user's spinning kernels; the engine on CPU ranks.
  // GIN_PROXY_PRODUCER_STORES=0|1 overrides.
  int producerStores = -1;
};

// A Linux cpulist ("0-3,8,10-11") as CPU numbers; throws gin::Error naming
// `what` on anything else.
inline std::vector<int> parseCpuList(const std::string& list, const std::string& what) {
  std::vector<int> cpus;
  auto bad = [&]() -> Error {
    return Error(what + "=\"" + list + "\" is not a CPU list; write it like 0-7,16 (CPU numbers and ranges)");
  };
  size_t i = 0;
  auto number = [&]() {
    if (i >= list.size() || list[i] < '0' || list[i] > '9') throw bad();
    long v = 0;
    while (i < list.size() && list[i] >= '0' && list[i] <= '9') {
      v = v * 10 + (list[i++] - '0');
      if (v > 1 << 20) throw bad();
    }
    return int(v);
  };
  while (i < list.size()) {
    const int a = number();
    int b = a;
    if (i < list.size() && list[i] == '-') {
      ++i;
      b = number();
    }
    if (b < a) throw bad();
    for (int c = a; c <= b; ++c) cpus.push_back(c);
    if (i < list.size()) {
      if (list[i] != ',' && list[i] != '\n') throw bad();
      ++i;
    }
  }
  if (cpus.empty()) throw bad();
  return cpus;
}

}  // namespace gin
