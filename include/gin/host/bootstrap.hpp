// gin/host/bootstrap.hpp — how the ranks of a job find each other before there is a communicator.
//
// Building a communicator needs a few small host collectives over a side channel
// (memory handles, queue-pair numbers, topology): allGather, broadcast, barrier.
// InProcessGroup runs N threads of one process as N ranks (tests, CPU emulation);
// TcpBootstrap runs ranks as processes on any hosts, meeting at rank 0 (a star),
// which is found through a UniqueId or through the launcher's environment
// (torchrun, Slurm, Open MPI; see detectLaunch()). This is slow-path code: it
// favours simple, checked framing and failures that name the rank, the address
// and what to do, and every wait has a deadline so a lost rank never hangs a job.
#pragma once

#include "gin/core/error.hpp"

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
#include <charconv>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace gin {

struct BootstrapConfig {
  uint64_t timeoutNs = 60'000'000'000ull;  // env GIN_BOOTSTRAP_TIMEOUT_MS overrides (milliseconds)
};

// Where a process sits in the job. Filled by detectLaunch() from the launcher's variables.
struct LaunchInfo {
  int rank = 0, nRanks = 1, localRank = 0, localSize = 1;
  std::string masterAddr;  // host or IPv4 address of rank 0's rendezvous
  int masterPort = 0;
  std::string source;  // "torchrun", "slurm", "openmpi", "gin", or "single"
};

namespace detail {

using Clock = std::chrono::steady_clock;

// Longer than any job waits for a rendezvous; keeps deadline arithmetic far from overflow.
inline constexpr uint64_t kMaxTimeoutNs = 365ull * 24 * 3600 * 1'000'000'000ull;
inline constexpr int kMaxRanks = 1 << 24;

inline std::string secondsText(uint64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(ns) / 1e9);
  return buf;
}

inline Clock::time_point deadlineAfter(uint64_t ns) {
  return Clock::now() + std::chrono::nanoseconds(static_cast<int64_t>(ns));
}

// An empty variable counts as unset: job scripts often export VAR= to clear it.
inline std::optional<std::string> envVar(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

// Strict decimal: "3 ", "0x3" or "+3" are launcher mistakes to report, not to guess around.
inline long long parseEnvInt(const char* name, const std::string& value, long long lo, long long hi) {
  long long v = 0;
  const char* b = value.data();
  const char* e = b + value.size();
  auto [p, ec] = std::from_chars(b, e, v);
  if (ec != std::errc() || p != e)
    throw Error(std::string(name) + "=\"" + value + "\" is not a decimal integer; fix the launcher's environment");
  if (v < lo || v > hi)
    throw Error(std::string(name) + "=" + value + " is out of range (expected " + std::to_string(lo) + ".." +
                std::to_string(hi) + "); fix the launcher's environment");
  return v;
}

inline uint64_t bootstrapTimeoutNs(const BootstrapConfig& cfg) {
  if (auto v = envVar("GIN_BOOTSTRAP_TIMEOUT_MS")) {
    const long long ms =
        parseEnvInt("GIN_BOOTSTRAP_TIMEOUT_MS", *v, 1, static_cast<long long>(kMaxTimeoutNs / 1'000'000));
    return static_cast<uint64_t>(ms) * 1'000'000ull;
  }
  if (cfg.timeoutNs == 0)
    throw Error(
        "BootstrapConfig::timeoutNs is 0; every bootstrap wait needs a positive deadline "
        "(default 60 s, or set GIN_BOOTSTRAP_TIMEOUT_MS)");
  return std::min(cfg.timeoutNs, kMaxTimeoutNs);
}

// "rank 2" / "ranks 2,3,7"; long lists are cut so a 4096-rank failure stays readable.
inline std::string rankList(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  const size_t shown = std::min<size_t>(ranks.size(), 16);
  for (size_t i = 0; i < shown; ++i) s += (i ? "," : "") + std::to_string(ranks[i]);
  if (shown < ranks.size()) s += ",... (" + std::to_string(ranks.size() - shown) + " more)";
  return s;
}

enum FrameOp : uint32_t { kHello = 1, kWelcome, kAllGather, kBroadcast, kBarrier, kAbort };

inline std::string opText(uint32_t op) {
  switch (op) {
    case kHello: return "hello";
    case kWelcome: return "welcome";
    case kAllGather: return "allGather";
    case kBroadcast: return "broadcast";
    case kBarrier: return "barrier";
    case kAbort: return "abort";
  }
  return "op " + std::to_string(op);
}

// One collective call, as it is named in messages: "broadcast #4 (bytes 16, root 1)".
inline std::string callText(uint32_t op, uint64_t seq, uint64_t size, int root) {
  std::string s = opText(op) + " #" + std::to_string(seq);
  if (op == kAllGather) s += " (bytesPerRank " + std::to_string(size) + ")";
  if (op == kBroadcast) s += " (bytes " + std::to_string(size) + ", root " + std::to_string(root) + ")";
  return s;
}

inline void checkBuffer(const void* data, size_t bytes, const char* what) {
  if (data == nullptr && bytes != 0)
    throw Error(std::string(what) + ": data is null but " + std::to_string(bytes) +
                " bytes were requested; pass a buffer of that size");
}

inline size_t gatherBytes(size_t bytesPerRank, int nRanks) {
  if (bytesPerRank != 0 && static_cast<size_t>(nRanks) > SIZE_MAX / bytesPerRank)
    throw Error("allGather: bytesPerRank " + std::to_string(bytesPerRank) + " times " + std::to_string(nRanks) +
                " ranks overflows size_t");
  return bytesPerRank * static_cast<size_t>(nRanks);
}

// ---- in-process state ------------------------------------------------------

// Every rank publishes one slot per phase. Collective k is phase 2k-1 (arrive,
// publish the buffer) and 2k (done copying, so buffers may be reused); a rank
// waits until every slot has reached the phase. Per-rank phases instead of one
// shared counter let a fast rank start the next collective while a slow one is
// still leaving the last, without either reading the other's newer slot.
struct InProcessState {
  struct Slot {
    uint64_t phase = 0;
    uint32_t op = 0;
    uint64_t seq = 0;
    uint64_t size = 0;
    int root = -1;
    void* data = nullptr;
  };
  InProcessState(int n, uint64_t t) : nRanks(n), timeoutNs(t), slots(static_cast<size_t>(n)) {}
  const int nRanks;
  const uint64_t timeoutNs;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Slot> slots;
  std::string failure;  // set once the group is broken; every later call throws it
};

// ---- sockets -----------------------------------------------------------------

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

inline int msUntil(Clock::time_point deadline) {
  const auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  // Round up so poll() never returns a hair before the deadline and spins.
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<int64_t>(ms, INT_MAX));
}

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

// Every message on the wire. Host byte order: the ranks of one job share an
// architecture, and a foreign one shows up as a magic mismatch, not as garbage.
struct FrameHeader {
  uint32_t magic;
  uint32_t op;
  uint64_t seq;     // collective number, 1-based, the same on every rank
  uint64_t length;  // payload bytes that follow
  uint64_t size;    // the call's size argument (bytesPerRank, bytes, or nRanks for hello)
  int32_t sender;
  int32_t root;  // broadcast root; -1 otherwise
};
static_assert(sizeof(FrameHeader) == 40);
inline constexpr uint32_t kFrameMagic = 0x424e4947;  // "GINB" in memory on little-endian hosts
inline constexpr uint64_t kMaxAbortText = 64 * 1024;

inline std::string hexText(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

inline std::string frameText(const FrameHeader& h) {
  return "{magic " + hexText(h.magic) + ", op " + opText(h.op) + ", seq " + std::to_string(h.seq) + ", length " +
         std::to_string(h.length) + ", size " + std::to_string(h.size) + ", sender " + std::to_string(h.sender) +
         ", root " + std::to_string(h.root) + "}";
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

inline constexpr const char* kUniqueIdPrefix = "gin-bootstrap-v1 ";

}  // namespace detail

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

// torchrun: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
// Slurm: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE (optional);
//   address from MASTER_ADDR or SLURM_LAUNCH_NODE_IPADDR; port from MASTER_PORT or 20000 + (SLURM_JOB_ID % 20000).
// Open MPI: OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_SIZE;
//   address/port from MASTER_ADDR/MASTER_PORT.
// gin's own: GIN_RANK, GIN_NRANKS, GIN_LOCAL_RANK, GIN_LOCAL_SIZE; MASTER_ADDR/MASTER_PORT.
// Precedence: torchrun vars (RANK+WORLD_SIZE) > Slurm > Open MPI > gin > none ("single": rank 0 of 1).
// Malformed numbers (e.g. RANK=abc, RANK >= WORLD_SIZE) -> gin::Error naming the variable and value.
// A job of one rank needs no rendezvous, so MASTER_ADDR/MASTER_PORT are only required when nRanks > 1.
inline LaunchInfo detectLaunch() {
  using detail::envVar;
  LaunchInfo info;
  auto num = [](const char* name, const std::string& v, long long lo, long long hi) {
    return static_cast<int>(detail::parseEnvInt(name, v, lo, hi));
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
  auto masterPort = [&]() -> std::optional<int> {
    if (auto p = envVar("MASTER_PORT")) return num("MASTER_PORT", *p, 1, 65535);
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
    info.masterPort = masterPort().value_or(0);
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
      info.masterPort = 20000 + static_cast<int>(detail::parseEnvInt("SLURM_JOB_ID", *job, 0, LLONG_MAX) % 20000);
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

class Bootstrap {  // abstract; one object per rank; not thread-safe per object
 public:
  virtual ~Bootstrap() = default;
  virtual int rank() const = 0;
  virtual int nRanks() const = 0;
  // Collective. `data` holds nRanks slots of `bytesPerRank`; this rank's slot
  // (data + rank*bytesPerRank) is its input; on return every slot is filled.
  virtual void allGather(void* data, size_t bytesPerRank) = 0;
  // Collective. Copies root's `bytes` at data to every rank's data.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  virtual void barrier() = 0;
  // Same-process ranks share one address space (InProcess); TCP ranks may or may not.
  virtual bool sameProcessGroup() const = 0;  // true for InProcessBootstrap
  // The IPv4 address of this process on the path to the other ranks, for
  // network wires to advertise; empty when the bootstrap does not know one.
  virtual std::string localAddress() const { return {}; }
};

class InProcessGroup;

// One rank of an InProcessGroup. A failure (timeout, mismatched calls, bad
// arguments) breaks the whole group so the other threads fail at once with the
// same message instead of each waiting out its own timeout.
class InProcessBootstrap final : public Bootstrap {
 public:
  int rank() const override { return rank_; }
  int nRanks() const override { return s_->nRanks; }
  bool sameProcessGroup() const override { return true; }

  void allGather(void* data, size_t bytesPerRank) override {
    const size_t n = bytesPerRank;
    try {
      detail::gatherBytes(n, s_->nRanks);
      detail::checkBuffer(data, n, "allGather");
    } catch (const Error& e) {
      breakGroup(e.what());
    }
    collective(detail::kAllGather, n, -1, data, [&](const std::vector<void*>& peers) {
      char* mine = static_cast<char*>(data);
      for (int p = 0; p < s_->nRanks; ++p) {
        const char* src = static_cast<const char*>(peers[static_cast<size_t>(p)]) + p * n;
        // Threads may share one buffer; then the slot is already in place.
        if (p != rank_ && src != mine + p * n && n != 0) std::memcpy(mine + p * n, src, n);
      }
    });
  }

  void broadcast(void* data, size_t bytes, int root) override {
    try {
      if (root < 0 || root >= s_->nRanks)
        throw Error("broadcast: root " + std::to_string(root) + " is outside 0.." + std::to_string(s_->nRanks - 1));
      detail::checkBuffer(data, bytes, "broadcast");
    } catch (const Error& e) {
      breakGroup(e.what());
    }
    collective(detail::kBroadcast, bytes, root, data, [&](const std::vector<void*>& peers) {
      const void* src = peers[static_cast<size_t>(root)];
      if (rank_ != root && src != data && bytes != 0) std::memcpy(data, src, bytes);
    });
  }

  void barrier() override {
    collective(detail::kBarrier, 0, -1, nullptr, [](const std::vector<void*>&) {});
  }

 private:
  friend class InProcessGroup;
  InProcessBootstrap(detail::InProcessState* s, int rank) : s_(s), rank_(rank) {}

  [[noreturn]] void breakGroup(const std::string& why) {
    std::lock_guard lk(s_->mu);
    if (s_->failure.empty()) {
      // Error's text already carries "gin: "; keep one.
      std::string w = why.rfind("gin: ", 0) == 0 ? why.substr(5) : why;
      s_->failure = "in-process bootstrap rank " + std::to_string(rank_) + ": " + w;
    }
    s_->cv.notify_all();
    throw Error(s_->failure);
  }

  // Waits until every rank has published `phase`; the group's failure (or our
  // own timeout, which becomes it) ends the wait for everyone.
  void waitPhase(std::unique_lock<std::mutex>& lk, uint64_t phase, const std::string& call, const char* verb) {
    const auto deadline = detail::deadlineAfter(s_->timeoutNs);
    auto missing = [&] {
      std::vector<int> m;
      for (int p = 0; p < s_->nRanks; ++p)
        if (s_->slots[static_cast<size_t>(p)].phase < phase) m.push_back(p);
      return m;
    };
    for (;;) {
      const auto m = missing();
      if (m.empty()) return;  // checked first: a collective that completed is not failed afterwards
      if (!s_->failure.empty()) throw Error(s_->failure);
      if (s_->cv.wait_until(lk, deadline) == std::cv_status::timeout && Clock::now() >= deadline) {
        const auto late = missing();
        if (late.empty()) return;
        if (s_->failure.empty())
          s_->failure = "in-process bootstrap: " + detail::rankList(late) + " of " + std::to_string(s_->nRanks) +
                        " did not " + verb + " " + call + " within " + detail::secondsText(s_->timeoutNs) + " (rank " +
                        std::to_string(rank_) +
                        " gave up waiting); check that every thread calls the same collectives in "
                        "the same order, or raise BootstrapConfig::timeoutNs / GIN_BOOTSTRAP_TIMEOUT_MS";
        s_->cv.notify_all();
        throw Error(s_->failure);
      }
    }
  }

  template <class Copy>
  void collective(uint32_t op, uint64_t size, int root, void* data, Copy&& copy) {
    std::unique_lock lk(s_->mu);
    if (!s_->failure.empty()) throw Error(s_->failure);
    const uint64_t seq = ++seq_;
    const std::string call = detail::callText(op, seq, size, root);
    auto& mine = s_->slots[static_cast<size_t>(rank_)];
    mine.op = op;
    mine.seq = seq;
    mine.size = size;
    mine.root = root;
    mine.data = data;
    mine.phase = 2 * seq - 1;
    s_->cv.notify_all();
    waitPhase(lk, 2 * seq - 1, call, "reach");

    // Every rank compares against rank 0 and so reaches the same verdict and message.
    const auto& ref = s_->slots[0];
    for (int p = 1; p < s_->nRanks; ++p) {
      const auto& o = s_->slots[static_cast<size_t>(p)];
      if (o.op != ref.op || o.size != ref.size || o.root != ref.root) {
        if (s_->failure.empty())
          s_->failure = "in-process bootstrap: rank " + std::to_string(p) + " called " +
                        detail::callText(o.op, o.seq, o.size, o.root) + " while rank 0 called " +
                        detail::callText(ref.op, ref.seq, ref.size, ref.root) +
                        "; every rank must call the same collectives in the same order with the same sizes";
        s_->cv.notify_all();
        throw Error(s_->failure);
      }
    }
    std::vector<void*> peers(static_cast<size_t>(s_->nRanks));
    for (int p = 0; p < s_->nRanks; ++p) peers[static_cast<size_t>(p)] = s_->slots[static_cast<size_t>(p)].data;
    // Peers' buffers stay put until everyone reaches phase 2*seq, so copying unlocked is safe.
    lk.unlock();
    copy(peers);
    lk.lock();
    mine.phase = 2 * seq;
    s_->cv.notify_all();
    waitPhase(lk, 2 * seq, call, "finish");
  }

  using Clock = detail::Clock;
  detail::InProcessState* s_;
  int rank_;
  uint64_t seq_ = 0;
};

// N threads of one process as N ranks. Make the group once, hand one
// Bootstrap to each thread (group.rank(i)).
class InProcessGroup {
 public:
  explicit InProcessGroup(int nRanks, BootstrapConfig cfg = {}) {
    if (nRanks < 1 || nRanks > detail::kMaxRanks)
      throw Error("InProcessGroup: nRanks is " + std::to_string(nRanks) + "; it must be at least 1");
    state_ = std::make_unique<detail::InProcessState>(nRanks, detail::bootstrapTimeoutNs(cfg));
    for (int r = 0; r < nRanks; ++r) ranks_.emplace_back(new InProcessBootstrap(state_.get(), r));
  }
  Bootstrap& rank(int r) {  // the Bootstrap for rank r (owned by the group)
    if (r < 0 || r >= nRanks())
      throw Error("InProcessGroup::rank(" + std::to_string(r) + "): the group has ranks 0.." +
                  std::to_string(nRanks() - 1));
    return *ranks_[static_cast<size_t>(r)];
  }
  int nRanks() const { return state_->nRanks; }

 private:
  std::unique_ptr<detail::InProcessState> state_;
  std::vector<std::unique_ptr<InProcessBootstrap>> ranks_;
};

// 128 opaque bytes like ncclUniqueId: the address and port of the rendezvous.
struct UniqueId {
  char bytes[128];
};

// Picks this host's address (first non-loopback IPv4, else 127.0.0.1; env GIN_BOOTSTRAP_ADDR overrides)
// and a free TCP port (bind to port 0, read it back). Call on one process and ship the bytes to the others.
inline UniqueId makeUniqueId() {
  const auto envAddr = detail::envVar("GIN_BOOTSTRAP_ADDR");
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

  detail::IoResult sendFrame(int fd, const FrameHeader& h, const void* payload, Clock::time_point deadline) {
    auto r = detail::sendAll(fd, &h, sizeof h, deadline);
    if (r.kind == detail::Io::Ok && h.length > 0) r = detail::sendAll(fd, payload, h.length, deadline);
    return r;
  }

  // Best effort: the peer learns why instead of running into its own timeout.
  void sendAbort(int fd, const std::string& why) {
    const std::string text = why.substr(0, detail::kMaxAbortText);
    const auto deadline = detail::deadlineAfter(std::min<uint64_t>(timeoutNs_, 1'000'000'000ull));
    sendFrame(fd, header(detail::kAbort, seq_, text.size(), 0, -1), text.data(), deadline);
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

  std::string readAbortText(int fd, uint64_t length, Clock::time_point deadline) {
    if (length > detail::kMaxAbortText) return "(abort message of " + std::to_string(length) + " bytes, not read)";
    std::string text(length, '\0');
    if (detail::recvAll(fd, text.data(), length, deadline).kind != detail::Io::Ok) return "(abort message cut short)";
    return text;
  }

  // When rank 0 gives up it sends its reason and exits; our next send may then
  // hit a reset connection before we read that reason, which is still queued.
  std::string abortReasonIfAny(int fd) {
    FrameHeader h{};
    const auto deadline = detail::deadlineAfter(std::min<uint64_t>(timeoutNs_, 200'000'000ull));
    if (detail::recvAll(fd, &h, sizeof h, deadline).kind != detail::Io::Ok) return {};
    if (h.magic != detail::kFrameMagic || h.op != detail::kAbort) return {};
    return readAbortText(fd, h.length, deadline);
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
      const auto r = sendFrame(peers_[static_cast<size_t>(p)].get(),
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
    const auto sent = sendFrame(root_.get(), hello, nullptr, detail::deadlineAfter(timeoutNs_));
    if (sent.kind != detail::Io::Ok) {
      if (auto why = abortReasonIfAny(root_.get()); !why.empty())
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
      fail("rendezvous at " + where() + " aborted by rank 0: " + readAbortText(root_.get(), h.length, replyDeadline));
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
    if (h.op == detail::kAbort) failAll(who + " failed in " + readAbortText(fd, h.length, deadline));
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
          sendFrame(peers_[static_cast<size_t>(p)].get(), header(op, seq, len, size, root), payload, deadline);
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
      if (auto why = abortReasonIfAny(fd); !why.empty()) fail(what + " aborted by rank 0: " + why);
      fail("lost the connection to rank 0 at " + where() + " during " + what + " (" + detail::errnoText(r.err) +
           "); rank 0's process exited or crashed: look at its output");
    };
    if (auto r = sendFrame(fd, header(op, seq, len, size, root), payload, detail::deadlineAfter(timeoutNs_));
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
      fail(what + " aborted by rank 0: " + readAbortText(fd, h.length, deadline));
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
