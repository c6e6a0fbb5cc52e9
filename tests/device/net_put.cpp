// Tests of gin/device/net.hpp put/putValue/signal/flush over the lsa transport,
// on CPU ranks (threads of this process).
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <cstring>

#include "../common/net_checks.hpp"

using namespace gin;
using gintest::expect;
using gintest::pattern;
using gintest::runRanks;

namespace {

// Every rank puts `bytes` to every peer on every context with SignalInc and
// CounterInc; each receiver checks each sender's block byte for byte and the
// poison around it (tests/common/net_checks.hpp).
using gintest::allToAllPut;
}  // namespace

TEST_CASE("put delivers every byte to every peer and signals after the payload, any size and alignment", "[net][put]") {
  const int n = GENERATE(1, 2, 3, 5, 8);
  const size_t bytes = GENERATE(size_t(0), size_t(1), size_t(7), size_t(16), size_t(4099), size_t(65536 + 13));
  const size_t srcMis = GENERATE(size_t(0), size_t(3));
  const size_t dstMis = GENERATE(size_t(0), size_t(5));
  CAPTURE(n, bytes, srcMis, dstMis);
  REQUIRE_NOTHROW(runRanks(n, [&](Comm& comm) { allToAllPut(comm, bytes, srcMis, dstMis, 77 + bytes); }));
}

TEST_CASE("put with SymPtr moves nElts typed elements", "[net][put]") {
  REQUIRE_NOTHROW(runRanks(3, [](Comm& comm) {
    const DevComm dc = comm.devComm();
    const int n = comm.nRanks(), me = comm.rank();
    constexpr size_t kN = 1000;
    Window w = comm.allocWindow(sizeof(double) * kN * size_t(n + 1));
    SymPtr<double> base(w, 0);
    double* local = base.local();
    for (size_t i = 0; i < kN; ++i) local[i] = me * 1e6 + double(i);
    comm.bootstrap().barrier();
    Net net(dc, 1);
    const int next = (me + 1) % n;
    net.put(teamWorld(dc), next, base + int64_t(kN) * (me + 1), base, kN, SignalAdd{3, 5});
    expect(net.waitSignal(CoopThread{}, 3, 5), "signal never reached 5");
    const int prev = (me + n - 1) % n;
    const double* got = (base + int64_t(kN) * (prev + 1)).local();
    for (size_t i = 0; i < kN; ++i) expect(got[i] == prev * 1e6 + double(i), "typed element mismatch");
    comm.check();
  }));
}

TEST_CASE("putValue writes 1, 2, 4 and 8 byte values inline and orders the signal after them", "[net][putValue]") {
  REQUIRE_NOTHROW(runRanks(4, [](Comm& comm) {
    gintest::putValueWidths(comm, comm.allocWindow(64 * size_t(comm.nRanks())), 0);
    comm.check();
  }));
}

TEST_CASE("signal alone: SignalInc, SignalAdd and SignalSet reach the peer's signal word", "[net][signal]") {
  REQUIRE_NOTHROW(runRanks(5, [](Comm& comm) {
    const DevComm dc = comm.devComm();
    const int n = comm.nRanks(), me = comm.rank();
    Net net(dc, 2);
    const Team world = teamWorld(dc);
    for (int p = 0; p < n; ++p) {
      net.signal(world, p, SignalInc{0});
      net.signal(world, p, SignalAdd{1, uint64_t(me + 1)});
    }
    expect(net.waitSignal(CoopThread{}, 0, uint64_t(n)), "SignalInc count");
    expect(net.waitSignal(CoopThread{}, 1, uint64_t(n * (n + 1) / 2)), "SignalAdd sum");
    expect(net.readSignal(0) == uint64_t(n), "SignalInc overshoot");
    expect(net.readSignal(1) == uint64_t(n * (n + 1) / 2), "SignalAdd overshoot");
    comm.bootstrap().barrier();
    // SignalSet from the next rank: the value is exactly what was set.
    const int prev = (me + n - 1) % n;
    net.signal(world, (me + 1) % n, SignalSet{2, 1000 + uint64_t(me)});
    expect(net.waitSignal(CoopThread{}, 2, 1000 + uint64_t(prev)), "SignalSet wait");
    expect(net.readSignal(2) == 1000 + uint64_t(prev), "SignalSet value");
    comm.check();
  }));
}

TEST_CASE("CounterInc counts local completion and waitCounter/readCounter/resetCounter see it", "[net][counter]") {
  REQUIRE_NOTHROW(runRanks(3, [](Comm& comm) {
    const DevComm dc = comm.devComm();
    const int n = comm.nRanks();
    Window w = comm.allocWindow(4096);
    Net net(dc, 3);
    for (int k = 0; k < 10; ++k)
      for (int p = 0; p < n; ++p) net.put(teamWorld(dc), p, w, 0, w, 1024, 100, None{}, CounterInc{4});
    net.flush(CoopThread{});
    expect(net.waitCounter(CoopThread{}, 4, uint64_t(10 * n)), "waitCounter");
    expect(net.readCounter(4) == uint64_t(10 * n), "readCounter");
    net.resetCounter(4);
    expect(net.readCounter(4) == 0, "resetCounter");
    comm.check();
  }));
}

TEST_CASE("put+signal ordering under stress: whenever the signal is seen the whole payload is there",
          "[net][ordering]") {
  REQUIRE_NOTHROW(runRanks(2, [](Comm& comm) {
    const DevComm dc = comm.devComm();
    const int me = comm.rank(), peer = 1 - me;
    constexpr size_t kSlot = 32768, kSlots = 4;
    constexpr int kIters = 400;
    Window w = comm.allocWindow(kSlot * kSlots);
    Window src = comm.allocWindow(kSlot);
    Net net(dc, me);  // each direction on its own context
    const Team world = teamWorld(dc);
    auto* s = static_cast<uint64_t*>(comm.localPointer(src));
    auto* d = static_cast<const uint64_t*>(comm.localPointer(w));
    // Both ranks send and receive: signal 0 = data arrived, signal 1 = slot freed.
    for (int k = 0; k < kIters; ++k) {
      // Wait for a free slot (the receiver acks each consumed slot).
      if (k >= int(kSlots)) expect(net.waitSignal(CoopThread{}, 1, uint64_t(k - kSlots + 1)), "ack wait");
      for (size_t i = 0; i < kSlot / 8; ++i) s[i] = (uint64_t(me) << 56) | (uint64_t(k) << 24) | i;
      net.put(world, peer, w, size_t(k % kSlots) * kSlot, src, 0, kSlot, SignalInc{0});
      // Receive the k-th message from the peer.
      expect(net.waitSignal(CoopThread{}, 0, uint64_t(k + 1)), "data wait");
      const uint64_t* blk = d + size_t(k % kSlots) * kSlot / 8;
      for (size_t i = 0; i < kSlot / 8; ++i)
        if (blk[i] != ((uint64_t(peer) << 56) | (uint64_t(k) << 24) | i))
          expect(false, "iteration " + std::to_string(k) + ": word " + std::to_string(i) +
                            " was not yet written when the signal arrived");
      net.signal(world, peer, SignalInc{1});
    }
    comm.check();
  }));
}
