// Tests of gin/device/net.hpp signal reads, waits, shadows and resets, and of
// gin/core/rolling.hpp, on CPU ranks.
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include "../common/net_checks.hpp"

using namespace gin;
using gintest::expect;
using gintest::runRanks;

TEST_CASE("rolling comparison keeps x < x+1 across wrap-around at every width", "[rolling]") {
  for (int bits : {8, 32, 56, 64}) {
    const uint64_t m = rollingMask(bits);
    for (uint64_t x : {uint64_t(0), m - 1, m, m / 2, m / 2 + 1, uint64_t(12345) & m}) {
      CAPTURE(bits, x);
      REQUIRE(rollingLessEqual(x, x, bits));
      REQUIRE(rollingLessEqual(x, (x + 1) & m, bits));
      REQUIRE_FALSE(rollingLessEqual((x + 1) & m, x, bits));
      REQUIRE(rollingLessEqual(x, (x + m / 2) & m, bits));
      REQUIRE_FALSE(rollingLessEqual(x, (x + m / 2 + 1) & m, bits));
      REQUIRE(rollingLess(x, (x + 1) & m, bits));
      REQUIRE_FALSE(rollingLess(x, x, bits));
    }
  }
}

TEST_CASE("signals near 2^64 wrap and waits still succeed", "[net][signal][wrap]") {
  REQUIRE_NOTHROW(runRanks(2, [](Comm& comm) {
    const DevComm dc = comm.devComm();
    const int me = comm.rank(), peer = 1 - me;
    Net net(dc, 0);
    const Team world = teamWorld(dc);
    const uint64_t start = ~uint64_t(0) - 5;  // six increments from wrapping
    net.signal(world, peer, SignalSet{10, start});
    // Not waitSignal: the 0 the signal held is 6 ahead of `start` on the
    // rolling scale, so that wait would return before the Set landed.
    expect(gintest::eventually(comm, [&] { return net.readSignal(10) == start; }), "wait for the set value");
    comm.bootstrap().barrier();
    for (int i = 0; i < 20; ++i) net.signal(world, peer, SignalInc{10});
    const uint64_t target = start + 20;  // wrapped: 14
    expect(target == 14, "test arithmetic");
    expect(net.waitSignal(CoopThread{}, 10, target), "wait across the wrap");
    expect(net.readSignal(10) == 14, "value after wrap");
    // A narrower width compares only the low bits.
    expect(net.readSignal(10, 4) == (14 & 15), "readSignal with 4 bits");
    comm.check();
  }));
}

TEST_CASE("counters near 2^56 wrap at 56 bits", "[net][counter][wrap]") {
  REQUIRE_NOTHROW(runRanks(1, [](Comm& comm) {
    const DevComm dc = comm.devComm();
    Net net(dc, 0);
    Window w = comm.allocWindow(64);
    dc.counters[2] = (uint64_t(1) << 56) - 3;
    for (int i = 0; i < 5; ++i) net.put(teamWorld(dc), 0, w, 0, w, 8, 8, None{}, CounterInc{2});
    expect(net.readCounter(2) == 2, "56-bit counter wrapped to 2");
    expect(net.waitCounter(CoopThread{}, 2, (uint64_t(1) << 56) - 1), "wait across the counter wrap");
    comm.check();
  }));
}

TEST_CASE("signal shadows: increase, meet and follow", "[net][signal][shadow]") {
  REQUIRE_NOTHROW(runRanks(2, [](Comm& comm) {
    const DevComm dc = comm.devComm();
    const int me = comm.rank(), peer = 1 - me;
    Net net(dc, 1);
    const Team world = teamWorld(dc);
    expect(*net.getSignalShadowPtr(5) == 0, "shadow starts at zero");
    net.increaseSignalShadow(5, 3);
    expect(*net.getSignalShadowPtr(5) == 3, "increaseSignalShadow");
    for (int i = 0; i < 3; ++i) net.signal(world, peer, SignalInc{5});
    expect(net.waitSignalMeetShadow(CoopThread{}, 5), "meet shadow");
    comm.bootstrap().barrier();
    net.signal(world, peer, SignalAdd{5, 4});
    uint64_t before = 0, delta = 0;
    expect(net.waitSignalFollowShadow(CoopThread{}, 5, uint64_t(2), &before, &delta), "follow shadow");
    expect(before == 3 && delta == 4, "follow: before " + std::to_string(before) + " delta " + std::to_string(delta));
    expect(*net.getSignalShadowPtr(5) == 7, "shadow moved to the value seen");
    comm.bootstrap().barrier();
    net.resetSignal(5);
    expect(net.readSignal(5) == 0 && *net.getSignalShadowPtr(5) == 0, "resetSignal clears signal and shadow");
    comm.check();
  }));
}

TEST_CASE("many contexts are independent and each is usable", "[net][contexts]") {
  CommConfig cfg = gintest::cpuConfig();
  cfg.nContexts = 64;
  cfg.nSignals = 64;
  REQUIRE_NOTHROW(runRanks(
      3,
      [](Comm& comm) {
        const DevComm dc = comm.devComm();
        const int n = comm.nRanks();
        expect(dc.nContexts == 64, "context count");
        for (int c = 0; c < dc.nContexts; ++c) {
          Net net(dc, c);
          for (int p = 0; p < n; ++p) net.signal(teamWorld(dc), p, SignalInc{uint32_t(c)});
        }
        for (int c = 0; c < dc.nContexts; ++c) {
          Net net(dc, c);
          expect(net.waitSignal(CoopThread{}, uint32_t(c), uint64_t(n)), "context " + std::to_string(c));
        }
        comm.check();
      },
      cfg));
}
