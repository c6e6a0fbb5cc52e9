// Tests of gin/device/batch.hpp (PostBatch) on CPU ranks: every peer through
// ibgda (the soft NIC), with queues small enough that the 16-bit indices wrap
// and reservations close and reopen many times, beside threads posting alone
// to the same QP; and the same calls over lsa and the proxy, where a batch
// runs each call at once.
#include <atomic>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <cstring>
#include <random>
#include <thread>

#include "../common/net_checks.hpp"
#include "gin/device/batch.hpp"
#include "gin/host/test_access.hpp"

using namespace gin;
using gin::test::CommAccess;
using gintest::checkMessage;
using gintest::expect;
using gintest::pattern;
using gintest::runRanks;

namespace {
constexpr uint8_t kPoison = 0xAB;

enum class Via { Ibgda, IbgdaDeferred, Lsa, Proxy };

CommConfig configFor(Via via, uint32_t depth) {
  CommConfig c = gintest::cpuConfig();
  if (via == Via::Lsa) return c;
  if (via == Via::Proxy) {
    c.transport = TransportChoice::Proxy;
    return c;
  }
  c.transport = TransportChoice::Ibgda;
  c.ibgda.device = IbgdaConfig::Device::Soft;
  c.ibgda.qpDepth = depth;
  c.ibgda.maxWqeBytes = 256;  // puts of up to 1000 bytes take up to 4 WRITEs
  c.ibgda.deferDoorbell = via == Via::IbgdaDeferred;
  return c;
}

const char* name(Via v) {
  return v == Via::Ibgda ? "ibgda" : v == Via::IbgdaDeferred ? "ibgda, deferred doorbells" : v == Via::Lsa ? "lsa"
                                                                                                            : "proxy";
}
}  // namespace

// Batch threads put random sizes (some larger than a reservation: posted on
// their own), inline values and bare signals, each with a counter, while
// plain threads post to the same QP; every byte, value, signal and counter is
// checked, and over ibgda the QP's indices agree (nothing reserved is left
// unpublished: resv == ready == done).
TEST_CASE("PostBatch: batches and plain posts share a QP; every byte, value, signal and counter arrives",
          "[batch]") {
  const Via via = GENERATE(Via::Ibgda, Via::IbgdaDeferred, Via::Lsa, Via::Proxy);
  const uint32_t depth = GENERATE(8u, 64u);
  const uint32_t slots = GENERATE(1u, 6u, 1000u);  // 1000: clamped to the queue
  if (via != Via::Ibgda && via != Via::IbgdaDeferred && (depth != 8 || slots != 6)) return;  // one shape is enough
  CAPTURE(name(via), depth, slots);
  REQUIRE_NOTHROW(runRanks(
      3,
      [&](Comm& comm) {
        const DevComm dc = comm.devComm();
        const int n = comm.nRanks(), me = comm.rank(), peer = (me + 1) % n, from = (me + n - 1) % n;
        constexpr int kBatchThreads = 3, kPlainThreads = 2, kOps = 150;
        constexpr int kThreads = kBatchThreads + kPlainThreads;
        constexpr size_t kMax = 1000;
        const size_t per = kMax * kOps;
        Window src = comm.allocWindow(per * kThreads);
        Window dst = comm.allocWindow(per * kThreads);
        Window vals = comm.allocWindow(8 * kThreads * kOps);
        auto* s = static_cast<uint8_t*>(comm.localPointer(src));
        auto* d = static_cast<uint8_t*>(comm.localPointer(dst));
        auto* v = static_cast<uint64_t*>(comm.localPointer(vals));
        for (size_t i = 0; i < per * kThreads; ++i) s[i] = pattern(5, me, i);
        std::memset(d, kPoison, per * kThreads);
        for (int i = 0; i < kThreads * kOps; ++i) v[i] = ~uint64_t(0);
        // The sizes each thread puts (the same sequence on every rank: the receiver checks them).
        std::vector<size_t> size(size_t(kThreads) * kOps);
        std::mt19937 rng(1234);
        for (size_t& z : size) z = rng() % 5 == 0 ? 0 : 1 + rng() % kMax;
        comm.bootstrap().barrier();
        const Team world = teamWorld(dc);
        std::vector<std::thread> ts;
        std::atomic<int> bad{0};
        for (int t = 0; t < kThreads; ++t)
          ts.emplace_back([&, t] {
            Net net(dc, 1);  // every thread on the same (context 1, peer) QP
            const auto op = [&](auto& poster, int k) {
              const size_t off = size_t(t) * per + size_t(k) * kMax, bytes = size[size_t(t) * kOps + size_t(k)];
              const uint64_t value = uint64_t(t) << 32 | uint64_t(k + 1);
              switch (k % 3) {
                case 0: poster.put(dst, off, src, off, bytes, SignalInc{uint32_t(t)}, CounterInc{uint32_t(t)}); break;
                case 1: poster.putValue(vals, 8 * size_t(t * kOps + k), value, SignalInc{uint32_t(t)}); break;
                default:
                  // A put without signal, then a bare signal: the signal still follows the payload.
                  poster.put(dst, off, src, off, bytes, None{}, CounterInc{uint32_t(t)});
                  poster.signal(SignalInc{uint32_t(t)});
              }
            };
            if (t < kBatchThreads) {
              PostBatch batch(net, world, peer, slots);
              for (int k = 0; k < kOps; ++k) {
                op(batch, k);
                if (k % 50 == 49 && !batch.close()) bad.fetch_add(1);  // closing mid-way keeps it usable
              }
              if (!batch.close()) bad.fetch_add(1);
            } else {
              struct Plain {
                const Net<>& net;
                Team world;
                int peer;
                void put(Window a, size_t ao, Window b, size_t bo, size_t bytes, SignalInc s, CounterInc c) {
                  net.put(world, peer, a, ao, b, bo, bytes, s, c);
                }
                void put(Window a, size_t ao, Window b, size_t bo, size_t bytes, None, CounterInc c) {
                  net.put(world, peer, a, ao, b, bo, bytes, None{}, c);
                }
                void putValue(Window w, size_t o, uint64_t x, SignalInc s) { net.putValue(world, peer, w, o, x, s); }
                void signal(SignalInc s) { net.signal(world, peer, s); }
              } plain{net, world, peer};
              for (int k = 0; k < kOps; ++k) op(plain, k);
            }
            if (!net.flush(CoopThread{})) bad.fetch_add(1);
            const uint64_t puts = uint64_t((kOps + 2) / 3 + kOps / 3);  // cases 0 and 2 count
            if (net.readCounter(uint32_t(t)) != puts) bad.fetch_add(1);
          });
        for (auto& th : ts) th.join();
        expect(bad.load() == 0, std::string("a close or flush gave up, or a counter is short: ") + checkMessage(comm));
        Net net(dc, 1);
        for (int t = 0; t < kThreads; ++t)
          expect(net.waitSignal(CoopThread{}, uint32_t(t), uint64_t(kOps)), "waitSignal: " + checkMessage(comm));
        comm.bootstrap().barrier();  // every rank's signals are in: so are its payloads
        for (int t = 0; t < kThreads; ++t)
          for (int k = 0; k < kOps; ++k) {
            const size_t off = size_t(t) * per + size_t(k) * kMax, bytes = size[size_t(t) * kOps + size_t(k)];
            const bool payload = k % 3 != 1;
            for (size_t i = 0; i < kMax; ++i) {
              const uint8_t want = payload && i < bytes ? pattern(5, from, off + i) : kPoison;
              if (d[off + i] != want)
                expect(false, "thread " + std::to_string(t) + " op " + std::to_string(k) + " byte " +
                                  std::to_string(i) + " wrong");
            }
            const uint64_t want = k % 3 == 1 ? (uint64_t(t) << 32 | uint64_t(k + 1)) : ~uint64_t(0);
            expect(v[t * kOps + k] == want, "value of thread " + std::to_string(t) + " op " + std::to_string(k));
          }
        if (via == Via::Ibgda || via == Via::IbgdaDeferred) {
          const IbgdaQpState& st = *ibgda::qpOf(dc, 1, peer)->state;
          expect(st.resv == st.ready && st.ready == st.done,
                 "QP indices: resv " + std::to_string(st.resv) + " ready " + std::to_string(st.ready) + " done " +
                     std::to_string(st.done));
          expect(st.resv > 8 * depth, "the queue did not wrap many times");
          expect(CommAccess::ibgda(comm)->nic().executed() >= st.done, "the NIC did not execute the WQEs");
        }
        comm.check();
        comm.bootstrap().barrier();
        comm.deregisterWindow(vals);
        comm.deregisterWindow(dst);
        comm.deregisterWindow(src);
      },
      configFor(via, depth)));
}

// Over ibgda 40 signals through a batch of 100 slots are one reservation of
// 101 WQEs (the 40 signals, then 61 NOPs, the last with the CQE), published
// once, when the batch closes.
TEST_CASE("PostBatch over ibgda: one reservation, one publication, NOPs fill what the calls left", "[batch]") {
  REQUIRE_NOTHROW(runRanks(
      2,
      [](Comm& comm) {
        const DevComm dc = comm.devComm();
        const int peer = 1 - comm.rank();
        Net net(dc, 0);
        const IbgdaQpState& st = *ibgda::qpOf(dc, 0, peer)->state;
        {
          PostBatch batch(net, teamWorld(dc), peer, 100);
          for (int k = 0; k < 40; ++k) batch.signal(SignalAdd{3, 2});
          expect(st.resv == 101 && st.ready == 0, "the batch reserved 101 WQEs and published none: resv " +
                                                      std::to_string(st.resv) + " ready " + std::to_string(st.ready));
        }
        expect(st.ready == 101, "the closed batch published its whole reservation");
        expect(net.flush(CoopThread{}), "flush: " + checkMessage(comm));
        expect(net.waitSignal(CoopThread{}, 3, 80), "waitSignal: " + checkMessage(comm));
        comm.bootstrap().barrier();
        expect(net.readSignal(3) == 80, "the NOPs changed nothing at the peer");
        comm.check();
      },
      configFor(Via::Ibgda, 256)));
}

// The rule "close before waiting", broken: a flush inside an open batch
// waits for WQEs that only the close publishes; it gives up at the timeout
// with an error that names the open batch, and nothing hangs. A peer out of
// range is refused when the batch opens; nothing is posted.
TEST_CASE("PostBatch: a flush inside an open batch times out naming it; a bad peer is refused", "[batch]") {
  CommConfig shortTimeout = configFor(Via::Ibgda, 64);
  shortTimeout.timeoutNs = 300'000'000ull;
  const std::vector<std::string> errs = gintest::rankErrors(1, shortTimeout, [](Comm& comm) {
    const DevComm dc = comm.devComm();
    Net net(dc, 0);
    PostBatch batch(net, teamWorld(dc), 0, 16);
    batch.signal(SignalInc{0});
    (void)net.flush(CoopThread{});
    comm.check();
  });
  CHECK(errs[0].find("ibgdaFlush") != std::string::npos);
  CHECK(errs[0].find("PostBatch") != std::string::npos);
  REQUIRE_NOTHROW(runRanks(
      2,
      [](Comm& comm) {
        const DevComm dc = comm.devComm();
        Net net(dc, 0);
        {
          PostBatch batch(net, teamWorld(dc), 5, 16);  // 2 ranks: peer 5 does not exist
          batch.signal(SignalInc{0});
          expect(!batch.close(), "a batch to a peer out of range closed without failing");
        }
        expect(ibgda::qpOf(dc, 0, 1 - comm.rank())->state->resv == 0, "something was posted");
        bool threw = false;
        try {
          comm.check();
        } catch (const std::exception& e) {
          threw = std::string(e.what()).find("badArgument") != std::string::npos;
        }
        expect(threw, "the bad peer was not recorded as a bad argument");
      },
      configFor(Via::Ibgda, 64)));
}
