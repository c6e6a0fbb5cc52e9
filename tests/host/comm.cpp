// Tests of gin/host/comm.hpp: construction, teams, windows (alloc, register,
// deregister), raw lsa pointers and argument errors, on CPU ranks.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <cstring>

#include "../common/ranks.hpp"

using namespace gin;
using Catch::Matchers::ContainsSubstring;
using gintest::expect;
using gintest::runRanks;

TEST_CASE("a communicator of N CPU ranks is one lsa team and hands out a complete DevComm", "[comm]") {
  for (int n : {1, 2, 7}) {
    REQUIRE_NOTHROW(runRanks(n, [n](Comm& comm) {
      const DevComm& dc = comm.devComm();
      expect(!comm.onGpu(), "CPU config ran on a GPU");
      expect(dc.nRanks == n && dc.lsaSize == n && dc.lsaRank == comm.rank() && dc.railSize == 1, "topology");
      expect(dc.nContexts == 4, "default four contexts");
      for (int r = 0; r < n; ++r) expect(comm.transportTo(r) == Transport::Lsa, "lsa to every peer");
      expect(dc.signals && dc.counters && dc.signalShadows && dc.error && dc.abortFlag, "pointers");
    }));
  }
}

TEST_CASE("team rank translation: world, lsa and rail", "[team]") {
  DevComm c{};
  c.rank = 13;
  c.nRanks = 16;
  c.lsaSize = 4;
  c.lsaRank = 1;
  c.railSize = 4;
  c.railRank = 3;
  const Team world = teamWorld(c), lsa = teamLsa(c), rail = teamRail(c);
  CHECK(teamToWorld(c, world, 5) == 5);
  CHECK(teamToWorld(c, lsa, 0) == 12);
  CHECK(teamToWorld(c, lsa, 3) == 15);
  CHECK(teamToWorld(c, rail, 0) == 1);
  CHECK(teamToWorld(c, rail, 2) == 9);
  CHECK(worldToTeam(c, rail, 5) == 1);
  CHECK(worldToTeam(c, rail, 6) == -1);
  CHECK(worldToTeam(c, lsa, 11) == -1);
  CHECK(teamToLsa(c, world, 14) == 2);
  CHECK(teamToLsa(c, world, 3) == -1);
  CHECK(lsaIndexOf(c, 13) == 1);
}

TEST_CASE("registerWindow shares the user's buffer; lsaPointer and peerPointer reach each peer's copy", "[window]") {
  REQUIRE_NOTHROW(runRanks(4, [](Comm& comm) {
    const DevComm dc = comm.devComm();
    const int n = comm.nRanks(), me = comm.rank();
    std::vector<uint32_t> mine(1024, 0);
    Window w = comm.registerWindow(mine.data(), mine.size() * 4);
    expect(comm.localPointer(w) == mine.data(), "localPointer is the user's buffer");
    expect(localPointer(w, 8) == reinterpret_cast<char*>(mine.data()) + 8, "device localPointer");
    for (int p = 0; p < n; ++p) {
      auto* dst = static_cast<uint32_t*>(peerPointer(dc, teamLsa(dc), p, w, 4 * size_t(me)));
      expect(dst != nullptr, "peer reachable");
      volatileStore(dst, uint32_t(0xC0DE0000u + unsigned(me)));
    }
    comm.bootstrap().barrier();
    for (int p = 0; p < n; ++p) expect(mine[size_t(p)] == 0xC0DE0000u + unsigned(p), "raw store from a peer");
    // The host's lsaPointer is the device one, and bad arguments are refused.
    for (int p = 0; p < n; ++p)
      expect(comm.lsaPointer(w, 12, p) == lsaPointer(w, 12, p), "host lsaPointer differs from the device one");
    bool threw = false;
    try {
      (void)comm.lsaPointer(w, 0, n);
    } catch (const Error& e) {
      threw = std::string(e.what()).find("lsa peer") != std::string::npos;
    }
    expect(threw, "lsaPointer accepted a peer outside the lsa team");
    comm.bootstrap().barrier();
    // memAlloc'd memory registers too.
    void* m = comm.memAlloc(4096);
    Window w2 = comm.registerWindow(static_cast<char*>(m) + 64, 1024);
    expect(comm.windowBytes(w2) == 1024, "window size");
    comm.deregisterWindow(w2);
    comm.memFree(m);
    comm.deregisterWindow(w);
  }));
}

TEST_CASE("bad window arguments give every rank a clear error instead of a hang", "[window][errors]") {
  auto errorsOf = [](int n, const std::function<void(Comm&)>& body) {
    std::vector<std::string> msgs(static_cast<size_t>(n));
    runRanks(n, [&](Comm& comm) {
      try {
        body(comm);
      } catch (const Error& e) {
        msgs[size_t(comm.rank())] = e.what();
      }
    });
    return msgs;
  };
  for (auto& m : errorsOf(3, [](Comm& c) { c.allocWindow(0); }))
    CHECK_THAT(m, ContainsSubstring("allocWindow") && ContainsSubstring("greater than 0"));
  for (auto& m : errorsOf(3, [](Comm& c) { c.allocWindow(c.rank() == 2 ? 8192 : 4096); }))
    CHECK_THAT(m, ContainsSubstring("disagree") && ContainsSubstring("rank 2 passed 8192"));
  for (auto& m : errorsOf(2, [](Comm& c) {
         std::vector<char> b(64);
         c.registerWindow(c.rank() == 1 ? nullptr : b.data(), 64);
       }))
    CHECK_THAT(m, ContainsSubstring("registerWindow") && ContainsSubstring("rank 1") && ContainsSubstring("null"));
  for (auto& m : errorsOf(2, [](Comm& c) {
         Window w = c.allocWindow(64);
         c.deregisterWindow(w);
         c.deregisterWindow(w);
       }))
    CHECK_THAT(m, ContainsSubstring("not registered"));
  for (auto& m : errorsOf(2, [](Comm& c) {
         Window w = c.allocWindow(64);
         c.deregisterWindow(w);
         (void)c.localPointer(w);
       }))
    CHECK_THAT(m, ContainsSubstring("localPointer") && ContainsSubstring("not registered"));
  for (auto& m : errorsOf(1, [](Comm& c) { c.memFree(reinterpret_cast<void*>(0x1234)); }))
    CHECK_THAT(m, ContainsSubstring("memFree"));
  for (auto& m : errorsOf(1, [](Comm& c) {
         Window w = c.allocWindow(64);
         (void)c.localPointer(w, 65);
       }))
    CHECK_THAT(m, ContainsSubstring("past the window"));
}

TEST_CASE("windows and the communicator can be released in any order", "[window][lifetime]") {
  REQUIRE_NOTHROW(runRanks(3, [](Comm& comm) {
    Window a = comm.allocWindow(1000), b = comm.allocWindow(2000), c = comm.allocWindow(3000);
    comm.deregisterWindow(b);
    comm.deregisterWindow(a);
    (void)c;  // left for the communicator's destructor
  }));
  REQUIRE_NOTHROW(runRanks(2, [](Comm& comm) {
    for (int i = 0; i < 50; ++i) comm.deregisterWindow(comm.allocWindow(size_t(4096 + i)));
  }));
}

TEST_CASE("bad CommConfig values are rejected with the values named", "[comm][errors]") {
  CommConfig cfg = gintest::cpuConfig();
  cfg.nContexts = 0;
  REQUIRE_THROWS_WITH(runRanks(
                          1, [](Comm&) {}, cfg),
                      ContainsSubstring("nContexts"));
}
