// Tests of gin/host/comm.hpp with one rank per process: TCP bootstrap on
// 127.0.0.1, windows in POSIX shared memory, lsa put/signal and barriers
// across processes, directly (lsa), through the proxy engine and over ibgda
// (soft NIC).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch_test_macros.hpp>
#include <cstdio>
#include <cstring>

#include "../common/processes.hpp"
#include "../common/ranks.hpp"
#include "gin/host/test_access.hpp"

using namespace gin;
using gin::test::CommAccess;

namespace {
using gintest::forkRanks;  // tests/common/processes.hpp
}  // namespace

namespace {
// One rank of the two-process test; nonzero: which check failed.
int twoProcessRank(const UniqueId& id, int r, CommConfig cfg) {
  TcpBootstrap bs(id, r, 2);
  Comm comm(bs, cfg);
  const DevComm dc = comm.devComm();
  const int peer = 1 - r;
  if (comm.lsaSize() != 2) return 10;
  const bool proxy = cfg.transport == TransportChoice::Proxy;
  const bool ibgda = cfg.transport == TransportChoice::Ibgda;
  if (comm.transportTo(peer) != (proxy ? Transport::Proxy : ibgda ? Transport::Ibgda : Transport::Lsa)) return 16;
  constexpr size_t kBytes = 1 << 20;
  Window w = comm.allocWindow(2 * kBytes);
  auto* base = static_cast<uint8_t*>(comm.localPointer(w));
  for (size_t i = 0; i < kBytes; ++i) base[i] = gintest::pattern(5, r, i);
  Net net(dc, 0);
  for (int round = 1; round <= 50; ++round) {
    net.put(teamWorld(dc), peer, w, kBytes, w, 0, kBytes, SignalInc{0});
    if (!net.waitSignal(CoopThread{}, 0, uint64_t(round))) return 11;
    for (size_t i = 0; i < kBytes; i += 4093)
      if (base[kBytes + i] != gintest::pattern(5, peer, i)) return 12;
    LsaBarrierSession<CoopThread> bar(CoopThread{}, dc, uint32_t(round % 8));
    if (!bar.sync(CoopThread{})) return 13;
  }
  void* m = comm.memAlloc(4096);
  Window u = comm.registerWindow(m, 4096);
  net.putValue(teamWorld(dc), peer, u, 8, uint64_t(0xABCD0000 + r), SignalInc{1});
  if (!net.waitSignal(CoopThread{}, 1, 1)) return 14;
  if (static_cast<uint64_t*>(m)[1] != uint64_t(0xABCD0000 + peer)) return 15;
  if (!net.flush(CoopThread{})) return 17;
  // Over the proxy every operation went through this process's engine, into
  // the peer process's shared memory.
  if (proxy && (!CommAccess::proxyEngine(comm) || CommAccess::proxyEngine(comm)->executed() != 51)) return 18;
  // Over ibgda this process's soft NIC executed every WQE (a payload and a
  // signal per operation) into the peer process's shared memory.
  if (ibgda && (!CommAccess::ibgda(comm) || CommAccess::ibgda(comm)->nic().executed() != 102)) return 19;
  comm.deregisterWindow(u);
  comm.memFree(m);
  comm.check();
  return 0;
}
}  // namespace

TEST_CASE("two processes over TCP: windows in shared memory, put+signal, barrier and memAlloc windows",
          "[comm][processes]") {
  const UniqueId id = makeUniqueId();
  auto status = forkRanks(2, [&](int r) { return twoProcessRank(id, r, gintest::cpuConfig()); });
  CHECK(status == std::vector<int>{0, 0});
}

TEST_CASE("two processes, proxy transport forced: the local wire writes into the peer process's shared memory",
          "[comm][processes][proxy]") {
  const UniqueId id = makeUniqueId();
  CommConfig cfg = gintest::cpuConfig();
  cfg.transport = TransportChoice::Proxy;
  auto status = forkRanks(2, [&](int r) { return twoProcessRank(id, r, cfg); });
  CHECK(status == std::vector<int>{0, 0});
}

TEST_CASE("two processes, ibgda forced: the soft NIC writes into the peer process's shared memory",
          "[comm][processes][ibgda]") {
  const UniqueId id = makeUniqueId();
  CommConfig cfg = gintest::cpuConfig();
  cfg.transport = TransportChoice::Ibgda;
  cfg.ibgda.device = IbgdaConfig::Device::Soft;
  auto status = forkRanks(2, [&](int r) { return twoProcessRank(id, r, cfg); });
  CHECK(status == std::vector<int>{0, 0});
}

TEST_CASE(
    "two processes: heap memory on one rank cannot be registered across processes; both ranks get an error naming "
    "it and saying what to use",
    "[comm][processes][errors]") {
  const UniqueId id = makeUniqueId();
  auto status = forkRanks(2, [&](int r) {
    BootstrapConfig bcfg;
    bcfg.timeoutNs = 3'000'000'000ull;
    TcpBootstrap bs(id, r, 2, bcfg);
    Comm comm(bs, gintest::cpuConfig());
    std::vector<char> heap(4096);
    void* shared = comm.memAlloc(4096);
    try {
      comm.registerWindow(r == 0 ? static_cast<void*>(heap.data()) : shared, 4096);
    } catch (const Error& e) {
      return std::strstr(e.what(), "memAlloc") && std::strstr(e.what(), "rank 0 registered") ? 0 : 20;
    }
    return 21;
  });
  CHECK(status == std::vector<int>{0, 0});
}
