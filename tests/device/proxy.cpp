// Tests of the proxy transport, phase 1 (gin/device/transport/proxy.hpp,
// gin/host/proxy.hpp): CPU ranks as threads, every peer forced through the
// proxy engine and the local wire. The same promises as the lsa tests, plus
// the ring itself: contention, wrap-around, a full ring, a stuck engine and
// descriptors the engine must refuse.
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch_get_random_seed.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "../common/net_checks.hpp"
#include "gin/host/error_text.hpp"
#include "gin/host/test_access.hpp"

using namespace gin;
using Catch::Matchers::ContainsSubstring;
using gin::test::CommAccess;
using gin::test::PauseAccess;
using gintest::checkMessage;
using gintest::expect;
using gintest::pattern;
using gintest::runRanks;

namespace {
constexpr uint8_t kPoison = 0xAB;

CommConfig proxyConfig(uint64_t timeoutNs = 20'000'000'000ull, uint32_t ringSlots = 1024) {
  CommConfig c = gintest::cpuConfig(timeoutNs);
  c.transport = TransportChoice::Proxy;
  c.proxy.ringSlots = ringSlots;
  return c;
}

using gintest::expectedThreads;


// The operations really went through this rank's engine (not the lsa path).
void expectEngineRan(Comm& comm, uint64_t atLeast) {
  expect(CommAccess::proxyEngine(comm) != nullptr, "no proxy engine although the proxy transport was forced");
  // What this rank pushed is done once its flushes return (a signal that
  // reached us says nothing about our own engine's progress).
  for (int c = 0; c < comm.devComm().nContexts; ++c) Net(comm.devComm(), c).flush(CoopThread{});
  expect(CommAccess::proxyEngine(comm)->executed() >= atLeast,
         "engine executed " + std::to_string(CommAccess::proxyEngine(comm)->executed()) +
             " descriptors, expected at least " + std::to_string(atLeast));
}

// The shared all-to-all check, and the operations really went through the engine.
void allToAllPut(Comm& comm, size_t bytes, size_t srcMis, size_t dstMis, uint64_t seed) {
  gintest::allToAllPut(comm, bytes, srcMis, dstMis, seed);
  expectEngineRan(comm, uint64_t(comm.nRanks()) * uint64_t(comm.devComm().nContexts));
}
}  // namespace

TEST_CASE("proxy: forcing the transport reports proxy for every peer and starts one engine", "[proxy]") {
  const char* env = std::getenv("GIN_TRANSPORT");
  REQUIRE_NOTHROW(runRanks(
      3,
      [&](Comm& comm) {
        for (int r = 0; r < comm.nRanks(); ++r)
          expect(comm.transportTo(r) == Transport::Proxy, "transportTo is not proxy");
        expect(CommAccess::proxyEngine(comm) != nullptr && CommAccess::proxyEngine(comm)->running(),
               "engine not running");
        expect(comm.devComm().proxyRings != nullptr && comm.devComm().proxyAll == 1, "DevComm proxy fields");
      },
      proxyConfig()));
  if (!env) {  // GIN_TRANSPORT overrides the config: the default is lsa only without it
    REQUIRE_NOTHROW(runRanks(2, [](Comm& comm) {
      expect(comm.transportTo(1 - comm.rank()) == Transport::Lsa, "default transport is not lsa");
      expect(CommAccess::proxyEngine(comm) == nullptr && comm.devComm().proxyRings == nullptr,
             "engine without proxy peers");
    }));
  }
  CommConfig bad = proxyConfig();
  bad.proxy.ringSlots = 12;
  REQUIRE_THROWS_WITH(runRanks(
                          1, [](Comm&) {}, bad),
                      ContainsSubstring("power of two"));
}

TEST_CASE("proxy: a Net compiled without the proxy backend records noTransport on a proxy-forced communicator",
          "[proxy][errors]") {
  std::string msg;
  REQUIRE_NOTHROW(runRanks(
      2,
      [&](Comm& comm) {
        Window w = comm.allocWindow(64);
        Net<kBackendLsa> net(comm.devComm(), 0);
        net.putValue(teamWorld(comm.devComm()), 1 - comm.rank(), w, 0, uint64_t(7), SignalInc{0});
        const auto* got = static_cast<const uint64_t*>(comm.localPointer(w));
        comm.bootstrap().barrier();
        expect(got[0] == 0 && comm.devComm().signals[0] == 0, "the lsa path ran on a proxy-forced communicator");
        if (comm.rank() == 0) msg = checkMessage(comm);
        comm.bootstrap().barrier();
      },
      proxyConfig()));
  CHECK_THAT(msg, ContainsSubstring("noTransport") && ContainsSubstring("peer 1"));
}

TEST_CASE("proxy: put delivers every byte to every peer on every context, any size and alignment", "[proxy][put]") {
  const int n = GENERATE(1, 3, 8);
  const size_t bytes = GENERATE(size_t(0), size_t(1), size_t(7), size_t(16), size_t(4099), size_t(65536 + 13));
  const auto mis = GENERATE(std::pair<size_t, size_t>{0, 0}, std::pair<size_t, size_t>{3, 5});
  CAPTURE(n, bytes, mis.first, mis.second);
  REQUIRE_NOTHROW(runRanks(
      n, [&](Comm& comm) { allToAllPut(comm, bytes, mis.first, mis.second, 91 + bytes); }, proxyConfig()));
}

TEST_CASE("proxy: putValue carries 1, 2, 4 and 8 byte values inline, signal after them", "[proxy][putValue]") {
  REQUIRE_NOTHROW(runRanks(
      4,
      [](Comm& comm) {
        gintest::putValueWidths(comm, comm.allocWindow(64 * size_t(comm.nRanks())), 0);
        expectEngineRan(comm, 5 * uint64_t(comm.nRanks()));
        comm.check();
        comm.bootstrap().barrier();
      },
      proxyConfig()));
}

TEST_CASE("proxy: SignalInc, SignalAdd and SignalSet reach the peer's signal word exactly", "[proxy][signal]") {
  REQUIRE_NOTHROW(runRanks(
      5,
      [](Comm& comm) {
        const DevComm dc = comm.devComm();
        const int n = comm.nRanks(), me = comm.rank();
        Net net(dc, 2);
        const Team world = teamWorld(dc);
        for (int p = 0; p < n; ++p) {
          net.signal(world, p, None{});  // nothing to carry: must not reach the engine as a bad descriptor
          net.signal(world, p, SignalInc{0});
          net.signal(world, p, SignalAdd{1, uint64_t(me + 1)});
        }
        expect(net.waitSignal(CoopThread{}, 0, uint64_t(n)), "SignalInc count");
        expect(net.waitSignal(CoopThread{}, 1, uint64_t(n * (n + 1) / 2)), "SignalAdd sum");
        expect(net.flush(CoopThread{}), "flush");
        comm.bootstrap().barrier();  // every engine has run every signal: an extra one would show now
        expect(net.readSignal(0) == uint64_t(n), "SignalInc overshoot");
        expect(net.readSignal(1) == uint64_t(n * (n + 1) / 2), "SignalAdd overshoot");
        const int prev = (me + n - 1) % n;
        net.signal(world, (me + 1) % n, SignalSet{2, 1000 + uint64_t(me)});
        expect(net.waitSignal(CoopThread{}, 2, 1000 + uint64_t(prev)), "SignalSet wait");
        expect(net.readSignal(2) == 1000 + uint64_t(prev), "SignalSet value");
        expect(net.flush(CoopThread{}), "flush");
        expect(CommAccess::proxyEngine(comm)->rejected() == 0, "the engine rejected a descriptor");
        expectEngineRan(comm, 2 * uint64_t(n) + 1);
        comm.check();
        comm.bootstrap().barrier();
      },
      proxyConfig()));
}

TEST_CASE("proxy: CounterInc counts consumed sources; waitCounter, readCounter and resetCounter see it",
          "[proxy][counter]") {
  REQUIRE_NOTHROW(runRanks(
      3,
      [](Comm& comm) {
        const DevComm dc = comm.devComm();
        const int n = comm.nRanks();
        Window w = comm.allocWindow(4096);
        Net net(dc, 3);
        for (int k = 0; k < 10; ++k)
          for (int p = 0; p < n; ++p)  // each sender its own destination bytes: no racing writers
            net.put(teamWorld(dc), p, w, 128 * size_t(comm.rank()), w, 1024, 100, None{}, CounterInc{4});
        expect(net.waitCounter(CoopThread{}, 4, uint64_t(10 * n)), "waitCounter");
        expect(net.flush(CoopThread{}), "flush");
        expect(net.readCounter(4) == uint64_t(10 * n), "readCounter");
        net.resetCounter(4);
        expect(net.readCounter(4) == 0, "resetCounter");
        comm.check();
        comm.bootstrap().barrier();
      },
      proxyConfig()));
}

TEST_CASE("proxy: put+signal ordering under stress: whenever the signal is seen the payload is there",
          "[proxy][ordering]") {
  REQUIRE_NOTHROW(runRanks(
      2,
      [](Comm& comm) {
        const DevComm dc = comm.devComm();
        const int me = comm.rank(), peer = 1 - me;
        constexpr size_t kSlot = 32768, kSlots = 4;
        constexpr int kIters = 300;
        Window w = comm.allocWindow(kSlot * kSlots);
        Window src = comm.allocWindow(kSlot * kSlots);
        Net net(dc, me);
        const Team world = teamWorld(dc);
        auto* d = static_cast<const uint64_t*>(comm.localPointer(w));
        for (int k = 0; k < kIters; ++k) {
          if (k >= int(kSlots)) expect(net.waitSignal(CoopThread{}, 1, uint64_t(k - kSlots + 1)), "ack wait");
          // The source slot is reused every kSlots iterations: the ack implies
          // the peer saw it, which implies our engine consumed it.
          auto* s = static_cast<uint64_t*>(comm.localPointer(src, size_t(k % kSlots) * kSlot));
          for (size_t i = 0; i < kSlot / 8; ++i) s[i] = (uint64_t(me) << 56) | (uint64_t(k) << 24) | i;
          net.put(world, peer, w, size_t(k % kSlots) * kSlot, src, size_t(k % kSlots) * kSlot, kSlot, SignalInc{0});
          expect(net.waitSignal(CoopThread{}, 0, uint64_t(k + 1)), "data wait");
          const uint64_t* blk = d + size_t(k % kSlots) * kSlot / 8;
          for (size_t i = 0; i < kSlot / 8; ++i)
            if (blk[i] != ((uint64_t(peer) << 56) | (uint64_t(k) << 24) | i))
              expect(false, "iteration " + std::to_string(k) + ": word " + std::to_string(i) +
                                " was not yet written when the signal arrived");
          net.signal(world, peer, SignalInc{1});
        }
        expect(net.flush(CoopThread{}), "flush");
        expectEngineRan(comm, 2 * kIters);
        comm.check();
        comm.bootstrap().barrier();
      },
      proxyConfig()));
}

TEST_CASE("proxy: many threads push into one small ring at once; no descriptor lost or run twice",
          "[proxy][contention]") {
  constexpr int kRanks = 8, kPushers = 4, kPerPeer = 24;
  REQUIRE_NOTHROW(runRanks(
      kRanks,
      [](Comm& comm) {
        const DevComm dc = comm.devComm();
        const int n = comm.nRanks(), me = comm.rank();
        const size_t perSender = size_t(kPushers) * kPerPeer;
        Window w = comm.allocWindow(8 * perSender * size_t(n));
        std::memset(comm.localPointer(w), 0, 8 * perSender * size_t(n));
        comm.bootstrap().barrier();
        std::vector<std::thread> pushers;
        for (int t = 0; t < kPushers; ++t)
          pushers.emplace_back([&, t] {
            Net net(dc, 0);  // every pusher of every rank on context 0
            for (int k = 0; k < kPerPeer; ++k)
              for (int q = 0; q < n; ++q) {
                const int p = (me + q + t) % n;
                const size_t idx = size_t(me) * perSender + size_t(t) * kPerPeer + size_t(k);
                const uint64_t v = (uint64_t(me + 1) << 40) | (uint64_t(t) << 20) | uint64_t(k);
                net.putValue(teamWorld(dc), p, w, 8 * idx, v, SignalInc{5});
              }
          });
        for (auto& th : pushers) th.join();
        Net net(dc, 0);
        const uint64_t total = uint64_t(n) * perSender;
        expect(net.waitSignal(CoopThread{}, 5, total), "not every descriptor arrived: signal 5 is " +
                                                           std::to_string(net.readSignal(5)) + " of " +
                                                           std::to_string(total));
        expect(net.flush(CoopThread{}), "flush");
        comm.bootstrap().barrier();  // everyone's engine is done with everything
        expect(net.readSignal(5) == total, "signal overshoot: a descriptor ran twice (" +
                                               std::to_string(net.readSignal(5)) + " != " + std::to_string(total) +
                                               ")");
        expect(CommAccess::proxyEngine(comm)->executed() == uint64_t(n) * perSender,
               "engine executed " + std::to_string(CommAccess::proxyEngine(comm)->executed()) + " descriptors");
        const auto* got = static_cast<const uint64_t*>(comm.localPointer(w));
        for (int s = 0; s < n; ++s)
          for (int t = 0; t < kPushers; ++t)
            for (int k = 0; k < kPerPeer; ++k) {
              const size_t idx = size_t(s) * perSender + size_t(t) * kPerPeer + size_t(k);
              const uint64_t v = (uint64_t(s + 1) << 40) | (uint64_t(t) << 20) | uint64_t(k);
              expect(got[idx] == v, "value from rank " + std::to_string(s) + " pusher " + std::to_string(t) + " #" +
                                        std::to_string(k) + " missing");
            }
        comm.check();
        comm.bootstrap().barrier();
      },
      // 70+ threads (8 ranks of 4 pushers, engine threads, receivers), one
      // 16-slot ring per rank. Under ASan on CI's 2 cores the wait above gave
      // up once at 20 s, cause unknown (not reproduced in 250 runs here under
      // ASan, TSan and CPU load; the failure message now carries the signal's
      // value and the rank's error record). 60 s, so a slow machine is not a
      // failure; a lost descriptor still is.
      proxyConfig(60'000'000'000ull, 16), 60'000'000'000ull));
}

TEST_CASE("proxy: an 8-slot ring wraps around many times, in order", "[proxy][wrap]") {
  REQUIRE_NOTHROW(runRanks(
      2,
      [](Comm& comm) {
        const DevComm dc = comm.devComm();
        const int peer = 1 - comm.rank();
        constexpr int kOps = 4096;  // 512 laps of the ring, a multiple of the 64 words
        Window w = comm.allocWindow(8 * 64);
        comm.bootstrap().barrier();
        Net net(dc, 1);
        // Same destination word over and over: in-order execution leaves the last value.
        for (int k = 0; k < kOps; ++k)
          net.putValue(teamWorld(dc), peer, w, 8 * size_t(k % 64), uint64_t(k), SignalInc{3});
        expect(net.waitSignal(CoopThread{}, 3, kOps), "signal 3");
        expect(net.flush(CoopThread{}), "flush");
        comm.bootstrap().barrier();
        expect(net.readSignal(3) == kOps, "signal overshoot");
        const auto* got = static_cast<const uint64_t*>(comm.localPointer(w));
        for (int j = 0; j < 64; ++j)
          expect(got[j] == uint64_t(kOps - 64 + j), "word " + std::to_string(j) + " is not the last value written");
        expect(CommAccess::proxyEngine(comm)->executed() == kOps, "executed count");
        const uint64_t consumed = *dc.proxyRings[1].consumed;
        expect(consumed == kOps, "consumer index " + std::to_string(consumed));
        comm.check();
        comm.bootstrap().barrier();
      },
      proxyConfig(20'000'000'000ull, 8)));
}

TEST_CASE("proxy: a full ring makes the producer wait instead of overwriting", "[proxy][full]") {
  REQUIRE_NOTHROW(runRanks(
      1,
      [](Comm& comm) {
        const DevComm dc = comm.devComm();
        Window w = comm.allocWindow(8 * 16);
        Net net(dc, 0);
        const Team world = teamWorld(dc);
        PauseAccess::pause(*CommAccess::proxyEngine(comm), true);
        for (int k = 0; k < 8; ++k) net.putValue(world, 0, w, 8 * size_t(k), uint64_t(100 + k), SignalInc{0});
        std::atomic<bool> done{false};
        std::thread late([&] {
          net.putValue(world, 0, w, 8 * 8, uint64_t(108), SignalInc{0});
          done.store(true);
        });
        std::this_thread::sleep_for(std::chrono::milliseconds(150));
        const bool waited = !done.load();
        ProxyDesc first{};
        const bool intact =
            proxyUnpack(&dc.proxyRings[0].slots[0], 0, &first) && first.dstOffset == 0 && first.srcOffset == 100;
        PauseAccess::pause(*CommAccess::proxyEngine(comm), false);
        late.join();
        expect(waited, "the 9th push into an 8-slot ring returned while the engine was paused");
        expect(intact, "the 9th push overwrote slot 0 before it was consumed");
        expect(net.waitSignal(CoopThread{}, 0, 9), "signal");
        expect(net.flush(CoopThread{}), "flush");
        const auto* got = static_cast<const uint64_t*>(comm.localPointer(w));
        for (int k = 0; k < 9; ++k) expect(got[k] == uint64_t(100 + k), "value " + std::to_string(k));
        expect(net.readSignal(0) == 9, "signal count");
        comm.check();
      },
      proxyConfig(10'000'000'000ull, 8)));
}

TEST_CASE("proxy: a stuck engine turns a full ring and a flush into error records, not hangs", "[proxy][errors]") {
  std::string fullMsg, flushMsg;
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE_NOTHROW(runRanks(
      1,
      [&](Comm& comm) {
        const DevComm dc = comm.devComm();
        Window w = comm.allocWindow(64);
        Net net(dc, 2);
        PauseAccess::pause(*CommAccess::proxyEngine(comm), true);
        for (int k = 0; k < 9; ++k) net.putValue(teamWorld(dc), 0, w, 0, uint64_t(k));  // the 9th gives up
        fullMsg = checkMessage(comm);
        PauseAccess::pause(*CommAccess::proxyEngine(comm), false);
      },
      proxyConfig(200'000'000ull, 8)));
  REQUIRE_NOTHROW(runRanks(
      2,
      [&](Comm& comm) {
        const DevComm dc = comm.devComm();
        Window w = comm.allocWindow(64);
        Net net(dc, 1);
        if (comm.rank() == 1) {
          PauseAccess::pause(*CommAccess::proxyEngine(comm), true);
          net.put(teamWorld(dc), 0, w, 0, w, 8, 8);
          expect(!net.flush(CoopThread{}), "flush should give up while the engine is paused");
          flushMsg = checkMessage(comm);
          PauseAccess::pause(*CommAccess::proxyEngine(comm), false);
        }
        comm.bootstrap().barrier();
      },
      proxyConfig(200'000'000ull)));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK_THAT(fullMsg,
             ContainsSubstring("proxyRingFull") && ContainsSubstring("context 2") && ContainsSubstring("consumed 0"));
  CHECK_THAT(flushMsg,
             ContainsSubstring("rank 1") && ContainsSubstring("proxyFlush") && ContainsSubstring("context 1"));
  CHECK(secs < 10.0);
}

TEST_CASE("proxy: the engine rejects bad descriptors without writing anything", "[proxy][errors]") {
  std::string msg;
  REQUIRE_NOTHROW(runRanks(
      2,
      [&](Comm& comm) {
        const DevComm dc = comm.devComm();
        Window w = comm.allocWindow(256);
        std::memset(comm.localPointer(w), kPoison, 256);
        comm.bootstrap().barrier();
        if (comm.rank() == 0) {
          const uint32_t id = w.dev->id;
          auto desc = [&](ProxyOp op) {
            ProxyDesc d{};
            d.op = uint8_t(op);
            d.peer = 1;
            d.dstWindow = id;
            d.srcWindow = id;
            d.dstOffset = 0;
            d.srcOffset = 0;
            d.bytes = 8;
            d.counterId = kProxyNoCounter;
            return d;
          };
          std::vector<ProxyDesc> bad;
          bad.push_back(desc(ProxyOp::Put)), bad.back().dstWindow = 999;               // unknown window
          bad.push_back(desc(ProxyOp::Put)), bad.back().dstOffset = 250;               // past the end
          bad.push_back(desc(ProxyOp::Put)), bad.back().srcOffset = ~uint64_t(0) - 2;  // source wraps
          bad.push_back(desc(ProxyOp::Put)), bad.back().action = uint8_t(ProxyAction::Add),
                                             bad.back().signalId = 1u << 20;   // bad signal id
          bad.push_back(desc(ProxyOp::Put)), bad.back().counterId = 1u << 20;  // bad counter id
          bad.push_back(desc(ProxyOp::PutValue)), bad.back().bytes = 9;        // too wide
          bad.push_back(desc(ProxyOp::Put)), bad.back().peer = 7;              // no such rank
          bad.push_back(desc(ProxyOp(9)));                                     // no such op
          for (const ProxyDesc& d : bad) expect(proxy::push(dc, 0, d, true), "push");
          ProxyDesc good = desc(ProxyOp::PutValue);
          good.dstOffset = 128;
          good.srcOffset = 0x1122334455667788ull;
          good.action = uint8_t(ProxyAction::Add);
          good.signalId = 6;
          good.signalValue = 1;
          expect(proxy::push(dc, 0, good, true), "push good");
          // Not flush: the first rejection raised the abort flag, which stops device-side waits.
          expect(CommAccess::proxyEngine(comm)->quiesce(5'000'000'000ull), "the engine did not get past the bad ones");
          expect(CommAccess::proxyEngine(comm)->rejected() == bad.size(),
                 "rejected " + std::to_string(CommAccess::proxyEngine(comm)->rejected()));
          expect(CommAccess::proxyEngine(comm)->executed() == 1, "the good descriptor did not run");
          expect(CommAccess::proxyEngine(comm)->running(), "the engine died");
          msg = checkMessage(comm);
        }
        comm.bootstrap().barrier();
        if (comm.rank() == 1) {
          // Over a network wire the engine's "consumed" is "sent": wait for
          // the good descriptor's signal, which follows its payload.
          // A host-side poll, not a wait: rank 0's rejections are failures, and
          // a wait here may see them (the team abort) before the good signal.
          expect(gintest::eventually(comm, [&] { return Net(comm.devComm(), 0).readSignal(6) >= 1; }),
                 "the good descriptor's signal never came");
          const auto* b = static_cast<const uint8_t*>(comm.localPointer(w));
          for (size_t i = 0; i < 256; ++i)
            if (i < 128 || i >= 136) expect(b[i] == kPoison, "a rejected descriptor wrote byte " + std::to_string(i));
          uint64_t v;
          std::memcpy(&v, b + 128, 8);
          expect(v == 0x1122334455667788ull, "the good descriptor's value");
          expect(Net(comm.devComm(), 0).readSignal(6) == 1, "the good descriptor's signal");
          expect(comm.devComm().signals[0] == 0, "a rejected signal landed");
        }
        comm.bootstrap().barrier();
      },
      proxyConfig()));
  CHECK_THAT(msg, ContainsSubstring("rank 0") && ContainsSubstring("badArgument") && ContainsSubstring("id 999"));
}

TEST_CASE("proxy: tickets and credits keep working across the 2^64 wrap of the ring counters", "[proxy][wrap]") {
  // A ring built by hand, with no engine: the test plays the consumer.
  DevComm c{};
  c.nContexts = 1;
  c.timeoutNs = 50'000'000ull;
  DeviceErrorRecord rec{};
  uint32_t claimAndAbort[2] = {0, 0};
  c.error = &rec;
  c.errorClaim = &claimAndAbort[0];
  c.abortFlag = &claimAndAbort[1];
  std::vector<ProxySlot> slots(8);
  const uint64_t start = ~uint64_t(0) - 5;  // the 7th ticket wraps to 0
  uint64_t head = start, consumed = start, hint[2] = {start, 0};
  const ProxyRingDev ring{slots.data(), &head, &consumed, hint, 8, 0};
  c.proxyRings = &ring;
  ProxyDesc d{};
  d.op = uint8_t(ProxyOp::Signal);
  for (uint64_t i = 0; i < 8; ++i) {
    d.dstOffset = i;
    REQUIRE(proxy::push(c, 0, d, true));
  }
  for (uint64_t i = 0; i < 8; ++i) {
    ProxyDesc s{};
    CHECK(proxyUnpack(&slots[size_t((start + i) & 7)], start + i, &s));
    CHECK(s.dstOffset == i);
  }
  CHECK(head == start + 8);  // wrapped
  // Full across the wrap: the 9th push must wait and give up, not overwrite.
  d.dstOffset = 99;
  CHECK_FALSE(proxy::push(c, 0, d, true));
  CHECK(rec.state == 2u);
  CHECK(rec.op == uint32_t(Op::ProxyFull));
  for (const ProxySlot& s : slots) CHECK(s.w[1] != 99);  // w1: dstOffset
  // Flush compares rolling: consumed (wrapped) reaching head (wrapped) completes it.
  claimAndAbort[1] = 0;
  consumed = head;
  CHECK(proxy::waitConsumed(c, 0, MemoryOrder::Acquire));
}

TEST_CASE("proxy: a slot packs every descriptor field and is accepted only when all four chunks carry its tag",
          "[proxy][slot]") {
  std::mt19937_64 rng(Catch::getSeed());
  for (int iter = 0; iter < 2000; ++iter) {
    ProxyDesc d{};
    d.op = uint8_t(rng());
    d.action = uint8_t(rng());
    d.peer = int32_t(uint32_t(rng()));
    d.dstWindow = uint32_t(rng());
    d.srcWindow = uint32_t(rng());
    d.dstOffset = rng();
    d.srcOffset = rng();
    d.bytes = rng() & kProxyMaxBytes;
    d.signalValue = rng();
    d.signalId = uint32_t(rng());
    d.counterId = uint32_t(rng());
    const uint64_t ticket = rng() % 4 == 0 ? ~uint64_t(0) - (rng() % 4) : rng();
    ProxySlot slot{};
    proxyPack(d, proxyTag(ticket), slot.w);
    ProxyDesc got{};
    REQUIRE(proxyUnpack(&slot, ticket, &got));
    CHECK(std::memcmp(&got, &d, sizeof d) == 0);
    CHECK_FALSE(proxyUnpack(&slot, ticket + 1, &got));
    // One chunk still from the previous lap of a 2^15-slot ring (or any
    // other ticket): not accepted until it arrives.
    const int k = int(rng() % 4);
    ProxySlot old = slot;
    ProxySlot prev{};
    proxyPack(d, proxyTag(ticket - kProxyMaxSlots), prev.w);
    old.w[2 * k] = prev.w[2 * k];
    old.w[2 * k + 1] = ~prev.w[2 * k + 1];
    CHECK_FALSE(proxyUnpack(&old, ticket, &got));
  }
  ProxySlot zero{};
  ProxyDesc got{};
  // A fresh (zeroed) ring is empty: slot i is first used by ticket i < 2^15,
  // whose tag i + 1 is not 0. (Tag 0 belongs to tickets 2^16 - 1 + k 2^16,
  // whose slots were all written before.)
  for (uint64_t t = 0; t < kProxyMaxSlots; ++t) CHECK_FALSE(proxyUnpack(&zero, t, &got));
}

TEST_CASE("proxy: GIN_TRANSPORT overrides CommConfig::transport; a bad value is an error", "[proxy][env]") {
  const char* old = std::getenv("GIN_TRANSPORT");
  const std::string saved = old ? old : "";
  ::setenv("GIN_TRANSPORT", "proxy", 1);
  CHECK_NOTHROW(runRanks(2, [](Comm& comm) {
    expect(comm.transportTo(1 - comm.rank()) == Transport::Proxy && CommAccess::proxyEngine(comm), "env proxy ignored");
  }));
  ::setenv("GIN_TRANSPORT", "lsa", 1);
  CHECK_NOTHROW(runRanks(
      2,
      [](Comm& comm) {
        expect(comm.transportTo(1 - comm.rank()) == Transport::Lsa && !CommAccess::proxyEngine(comm),
               "env lsa ignored");
      },
      proxyConfig()));
  ::setenv("GIN_TRANSPORT", "carrier-pigeon", 1);
  CHECK_THROWS_WITH(runRanks(2, [](Comm&) {}), ContainsSubstring("GIN_TRANSPORT=\"carrier-pigeon\" is not allowed: expected one of auto, lsa, proxy, ibgda"));
  if (old)
    ::setenv("GIN_TRANSPORT", saved.c_str(), 1);
  else
    ::unsetenv("GIN_TRANSPORT");
}

namespace {
// A wire that fails inside: the engine must record it, not crash or hang.
struct ThrowingWire final : Wire {
  bool put(int, uint32_t, uint64_t, const void*, uint64_t, WireReject*) override {
    throw std::runtime_error("the wire broke");
  }
  bool signal(int, uint32_t, ProxyAction, uint64_t, WireReject*) override { return true; }
};
// A wire that accepts everything and writes nothing.
struct NullWire final : Wire {
  bool put(int, uint32_t, uint64_t, const void*, uint64_t, WireReject*) override { return true; }
  bool signal(int, uint32_t, ProxyAction, uint64_t, WireReject*) override { return true; }
};
}  // namespace

TEST_CASE("proxy: an engine that fails internally stops, records proxyEngine and makes waits give up",
          "[proxy][errors]") {
  DevComm c{};
  c.nRanks = 2;
  c.nContexts = 1;
  c.nCounters = 4;
  c.timeoutNs = 5'000'000'000ull;
  DeviceErrorRecord rec{};
  uint32_t claimAndAbort[2] = {0, 0};
  c.error = &rec;
  c.errorClaim = &claimAndAbort[0];
  c.abortFlag = &claimAndAbort[1];
  std::vector<ProxySlot> slots(8);
  uint64_t head = 0, consumed = 0, hint[2] = {0, 0};
  const ProxyRingDev ringDev{slots.data(), &head, &consumed, hint, 8, 0};
  c.proxyRings = &ringDev;
  std::vector<char> buf(64);
  WindowDirectory dir;
  dir.add(1, WindowDirectory::Entry{64, buf.data(), {buf.data(), buf.data()}});
  ThrowingWire wire;
  ProxyEngine engine(c, {ProxyEngine::Ring{slots.data(), &consumed, &head, 8}}, wire, dir, 16, ProxyConfig{});
  ProxyDesc d{};
  d.op = uint8_t(ProxyOp::Put);
  d.peer = 1;
  d.dstWindow = d.srcWindow = 1;
  d.bytes = 8;
  d.counterId = kProxyNoCounter;
  REQUIRE(proxy::push(c, 0, d, true));
  const auto t0 = std::chrono::steady_clock::now();
  while (engine.running() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK_FALSE(engine.running());
  CHECK(rec.state == 2u);
  CHECK(rec.op == uint32_t(Op::ProxyEngine));
  CHECK_THAT(describe(rec), ContainsSubstring("proxyEngine"));
  // The abort flag is up, so a flush returns at once instead of waiting 5 s.
  CHECK_FALSE(proxy::waitConsumed(c, 0, MemoryOrder::Acquire));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(4));
}

TEST_CASE("proxy: CPU lists parse, and bad ones are refused with the knob's name", "[proxy][cpus]") {
  CHECK(parseCpuList("0-3,8", "X") == std::vector<int>{0, 1, 2, 3, 8});
  CHECK(parseCpuList("5", "X") == std::vector<int>{5});
  CHECK(parseCpuList("2-2,0\n", "X") == std::vector<int>{2, 0});
  for (const char* bad : {"", "a", "3-1", "1,,2", "5-", "-1", "1 2", "99999999"})
    CHECK_THROWS_WITH(parseCpuList(bad, "GIN_PROXY_CPUS"),
                      ContainsSubstring("GIN_PROXY_CPUS") && ContainsSubstring("is not a CPU list"));
}

TEST_CASE("proxy: GIN_PROXY_CPUS pins every engine thread; a CPU the process may not use stops every rank",
          "[proxy][cpus]") {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  REQUIRE(sched_getaffinity(0, sizeof allowed, &allowed) == 0);
  int first = -1;
  for (int c = 0; c < CPU_SETSIZE && first < 0; ++c)
    if (CPU_ISSET(c, &allowed)) first = c;
  REQUIRE(first >= 0);
  const char* old = std::getenv("GIN_PROXY_CPUS");
  const std::string saved = old ? old : "";
  ::setenv("GIN_PROXY_CPUS", std::to_string(first).c_str(), 1);
  CommConfig cfg = proxyConfig();
  cfg.proxy.threads = GENERATE(1u, 3u);
  CHECK_NOTHROW(runRanks(
      2,
      [first, want = expectedThreads(cfg)](Comm& comm) {
        ProxyEngine* e = CommAccess::proxyEngine(comm);
        expect(e != nullptr, "no engine");
        expect(e->threadCount() == want, "engine threads: " + std::to_string(e->threadCount()));
        for (int t = 0; t < e->threadCount(); ++t) {
          // Each thread pins itself when it starts: give it a moment.
          cpu_set_t set;
          bool pinned = false;
          for (int i = 0; i < 2000 && !pinned; ++i) {
            CPU_ZERO(&set);
            expect(pthread_getaffinity_np(e->nativeHandle(t), sizeof set, &set) == 0, "getaffinity");
            pinned = CPU_COUNT(&set) == 1 && CPU_ISSET(first, &set);
            if (!pinned) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
          expect(pinned, "engine thread " + std::to_string(t) + " is not pinned to CPU " + std::to_string(first));
        }
      },
      cfg));
  ::setenv("GIN_PROXY_CPUS", "100000", 1);
  CHECK_THROWS_WITH(runRanks(
                        2, [](Comm&) {}, proxyConfig()),
                    ContainsSubstring("proxy engine CPUs") && ContainsSubstring("CPU 100000 is not available"));
  if (old)
    ::setenv("GIN_PROXY_CPUS", saved.c_str(), 1);
  else
    ::unsetenv("GIN_PROXY_CPUS");
}

// ---- several engine threads --------------------------------------------------

TEST_CASE(
    "proxy: 2, 3 and 4 engine threads: random puts, values and signals from many threads of every rank, "
    "data there whenever its signal is, every descriptor run exactly once",
    "[proxy][threads]") {
  const int threads = GENERATE(2, 3, 4);
  const uint64_t seed = Catch::getSeed() + uint64_t(threads);
  CAPTURE(threads, seed);
  CommConfig cfg = proxyConfig(20'000'000'000ull, 16);  // small rings: full rings and many laps
  cfg.nContexts = 5;                                    // uneven: some threads consume two rings
  cfg.proxy.threads = uint32_t(threads);
  const int want = expectedThreads(cfg);
  REQUIRE_NOTHROW(runRanks(
      6,
      [&](Comm& comm) {
        expect(CommAccess::proxyEngine(comm)->threadCount() == want,
               "engine threads: " + std::to_string(CommAccess::proxyEngine(comm)->threadCount()));
        expect(comm.config().proxy.threads == uint32_t(want), "config().proxy.threads");
        gintest::engineStress(comm, seed, 7, 20, 8192);  // 7 pushers on 5 contexts: rings with two producers
        gintest::engineStress(comm, seed + 1, 3, 12);
      },
      cfg));
}

TEST_CASE(
    "proxy: producers that store to peers mapped here (proxy.producerStores, the GPU default) keep every ordering "
    "rule; the engine carries only the actions",
    "[proxy][stores]") {
  if (const char* w = std::getenv("GIN_PROXY_WIRE"); w && std::string(w) != "local" && std::string(w) != "auto")
    SKIP("producer stores need the local wire; GIN_PROXY_WIRE=" << w);
  const int ranks = GENERATE(1, 3, 5);
  const uint64_t seed = Catch::getSeed() + uint64_t(ranks);
  CAPTURE(ranks, seed);
  CommConfig cfg = proxyConfig(20'000'000'000ull, 16);
  cfg.proxy.producerStores = 1;
  cfg.proxy.threads = 2;
  REQUIRE_NOTHROW(runRanks(
      ranks,
      [&](Comm& comm) {
        expect(comm.devComm().proxyLsaStores == 1, "proxyLsaStores is not set");
        gintest::engineStress(comm, seed, 5, 16, 4096);
        // A put without actions pushes nothing; its CounterInc alone is a descriptor.
        const DevComm dc = comm.devComm();
        Window w = comm.allocWindow(64);
        const Net net(dc, 0);
        const int next = (comm.rank() + 1) % comm.nRanks();
        const uint64_t before = CommAccess::proxyEngine(comm)->executed();
        net.put(teamWorld(dc), next, w, 0, w, 32, 8);
        expect(net.flush(CoopThread{}) && CommAccess::proxyEngine(comm)->executed() == before,
               "a bare put pushed a descriptor");
        net.put(teamWorld(dc), next, w, 0, w, 32, 8, None{}, CounterInc{7});
        expect(net.waitCounter(CoopThread{}, 7, 1) && CommAccess::proxyEngine(comm)->executed() == before + 1,
               "CounterInc alone: one descriptor");
        comm.check();
        comm.bootstrap().barrier();
      },
      cfg));
  // Off by default on CPU ranks; GIN_PROXY_PRODUCER_STORES must say 0 or 1.
  REQUIRE_NOTHROW(runRanks(
      2, [](Comm& comm) { expect(comm.devComm().proxyLsaStores == 0, "on by default on CPU ranks"); },
      proxyConfig()));
  ::setenv("GIN_PROXY_PRODUCER_STORES", "yes", 1);
  CHECK_THROWS_WITH(runRanks(2, [](Comm&) {}, proxyConfig()), ContainsSubstring("GIN_PROXY_PRODUCER_STORES=\"yes\""));
  ::unsetenv("GIN_PROXY_PRODUCER_STORES");
}

TEST_CASE("proxy: pause(true) parks every engine thread; nothing on any ring is consumed until resumed",
          "[proxy][threads]") {
  CommConfig cfg = proxyConfig();
  cfg.proxy.threads = 4;
  REQUIRE_NOTHROW(runRanks(
      2,
      [&](Comm& comm) {
        const DevComm dc = comm.devComm();
        ProxyEngine* e = CommAccess::proxyEngine(comm);
        Window w = comm.allocWindow(64);
        comm.bootstrap().barrier();
        PauseAccess::pause(*e, true);
        const int peer = 1 - comm.rank();
        for (int c = 0; c < dc.nContexts; ++c)
          Net(dc, c).putValue(teamWorld(dc), peer, w, 8 * size_t(c), uint64_t(c + 1), SignalInc{0});
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
        for (int c = 0; c < dc.nContexts; ++c)
          expect(*dc.proxyRings[c].consumed == 0, "ring " + std::to_string(c) + " was consumed while paused");
        expect(e->executed() == 0, "executed while paused");
        PauseAccess::pause(*e, false);
        Net net(dc, 0);
        expect(net.waitSignal(CoopThread{}, 0, uint64_t(dc.nContexts)), "signals after resuming");
        const auto* got = static_cast<const uint64_t*>(comm.localPointer(w));
        for (int c = 0; c < dc.nContexts; ++c) expect(got[c] == uint64_t(c + 1), "value " + std::to_string(c));
        for (int c = 0; c < dc.nContexts; ++c) expect(Net(dc, c).flush(CoopThread{}), "flush");
        expect(e->executed() == uint64_t(dc.nContexts), "executed " + std::to_string(e->executed()));
        comm.check();
        comm.bootstrap().barrier();
      },
      cfg));
}

TEST_CASE(
    "proxy: GIN_PROXY_THREADS overrides CommConfig::proxy.threads, clamps to the contexts; bad values and 0 "
    "are errors on every rank",
    "[proxy][threads][env]") {
  auto threadsOf = [](const CommConfig& cfg) {
    std::atomic<int> got{-1};
    runRanks(
        2, [&](Comm& comm) { got = CommAccess::proxyEngine(comm)->threadCount(); }, cfg);
    return got.load();
  };
  CommConfig cfg = proxyConfig();
  cfg.nContexts = 3;
  {
    gintest::EnvVar unset("GIN_PROXY_THREADS", nullptr);
    CHECK(threadsOf(cfg) == 1);  // the default
    cfg.proxy.threads = 2;
    CHECK(threadsOf(cfg) == 2);
    cfg.proxy.threads = 7;
    CHECK(threadsOf(cfg) == 3);  // one per ring at most
  }
  {
    gintest::EnvVar env("GIN_PROXY_THREADS", "3");
    cfg.proxy.threads = 1;
    CHECK(threadsOf(cfg) == 3);
  }
  {
    gintest::EnvVar env("GIN_PROXY_THREADS", "64");
    CHECK(threadsOf(cfg) == 3);
  }
  {
    gintest::EnvVar env("GIN_PROXY_THREADS", "");  // empty: unset
    cfg.proxy.threads = 2;
    CHECK(threadsOf(cfg) == 2);
  }
  for (const char* bad : {"0", "abc", "-1", "2x", " 2", "1.5", "99999999999", "+3"}) {
    CAPTURE(bad);
    gintest::EnvVar env("GIN_PROXY_THREADS", bad);
    for (const std::string& msg : gintest::rankErrors(2, cfg)) {
      CHECK_THAT(msg, ContainsSubstring("proxy engine threads") &&
                          ContainsSubstring(std::string("GIN_PROXY_THREADS=\"") + bad + "\"") &&
                          ContainsSubstring("expected an integer from 1 to 4096"));
    }
  }
  {
    gintest::EnvVar unset("GIN_PROXY_THREADS", nullptr);
    cfg.proxy.threads = 0;
    CHECK_THROWS_WITH(runRanks(
                          1, [](Comm&) {}, cfg),
                      ContainsSubstring("CommConfig::proxy") && ContainsSubstring("threads >= 1"));
  }
}

TEST_CASE("proxy: an engine thread that fails stops every thread and records proxyEngine once", "[proxy][threads]") {
  DevComm c{};
  c.nRanks = 2;
  c.nContexts = 3;
  c.nCounters = 4;
  c.timeoutNs = 5'000'000'000ull;
  DeviceErrorRecord rec{};
  uint32_t claimAndAbort[2] = {0, 0};
  c.error = &rec;
  c.errorClaim = &claimAndAbort[0];
  c.abortFlag = &claimAndAbort[1];
  std::vector<ProxySlot> slots(3 * 8);
  uint64_t head[3] = {0, 0, 0}, consumed[3] = {0, 0, 0}, hint[3][2] = {};
  ProxyRingDev ringDev[3];
  std::vector<ProxyEngine::Ring> rings;
  for (int i = 0; i < 3; ++i) {
    ringDev[i] = ProxyRingDev{slots.data() + 8 * i, &head[i], &consumed[i], hint[i], 8, 0};
    rings.push_back(ProxyEngine::Ring{slots.data() + 8 * i, &consumed[i], &head[i], 8});
  }
  c.proxyRings = ringDev;
  std::vector<char> buf(64);
  WindowDirectory dir;
  dir.add(1, WindowDirectory::Entry{64, buf.data(), {buf.data(), buf.data()}});
  NullWire good0, good2;
  ThrowingWire bad;
  ProxyEngine engine(c, rings, std::vector<Wire*>{&good0, &bad, &good2}, dir, 16, ProxyConfig{});
  REQUIRE(engine.threadCount() == 3);
  ProxyDesc sig{};
  sig.op = uint8_t(ProxyOp::Signal);
  sig.action = uint8_t(ProxyAction::Add);
  sig.peer = 1;
  sig.counterId = kProxyNoCounter;
  // Ring i is thread i's: rings 0 and 2 work while ring 1 has nothing.
  REQUIRE(proxy::push(c, 0, sig, true));
  REQUIRE(proxy::push(c, 2, sig, true));
  REQUIRE(engine.quiesce(5'000'000'000ull));
  CHECK(engine.executed() == 2);
  ProxyDesc put{};
  put.op = uint8_t(ProxyOp::Put);
  put.peer = 1;
  put.dstWindow = put.srcWindow = 1;
  put.bytes = 8;
  put.counterId = kProxyNoCounter;
  REQUIRE(proxy::push(c, 1, put, true));  // thread 1's wire throws
  // running() turns false when the first thread exits, which the healthy
  // threads may do before the failing one has finished its record and raised
  // the abort flag (its last write): wait for those too, reading them as the
  // engine writes them (a plain read here raced with it under TSan).
  const auto recorded = [&] {
    return !engine.running() && atomicLoad<Scope::System>(&rec.state, MemoryOrder::Acquire) == 2u &&
           atomicLoad<Scope::System>(&claimAndAbort[1], MemoryOrder::Acquire) == 1u;
  };
  const auto t0 = std::chrono::steady_clock::now();
  while (!recorded() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  REQUIRE(recorded());
  CHECK(rec.op == uint32_t(Op::ProxyEngine));
  // The other threads stop too: what is pushed on their rings now stays.
  atomicStore<Scope::System>(&claimAndAbort[1], 0u, MemoryOrder::Release);  // let the pushes through
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  REQUIRE(proxy::push(c, 0, sig, true));
  REQUIRE(proxy::push(c, 2, sig, true));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(consumed[0] == 1);
  CHECK(consumed[2] == 1);
  CHECK(engine.executed() == 2);
  CHECK_FALSE(engine.quiesce(10'000'000ull));
}

TEST_CASE("proxy: a ProxyEngine refuses more threads (wires) than rings, and none", "[proxy][threads]") {
  DevComm c{};
  c.nRanks = 1;
  c.nContexts = 1;
  std::vector<ProxySlot> slots(8);
  uint64_t head = 0, consumed = 0;
  WindowDirectory dir;
  NullWire a, b;
  const std::vector<ProxyEngine::Ring> rings{ProxyEngine::Ring{slots.data(), &consumed, &head, 8}};
  CHECK_THROWS_WITH(ProxyEngine(c, rings, std::vector<Wire*>{&a, &b}, dir, 16, ProxyConfig{}),
                    ContainsSubstring("2 wires (threads) for 1 rings"));
  CHECK_THROWS_WITH(ProxyEngine(c, rings, std::vector<Wire*>{}, dir, 16, ProxyConfig{}),
                    ContainsSubstring("0 wires (threads)"));
}
