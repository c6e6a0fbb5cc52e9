// Tests of the proxy's tcp wire (gin/host/tcp_wire.hpp) and of how the Comm
// picks it: CPU ranks as threads and as processes over loopback, ranks that
// pretend to be on two hosts (GIN_HOST_ID), ranks in two network namespaces
// joined by a veth pair (root only), malformed frames injected at a
// receiver, and a rank killed in the middle of a run.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <poll.h>
#include <atomic>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "../common/net_checks.hpp"
#include "../common/processes.hpp"
#include "gin/host/tcp_frame.hpp"
#include "gin/host/test_access.hpp"

using namespace gin;
using Catch::Matchers::ContainsSubstring;
using gin::test::CommAccess;
using gintest::checkMessage;
using gintest::expect;
using gintest::pattern;
using gintest::runRanks;

namespace {
constexpr uint8_t kPoison = 0xAB;
using Clock = std::chrono::steady_clock;

CommConfig tcpConfig(uint64_t timeoutNs = 20'000'000'000ull, uint32_t ringSlots = 1024) {
  CommConfig c = gintest::cpuConfig(timeoutNs);
  c.transport = TransportChoice::Proxy;
  c.proxy.wire = ProxyWire::Tcp;
  c.proxy.ringSlots = ringSlots;
  return c;
}

uint64_t freshSeed() {
  static std::random_device rd;
  return (uint64_t(rd()) << 32) ^ rd();
}

// The message is read after `ok` was computed (argument order is unspecified).
void expectOk(const Comm& comm, bool ok, const std::string& what) {
  if (!ok) expect(false, what + ": " + checkMessage(comm));
}

// Every other rank over tcp, itself by a copy.
void expectTcpToOthers(Comm& comm) {
  for (int r = 0; r < comm.nRanks(); ++r) {
    expect(comm.transportTo(r) == Transport::Proxy, "transport to " + std::to_string(r) + " is not proxy");
    const ProxyWire want = r == comm.rank() ? ProxyWire::Local : ProxyWire::Tcp;
    expect(comm.proxyWireTo(r) == want,
           "wire to " + std::to_string(r) + " is " + detail::proxyWireName(comm.proxyWireTo(r)));
  }
  if (comm.nRanks() > 1) expect(CommAccess::tcpWire(comm) != nullptr, "no tcp wire");
}

// Between test phases on one Comm: everything sent is applied everywhere,
// then the signals and counters a phase used start from zero again.
void resetAll(Comm& comm, std::initializer_list<uint32_t> signals, std::initializer_list<uint32_t> counters) {
  const DevComm dc = comm.devComm();
  for (int c = 0; c < dc.nContexts; ++c) expect(Net(dc, c).flush(CoopThread{}), "flush");
  if (CommAccess::tcpWire(comm)) expectOk(comm, CommAccess::tcpWire(comm)->fence(10'000'000'000ull), "fence");
  comm.bootstrap().barrier();
  Net net(dc, 0);
  for (uint32_t s : signals) net.resetSignal(s);
  for (uint32_t c : counters) net.resetCounter(c);
  comm.bootstrap().barrier();
}

// The shared all-to-all check (tests/common/net_checks.hpp), and the bytes
// really crossed the tcp wire.
void allToAllPut(Comm& comm, size_t bytes, size_t srcMis, size_t dstMis, uint64_t seed) {
  const uint64_t appliedBefore = CommAccess::tcpWire(comm) ? CommAccess::tcpWire(comm)->framesApplied() : 0;
  gintest::allToAllPut(comm, bytes, srcMis, dstMis, seed);
  if (comm.nRanks() > 1)
    expect(CommAccess::tcpWire(comm)->framesApplied() > appliedBefore, "nothing arrived over the tcp wire");
}

// putValue of every width, SignalInc/Add/Set, CounterInc, waits, resets.
void valuesSignalsCounters(Comm& comm) {
  const DevComm dc = comm.devComm();
  const int n = comm.nRanks(), me = comm.rank();
  const Team world = teamWorld(dc);
  Window w = comm.allocWindow(64 * size_t(n));
  gintest::putValueWidths(comm, w, 1);

  Net sig(dc, 2);
  for (int round = 0; round < 2; ++round) {  // the second round after resets
    for (int p = 0; p < n; ++p) {
      sig.signal(world, p, None{});
      sig.signal(world, p, SignalInc{0});
      sig.signal(world, p, SignalAdd{1, uint64_t(me + 1) << 20});
    }
    expect(sig.waitSignal(CoopThread{}, 0, uint64_t(n)), "SignalInc count");
    expect(sig.waitSignal(CoopThread{}, 1, uint64_t(n * (n + 1) / 2) << 20), "SignalAdd sum");
    expect(sig.flush(CoopThread{}), "flush");
    CommAccess::tcpWire(comm)->fence(5'000'000'000ull);  // everyone's frames to us are applied: an extra one would show
    comm.bootstrap().barrier();
    expect(sig.readSignal(0) == uint64_t(n), "SignalInc overshoot");
    expect(sig.readSignal(1) == uint64_t(n * (n + 1) / 2) << 20, "SignalAdd overshoot");
    const int prev = (me + n - 1) % n;
    sig.signal(world, (me + 1) % n, SignalSet{2, 1000 + uint64_t(me) + uint64_t(round) * 77});
    expect(sig.waitSignal(CoopThread{}, 2, 1000 + uint64_t(prev) + uint64_t(round) * 77), "SignalSet wait");
    expect(sig.readSignal(2) == 1000 + uint64_t(prev) + uint64_t(round) * 77, "SignalSet value");
    expect(sig.flush(CoopThread{}), "flush");
    CommAccess::tcpWire(comm)->fence(5'000'000'000ull);
    comm.bootstrap().barrier();
    sig.resetSignal(0);
    sig.resetSignal(1);
    sig.resetSignal(2);
    expect(sig.readSignal(0) == 0 && sig.readSignal(1) == 0 && sig.readSignal(2) == 0, "resetSignal");
    comm.bootstrap().barrier();
  }

  Net cnt(dc, 3);
  for (int k = 0; k < 10; ++k)
    for (int p = 0; p < n; ++p)
      cnt.put(world, p, w, 64 * size_t(me) + 24, w, 64 * size_t(me) + 24, 16, None{}, CounterInc{4});
  expect(cnt.waitCounter(CoopThread{}, 4, uint64_t(10 * n)), "waitCounter");
  expect(cnt.flush(CoopThread{}), "flush");
  expect(cnt.readCounter(4) == uint64_t(10 * n), "readCounter");
  cnt.resetCounter(4);
  expect(cnt.readCounter(4) == 0, "resetCounter");
  expect(CommAccess::proxyEngine(comm)->rejected() == 0, "the engine rejected a descriptor");
  comm.check();
  resetAll(comm, {9}, {});
  comm.deregisterWindow(w);
}

// Ping-pong with large slots: whenever the signal is seen, the whole payload is there.
void orderingStress(Comm& comm, size_t slotBytes, int iters) {
  const DevComm dc = comm.devComm();
  const int me = comm.rank(), peer = 1 - me;
  constexpr size_t kSlots = 4;
  Window w = comm.allocWindow(slotBytes * kSlots);
  Window src = comm.allocWindow(slotBytes * kSlots);
  Net net(dc, me % dc.nContexts);
  const Team world = teamWorld(dc);
  auto* d = static_cast<const uint64_t*>(comm.localPointer(w));
  for (int k = 0; k < iters; ++k) {
    if (k >= int(kSlots)) expectOk(comm, net.waitSignal(CoopThread{}, 1, uint64_t(k - kSlots + 1)), "ack wait");
    auto* s = static_cast<uint64_t*>(comm.localPointer(src, size_t(k % kSlots) * slotBytes));
    for (size_t i = 0; i < slotBytes / 8; ++i) s[i] = (uint64_t(me) << 56) | (uint64_t(k) << 32) | i;
    net.put(world, peer, w, size_t(k % kSlots) * slotBytes, src, size_t(k % kSlots) * slotBytes, slotBytes,
            SignalInc{0});
    expectOk(comm, net.waitSignal(CoopThread{}, 0, uint64_t(k + 1)), "data wait");
    const uint64_t* blk = d + size_t(k % kSlots) * slotBytes / 8;
    for (size_t i = 0; i < slotBytes / 8; ++i)
      if (blk[i] != ((uint64_t(peer) << 56) | (uint64_t(k) << 32) | i))
        expect(false, "iteration " + std::to_string(k) + ": word " + std::to_string(i) + " = " +
                          std::to_string(blk[i]) + " was not yet written when the signal arrived");
    net.signal(world, peer, SignalInc{1});
  }
  expect(net.flush(CoopThread{}), "flush");
  comm.check();
  resetAll(comm, {0, 1}, {});
  comm.deregisterWindow(src);
  comm.deregisterWindow(w);
}

// Threads on every context push putValue+SignalInc into small rings at once.
void contention(Comm& comm, int pushers, int perPeer) {
  const DevComm dc = comm.devComm();
  const int n = comm.nRanks(), me = comm.rank();
  const size_t perSender = size_t(pushers) * size_t(perPeer);
  Window w = comm.allocWindow(8 * perSender * size_t(n));
  std::memset(comm.localPointer(w), 0, 8 * perSender * size_t(n));
  comm.bootstrap().barrier();
  std::vector<std::thread> threads;
  for (int t = 0; t < pushers; ++t)
    threads.emplace_back([&, t] {
      Net net(dc, t % dc.nContexts);
      for (int k = 0; k < perPeer; ++k)
        for (int q = 0; q < n; ++q) {
          const int p = (me + q + t) % n;
          const size_t idx = size_t(me) * perSender + size_t(t) * size_t(perPeer) + size_t(k);
          net.putValue(teamWorld(dc), p, w, 8 * idx, (uint64_t(me + 1) << 40) | (uint64_t(t) << 20) | uint64_t(k),
                       SignalInc{5});
        }
    });
  for (auto& th : threads) th.join();
  Net net(dc, 0);
  const uint64_t total = uint64_t(n) * perSender;
  expectOk(comm, net.waitSignal(CoopThread{}, 5, total), "not every descriptor arrived");
  for (int c = 0; c < dc.nContexts; ++c) expect(Net(dc, c).flush(CoopThread{}), "flush");
  CommAccess::tcpWire(comm)->fence(5'000'000'000ull);
  comm.bootstrap().barrier();
  expect(net.readSignal(5) == total, "signal overshoot: a frame was applied twice (" +
                                         std::to_string(net.readSignal(5)) + " != " + std::to_string(total) + ")");
  const auto* got = static_cast<const uint64_t*>(comm.localPointer(w));
  for (int s = 0; s < n; ++s)
    for (int t = 0; t < pushers; ++t)
      for (int k = 0; k < perPeer; ++k) {
        const size_t idx = size_t(s) * perSender + size_t(t) * size_t(perPeer) + size_t(k);
        expect(got[idx] == ((uint64_t(s + 1) << 40) | (uint64_t(t) << 20) | uint64_t(k)),
               "value from rank " + std::to_string(s) + " pusher " + std::to_string(t) + " #" + std::to_string(k) +
                   " missing");
      }
  comm.check();
  resetAll(comm, {5}, {});
  comm.deregisterWindow(w);
}

// ---- processes ----

using gintest::forkRanks;  // tests/common/processes.hpp

// Captures what this process writes to stderr while `f` runs.
std::string captureStderr(const std::function<void()>& f) {
  std::fflush(stderr);
  char path[] = "/tmp/gin-stderr-XXXXXX";
  const int fd = mkstemp(path);
  const int saved = dup(2);
  dup2(fd, 2);
  try {
    f();
  } catch (...) {
    std::fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    unlink(path);
    throw;
  }
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  close(fd);
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  unlink(path);
  return ss.str();
}

}  // namespace

// ---- format ----

TEST_CASE("tcp wire: XXH64 matches the reference implementation's values", "[tcp][format]") {
  CHECK(xxh64("", 0) == 0xef46db3751d8e999ull);
  CHECK(xxh64("a", 1) == 0xd24ec4f1a98c6e5bull);
  CHECK(xxh64("abc", 3) == 0x44bc2cf5ad770999ull);
  const char* s = "Nobody inspects the spammish repetition";
  CHECK(xxh64(s, std::strlen(s)) == 0xfbcea83c8a378bf1ull);
  std::string big;
  for (int k = 0; k < 3; ++k)
    for (int i = 0; i < 256; ++i) big.push_back(char(i));
  big += "xyz";  // 771 bytes: the 32-byte stripes, then 8-, 4- and 1-byte tails
  CHECK(xxh64(big.data(), big.size()) == 0xe921a1b45bd779f8ull);
}

TEST_CASE("tcp wire: a sealed frame carries both checksums; any flipped header bit changes the header sum",
          "[tcp][format]") {
  TcpFrame h{};
  h.type = uint8_t(TcpFrameType::Data);
  h.sender = 3;
  h.window = 7;
  h.offset = 4096;
  h.length = 5;
  h.seq = 42;
  sealTcpFrame(h, "hello");
  CHECK(h.magic == kTcpFrameMagic);
  CHECK(h.version == kTcpWireVersion);
  CHECK(h.payloadSum == xxh64("hello", 5));
  CHECK(h.headerSum == xxh64(&h, 64));
  for (size_t bit = 0; bit < 64 * 8; ++bit) {
    TcpFrame f = h;
    reinterpret_cast<unsigned char*>(&f)[bit / 8] ^= uint8_t(1u << (bit % 8));
    REQUIRE(xxh64(&f, 64) != f.headerSum);
  }
}

// ---- CPU ranks as threads, every peer forced through the proxy over tcp ----

TEST_CASE("tcp wire (threads): forcing tcp uses it for every other rank and a copy for oneself; GIN_DEBUG shows it",
          "[tcp][select]") {
  std::string out = captureStderr([] {
    gintest::EnvVar dbg("GIN_DEBUG", "1");
    runRanks(
        3, [](Comm& comm) { expectTcpToOthers(comm); }, tcpConfig());
  });
  CHECK_THAT(out, ContainsSubstring("0=proxy 1=proxy 2=proxy") &&
                      ContainsSubstring("proxy wires: 0=local 1=tcp 2=tcp") && ContainsSubstring("tcp wire on port"));
  // The environment overrides the config; a bad value is an error naming it.
  {
    gintest::EnvVar w("GIN_PROXY_WIRE", "local");
    CHECK_NOTHROW(runRanks(
        2,
        [](Comm& comm) {
          expect(comm.proxyWireTo(1 - comm.rank()) == ProxyWire::Local && !CommAccess::tcpWire(comm),
                 "env local ignored");
        },
        tcpConfig()));
  }
  {
    gintest::EnvVar w("GIN_PROXY_WIRE", "smoke-signals");
    CHECK_THROWS_WITH(runRanks(
                          2, [](Comm&) {}, tcpConfig()),
                      ContainsSubstring("GIN_PROXY_WIRE=\"smoke-signals\""));
  }
  // Auto on one host: the local wire, no sockets.
  CommConfig autoCfg = tcpConfig();
  autoCfg.proxy.wire = ProxyWire::Auto;
  CHECK_NOTHROW(runRanks(
      2,
      [](Comm& comm) {
        expect(comm.proxyWireTo(1 - comm.rank()) == ProxyWire::Local && !CommAccess::tcpWire(comm), "auto on one host");
      },
      autoCfg));
  // Ranks must agree.
  CHECK_THROWS_WITH(gintest::runRankThreads(
                        2,
                        [](int r) {
                          CommConfig c = tcpConfig();
                          if (r == 1) c.proxy.wire = ProxyWire::Local;
                          return c;
                        },
                        [](Comm&) {}),
                    ContainsSubstring("ranks disagree on the proxy wire") && ContainsSubstring("rank 1 for local"));
}

TEST_CASE("tcp wire (threads): put delivers every byte to every peer on every context, any size and alignment",
          "[tcp][put]") {
  const size_t bytes =
      GENERATE(size_t(0), size_t(1), size_t(7), size_t(4099), size_t((1 << 20) + 13), size_t(3 << 20) + 5);
  const auto mis = GENERATE(std::pair<size_t, size_t>{0, 0}, std::pair<size_t, size_t>{3, 5});
  const uint64_t seed = freshSeed();
  CAPTURE(bytes, mis.first, mis.second, seed);
  REQUIRE_NOTHROW(runRanks(
      3,
      [&](Comm& comm) {
        expectTcpToOthers(comm);
        allToAllPut(comm, bytes, mis.first, mis.second, seed);
      },
      tcpConfig()));
}

TEST_CASE("tcp wire (threads): putValue of every width, SignalInc/Add/Set, CounterInc, waits and resets",
          "[tcp][signal][counter]") {
  REQUIRE_NOTHROW(runRanks(4, valuesSignalsCounters, tcpConfig()));
}

TEST_CASE("tcp wire (threads): put+signal ordering under stress, within and across 1 MiB frames", "[tcp][ordering]") {
  REQUIRE_NOTHROW(runRanks(
      2, [](Comm& comm) { orderingStress(comm, 32768, 300); }, tcpConfig()));
  REQUIRE_NOTHROW(runRanks(
      2, [](Comm& comm) { orderingStress(comm, (5 << 18) + 8, 24); }, tcpConfig()));
}

TEST_CASE("tcp wire (threads): many threads on every context push at once; nothing lost or applied twice",
          "[tcp][contention]") {
  REQUIRE_NOTHROW(runRanks(
      4, [](Comm& comm) { contention(comm, 8, 40); }, tcpConfig(20'000'000'000ull, 16)));
}

TEST_CASE(
    "tcp wire (threads): 2, 3 and 4 engine threads send to every peer at once: data there whenever its "
    "signal is, every descriptor run exactly once",
    "[tcp][threads]") {
  const int threads = GENERATE(2, 3, 4);
  const uint64_t seed = freshSeed();
  CAPTURE(threads, seed);
  CommConfig cfg = tcpConfig(20'000'000'000ull, 16);
  cfg.nContexts = 5;
  cfg.proxy.threads = uint32_t(threads);
  const int want = gintest::expectedThreads(cfg);
  REQUIRE_NOTHROW(runRanks(
      4,
      [&](Comm& comm) {
        expectTcpToOthers(comm);
        expect(CommAccess::proxyEngine(comm)->threadCount() == want,
               "engine threads: " + std::to_string(CommAccess::proxyEngine(comm)->threadCount()));
        gintest::engineStress(comm, seed, 7, 16, 8192);
        gintest::engineStress(comm, seed + 1, 4, 6, 3 << 19);  // frames of 1 MiB from several threads to one peer
      },
      cfg));
}

TEST_CASE("tcp wire (threads): a put issued as soon as allocWindow returns is applied on every peer",
          "[tcp][window]") {
  REQUIRE_NOTHROW(runRanks(
      4, [](Comm& comm) { gintest::putRightAfterAlloc(comm, 60); }, tcpConfig()));
}

// ---- malformed frames ----

namespace {
struct BadFrame {
  const char* name;
  Op op;
  WireFault fault;
  const char* text;  // in the error message
};

// Rank 0 injects a frame (built by `make` with the next sequence number and
// the window id) at rank 1, then a valid frame; rank 1 must reject the first
// with the expected error, write nothing, and apply nothing after it.
// The rank's error message once its record is complete, "" if none within
// 10 s. Not `while (!hasError())`: hasError() holds from the claim (state 1),
// while the wire thread is still filling the record, and check() throws only
// once it is complete (state 2), so a check() right after it may find nothing.
std::string waitForMessage(const Comm& comm) {
  const auto t0 = Clock::now();
  std::string m = checkMessage(comm);
  while (m.empty() && Clock::now() - t0 < std::chrono::seconds(10)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    m = checkMessage(comm);
  }
  return m;
}

std::string injectAndCheck(const std::function<std::vector<char>(uint64_t seq, uint32_t window)>& make,
                           bool truncate = false) {
  std::string msg;
  runRanks(
      2,
      [&](Comm& comm) {
        Window w = comm.allocWindow(256);
        std::memset(comm.localPointer(w), kPoison, 256);
        comm.bootstrap().barrier();
        TcpWire& tw = *CommAccess::tcpWire(comm);
        if (comm.rank() == 0) {
          const uint64_t seq = tw.nextSeqForTest(1);
          std::vector<char> bad = make(seq, w.dev->id);
          expect(tw.injectForTest(1, bad.data(), bad.size(), 1), "inject");
          if (truncate) {
            tw.shutdownSendForTest(1);
          } else {
            // A good frame behind it: it must not be applied either.
            TcpFrame g{};
            g.type = uint8_t(TcpFrameType::Data);
            g.action = uint8_t(ProxyAction::Add);
            g.signalId = 3;
            g.value = 1;
            g.window = w.dev->id;
            g.offset = 64;
            g.length = 8;
            g.seq = seq + 1;
            const uint64_t v = 0x1122334455667788ull;
            sealTcpFrame(g, &v);
            std::vector<char> good(sizeof g + 8);
            std::memcpy(good.data(), &g, sizeof g);
            std::memcpy(good.data() + sizeof g, &v, 8);
            (void)tw.injectForTest(1, good.data(), good.size(), 1);  // may fail: rank 1 closes on the bad one
          }
          // Rank 1 shuts the connection after rejecting: the sender learns it lost rank 1.
          const std::string senderMsg = waitForMessage(comm);
          expect(senderMsg.find("peerLost") != std::string::npos && senderMsg.find("peer 1") != std::string::npos,
                 "the sender's error does not name the peer that closed: " + senderMsg);
          // The receiver records the error, then marks the peer lost: the
          // flag may trail the record by a moment (seen under TSan on 2 cores).
          const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
          while (!tw.peerLost(1) && std::chrono::steady_clock::now() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          expect(tw.peerLost(1), "peerLost(1) within 5 s of the error record");
        } else {
          msg = waitForMessage(comm);
          std::this_thread::sleep_for(std::chrono::milliseconds(50));  // a frame applied after it would show
          const auto* b = static_cast<const uint8_t*>(comm.localPointer(w));
          for (size_t i = 0; i < 256; ++i)
            expect(b[i] == kPoison, "byte " + std::to_string(i) + " was written by a rejected or later frame");
          for (uint32_t s = 0; s < uint32_t(comm.devComm().nSignals); ++s)
            expect(Net(comm.devComm(), 0).readSignal(s) == 0, "signal " + std::to_string(s) + " moved");
          expect(tw.framesApplied() == 0, "frames applied: " + std::to_string(tw.framesApplied()));
        }
        comm.bootstrap().barrier();
      },
      tcpConfig(5'000'000'000ull));
  return msg;
}

// The frame's bytes, sealed like the sender does (over the payload actually
// sent, which may disagree with h.length on purpose).
std::vector<char> frameBytes(TcpFrame h, const std::vector<char>& payload, bool seal = true) {
  if (seal) {
    h.magic = kTcpFrameMagic;
    h.version = kTcpWireVersion;
    h.payloadSum = payload.empty() ? 0 : xxh64(payload.data(), payload.size());
    h.headerSum = xxh64(&h, 64);
  }
  std::vector<char> out(sizeof h + payload.size());
  std::memcpy(out.data(), &h, sizeof h);
  if (!payload.empty()) std::memcpy(out.data() + sizeof h, payload.data(), payload.size());
  return out;
}

TcpFrame dataFrame(uint64_t seq, uint32_t window, uint64_t offset, uint64_t length) {
  TcpFrame h{};
  h.type = uint8_t(TcpFrameType::Data);
  h.sender = 0;
  h.window = window;
  h.offset = offset;
  h.length = length;
  h.seq = seq;
  return h;
}
}  // namespace

TEST_CASE("tcp wire: malformed frames are rejected with an error naming the fault, and nothing is written",
          "[tcp][malformed]") {
  const std::vector<char> eight(8, 'x');
  using Make = std::function<std::vector<char>(uint64_t, uint32_t)>;
  struct Case {
    const char* name;
    Make make;
    const char* expectText;
  };
  const std::vector<Case> cases = {
      {"bad magic",
       [&](uint64_t seq, uint32_t win) {
         TcpFrame h = dataFrame(seq, win, 0, 8);
         sealTcpFrame(h, eight.data());
         h.magic = 0x12345678;
         return frameBytes(h, eight, false);
       },
       "bad magic"},
      {"bad version",
       [&](uint64_t seq, uint32_t win) {
         TcpFrame h = dataFrame(seq, win, 0, 8);
         sealTcpFrame(h, eight.data());
         h.version = 9;
         h.headerSum = xxh64(&h, 64);
         return frameBytes(h, eight, false);
       },
       "unsupported wire version"},
      {"bad header checksum",
       [&](uint64_t seq, uint32_t win) {
         TcpFrame h = dataFrame(seq, win, 0, 8);
         sealTcpFrame(h, eight.data());
         h.offset = 8;  // changed after sealing
         return frameBytes(h, eight, false);
       },
       "header checksum mismatch"},
      {"bad payload checksum",
       [&](uint64_t seq, uint32_t win) {
         std::vector<char> p = eight;
         TcpFrame h = dataFrame(seq, win, 0, 8);
         sealTcpFrame(h, p.data());
         p[3] ^= 1;  // corrupted in transit
         return frameBytes(h, p, false);
       },
       "payload checksum mismatch"},
      {"oversized",
       [&](uint64_t seq, uint32_t win) { return frameBytes(dataFrame(seq, win, 0, kTcpMaxPayload + 1), {}); },
       "oversized payload"},
      {"out of bounds", [&](uint64_t seq, uint32_t win) { return frameBytes(dataFrame(seq, win, 252, 8), eight); },
       "range past the end of the window"},
      {"offset wraps around",
       [&](uint64_t seq, uint32_t win) { return frameBytes(dataFrame(seq, win, ~uint64_t(0) - 3, 8), eight); },
       "range past the end of the window"},
      {"unknown window", [&](uint64_t seq, uint32_t) { return frameBytes(dataFrame(seq, 999, 0, 8), eight); },
       "unknown window"},
      {"bad signal id",
       [&](uint64_t seq, uint32_t win) {
         TcpFrame h = dataFrame(seq, win, 0, 8);
         h.action = uint8_t(ProxyAction::Add);
         h.signalId = 1u << 20;
         h.value = 1;
         return frameBytes(h, eight);
       },
       "signal id out of range"},
      {"bad action",
       [&](uint64_t seq, uint32_t) {
         TcpFrame h{};
         h.type = uint8_t(TcpFrameType::Signal);
         h.action = 7;
         h.seq = seq;
         return frameBytes(h, {});
       },
       "bad signal action"},
      {"bad type",
       [&](uint64_t seq, uint32_t) {
         TcpFrame h{};
         h.type = 42;
         h.seq = seq;
         return frameBytes(h, {});
       },
       "unknown frame type"},
      {"sequence gap", [&](uint64_t seq, uint32_t win) { return frameBytes(dataFrame(seq + 5, win, 0, 8), eight); },
       "sequence number out of order"},
      {"sender is not the connection's peer",
       [&](uint64_t seq, uint32_t win) {
         TcpFrame h = dataFrame(seq, win, 0, 8);
         h.sender = 1;
         return frameBytes(h, eight);
       },
       "sender rank does not match"},
      {"signal frame with a payload",
       [&](uint64_t seq, uint32_t) {
         TcpFrame h{};
         h.type = uint8_t(TcpFrameType::Signal);
         h.action = uint8_t(ProxyAction::Add);
         h.length = 8;
         h.seq = seq;
         return frameBytes(h, eight);
       },
       "payload length not allowed"},
      {"data frame without payload",
       [&](uint64_t seq, uint32_t win) { return frameBytes(dataFrame(seq, win, 0, 0), {}); },
       "payload length not allowed"},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    std::string msg;
    std::string err = captureStderr([&] { msg = injectAndCheck(c.make); });
    CHECK_THAT(msg, ContainsSubstring("rank 1") && ContainsSubstring("wireFrame") && ContainsSubstring("from peer 0") &&
                        ContainsSubstring(c.expectText) && ContainsSubstring("nothing of it was written"));
    CHECK_THAT(err,
               ContainsSubstring("rank 1: tcp wire: rejected a frame from rank 0") && ContainsSubstring(c.expectText));
  }
}

TEST_CASE("tcp wire: well-formed frames built by hand are applied: data with an action, then a signal, in order",
          "[tcp][format]") {
  REQUIRE_NOTHROW(runRanks(
      2,
      [](Comm& comm) {
        Window w = comm.allocWindow(256);
        std::memset(comm.localPointer(w), kPoison, 256);
        comm.bootstrap().barrier();
        TcpWire& tw = *CommAccess::tcpWire(comm);
        if (comm.rank() == 0) {
          const uint64_t seq = tw.nextSeqForTest(1);
          std::vector<char> payload(13);
          for (size_t i = 0; i < payload.size(); ++i) payload[i] = char(i + 1);
          TcpFrame d = dataFrame(seq, w.dev->id, 100, payload.size());
          d.action = uint8_t(ProxyAction::Set);  // Data frames may carry the action themselves
          d.signalId = 4;
          d.value = 77;
          TcpFrame sg{};
          sg.type = uint8_t(TcpFrameType::Signal);
          sg.action = uint8_t(ProxyAction::Add);
          sg.signalId = 4;
          sg.value = 5;
          sg.seq = seq + 1;
          std::vector<char> bytes = frameBytes(d, payload);
          const std::vector<char> more = frameBytes(sg, {});
          bytes.insert(bytes.end(), more.begin(), more.end());
          expect(tw.injectForTest(1, bytes.data(), bytes.size(), 2), "inject");
        } else {
          Net net(comm.devComm(), 0);
          expectOk(comm, net.waitSignal(CoopThread{}, 4, 82), "the injected frames' signal");
          const auto* b = static_cast<const uint8_t*>(comm.localPointer(w));
          for (size_t i = 0; i < 256; ++i)
            expect(b[i] == (i >= 100 && i < 113 ? uint8_t(i - 99) : kPoison), "byte " + std::to_string(i));
          expect(net.readSignal(4) == 82, "Set 77 then Add 5");
        }
        comm.check();
        comm.bootstrap().barrier();
      },
      tcpConfig(5'000'000'000ull)));
}

TEST_CASE("tcp wire: the sender refuses a descriptor whose range the receiver would refuse; nothing is sent",
          "[tcp][malformed]") {
  std::string msg;
  REQUIRE_NOTHROW(runRanks(
      2,
      [&](Comm& comm) {
        const DevComm dc = comm.devComm();
        Window w = comm.allocWindow(256);
        std::memset(comm.localPointer(w), kPoison, 256);
        comm.bootstrap().barrier();
        if (comm.rank() == 0) {
          ProxyDesc d{};
          d.op = uint8_t(ProxyOp::Put);
          d.peer = 1;
          d.dstWindow = d.srcWindow = w.dev->id;
          d.dstOffset = 250;  // 8 bytes from 250: past the 256-byte window (Net would have refused it first)
          d.bytes = 8;
          d.counterId = kProxyNoCounter;
          expect(proxy::push(dc, 0, d, true), "push");
          expect(CommAccess::proxyEngine(comm)->quiesce(5'000'000'000ull), "quiesce");
          expect(CommAccess::proxyEngine(comm)->rejected() == 1, "not rejected by the engine");
          msg = checkMessage(comm);
        }
        comm.bootstrap().barrier();
        if (comm.rank() == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          expect(CommAccess::tcpWire(comm)->framesApplied() == 0 && CommAccess::tcpWire(comm)->framesRejected() == 0,
                 "a frame went out");
          const auto* b = static_cast<const uint8_t*>(comm.localPointer(w));
          for (size_t i = 0; i < 256; ++i) expect(b[i] == kPoison, "byte " + std::to_string(i) + " written");
        }
        comm.bootstrap().barrier();
      },
      tcpConfig(5'000'000'000ull)));
  CHECK_THAT(msg, ContainsSubstring("rank 0") && ContainsSubstring("badArgument") && ContainsSubstring("limit 256"));
}

TEST_CASE("tcp wire: a short frame (the stream ends inside it) is discarded and reported as a lost peer",
          "[tcp][malformed]") {
  const std::vector<char> eight(8, 'x');
  for (size_t cut : {size_t(40), sizeof(TcpFrame) + 3}) {
    INFO(cut);
    std::string msg;
    std::string err = captureStderr([&] {
      msg = injectAndCheck(
          [&](uint64_t seq, uint32_t win) {
            std::vector<char> f = frameBytes(dataFrame(seq, win, 0, 8), eight);
            f.resize(cut);
            return f;
          },
          /*truncate=*/true);
    });
    CHECK_THAT(msg,
               ContainsSubstring("rank 1") && ContainsSubstring("peerLost") && ContainsSubstring("peer 0") &&
                   ContainsSubstring(std::to_string(cut) + " of the " +
                                     std::to_string(cut < sizeof(TcpFrame) ? sizeof(TcpFrame) : sizeof(TcpFrame) + 8) +
                                     " bytes of a frame"));
    CHECK_THAT(err, ContainsSubstring("in the middle of a frame"));
  }
}

// ---- processes ----

namespace {
// One rank of a process test over loopback (or two pretend hosts).
int processRank(const UniqueId& id, int r, int n, CommConfig cfg, uint64_t seed, const char* hostId,
                const std::function<void(Comm&)>& body) {
  if (hostId) ::setenv("GIN_HOST_ID", hostId, 1);
  BootstrapConfig bcfg;
  bcfg.timeoutNs = 30'000'000'000ull;
  TcpBootstrap bs(id, r, n, bcfg);
  Comm comm(bs, cfg);
  (void)seed;
  body(comm);
  return 0;
}
}  // namespace

TEST_CASE("tcp wire (4 processes over loopback): random multi-MB puts, values, signals, counters, ordering",
          "[tcp][processes]") {
  const UniqueId id = makeUniqueId();
  const uint64_t seed = freshSeed();
  CAPTURE(seed);
  auto status = forkRanks(4, [&](int r) {
    return processRank(id, r, 4, tcpConfig(), seed, nullptr, [&](Comm& comm) {
      expectTcpToOthers(comm);
      allToAllPut(comm, size_t(3 << 20) + 11, 5, 3, seed);
      allToAllPut(comm, 1, 0, 7, seed + 1);
      valuesSignalsCounters(comm);
      contention(comm, 4, 32);
    });
  });
  CHECK(status == std::vector<int>{0, 0, 0, 0});
}

TEST_CASE("tcp wire (3 processes, 3 engine threads each): random puts, values and signals from many threads",
          "[tcp][processes][threads]") {
  const UniqueId id = makeUniqueId();
  const uint64_t seed = freshSeed();
  CAPTURE(seed);
  CommConfig cfg = tcpConfig(20'000'000'000ull, 32);
  cfg.proxy.threads = 3;
  auto status = forkRanks(3, [&](int r) {
    return processRank(id, r, 3, cfg, seed, nullptr, [&](Comm& comm) {
      expectTcpToOthers(comm);
      gintest::engineStress(comm, seed, 6, 16, 32768);
      contention(comm, 6, 24);
    });
  });
  CHECK(status == std::vector<int>{0, 0, 0});
}

TEST_CASE("tcp wire (2 processes): put+signal ordering stress between processes", "[tcp][processes][ordering]") {
  const UniqueId id = makeUniqueId();
  auto status = forkRanks(2, [&](int r) {
    return processRank(id, r, 2, tcpConfig(), 0, nullptr, [](Comm& comm) {
      orderingStress(comm, 65536, 200);
      orderingStress(comm, (3 << 19) + 16, 16);
    });
  });
  CHECK(status == std::vector<int>{0, 0});
}

TEST_CASE(
    "tcp wire (4 processes, 2 pretend hosts): auto picks lsa on a host and proxy over tcp across; puts, signals and "
    "the world barrier cross hosts",
    "[tcp][processes][hosts]") {
  const UniqueId id = makeUniqueId();
  const uint64_t seed = freshSeed();
  CAPTURE(seed);
  CommConfig cfg = gintest::cpuConfig();  // transport and wire: auto
  std::vector<int> status;
  const std::string table = captureStderr([&] {
    gintest::EnvVar dbg("GIN_DEBUG", "1");
    status = forkRanks(4, [&](int r) {
      return processRank(id, r, 4, cfg, seed, r < 2 ? "host-a" : "host-b", [&](Comm& comm) {
        expect(comm.lsaSize() == 2 && comm.railSize() == 2, "topology");
        for (int p = 0; p < 4; ++p) {
          const bool sameHost = p / 2 == comm.rank() / 2;
          expect(comm.transportTo(p) == (sameHost ? Transport::Lsa : Transport::Proxy), "transport");
          expect(comm.proxyWireTo(p) == (sameHost ? ProxyWire::Auto : ProxyWire::Tcp), "wire");
        }
        allToAllPut(comm, size_t(1 << 20) + 3, 1, 2, seed);
        const DevComm dc = comm.devComm();
        for (int round = 0; round < 20; ++round) {
          BarrierSession<CoopThread> bar(CoopThread{}, dc, uint32_t(round % 4));
          expectOk(comm, bar.sync(CoopThread{}), "world barrier across hosts");
        }
        // The same barrier built for the transports this topology uses (no ibgda code).
        for (int round = 0; round < 8; ++round) {
          BarrierSession<CoopThread, kBackendLsa | kBackendProxy> bar(CoopThread{}, dc, uint32_t(round % 4));
          expectOk(comm, bar.sync(CoopThread{}), "world barrier over lsa and proxy only");
        }
        comm.check();
      });
    });
  });
  CHECK(status == std::vector<int>{0, 0, 0, 0});
  CHECK_THAT(table, ContainsSubstring("0=lsa 1=lsa 2=proxy 3=proxy; proxy wires: 2=tcp 3=tcp"));
}

TEST_CASE("tcp wire (2 processes, 2 pretend hosts): forcing the local wire across hosts is refused on every rank",
          "[tcp][processes][hosts]") {
  const UniqueId id = makeUniqueId();
  auto status = forkRanks(2, [&](int r) {
    ::setenv("GIN_HOST_ID", r == 0 ? "host-a" : "host-b", 1);
    TcpBootstrap bs(id, r, 2);
    CommConfig c = gintest::cpuConfig();
    c.proxy.wire = ProxyWire::Local;
    try {
      Comm comm(bs, c);
    } catch (const Error& e) {
      return std::strstr(e.what(), "cannot reach rank") && std::strstr(e.what(), "use auto or tcp") ? 0 : 20;
    }
    return 21;
  });
  CHECK(status == std::vector<int>{0, 0});
}

TEST_CASE("tcp wire (3 processes): a rank killed mid-run gives every other rank a gin::Error naming it, quickly",
          "[tcp][processes][fault]") {
  const UniqueId id = makeUniqueId();
  int ready[2];
  REQUIRE(pipe(ready) == 0);
  std::fflush(stdout);
  std::fflush(stderr);
  constexpr int kVictim = 2;
  std::vector<pid_t> pids;
  for (int r = 0; r < 3; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      close(ready[0]);
      int rc = 1;
      try {
        TcpBootstrap bs(id, r, 3);
        Comm comm(bs, tcpConfig(30'000'000'000ull));
        const DevComm dc = comm.devComm();
        Window w = comm.allocWindow(1 << 16);
        Net net(dc, 0);
        rc = 10;
        for (int k = 1; k <= 100000; ++k) {  // bounded; the victim dies long before
          for (int p = 0; p < 3; ++p)
            if (p != r) net.put(teamWorld(dc), p, w, 0, w, 4096, 4096, SignalInc{0});
          if (!net.waitSignal(CoopThread{}, 0, uint64_t(2 * k))) break;
          if (r == kVictim && k == 50) {
            const char b = 1;
            (void)!write(ready[1], &b, 1);
          }
        }
        const std::string msg = checkMessage(comm);
        std::fprintf(stderr, "rank %d: %s\n", r, msg.c_str());
        // Its own error names peer 2; or the other survivor noticed first and
        // its team abort stopped this rank's wait (peerFailed naming that
        // rank, whose own message is held to the first rule).
        const bool own = msg.find("peerLost") != std::string::npos && msg.find("peer 2") != std::string::npos;
        const bool viaOther =
            msg.find("peerFailed") != std::string::npos &&
            msg.find("because rank " + std::to_string(1 - r) + " failed first") != std::string::npos;
        rc = own || viaOther ? 0 : 11;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        rc = 12;
      }
      std::fflush(stderr);
      _exit(rc);
    }
    pids.push_back(pid);
  }
  close(ready[1]);
  pollfd p{ready[0], POLLIN, 0};
  REQUIRE(poll(&p, 1, 30000) == 1);
  kill(pids[kVictim], SIGKILL);
  double lastExit = 0;
  const std::vector<int> status = gintest::reap(pids, Clock::now(), 40, &lastExit);
  close(ready[0]);
  CHECK(status[kVictim] == 128 + SIGKILL);
  CHECK(status[0] == 0);
  CHECK(status[1] == 0);
  // Well inside the 30 s timeout: the closed socket is noticed, not waited out.
  CHECK(lastExit < 10.0);
}

// ---- two network namespaces joined by a veth pair ----

namespace {
int sh(const std::string& cmd) {
  const int rc = std::system((cmd + " >/dev/null 2>&1").c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// Two namespaces with one end of a veth pair each; removed in the destructor,
// whatever happened in between.
struct NetnsPair {
  std::string a, b, va, vb, addrA, addrB, error;
  bool ok = false;
  NetnsPair() {
    const int id = int(getpid() % 100000);
    a = "gin-a-" + std::to_string(id);
    b = "gin-b-" + std::to_string(id);
    va = "gva" + std::to_string(id);
    vb = "gvb" + std::to_string(id);
    const std::string net = "10.211." + std::to_string(id % 250 + 1) + ".";
    addrA = net + "1";
    addrB = net + "2";
    const std::vector<std::string> steps = {
        "ip netns add " + a,
        "ip netns add " + b,
        "ip link add " + va + " type veth peer name " + vb,
        "ip link set " + va + " netns " + a,
        "ip link set " + vb + " netns " + b,
        "ip -n " + a + " addr add " + addrA + "/24 dev " + va,
        "ip -n " + b + " addr add " + addrB + "/24 dev " + vb,
        "ip -n " + a + " link set lo up",
        "ip -n " + b + " link set lo up",
        "ip -n " + a + " link set " + va + " up",
        "ip -n " + b + " link set " + vb + " up",
    };
    for (const std::string& s : steps)
      if (sh(s) != 0) {
        error = "'" + s + "' failed";
        return;
      }
    ok = true;
  }
  ~NetnsPair() {
    sh("ip netns del " + a);
    sh("ip netns del " + b);
    sh("ip link del " + va);  // in case it never moved into a namespace
  }
};

std::string selfExe() {
  char buf[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, size_t(n)) : std::string();
}
}  // namespace

TEST_CASE("tcp wire across two network namespaces joined by a veth pair: one rank in each, proxy over tcp",
          "[tcp][netns]") {
  if (geteuid() != 0) SKIP("needs root to create network namespaces (ip netns); run the tests as root to cover this");
  NetnsPair ns;
  if (!ns.ok) SKIP("cannot create network namespaces here: " + ns.error);
  const std::string exe = selfExe();
  REQUIRE(!exe.empty());
  const uint64_t seed = freshSeed();
  CAPTURE(seed, ns.addrA, ns.addrB);
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", "2", 1);
      ::setenv("MASTER_ADDR", ns.addrA.c_str(), 1);
      ::setenv("MASTER_PORT", "29517", 1);
      ::setenv("GIN_HOST_ID", "netns", 1);  // same machine, but each namespace counts as a host
      ::setenv("GIN_DEBUG", "1", 1);        // rank 0 prints the transport table into the log
      ::setenv("GIN_TEST_NETNS_SEED", std::to_string(seed).c_str(), 1);
      const std::string nsName = r == 0 ? ns.a : ns.b;
      execlp("ip", "ip", "netns", "exec", nsName.c_str(), exe.c_str(), "[.netns-rank]", "--reporter", "compact",
             static_cast<char*>(nullptr));
      _exit(127);
    }
    pids.push_back(pid);
  }
  std::vector<int> status(2, -1);
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < deadline && (status[0] == -1 || status[1] == -1)) {
    for (int r = 0; r < 2; ++r) {
      int st = 0;
      if (status[size_t(r)] == -1 && waitpid(pids[size_t(r)], &st, WNOHANG) == pids[size_t(r)])
        status[size_t(r)] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int r = 0; r < 2; ++r)
    if (status[size_t(r)] == -1) {
      kill(pids[size_t(r)], SIGKILL);
      waitpid(pids[size_t(r)], nullptr, 0);
    }
  CHECK(status == std::vector<int>{0, 0});
}

// Run by the test above inside a namespace (hidden: not part of a normal run).
TEST_CASE("netns rank (started by the netns test)", "[.netns-rank]") {
  const char* seedText = std::getenv("GIN_TEST_NETNS_SEED");
  if (!seedText) SKIP("only runs inside the namespaces the netns test creates");
  const uint64_t seed = std::strtoull(seedText, nullptr, 10);
  BootstrapConfig bcfg;
  bcfg.timeoutNs = 30'000'000'000ull;
  auto bs = TcpBootstrap::fromEnvironment(bcfg);
  Comm comm(*bs, gintest::cpuConfig());
  const int peer = 1 - comm.rank();
  REQUIRE(comm.railSize() == 2);
  REQUIRE(comm.transportTo(peer) == Transport::Proxy);
  REQUIRE(comm.proxyWireTo(peer) == ProxyWire::Tcp);
  REQUIRE_NOTHROW(allToAllPut(comm, size_t(2 << 20) + 9, 3, 1, seed));
  REQUIRE_NOTHROW(orderingStress(comm, 40000, 50));
  const DevComm dc = comm.devComm();
  for (int round = 0; round < 10; ++round) {
    BarrierSession<CoopThread> bar(CoopThread{}, dc, uint32_t(round % 3));
    REQUIRE(bar.sync(CoopThread{}));
  }
  comm.check();
}
