// Tests of the ibgda transport (gin/device/transport/ibgda.hpp) end to end on
// CPU ranks through the soft NIC (gin/host/soft_nic.hpp, gin/host/ibgda.hpp):
// every peer forced through ibgda, so the same promises as the lsa and proxy
// tests hold over mlx5 WQEs, doorbells and CQEs; plus the queue itself: many
// threads per QP, several contexts, wrap-around of the 16-bit WQE index, a
// full queue, and WQEs the NIC must refuse (error CQE -> error record).
#include <atomic>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "../common/net_checks.hpp"
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

CommConfig ibgdaConfig(uint64_t timeoutNs = 20'000'000'000ull, uint32_t depth = 256, uint32_t maxWqeBytes = 1u << 20,
                       IbgdaConfig::Device device = IbgdaConfig::Device::Soft) {
  CommConfig c = gintest::cpuConfig(timeoutNs);
  c.transport = TransportChoice::Ibgda;
  c.ibgda.device = device;
  c.ibgda.qpDepth = depth;
  c.ibgda.maxWqeBytes = maxWqeBytes;
  return c;
}

// The QP state of (ctx, peer), host view (CPU ranks: the table is host memory).
IbgdaQpState& qpState(Comm& comm, int ctx, int peer) { return *ibgda::qpOf(comm.devComm(), ctx, peer)->state; }

void expectNicRan(Comm& comm, uint64_t atLeast) {
  expect(CommAccess::ibgda(comm) != nullptr, "no ibgda transport although it was forced");
  expect(CommAccess::ibgda(comm)->nic().executed() >= atLeast,
         "soft NIC executed " + std::to_string(CommAccess::ibgda(comm)->nic().executed()) +
             " WQEs, expected at least " + std::to_string(atLeast));
}

// The shared all-to-all check, and the operations really went through the NIC.
void allToAllPut(Comm& comm, size_t bytes, size_t srcMis, size_t dstMis, uint64_t seed) {
  gintest::allToAllPut(comm, bytes, srcMis, dstMis, seed);
  expectNicRan(comm, uint64_t(comm.nRanks()) * uint64_t(comm.devComm().nContexts));
}
}  // namespace

TEST_CASE("ibgda: forcing the transport reports ibgda for every peer and starts the soft NIC", "[ibgda]") {
  REQUIRE_NOTHROW(runRanks(
      3,
      [&](Comm& comm) {
        for (int r = 0; r < comm.nRanks(); ++r)
          expect(comm.transportTo(r) == Transport::Ibgda, "transportTo is not ibgda");
        expect(CommAccess::ibgda(comm) != nullptr, "no ibgda transport");
        expect(comm.devComm().ibgda != nullptr && comm.devComm().ibgdaAll == 1, "DevComm ibgda fields");
        expect(CommAccess::ibgda(comm)->nic().nQps() == size_t(comm.nRanks() * comm.devComm().nContexts),
               "one QP per (ctx, peer)");
        expect(CommAccess::proxyEngine(comm) == nullptr, "a proxy engine without proxy peers");
      },
      ibgdaConfig()));
}

TEST_CASE("ibgda: without a soft NIC and with no mlx5 support, the Comm says what to do", "[ibgda]") {
  REQUIRE_THROWS_WITH(runRanks(
                          2, [](Comm&) {}, ibgdaConfig(20'000'000'000ull, 256, 1u << 20, IbgdaConfig::Device::Mlx5)),
                      ContainsSubstring("GIN_IBGDA_DEVICE=soft"));
  CommConfig bad = ibgdaConfig(20'000'000'000ull, 12);
  REQUIRE_THROWS_WITH(runRanks(
                          1, [](Comm&) {}, bad),
                      ContainsSubstring("power of two"));
}

TEST_CASE("ibgda: GIN_TRANSPORT=ibgda and GIN_IBGDA_DEVICE=soft select the transport", "[ibgda]") {
  const char* oldT = std::getenv("GIN_TRANSPORT");
  const char* oldD = std::getenv("GIN_IBGDA_DEVICE");
  const std::string keepT = oldT ? oldT : "", keepD = oldD ? oldD : "";
  ::setenv("GIN_TRANSPORT", "ibgda", 1);
  ::setenv("GIN_IBGDA_DEVICE", "soft", 1);
  auto restore = [&] {
    if (oldT)
      ::setenv("GIN_TRANSPORT", keepT.c_str(), 1);
    else
      ::unsetenv("GIN_TRANSPORT");
    if (oldD)
      ::setenv("GIN_IBGDA_DEVICE", keepD.c_str(), 1);
    else
      ::unsetenv("GIN_IBGDA_DEVICE");
  };
  try {
    runRanks(2, [](Comm& comm) {
      expect(comm.transportTo(1 - comm.rank()) == Transport::Ibgda, "GIN_TRANSPORT=ibgda ignored");
      expect(CommAccess::ibgda(comm) && CommAccess::ibgda(comm)->nic().mode() == SoftNic::Mode::Execute,
             "GIN_IBGDA_DEVICE=soft ignored");
    });
    ::setenv("GIN_IBGDA_DEVICE", "bogus", 1);
    REQUIRE_THROWS_WITH(runRanks(1, [](Comm&) {}), ContainsSubstring("GIN_IBGDA_DEVICE=\"bogus\""));
  } catch (...) {
    restore();
    throw;
  }
  restore();
}

TEST_CASE("ibgda put: every byte arrives, nothing around it is touched, signal and counter count", "[ibgda]") {
  const int nRanks = GENERATE(1, 2, 4);
  const size_t bytes = GENERATE(size_t(0), size_t(1), size_t(7), size_t(64), size_t(4096), size_t(70001));
  const size_t srcMis = GENERATE(size_t(0), size_t(3));
  const size_t dstMis = GENERATE(size_t(0), size_t(5));
  CAPTURE(nRanks, bytes, srcMis, dstMis);
  // maxWqeBytes 4096: the larger puts are split into many WQEs.
  REQUIRE_NOTHROW(runRanks(
      nRanks, [&](Comm& comm) { allToAllPut(comm, bytes, srcMis, dstMis, bytes * 7 + srcMis + dstMis); },
      ibgdaConfig(20'000'000'000ull, 64, 4096)));
}

TEST_CASE("ibgda put: a put issued as soon as allocWindow returns lands on every peer", "[ibgda]") {
  REQUIRE_NOTHROW(runRanks(
      4, [](Comm& comm) { gintest::putRightAfterAlloc(comm, 40); }, ibgdaConfig()));
}

TEST_CASE("ibgda put: 8 ranks, several contexts, a put larger than the whole queue", "[ibgda]") {
  // 8 ranks x 4 contexts; depth 8 and 1 KiB WQEs: a 20000-byte put is 20
  // WQEs, more than the queue holds, posted in batches.
  REQUIRE_NOTHROW(runRanks(
      8, [](Comm& comm) { allToAllPut(comm, 20000, 1, 2, 11); }, ibgdaConfig(20'000'000'000ull, 8, 1024)));
}

TEST_CASE("ibgda putValue and signals: inline writes, SignalInc/Add/Set, resets", "[ibgda]") {
  REQUIRE_NOTHROW(runRanks(
      3,
      [](Comm& comm) {
        gintest::putValueAndSignals(comm);
        expectNicRan(comm, uint64_t(comm.nRanks()) * 7);
      },
      ibgdaConfig()));
}

TEST_CASE("ibgda signal after payload: a waiter that sees the signal sees every earlier put of the context",
          "[ibgda]") {
  REQUIRE_NOTHROW(runRanks(
      2, [](Comm& comm) { gintest::signalAfterPayload(comm); }, ibgdaConfig(20'000'000'000ull, 16, 1024)));
}

TEST_CASE("ibgda: many threads share one QP; the queue wraps many times and stays in order", "[ibgda]") {
  const int nRanks = GENERATE(2, 4);
  const uint32_t depth = GENERATE(4u, 32u);
  CAPTURE(nRanks, depth);
  REQUIRE_NOTHROW(runRanks(
      nRanks,
      [&](Comm& comm) {
        const DevComm dc = comm.devComm();
        const int n = comm.nRanks(), me = comm.rank(), peer = (me + 1) % n, from = (me + n - 1) % n;
        constexpr int kThreads = 6, kOps = 400;
        constexpr size_t kBytes = 40;
        const size_t per = kBytes * kOps;
        Window src = comm.allocWindow(per * kThreads);
        Window dst = comm.allocWindow(per * kThreads);
        auto* s = static_cast<uint8_t*>(comm.localPointer(src));
        auto* d = static_cast<uint8_t*>(comm.localPointer(dst));
        for (size_t i = 0; i < per * kThreads; ++i) s[i] = pattern(9, me, i);
        std::memset(d, kPoison, per * kThreads);
        comm.bootstrap().barrier();
        const Team world = teamWorld(dc);
        std::vector<std::thread> ts;
        std::atomic<int> bad{0};
        for (int t = 0; t < kThreads; ++t)
          ts.emplace_back([&, t] {
            Net net(dc, 0);  // every thread on the same (context, peer) QP
            for (int k = 0; k < kOps; ++k) {
              const size_t off = size_t(t) * per + size_t(k) * kBytes;
              net.put(world, peer, dst, off, src, off, kBytes, SignalInc{uint32_t(10 + t)}, CounterInc{uint32_t(t)});
            }
            if (!net.flush(CoopThread{})) bad.fetch_add(1);
            if (net.readCounter(uint32_t(t)) != uint64_t(kOps)) bad.fetch_add(1);
          });
        for (auto& th : ts) th.join();
        expect(bad.load() == 0, "a thread's flush gave up or its counter is short: " + checkMessage(comm));
        Net net(dc, 0);
        for (int t = 0; t < kThreads; ++t) {
          expect(net.waitSignal(CoopThread{}, uint32_t(10 + t), uint64_t(kOps)), "waitSignal gave up");
          // Per-thread order: the signal count k means the first k puts of that thread are in.
        }
        for (size_t i = 0; i < per * kThreads; ++i)
          if (d[i] != pattern(9, from, i)) expect(false, "byte " + std::to_string(i) + " wrong");
        const IbgdaQpState& st = qpState(comm, 0, peer);
        const uint64_t posted = uint64_t(kThreads) * kOps * 2;  // payload + signal per put
        expect(st.resv == posted && st.ready == posted && st.done == posted,
               "QP indices: resv " + std::to_string(st.resv) + " ready " + std::to_string(st.ready) + " done " +
                   std::to_string(st.done) + ", expected " + std::to_string(posted));
        expect(posted / dc.nContexts > 4 * depth, "the queue did not wrap many times");
        comm.check();
        comm.bootstrap().barrier();
        comm.deregisterWindow(dst);
        comm.deregisterWindow(src);
      },
      ibgdaConfig(20'000'000'000ull, depth)));
}

TEST_CASE("ibgda: the 16-bit WQE index and the CQ owner bit wrap; doorbell record and UAR carry the last WQE",
          "[ibgda]") {
  REQUIRE_NOTHROW(runRanks(
      1,
      [](Comm& comm) {
        const DevComm dc = comm.devComm();
        Window w = comm.allocWindow(64);
        Net net(dc, 0);
        const Team world = teamWorld(dc);
        constexpr uint64_t kOps = 70000;  // > 2^16 WQEs
        for (uint64_t k = 0; k < kOps; ++k) net.putValue(world, 0, w, 8, k, SignalInc{0});
        expect(net.flush(CoopThread{}), "flush gave up: " + checkMessage(comm));
        // flush: sources reusable, not signals landed. Once the last signal has,
        // its payload (and every earlier one) has too.
        expect(net.waitSignal(CoopThread{}, 0, kOps), "signal count after 2^16 WQEs: " + checkMessage(comm));
        expect(net.readSignal(0) == kOps, "signal count after 2^16 WQEs");
        uint64_t v;
        std::memcpy(&v, static_cast<char*>(comm.localPointer(w)) + 8, 8);
        expect(v == kOps - 1, "last putValue is the one that stayed");
        const IbgdaQpDev* qp = ibgda::qpOf(dc, 0, 0);
        const uint64_t posted = 2 * kOps;
        expect(qp->state->done == posted, "done");
        expect(mlx5::bswap32(qp->dbrec[mlx5::kDbrSend]) == uint32_t(posted & 0xffff),
               "doorbell record is the big-endian producer index mod 2^16");
        mlx5::CtrlSeg last;
        std::memcpy(&last, qp->sq + ((posted - 1) & (qp->nWqe - 1)) * 64, sizeof last);
        uint64_t head;
        std::memcpy(&head, &last, 8);
        expect(*qp->uar == head, "the UAR word is the last WQE's control segment head");
        expect(mlx5::ctrlWqeIndex(last) == uint16_t(posted - 1) && mlx5::ctrlQpn(last) == qp->qpn, "last WQE's ctrl");
        mlx5::CtrlSeg first;  // the putValue's WRITE, the post's first WQE
        std::memcpy(&first, qp->sq + ((posted - 2) & (qp->nWqe - 1)) * 64, sizeof first);
        expect((last.fmCeSe & mlx5::kCtrlCqUpdate) && !(first.fmCeSe & mlx5::kCtrlCqUpdate),
               "only a post's last WQE asks for a CQE");
        // One CQE per post (its last WQE asks for it), so kOps of them.
        expect(mlx5::bswap32(qp->cqDbrec[0]) == uint32_t(kOps & 0xffffff),
               "CQ doorbell record is the consumer index, one CQE per post");
        comm.check();
        comm.deregisterWindow(w);
      },
      ibgdaConfig(20'000'000'000ull, 8)));
}

TEST_CASE("ibgda: a full queue makes producers wait for completions, never overwrite", "[ibgda]") {
  REQUIRE_NOTHROW(runRanks(
      1,
      [](Comm& comm) {
        const DevComm dc = comm.devComm();
        constexpr uint32_t kDepth = 8;
        Window w = comm.allocWindow(8 * 64);
        Net net(dc, 0);
        const Team world = teamWorld(dc);
        SoftNic& nic = CommAccess::ibgda(comm)->nic();
        PauseAccess::pause(nic, true);
        for (uint32_t k = 0; k < kDepth; ++k) net.putValue(world, 0, w, 8 * k, uint64_t(k + 1));
        const IbgdaQpState& st = qpState(comm, 0, 0);
        expect(st.ready == kDepth, "the queue holds depth WQEs");
        std::atomic<bool> returned{false};
        std::thread producer([&] {
          for (uint32_t k = 0; k < 3 * kDepth; ++k) net.putValue(world, 0, w, 8 * (k % 64), uint64_t(100 + k));
          returned.store(true);
        });
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        const bool earlyReturn = returned.load();
        const uint64_t readyWhilePaused = st.ready, consumedWhilePaused = nic.consumed(0);
        PauseAccess::pause(nic, false);
        producer.join();
        expect(!earlyReturn, "a producer returned while the queue was full");
        expect(readyWhilePaused == kDepth,
               "a WQE was published into a full queue (ready " + std::to_string(readyWhilePaused) + ")");
        expect(consumedWhilePaused == 0, "the paused NIC consumed WQEs");
        expect(net.flush(CoopThread{}), "flush after resume");
        expect(st.done == 4 * kDepth, "every WQE completed");
        // A completion is not remote visibility, and no signal counts these
        // values: poll for the last one, bounded.
        const auto* slot23 = static_cast<const uint64_t*>(comm.localPointer(w, 8 * 23));
        expect(gintest::eventually(comm, [&] { return atomicLoad(slot23, MemoryOrder::Acquire) == 100 + 23; }),
               "the last value written to slot 23 is " + std::to_string(atomicLoad(slot23, MemoryOrder::Acquire)));
        comm.check();
        comm.deregisterWindow(w);
      },
      ibgdaConfig(20'000'000'000ull, 8)));
}

TEST_CASE("ibgda: a queue that stays full times out into the error record", "[ibgda]") {
  std::string msg;
  REQUIRE_NOTHROW(runRanks(
      1,
      [&](Comm& comm) {
        const DevComm dc = comm.devComm();
        Window w = comm.allocWindow(64);
        Net net(dc, 3);
        const Team world = teamWorld(dc);
        PauseAccess::pause(CommAccess::ibgda(comm)->nic(), true);
        const auto t0 = std::chrono::steady_clock::now();
        for (int k = 0; k < 5; ++k) net.putValue(world, 0, w, 0, uint64_t(k));  // depth 4: the 5th waits
        const auto ms =
            std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
        expect(ms >= 150 && ms < 10000, "the full-queue wait took " + std::to_string(ms) + " ms, timeout is 200");
        msg = checkMessage(comm);
        expect(!net.flush(CoopThread{}), "flush succeeded after an abort");
        PauseAccess::pause(CommAccess::ibgda(comm)->nic(), false);
        comm.deregisterWindow(w);
      },
      ibgdaConfig(200'000'000ull, 4)));
  REQUIRE_THAT(msg, ContainsSubstring("ibgdaQueueFull") && ContainsSubstring("context 3"));
}

TEST_CASE("ibgda: a soft NIC that stops on an error ends the waits on it at once, naming it", "[ibgda]") {
  // Windows count as device memory (GIN_SOFT_NIC_DEFERRED_COPIES), so the
  // NIC's copies go through its copy hook; the test swaps in one that fails,
  // as a side-context copy on a GPU rank can. Before the NIC told the Comm,
  // the flush below waited out its whole 20 s timeout.
  gintest::EnvVar deferred("GIN_SOFT_NIC_DEFERRED_COPIES", "1");
  std::string msg;
  long long ms = -1;
  REQUIRE_NOTHROW(runRanks(
      1,
      [&](Comm& comm) {
        const DevComm dc = comm.devComm();
        Window src = comm.allocWindow(256), dst = comm.allocWindow(256);
        SoftNic& nic = CommAccess::ibgda(comm)->nic();
        PauseAccess::pause(nic, true);  // parked: the hook is not in use while it changes
        nic.setDeviceCopy([](void*, const void*, size_t, bool) { throw Error("injected copy failure"); });
        PauseAccess::pause(nic, false);
        Net net(dc, 0);
        const auto t0 = std::chrono::steady_clock::now();
        net.put(teamWorld(dc), 0, dst, 0, src, 0, 256);
        expect(!net.flush(CoopThread{}), "flush succeeded although the NIC stopped");
        ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
        msg = checkMessage(comm);
      },
      ibgdaConfig(20'000'000'000ull)));
  CAPTURE(ms);
  CHECK(ms < 5000);
  REQUIRE_THAT(msg, ContainsSubstring("ibgdaNic") && ContainsSubstring("soft NIC stopped"));
}

TEST_CASE("ibgda: a bad rkey, a bad lkey, an address out of bounds: error CQE, error record, no write, no hang",
          "[ibgda]") {
  enum class Fault { Rkey, Lkey, RemoteBounds, SignalRkey };
  const Fault fault = GENERATE(Fault::Rkey, Fault::Lkey, Fault::RemoteBounds, Fault::SignalRkey);
  CAPTURE(int(fault));
  std::string msg;
  bool dstClean = true, waitStopped = false;
  REQUIRE_NOTHROW(runRanks(
      2,
      [&](Comm& comm) {
        const DevComm dc = comm.devComm();
        Window src = comm.allocWindow(4096);
        Window dst = comm.allocWindow(4096);
        std::memset(comm.localPointer(src), 0x11, 4096);
        std::memset(comm.localPointer(dst), kPoison, 4096);
        comm.bootstrap().barrier();
        if (comm.rank() == 0) {
          const IbgdaDev* id = dc.ibgda;
          const uint32_t slotD = dst.dev->id % id->maxWindows, slotS = src.dev->id % id->maxWindows;
          // Corrupt this rank's key tables, as a broken host setup would.
          switch (fault) {
            case Fault::Rkey: id->windowRemotes[slotD * 2 + 1].rkey ^= 0x5a5a00; break;
            case Fault::Lkey: id->windows[slotS].lkey ^= 0x3300; break;
            case Fault::RemoteBounds: id->windowRemotes[slotD * 2 + 1].addr += 4000; break;
            case Fault::SignalRkey: id->signalRemotes[1].rkey += 1; break;
          }
          Net net(dc, 1);
          net.put(teamWorld(dc), 1, dst, 0, src, 0, 512, SignalInc{0});
          expect(!net.flush(CoopThread{}), "flush reported success after an error CQE");
          msg = checkMessage(comm);
          // Every wait stops at once (the abort flag), long before the 20 s timeout.
          const auto t0 = std::chrono::steady_clock::now();
          waitStopped =
              !net.waitSignal(CoopThread{}, 5, 1) && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5);
          expect(CommAccess::ibgda(comm)->nic().errors() == 1,
                 "the NIC reported " + std::to_string(CommAccess::ibgda(comm)->nic().errors()) + " errors");
        }
        comm.bootstrap().barrier();
        if (comm.rank() == 1) {
          const auto* d = static_cast<const uint8_t*>(comm.localPointer(dst));
          const size_t clean = fault == Fault::SignalRkey ? 512 : 0;  // the payload itself was fine there
          for (size_t i = clean; i < 4096; ++i) dstClean = dstClean && d[i] == kPoison;
          dstClean = dstClean && Net(dc, 0).readSignal(0) == 0;
        }
        comm.bootstrap().barrier();
        comm.deregisterWindow(dst);
        comm.deregisterWindow(src);
      },
      ibgdaConfig(20'000'000'000ull, 16)));
  REQUIRE(dstClean);
  REQUIRE(waitStopped);
  REQUIRE_THAT(msg, ContainsSubstring("ibgdaCompletionError") && ContainsSubstring("context 1") &&
                        ContainsSubstring("peer 1") && ContainsSubstring("WQE index"));
  switch (fault) {
    case Fault::Rkey:
    case Fault::RemoteBounds:
      REQUIRE_THAT(msg, ContainsSubstring("syndrome 0x13") && ContainsSubstring("remote access error") &&
                            ContainsSubstring("WQE index 0"));
      break;
    case Fault::Lkey:
      REQUIRE_THAT(msg, ContainsSubstring("syndrome 0x04") && ContainsSubstring("local protection error"));
      break;
    case Fault::SignalRkey:
      // The payload WQE (index 0) went through; the signal WQE (index 1) failed.
      REQUIRE_THAT(msg, ContainsSubstring("syndrome 0x13") && ContainsSubstring("WQE index 1"));
      break;
  }
}

TEST_CASE("ibgda: a window not registered with ibgda is refused on the device", "[ibgda]") {
  std::string msg;
  REQUIRE_NOTHROW(runRanks(
      1,
      [&](Comm& comm) {
        const DevComm dc = comm.devComm();
        Window w = comm.allocWindow(64);
        // A forged WindowDev whose id no registration gave out.
        WindowDev fake = *w.dev;
        fake.id = 999;
        Net net(dc, 0);
        net.put(teamWorld(dc), 0, Window{&fake}, 0, w, 0, 8);
        msg = checkMessage(comm);
        expect(CommAccess::ibgda(comm)->nic().executed() == 0, "the NIC executed a WQE for an unknown window");
        comm.deregisterWindow(w);
      },
      ibgdaConfig()));
  REQUIRE_THAT(msg, ContainsSubstring("badArgument") && ContainsSubstring("999"));
}

TEST_CASE("ibgda sink mode: every WQE completes, nothing is written", "[ibgda]") {
  REQUIRE_NOTHROW(runRanks(
      2,
      [](Comm& comm) {
        const DevComm dc = comm.devComm();
        expect(CommAccess::ibgda(comm)->nic().mode() == SoftNic::Mode::Sink, "not in sink mode");
        Window src = comm.allocWindow(1024);
        Window dst = comm.allocWindow(1024);
        std::memset(comm.localPointer(dst), kPoison, 1024);
        comm.bootstrap().barrier();
        Net net(dc, 0);
        for (int k = 0; k < 100; ++k)
          net.put(teamWorld(dc), 1 - comm.rank(), dst, 0, src, 0, 1024, SignalInc{0}, CounterInc{0});
        expect(net.flush(CoopThread{}), "flush in sink mode");
        expect(net.readCounter(0) == 100, "counters count sink completions");
        comm.bootstrap().barrier();
        const auto* d = static_cast<const uint8_t*>(comm.localPointer(dst));
        for (size_t i = 0; i < 1024; ++i) expect(d[i] == kPoison, "the sink wrote data");
        expect(net.readSignal(0) == 0, "the sink applied a signal");
        comm.bootstrap().barrier();
        comm.deregisterWindow(dst);
        comm.deregisterWindow(src);
      },
      ibgdaConfig(20'000'000'000ull, 64, 1u << 20, IbgdaConfig::Device::SoftSink)));
}

TEST_CASE("ibgda deferred doorbell: posts only publish; one ring at flush covers the batch", "[ibgda]") {
  REQUIRE_NOTHROW(runRanks(
      1,
      [](Comm& comm) {
        const DevComm dc = comm.devComm();
        Window w = comm.allocWindow(64);
        Net net(dc, 0);
        const Team world = teamWorld(dc);
        for (uint64_t k = 0; k < 10; ++k) net.putValue(world, 0, w, 8, k + 1, SignalInc{0});
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        const IbgdaQpDev* qp = ibgda::qpOf(dc, 0, 0);
        expect(qp->state->ready == 20, "20 WQEs published");
        expect(CommAccess::ibgda(comm)->nic().consumed(0) == 0 && *qp->dbrec == 0 && *qp->uar == 0,
               "the NIC saw a doorbell before any flush");
        expect(net.readSignal(0) == 0, "a signal arrived without a doorbell");
        expect(net.flush(CoopThread{}), "flush: " + checkMessage(comm));
        // The flush rang the doorbell and saw the completions; the signals are
        // waited for (bounded), not read at once: no doorbell, no signals.
        expect(net.waitSignal(CoopThread{}, 0, 10), "signals after the flush's ring: " + checkMessage(comm));
        expect(net.readSignal(0) == 10, "signals after the flush's ring");
        expect(mlx5::bswap32(qp->dbrec[mlx5::kDbrSend]) == 20, "one ring covers all 20 WQEs");
        expect(qp->state->rung == 20, "rung index");
        comm.check();
        comm.deregisterWindow(w);
      },
      [] {
        CommConfig c = ibgdaConfig(20'000'000'000ull, 64);
        c.ibgda.deferDoorbell = true;
        return c;
      }()));
}

TEST_CASE("ibgda deferred doorbell: many threads, a small queue; producers waiting for room ring", "[ibgda]") {
  REQUIRE_NOTHROW(runRanks(
      2,
      [](Comm& comm) {
        const DevComm dc = comm.devComm();
        const int me = comm.rank(), peer = 1 - me;
        constexpr int kThreads = 4, kOps = 300;
        Window w = comm.allocWindow(8 * kThreads * kOps);
        comm.bootstrap().barrier();
        std::vector<std::thread> ts;
        std::atomic<int> bad{0};
        for (int t = 0; t < kThreads; ++t)
          ts.emplace_back([&, t] {
            Net net(dc, 1);
            for (int k = 0; k < kOps; ++k)
              net.putValue(teamWorld(dc), peer, w, 8 * size_t(t * kOps + k), uint64_t(t * kOps + k + 1),
                           SignalInc{uint32_t(t)}, CoopThread{});
            if (!net.flush(CoopThread{})) bad.fetch_add(1);
          });
        for (auto& th : ts) th.join();
        expect(bad.load() == 0, "flush gave up: " + checkMessage(comm));
        Net net(dc, 1);
        for (int t = 0; t < kThreads; ++t)
          expect(net.waitSignal(CoopThread{}, uint32_t(t), kOps), "waitSignal: " + checkMessage(comm));
        const auto* v = static_cast<const uint64_t*>(comm.localPointer(w));
        for (int i = 0; i < kThreads * kOps; ++i) expect(v[i] == uint64_t(i + 1), "value " + std::to_string(i));
        comm.check();
        comm.bootstrap().barrier();
        comm.deregisterWindow(w);
      },
      [] {
        CommConfig c = ibgdaConfig(20'000'000'000ull, 8);
        c.ibgda.deferDoorbell = true;
        return c;
      }()));
}

// ---- the WQE builders' limits (issue 12, item 5) ----

TEST_CASE("ibgda: maxWqeBytes of 2^31 or more is refused (bit 31 of a data segment's byte count means inline)",
          "[ibgda]") {
  const uint32_t bad = GENERATE(0x80000000u, 0xffffffffu);
  CAPTURE(bad);
  REQUIRE_THROWS_WITH(runRanks(
                          2, [](Comm&) {}, ibgdaConfig(20'000'000'000ull, 64, bad)),
                      ContainsSubstring("maxWqeBytes = " + std::to_string(bad)) && ContainsSubstring("below 2^31"));
  // The largest value that fits is taken as it is.
  REQUIRE_NOTHROW(runRanks(
      1,
      [](Comm& comm) { expect(comm.devComm().ibgda->maxWqeBytes == 0x7fffffffu, "maxWqeBytes 2^31 - 1 was not kept"); },
      ibgdaConfig(20'000'000'000ull, 64, 0x7fffffffu)));
}

TEST_CASE("ibgda put: no data segment's byte count reaches bit 31, whatever maxWqeBytes the table holds", "[ibgda]") {
  REQUIRE_NOTHROW(runRanks(
      1,
      [](Comm& comm) {
        const DevComm dc = comm.devComm();
        Window src = comm.allocWindow(64);
        Window dst = comm.allocWindow(64);
        // A table the host check never let through (corrupt or hand-built).
        const_cast<IbgdaDev*>(dc.ibgda)->maxWqeBytes = 0x80000000u;
        // Sink mode: the NIC reads no payload, so a 4 GiB put needs no 4 GiB buffer.
        const uint64_t bytes = (uint64_t(1) << 32) + 5;
        expect(ibgda::put(dc, 0, 0, dst.dev, 0, src.dev, 0, bytes, ibgda::Action{}), "put: " + checkMessage(comm));
        expect(ibgda::flush(dc, 0), "flush: " + checkMessage(comm));
        const IbgdaQpDev* qp = ibgda::qpOf(dc, 0, 0);
        const uint64_t n = qp->state->resv;
        uint64_t sum = 0;
        for (uint64_t i = 0; i < n; ++i) {
          mlx5::DataSeg d;
          std::memcpy(&d, qp->sq + (i & (qp->nWqe - 1)) * 64 + 32, sizeof d);
          expect(!mlx5::isInline(d.byteCount), "WQE " + std::to_string(i) + " of the put has the inline bit set (" +
                                                   std::to_string(mlx5::dataBytes(d)) + " bytes)");
          sum += mlx5::dataBytes(d);
        }
        expect(n == 3 && sum == bytes, std::to_string(n) + " WQEs carrying " + std::to_string(sum) + " bytes");
        comm.check();
        const_cast<IbgdaDev*>(dc.ibgda)->maxWqeBytes = 4096;
        comm.deregisterWindow(dst);
        comm.deregisterWindow(src);
      },
      ibgdaConfig(20'000'000'000ull, 64, 4096, IbgdaConfig::Device::SoftSink)));
}

TEST_CASE("ibgda putValue: more bytes than a WQE carries inline are refused on the device; nothing is posted",
          "[ibgda]") {
  const uint32_t bytes = GENERATE(9u, 28u, 29u, 40u);
  CAPTURE(bytes);
  std::string msg;
  REQUIRE_NOTHROW(runRanks(
      1,
      [&](Comm& comm) {
        const DevComm dc = comm.devComm();
        Window w = comm.allocWindow(64);
        uint8_t value[64];
        for (size_t i = 0; i < sizeof value; ++i) value[i] = uint8_t(i + 1);
        const bool ok = ibgda::putValue(dc, 1, 0, w.dev, 0, value, bytes, ibgda::Action{});
        msg = checkMessage(comm);
        expect(!ok, "putValue of " + std::to_string(bytes) + " bytes was accepted");
        expect(qpState(comm, 1, 0).resv == 0, "WQE slots were reserved for a refused putValue");
        expect(CommAccess::ibgda(comm)->nic().executed() == 0 && CommAccess::ibgda(comm)->nic().errors() == 0,
               "the NIC saw a WQE for a refused putValue");
        comm.deregisterWindow(w);
      },
      ibgdaConfig()));
  REQUIRE_THAT(msg, ContainsSubstring("badArgument") && ContainsSubstring("value " + std::to_string(bytes)) &&
                        ContainsSubstring("limit 8"));
}

TEST_CASE("ibgda: a compressed CQE (mini-CQE array) is reported as such, never parsed as a completion", "[ibgda]") {
  std::string msg;
  bool flushed = true;
  REQUIRE_NOTHROW(runRanks(
      1,
      [&](Comm& comm) {
        const DevComm dc = comm.devComm();
        Window w = comm.allocWindow(64);
        Net net(dc, 2);
        const Team world = teamWorld(dc);
        net.putValue(world, 0, w, 0, uint64_t(1));
        expect(net.flush(CoopThread{}), "first flush: " + checkMessage(comm));
        SoftNic& nic = CommAccess::ibgda(comm)->nic();
        PauseAccess::pause(nic, true);
        net.putValue(world, 0, w, 8, uint64_t(2));  // WQE 1: published, not consumed
        // What a NIC with CQE compression on for this CQ could write at CQ
        // index 1: this pass's owner bit, format 3 (bits 3..2 of op_own).
        const IbgdaQpDev* qp = ibgda::qpOf(dc, 2, 0);
        mlx5::Cqe64 c;
        mlx5::fillCqe(c, 1, qp->qpn, 0);
        c.b[mlx5::kCqeOpOwn] = uint8_t(mlx5::makeOpOwn(mlx5::kCqeReq, mlx5::cqeExpectedOwner(1, qp->nCqe)) | (3u << 2));
        std::memcpy(qp->cq[1].b, c.b, sizeof c);
        flushed = net.flush(CoopThread{});
        msg = checkMessage(comm);
        expect(qp->state->done == 1, "the compressed block counted as the completion of WQE 1");
        PauseAccess::pause(nic, false);
        comm.deregisterWindow(w);
      },
      ibgdaConfig(20'000'000'000ull, 16)));
  REQUIRE(!flushed);
  REQUIRE_THAT(msg, ContainsSubstring("compressed CQE") && ContainsSubstring("context 2") &&
                        ContainsSubstring("peer 0") && ContainsSubstring("CQ index 1"));
}
