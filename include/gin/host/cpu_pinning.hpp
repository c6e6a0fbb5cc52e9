// gin/host/cpu_pinning.hpp — which CPUs the proxy engine threads run on, and
// pinning a thread to them. The list comes from GIN_PROXY_CPUS, then
// CommConfig::proxy.cpus, then (GPU ranks) the CPUs sysfs says are local to
// the GPU; "none" turns pinning off. A list the user gives must name CPUs
// this process may use (else gin::Error); the GPU's list is narrowed to them.
#pragma once

#include <pthread.h>
#include <sched.h>

#include <cctype>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "gin/core/error.hpp"
#include "gin/host/env.hpp"
#include "gin/host/proxy.hpp"

namespace gin::detail {

// The engine threads' CPUs (empty: not pinned). `busId`: this rank's GPU
// (PCI bus id), used on GPU ranks only; `rank` names the rank in errors.
inline std::vector<int> engineCpus(const ProxyConfig& cfg, int rank, bool gpu, std::string busId) {
  std::string list, what;
  if (auto e = env::text("GIN_PROXY_CPUS")) {
    list = *e;
    what = "GIN_PROXY_CPUS";
  } else if (!cfg.cpus.empty()) {
    list = cfg.cpus;
    what = "CommConfig::proxy.cpus";
  }
  if (list == "none") return {};
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return {};
  auto usable = [&](int c) { return c >= 0 && c < CPU_SETSIZE && CPU_ISSET(c, &allowed); };
  if (!list.empty()) {
    std::vector<int> cpus = parseCpuList(list, what);
    for (int c : cpus)
      if (!usable(c))
        throw Error(what + "=" + list + ": CPU " + std::to_string(c) + " is not available to this process (rank " +
                    std::to_string(rank) + "); name CPUs from its affinity mask, or use \"none\"");
    return cpus;
  }
  if (!gpu) return {};
  for (char& ch : busId) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  std::ifstream f("/sys/bus/pci/devices/" + busId + "/local_cpulist");
  std::string local;
  if (!std::getline(f, local)) return {};
  std::vector<int> cpus;
  try {
    for (int c : parseCpuList(local, "local_cpulist"))
      if (usable(c)) cpus.push_back(c);
  } catch (const Error&) {
    return {};
  }
  return cpus;
}

// Pin the calling thread to `cpus` (nothing when empty); throws gin::Error.
inline void pinThisThread(const std::vector<int>& cpus) {
  if (cpus.empty()) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  if (const int e = pthread_setaffinity_np(pthread_self(), sizeof set, &set))
    throw Error(std::string("cannot pin the proxy engine thread: ") + std::strerror(e));
}

}  // namespace gin::detail
