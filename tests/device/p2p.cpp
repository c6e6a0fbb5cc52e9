// Tests of gin/device/p2p.hpp (send/recv over a step FIFO) and
// gin/host/p2p.hpp on CPU ranks: ring exchanges, all-to-all pairs, self
// sends, separate sender and receiver threads on several channels, random
// sizes and data, poisoned destinations, many iterations that wrap the rings
// (and the 64-bit step counters), over lsa, the proxy and ibgda (soft NIC).
#include <atomic>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "../common/ranks.hpp"
#include "gin/host/test_access.hpp"

using namespace gin;
using Catch::Matchers::ContainsSubstring;
using gin::test::CommAccess;
using gintest::expect;
using gintest::pattern;
using gintest::runRanks;

namespace {
constexpr uint8_t kPoison = 0xAB;

CommConfig lsaConfig(uint64_t timeoutNs = 20'000'000'000ull) { return gintest::cpuConfig(timeoutNs); }
CommConfig proxyConfig(uint64_t timeoutNs = 20'000'000'000ull) {
  CommConfig c = gintest::cpuConfig(timeoutNs);
  c.transport = TransportChoice::Proxy;
  return c;
}
CommConfig ibgdaConfig(uint64_t timeoutNs = 20'000'000'000ull) {
  CommConfig c = gintest::cpuConfig(timeoutNs);
  c.transport = TransportChoice::Ibgda;
  c.ibgda.device = IbgdaConfig::Device::Soft;
  return c;
}

// Sizes around the chunk and the ring: 0, 1, primes, chunk +- 1, several
// slots, and much more than the ring holds.
std::vector<size_t> sizesFor(const p2p::Fifo& f) {
  const size_t c = f.chunkBytes, ring = c * f.nSlots;
  return {0, 1, 2, 7, 13, 97, c - 1, c, c + 1, 3 * c + 5, ring - 3, ring, ring + 1, 5 * ring + 31, 2 * c + 1};
}

// Per (iteration, sender, receiver) size and data; both sides compute them.
size_t sizeFor(const std::vector<size_t>& sizes, int it, int from, int to) {
  return sizes[size_t(it * 5 + from * 3 + to * 7) % sizes.size()];
}
uint64_t seedFor(uint64_t seed, int it, int to) { return seed * 1000003 + uint64_t(it) * 131 + uint64_t(to); }

struct Buffers {
  Window src;
  size_t srcBytes;
  std::vector<uint8_t> dst;
};

Buffers makeBuffers(Comm& comm, size_t maxBytes) {
  Buffers b;
  b.srcBytes = maxBytes + 16;
  b.src = comm.allocWindow(b.srcBytes);
  b.dst.resize(maxBytes + 32);
  return b;
}

// Fill the source for a message to `to` at offset `mis`.
void fillSource(Comm& comm, Buffers& b, size_t mis, size_t bytes, uint64_t seed, int it, int to) {
  auto* s = static_cast<uint8_t*>(comm.localPointer(b.src));
  std::memset(s, 0x5A, b.srcBytes);
  for (size_t i = 0; i < bytes; ++i) s[mis + i] = pattern(seedFor(seed, it, to), comm.rank(), i);
}
// Check a message from `from` at dst + mis; the poison around it is intact.
void checkDest(const Buffers& b, size_t mis, size_t bytes, uint64_t seed, int it, int from, int me,
               const std::string& what) {
  bool poison = true;
  for (size_t i = 0; i < mis; ++i) poison &= b.dst[i] == kPoison;
  for (size_t i = mis + bytes; i < b.dst.size(); ++i) poison &= b.dst[i] == kPoison;
  expect(poison, what + ": recv wrote outside the destination");
  for (size_t i = 0; i < bytes; ++i)
    if (b.dst[mis + i] != pattern(seedFor(seed, it, me), from, i))
      expect(false, what + ": rank " + std::to_string(me) + " iteration " + std::to_string(it) + " byte " +
                        std::to_string(i) + " of " + std::to_string(bytes) + " from rank " + std::to_string(from) +
                        " is wrong");
}

// Every iteration each rank sends to (me + shift) and receives from
// (me - shift) with sendRecv; shift = 1 is a ring, shift 0..n-1 over the
// iterations is an all-to-all (pairwise schedule, self included).
void exchange(Comm& comm, const p2p::Config& cfg, int iterations, bool allToAll, uint64_t seed) {
  const DevComm dc = comm.devComm();
  const int n = comm.nRanks(), me = comm.rank();
  p2p::Fifo fifo = p2p::create(comm, cfg);
  const std::vector<size_t> sizes = sizesFor(fifo);
  size_t maxBytes = 0;
  for (size_t s : sizes) maxBytes = std::max(maxBytes, s);
  Buffers b = makeBuffers(comm, maxBytes);
  comm.bootstrap().barrier();
  p2p::Endpoint ep(Net(dc, 1), fifo);
  for (int it = 0; it < iterations; ++it) {
    const int shift = allToAll ? it % n : 1 % n;
    const int to = (me + shift) % n, from = (me - shift + n) % n;
    const size_t sendBytes = sizeFor(sizes, it, me, to), recvBytes = sizeFor(sizes, it, from, me);
    const size_t smis = size_t(it % 3), dmis = size_t((it / 3) % 5);
    fillSource(comm, b, smis, sendBytes, seed, it, to);
    std::memset(b.dst.data(), kPoison, b.dst.size());
    expect(ep.sendRecv(CoopThread{}, to, b.src, smis, sendBytes, from, b.dst.data() + dmis, recvBytes),
           "sendRecv gave up in iteration " + std::to_string(it));
    checkDest(b, dmis, recvBytes, seed, it, from, me, allToAll ? "all-to-all" : "ring");
  }
  comm.check();
  comm.bootstrap().barrier();
  comm.deregisterWindow(b.src);
  p2p::destroy(comm, fifo);
}
}  // namespace

TEST_CASE("p2p ring exchange: every size (0, 1, primes, multi-slot, 5x the ring) over 200 iterations, 1..8 ranks",
          "[p2p]") {
  p2p::Config cfg;
  cfg.chunkBytes = 256;
  for (int n : {1, 2, 3, 5, 8}) {
    CAPTURE(n);
    REQUIRE_NOTHROW(runRanks(
        n, [&](Comm& comm) { exchange(comm, cfg, 200, false, 1); }, lsaConfig()));
  }
}

TEST_CASE("p2p all-to-all pairs (self included): random sizes and data, rings of 1, 2 and 8 slots", "[p2p]") {
  for (uint32_t slots : {1u, 2u, 8u}) {
    p2p::Config cfg;
    cfg.chunkBytes = 64;
    cfg.nSlots = slots;
    for (int n : {1, 2, 4, 7, 8}) {
      CAPTURE(slots, n);
      REQUIRE_NOTHROW(runRanks(
          n, [&](Comm& comm) { exchange(comm, cfg, 6 * n, true, 2 + slots); }, lsaConfig()));
    }
  }
}

TEST_CASE("p2p self send: one rank exchanges 1 MiB + 3 with itself through a 4 x 16 KiB ring", "[p2p]") {
  REQUIRE_NOTHROW(runRanks(1, [](Comm& comm) {
    p2p::Config cfg;
    cfg.nSlots = 4;
    cfg.chunkBytes = 16 << 10;
    p2p::Fifo fifo = p2p::create(comm, cfg);
    const size_t bytes = (1 << 20) + 3;
    Buffers b = makeBuffers(comm, bytes);
    p2p::Endpoint ep(Net(comm.devComm(), 0), fifo);
    for (int it = 0; it < 3; ++it) {
      fillSource(comm, b, 1, bytes, 9, it, 0);
      std::memset(b.dst.data(), kPoison, b.dst.size());
      expect(ep.sendRecv(CoopThread{}, 0, b.src, 1, bytes, 0, b.dst.data() + 5, bytes), "self sendRecv");
      checkDest(b, 5, bytes, 9, it, 0, 0, "self");
    }
    comm.check();
  }));
}

namespace {
// Separate sender and receiver threads per rank (as separate CTAs would be),
// `nCh` of each, thread c on channel c: senders send to every rank in order,
// receivers receive from every rank in order, `iterations` times.
void threadsPerChannel(Comm& comm, int nCh, int iterations, uint64_t seed) {
  const DevComm dc = comm.devComm();
  const int n = comm.nRanks(), me = comm.rank();
  p2p::Config cfg;
  cfg.chunkBytes = 128;
  cfg.nChannels = uint32_t(nCh);
  p2p::Fifo fifo = p2p::create(comm, cfg);
  const std::vector<size_t> sizes = sizesFor(fifo);
  size_t maxBytes = 0;
  for (size_t s : sizes) maxBytes = std::max(maxBytes, s);
  // One source window slice per (channel, destination) so senders never share a source.
  const size_t slice = maxBytes + 16;
  Window src = comm.allocWindow(slice * size_t(nCh) * size_t(n));
  auto* s = static_cast<uint8_t*>(comm.localPointer(src));
  comm.bootstrap().barrier();
  std::vector<std::string> errors(size_t(2 * nCh));
  std::vector<std::thread> threads;
  for (int c = 0; c < nCh; ++c) {
    threads.emplace_back([&, c] {
      try {
        p2p::Endpoint ep(Net(dc, c % dc.nContexts), fifo, c);
        for (int it = 0; it < iterations; ++it)
          for (int p = 0; p < n; ++p) {
            const size_t bytes = sizeFor(sizes, it + c, me, p);
            uint8_t* mine = s + (size_t(c) * n + size_t(p)) * slice;
            for (size_t i = 0; i < bytes; ++i) mine[i] = pattern(seedFor(seed + uint64_t(c), it, p), me, i);
            expect(ep.send(CoopThread{}, p, src, (size_t(c) * n + size_t(p)) * slice, bytes), "send gave up");
          }
      } catch (const std::exception& e) {
        errors[size_t(c)] = e.what();
      }
    });
    threads.emplace_back([&, c] {
      try {
        p2p::Endpoint ep(Net(dc, (c + 1) % dc.nContexts), fifo, c);
        Buffers b;
        b.dst.resize(maxBytes + 32);
        for (int it = 0; it < iterations; ++it)
          for (int p = 0; p < n; ++p) {
            const size_t bytes = sizeFor(sizes, it + c, p, me);
            std::memset(b.dst.data(), kPoison, b.dst.size());
            expect(ep.recv(CoopThread{}, p, b.dst.data() + 3, bytes), "recv gave up");
            checkDest(b, 3, bytes, seed + uint64_t(c), it, p, me, "channel " + std::to_string(c));
          }
      } catch (const std::exception& e) {
        errors[size_t(nCh + c)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) expect(e.empty(), e);
  comm.check();
  comm.bootstrap().barrier();
  comm.deregisterWindow(src);
  p2p::destroy(comm, fifo);
}
}  // namespace

TEST_CASE("p2p send and recv from separate threads on 1 and 3 channels at once: every pair, in order", "[p2p]") {
  for (int n : {1, 2, 3, 5}) {
    CAPTURE(n);
    REQUIRE_NOTHROW(runRanks(
        n, [](Comm& comm) { threadsPerChannel(comm, 1, 30, 30); }, lsaConfig()));
    REQUIRE_NOTHROW(runRanks(
        n, [](Comm& comm) { threadsPerChannel(comm, 3, 15, 40); }, lsaConfig()));
  }
}

TEST_CASE("p2p step counters near 2^64 wrap and the rings keep their order (FIFO steps, LL steps, both)",
          "[p2p][wrap]") {
  // llMax 0: every message through the FIFO (many steps each); 1000: every
  // message one LL step (flags from the step count, across the wrap); 400:
  // LL steps, then FIFO steps, on one connector.
  for (const uint64_t llMax : {uint64_t(0), uint64_t(1000), uint64_t(400)}) {
    CAPTURE(llMax);
    REQUIRE_NOTHROW(runRanks(
        3,
        [llMax](Comm& comm) {
          const DevComm dc = comm.devComm();
          p2p::Config cfg;
          cfg.chunkBytes = 32;
          cfg.llMaxBytes = llMax;
          p2p::Fifo fifo = p2p::create(comm, cfg);
          // Pretend 2^64 - 3 steps already went through every connector: data
          // and credit signals, and the step counts in their shadows, all agree.
          const uint64_t start = ~uint64_t(0) - 2;
          for (uint32_t id = fifo.signalBase; id < fifo.signalBase + 2 * fifo.nChannels * uint32_t(fifo.nRanks); ++id)
            dc.signals[id] = dc.signalShadows[id] = start;
          comm.bootstrap().barrier();
          Buffers b = makeBuffers(comm, 1000);
          p2p::Endpoint ep(Net(dc, 0), fifo);
          const int n = comm.nRanks(), me = comm.rank(), to = (me + 1) % n, from = (me + n - 1) % n;
          for (int it = 0; it < 6; ++it) {
            const size_t bytes = 100 + size_t(it) * 151;
            fillSource(comm, b, 0, bytes, 5, it, to);
            std::memset(b.dst.data(), kPoison, b.dst.size());
            expect(ep.sendRecv(CoopThread{}, to, b.src, 0, bytes, from, b.dst.data(), bytes), "sendRecv across wrap");
            checkDest(b, 0, bytes, 5, it, from, me, "wrap");
          }
          expect(*Net(dc, 0).getSignalShadowPtr(p2p::creditSignal(fifo, 0, to)) < 1000, "step count wrapped");
          comm.check();
        },
        lsaConfig()));
  }
}

TEST_CASE("p2p over the proxy and ibgda (soft NIC) transports: ring, all-to-all and threads per channel",
          "[p2p][proxy][ibgda]") {
  const char* forced = std::getenv("GIN_TRANSPORT");
  p2p::Config cfg;
  cfg.chunkBytes = 256;
  for (bool ibgda : {false, true}) {
    if (forced && std::string(forced) != (ibgda ? "ibgda" : "proxy")) continue;  // another transport forced
    for (int n : {1, 2, 4}) {
      CAPTURE(ibgda, n);
      REQUIRE_NOTHROW(runRanks(
          n,
          [&](Comm& comm) {
            // What the transport carried out: the engine's descriptors or the NIC's WQEs.
            auto done = [&] {
              return ibgda ? CommAccess::ibgda(comm)->nic().executed() : CommAccess::proxyEngine(comm)->executed();
            };
            expect(ibgda ? CommAccess::ibgda(comm) != nullptr : CommAccess::proxyEngine(comm) != nullptr,
                   "the transport is not in use");
            const uint64_t before = done();
            exchange(comm, cfg, 20, false, 11);
            exchange(comm, cfg, 2 * n, true, 12);
            threadsPerChannel(comm, 2, 3, 13);
            expect(done() > before, "the transport carried out nothing");
          },
          ibgda ? ibgdaConfig() : proxyConfig()));
    }
  }
}

TEST_CASE("p2p: a recv nobody sends to, and a send nobody receives, give errors naming p2pRecv / p2pSend",
          "[p2p][errors]") {
  // FIFO steps (no LL), then LL steps (a send of 1000 bytes is one LL step:
  // the third waits for the first's release).
  const char* forced = std::getenv("GIN_TRANSPORT");
  for (const bool ll : {false, true}) {
    if (ll && forced && std::string(forced) != "lsa") continue;  // LL steps are lsa's
    CAPTURE(ll);
    std::string recvMsg, sendMsg;
    bool recvOk = true, sendOk = true;
    REQUIRE_NOTHROW(runRanks(
        2,
        [&](Comm& comm) {
          const DevComm dc = comm.devComm();
          p2p::Config cfg;
          cfg.chunkBytes = 64;
          cfg.nSlots = 2;
          cfg.nChannels = 2;
          cfg.llMaxBytes = ll ? 1024 : 0;
          p2p::Fifo fifo = p2p::create(comm, cfg);
          Window src = comm.allocWindow(1024);
          // Rank 1 sends to rank 0 on channel 0; rank 0 receives from rank 1 on channel 1.
          p2p::Endpoint ep(Net(dc, 2), fifo, comm.rank() == 0 ? 1 : 0);
          std::vector<uint8_t> dst(1024);
          auto message = [&] {
            try {
              comm.check();
            } catch (const Error& e) {
              return std::string(e.what());
            }
            return std::string();
          };
          if (comm.rank() == 0) {
            recvOk = ep.recv(CoopThread{}, 1, dst.data(), 100);
            recvMsg = message();
          } else {
            // FIFO: two slots of 64 bytes fill; the third step waits for a
            // credit forever. LL: two LL sends fill the two LL slots.
            sendOk = ep.send(CoopThread{}, 0, src, 0, 1000);
            if (ll) {
              expect(sendOk, "the first LL send");
              expect(ep.send(CoopThread{}, 0, src, 0, 1000), "the second LL send");
              sendOk = ep.send(CoopThread{}, 0, src, 0, 1000);
            }
            sendMsg = message();
          }
          comm.bootstrap().barrier();
        },
        lsaConfig(150'000'000ull)));
    CHECK_FALSE(recvOk);
    CHECK_FALSE(sendOk);
    // The first to give up names its own wait; the other may stop on that
    // failure instead of its own timeout (peerFailed, naming the first).
    const bool recvFirst = recvMsg.find("peerFailed") == std::string::npos;
    CHECK((recvFirst || sendMsg.find("peerFailed") == std::string::npos));
    if (recvFirst)
      CHECK_THAT(recvMsg, ContainsSubstring("p2pRecv") && ContainsSubstring("rank 0") && ContainsSubstring("peer 1") &&
                              ContainsSubstring("context 2") && ContainsSubstring("expected 1"));
    else
      CHECK_THAT(recvMsg, ContainsSubstring("stopped its p2pRecv") && ContainsSubstring("because rank 1 failed first"));
    if (sendMsg.find("peerFailed") == std::string::npos)
      CHECK_THAT(sendMsg, ContainsSubstring("p2pSend") && ContainsSubstring("rank 1") && ContainsSubstring("peer 0") &&
                              ContainsSubstring("expected 1") && ContainsSubstring("observed 0"));
    else
      CHECK_THAT(sendMsg, ContainsSubstring("stopped its p2pSend") && ContainsSubstring("because rank 0 failed first"));
  }
}

TEST_CASE("p2p::create refuses configs it cannot serve, with the reason", "[p2p][errors]") {
  auto attempt = [](p2p::Config cfg, CommConfig cc = lsaConfig()) {
    std::string msg;
    REQUIRE_NOTHROW(runRanks(
        2,
        [&](Comm& comm) {
          try {
            (void)p2p::create(comm, cfg);
          } catch (const Error& e) {
            if (comm.rank() == 0) msg = e.what();
          }
        },
        cc));
    return msg;
  };
  p2p::Config odd;
  odd.chunkBytes = 100;
  CHECK_THAT(attempt(odd), ContainsSubstring("multiple of 16"));
  p2p::Config slots;
  slots.nSlots = 6;
  CHECK_THAT(attempt(slots), ContainsSubstring("power of two"));
  CommConfig few = lsaConfig();
  few.nSignals = 3;
  CHECK_THAT(attempt(p2p::Config{}, few), ContainsSubstring("needs 4 signal ids") && ContainsSubstring("nSignals"));
  p2p::Config base;
  base.signalBase = 255;
  CHECK_THAT(attempt(base), ContainsSubstring("signal ids"));
  p2p::Config bigLl;
  bigLl.llMaxBytes = (1u << 20) + 1;
  CHECK_THAT(attempt(bigLl), ContainsSubstring("llMaxBytes") && ContainsSubstring("1 MiB"));
  // Ranks that pass different llMaxBytes would disagree on which messages go
  // as LL steps: every rank throws at create instead.
  std::atomic<int> threw{0};
  REQUIRE_NOTHROW(runRanks(
      2,
      [&](Comm& comm) {
        p2p::Config c;
        c.llMaxBytes = comm.rank() == 0 ? 1000 : 1008;
        try {
          (void)p2p::create(comm, c);
        } catch (const Error& e) {
          if (std::string(e.what()).find("disagree on llMaxBytes") != std::string::npos) ++threw;
        }
      },
      lsaConfig()));
  CHECK(threw == 2);
}

TEST_CASE("p2p LL steps: up to nSlots small messages in flight before the first recv, as through the FIFO",
          "[p2p][ll]") {
  if (const char* t = std::getenv("GIN_TRANSPORT"); t && std::string(t) != "lsa") SKIP("LL steps are lsa's");
  for (const uint32_t slots : {1u, 2u, 8u}) {
    CAPTURE(slots);
    REQUIRE_NOTHROW(runRanks(
        2,
        [slots](Comm& comm) {
          p2p::Config cfg;
          cfg.nSlots = slots;
          cfg.chunkBytes = 1024;
          p2p::Fifo fifo = p2p::create(comm, cfg);
          expect(fifo.llMaxBytes == cfg.llMaxBytes, "LL steps on over lsa");
          Buffers b = makeBuffers(comm, 3000);
          p2p::Endpoint ep(Net(comm.devComm(), 0), fifo);
          const int me = comm.rank(), other = 1 - me;
          // nSlots LL messages to ourselves and to the other rank, then a FIFO
          // one (3000 bytes over 1 KiB chunks would need 3 slots: only with 8).
          for (int k = 0; k < int(slots); ++k) {
            fillSource(comm, b, 0, 100 + size_t(k), 9, k, me);
            expect(ep.send(CoopThread{}, me, b.src, 0, 100 + size_t(k)), "LL send to self");
            fillSource(comm, b, 0, 200 + size_t(k), 9, k, other);
            expect(ep.send(CoopThread{}, other, b.src, 0, 200 + size_t(k)), "LL send to the other rank");
          }
          for (int k = 0; k < int(slots); ++k) {
            std::memset(b.dst.data(), kPoison, b.dst.size());
            expect(ep.recv(CoopThread{}, me, b.dst.data(), 100 + size_t(k)), "LL recv from self");
            checkDest(b, 0, 100 + size_t(k), 9, k, me, me, "LL self");
            std::memset(b.dst.data(), kPoison, b.dst.size());
            expect(ep.recv(CoopThread{}, other, b.dst.data(), 200 + size_t(k)), "LL recv from the other rank");
            checkDest(b, 0, 200 + size_t(k), 9, k, other, me, "LL pair");
          }
          comm.bootstrap().barrier();
          comm.check();
          comm.deregisterWindow(b.src);
          p2p::destroy(comm, fifo);
        },
        lsaConfig()));
  }
}

TEST_CASE("p2p: a peer out of range or a source past its window is a bad argument on every call", "[p2p][errors]") {
  std::string msg;
  REQUIRE_NOTHROW(runRanks(1, [&](Comm& comm) {
    p2p::Fifo fifo = p2p::create(comm);
    Window src = comm.allocWindow(64);
    p2p::Endpoint ep(Net(comm.devComm(), 0), fifo);
    uint8_t dst[8];
    expect(!ep.send(CoopThread{}, 1, src, 0, 8), "send to rank 1 of 1 accepted");
    expect(!ep.recv(CoopThread{}, -1, dst, 8), "recv from rank -1 accepted");
    expect(!ep.send(CoopThread{}, 0, src, 60, 8), "source past the window accepted");
    p2p::Endpoint bad(Net(comm.devComm(), 0), fifo, 1);
    expect(!bad.send(CoopThread{}, 0, src, 0, 8), "channel 1 of 1 accepted");
    try {
      comm.check();
    } catch (const Error& e) {
      msg = e.what();
    }
  }));
  CHECK_THAT(msg, ContainsSubstring("badArgument"));
}
