// gin/host/launch.hpp — where this process sits in the job, read from the
// launcher's environment (torchrun, Slurm, Open MPI, gin's own variables):
// detectLaunch(). A malformed or inconsistent variable is a gin::Error naming it.
#pragma once

#include "gin/core/error.hpp"
#include "gin/host/bootstrap_base.hpp"
#include "gin/host/env.hpp"

#include <charconv>
#include <climits>
#include <optional>
#include <string>
#include <system_error>
#include <utility>

namespace gin {

// Where a process sits in the job. Filled by detectLaunch() from the launcher's variables.
struct LaunchInfo {
  int rank = 0, nRanks = 1, localRank = 0, localSize = 1;
  std::string masterAddr;  // host or IPv4 address of rank 0's rendezvous
  int masterPort = 0;
  std::string source;  // "torchrun", "slurm", "openmpi", "gin", or "single"
};

// Slurm's SLURM_TASKS_PER_NODE ("2(x3),1") gives the task count of node `node`.
namespace detail {
inline std::optional<int> slurmTasksOnNode(const std::string& spec, int node) {
  size_t pos = 0;
  int first = 0;
  while (pos < spec.size()) {
    size_t end = spec.find(',', pos);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(pos, end - pos);
    int count = 0, repeat = 1;
    const size_t paren = item.find('(');
    const std::string countText = item.substr(0, paren);
    auto [p, ec] = std::from_chars(countText.data(), countText.data() + countText.size(), count);
    if (ec != std::errc() || p != countText.data() + countText.size() || count < 1) return std::nullopt;
    if (paren != std::string::npos) {
      if (item.size() < paren + 4 || item.compare(paren, 2, "(x") != 0 || item.back() != ')') return std::nullopt;
      const std::string r = item.substr(paren + 2, item.size() - paren - 3);
      auto [q, ec2] = std::from_chars(r.data(), r.data() + r.size(), repeat);
      if (ec2 != std::errc() || q != r.data() + r.size() || repeat < 1) return std::nullopt;
    }
    if (node < first + repeat) return count;
    first += repeat;
    pos = end + 1;
  }
  return std::nullopt;
}
}  // namespace detail

// torchrun: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (+ 1 when
//   TORCHELASTIC_RUN_ID says torchrun's agent runs: it listens on MASTER_PORT itself).
// Every launcher: GIN_BOOTSTRAP_PORT, when set, is the port instead.
// Slurm: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE (optional);
//   address from MASTER_ADDR or SLURM_LAUNCH_NODE_IPADDR; port from MASTER_PORT or 20000 + (SLURM_JOB_ID % 20000).
// Open MPI: OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_SIZE;
//   address/port from MASTER_ADDR/MASTER_PORT.
// gin's own: GIN_RANK, GIN_NRANKS, GIN_LOCAL_RANK, GIN_LOCAL_SIZE; MASTER_ADDR/MASTER_PORT.
// Precedence: torchrun vars (RANK+WORLD_SIZE) > Slurm > Open MPI > gin > none ("single": rank 0 of 1).
// Malformed numbers (e.g. RANK=abc, RANK >= WORLD_SIZE) -> gin::Error naming the variable and value.
// A job of one rank needs no rendezvous, so MASTER_ADDR/MASTER_PORT are only required when nRanks > 1.
inline LaunchInfo detectLaunch() {
  // gin/host/env.hpp's reader and number parser (an empty variable counts as unset).
  static constexpr auto envVar = &env::raw;
  LaunchInfo info;
  auto num = [](const char* name, const std::string& v, long long lo, long long hi) {
    return static_cast<int>(env::parseNumber(name, v, lo, hi));
  };
  // Fills rank/size/local from the launcher's four variable names; a missing local
  // pair means the launcher did not say, and one node is the only safe reading.
  auto counts = [&](const char* rankVar, const char* sizeVar, const char* localRankVar, const char* localSizeVar,
                    const std::string& rankV, const std::string& sizeV) {
    info.nRanks = num(sizeVar, sizeV, 1, detail::kMaxRanks);
    info.rank = num(rankVar, rankV, 0, detail::kMaxRanks);
    if (info.rank >= info.nRanks)
      throw Error(std::string(rankVar) + "=" + rankV + " is not below " + sizeVar + "=" + sizeV +
                  "; ranks are numbered 0.." + sizeVar + "-1");
    const auto lr = localRankVar ? envVar(localRankVar) : std::nullopt;
    const auto ls = localSizeVar ? envVar(localSizeVar) : std::nullopt;
    info.localRank = lr ? num(localRankVar, *lr, 0, detail::kMaxRanks) : info.rank;
    info.localSize = ls ? num(localSizeVar, *ls, 1, detail::kMaxRanks) : info.nRanks;
    if (info.localRank >= info.localSize)
      throw Error(std::string(localRankVar ? localRankVar : "local rank") + "=" + std::to_string(info.localRank) +
                  " is not below " + (localSizeVar ? localSizeVar : "local size") + "=" +
                  std::to_string(info.localSize) + "; fix the launcher's environment");
  };
  // GIN_BOOTSTRAP_PORT, else MASTER_PORT (+ `offset`).
  auto masterPort = [&](int offset = 0) -> std::optional<int> {
    if (auto p = envVar("GIN_BOOTSTRAP_PORT")) return num("GIN_BOOTSTRAP_PORT", *p, 1, 65535);
    if (auto p = envVar("MASTER_PORT")) {
      const int port = num("MASTER_PORT", *p, 1, 65535);
      if (port + offset > 65535)
        throw Error("MASTER_PORT=" + *p + ": gin's rendezvous takes MASTER_PORT + " + std::to_string(offset) +
                    " under torchrun, past 65535; set GIN_BOOTSTRAP_PORT");
      return port + offset;
    }
    return std::nullopt;
  };
  auto requireMaster = [&](const std::string& how) {
    if (info.nRanks > 1 && (info.masterAddr.empty() || info.masterPort == 0))
      throw Error(info.source + " launch detected (rank " + std::to_string(info.rank) + " of " +
                  std::to_string(info.nRanks) + ") but the rendezvous address is unknown: " + how);
    if (info.masterAddr.empty()) info.masterAddr = "127.0.0.1";
  };
  auto pair = [](const char* a, const char* b) {
    const auto va = envVar(a), vb = envVar(b);
    if (va.has_value() != vb.has_value())
      throw Error(std::string(va ? a : b) + " is set but " + (va ? b : a) +
                  " is not; a launcher sets both (unset the stray one or set the other)");
    return std::pair{va, vb};
  };

  if (auto [r, w] = pair("RANK", "WORLD_SIZE"); r) {
    info.source = "torchrun";
    counts("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", *r, *w);
    info.masterAddr = envVar("MASTER_ADDR").value_or("");
    // torchrun's agent listens on MASTER_PORT itself (its TCPStore, which
    // the workers join: TORCHELASTIC_USE_AGENT_STORE); rank 0 takes the next.
    info.masterPort = masterPort(envVar("TORCHELASTIC_RUN_ID") ? 1 : 0).value_or(0);
    requireMaster("set MASTER_ADDR and MASTER_PORT (torchrun sets both)");
    return info;
  }
  if (auto procid = envVar("SLURM_PROCID")) {
    info.source = "slurm";
    auto ntasks = envVar("SLURM_NTASKS");
    if (!ntasks) ntasks = envVar("SLURM_NPROCS");
    if (!ntasks)
      throw Error("SLURM_PROCID=" + *procid + " is set but SLURM_NTASKS is not; run the job step with srun -n N");
    counts("SLURM_PROCID", "SLURM_NTASKS", nullptr, nullptr, *procid, *ntasks);
    info.localRank = 0;
    if (auto lid = envVar("SLURM_LOCALID")) info.localRank = num("SLURM_LOCALID", *lid, 0, detail::kMaxRanks);
    if (auto tpn = envVar("SLURM_NTASKS_PER_NODE")) {
      info.localSize = num("SLURM_NTASKS_PER_NODE", *tpn, 1, detail::kMaxRanks);
    } else if (auto spec = envVar("SLURM_TASKS_PER_NODE"); spec && envVar("SLURM_NODEID")) {
      const int node = num("SLURM_NODEID", *envVar("SLURM_NODEID"), 0, detail::kMaxRanks);
      const auto n = detail::slurmTasksOnNode(*spec, node);
      if (!n)
        throw Error("SLURM_TASKS_PER_NODE=\"" + *spec + "\" does not describe node SLURM_NODEID=" +
                    std::to_string(node) + "; fix the launcher's environment");
      info.localSize = *n;
    } else {
      // Outside srun nothing says how many tasks share the node; this is a lower bound.
      info.localSize = info.localRank + 1;
    }
    if (info.localRank >= info.localSize)
      throw Error("SLURM_LOCALID=" + std::to_string(info.localRank) + " is not below the node's task count " +
                  std::to_string(info.localSize) + "; fix the launcher's environment");
    info.masterAddr = envVar("MASTER_ADDR").value_or(envVar("SLURM_LAUNCH_NODE_IPADDR").value_or(""));
    if (auto p = masterPort()) {
      info.masterPort = *p;
    } else if (auto job = envVar("SLURM_JOB_ID")) {
      // Same job -> same port on every task, different jobs sharing a node rarely collide.
      info.masterPort = 20000 + static_cast<int>(env::parseNumber("SLURM_JOB_ID", *job, 0, LLONG_MAX) % 20000);
    }
    requireMaster(
        "set MASTER_ADDR (or run under srun, which sets SLURM_LAUNCH_NODE_IPADDR) and "
        "MASTER_PORT (or SLURM_JOB_ID)");
    return info;
  }
  if (auto [r, w] = pair("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"); r) {
    info.source = "openmpi";
    counts("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
           *r, *w);
    info.masterAddr = envVar("MASTER_ADDR").value_or("");
    info.masterPort = masterPort().value_or(0);
    requireMaster(
        "Open MPI does not publish one; set MASTER_ADDR and MASTER_PORT for every rank "
        "(e.g. mpirun -x MASTER_ADDR=<rank 0's host> -x MASTER_PORT=29500)");
    return info;
  }
  if (auto [r, w] = pair("GIN_RANK", "GIN_NRANKS"); r) {
    info.source = "gin";
    counts("GIN_RANK", "GIN_NRANKS", "GIN_LOCAL_RANK", "GIN_LOCAL_SIZE", *r, *w);
    info.masterAddr = envVar("MASTER_ADDR").value_or("");
    info.masterPort = masterPort().value_or(0);
    requireMaster("set MASTER_ADDR and MASTER_PORT");
    return info;
  }
  info.source = "single";
  info.masterAddr = "127.0.0.1";
  return info;
}

}  // namespace gin
