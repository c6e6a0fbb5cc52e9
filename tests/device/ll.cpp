// Tests of gin/device/ll.hpp (LL8 / LL16 flag-in-data packets) on CPU ranks:
// every size, every pair of ranks, many rounds reusing the buffers with a new
// flag each round (double buffered, acknowledged with LL8 packets, no
// barriers), poisoned buffers, a reader racing a writer that never stops, and
// the timeout path.
#include <atomic>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <cstring>
#include <thread>

#include "../common/ranks.hpp"
#include "gin/device/ll.hpp"

using namespace gin;
using Catch::Matchers::ContainsSubstring;
using gintest::expect;
using gintest::pattern;
using gintest::runRanks;

namespace {
constexpr uint8_t kPoison = 0xAB;
constexpr size_t kSizes[] = {0, 1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 31, 64, 97, 251, 1000, 4099, 65537};
constexpr size_t kMaxBytes = 65537;

template <class P>
const char* packetName() {
  return sizeof(P) == 8 ? "LL8" : "LL16";
}

// Each rank sends a packet message to every rank (itself included) in each of
// `rounds` rounds. Round r uses buffer r % 2 and flag flagForRound(r); before
// overwriting a buffer the writer waits for the reader's LL8 acknowledgement
// of round r - 2 in that buffer. Sizes and source/destination misalignment
// change every round; destinations are poisoned and checked around the data.
template <class P>
void allPairsRounds(Comm& comm, int rounds, uint64_t seed) {
  const DevComm dc = comm.devComm();
  const int n = comm.nRanks(), me = comm.rank();
  const Team world = teamWorld(dc);
  const size_t buf = ll::bufferBytes<P>(kMaxBytes);
  const size_t ackBase = 2 * size_t(n) * buf;
  const size_t winBytes = ackBase + 2 * size_t(n) * sizeof(ll::Packet8) + 64;
  Window w = comm.allocWindow(winBytes);
  std::memset(comm.localPointer(w), kPoison, winBytes);  // poisoned packets: flag 0xABABABAB is never a round's
  comm.bootstrap().barrier();
  std::vector<uint8_t> src(kMaxBytes + 8), dst(kMaxBytes + 16);
  auto sizeOf = [&](int r, int from, int to) { return kSizes[size_t(r * 7 + from * 3 + to) % std::size(kSizes)]; };
  for (int r = 0; r < rounds; ++r) {
    const uint32_t flag = ll::flagForRound(uint64_t(r));
    const int parity = r % 2;
    const size_t mis = size_t(r % 4);
    for (int p = 0; p < n; ++p) {
      if (r >= 2) {
        // Reader p acknowledged round r - 2 (or later: an empty message of
        // round r - 1 or r is acknowledged without waiting for us) in this
        // buffer: it may be overwritten.
        const auto* ack = static_cast<const ll::Packet8*>(
            comm.localPointer(w, ackBase + (size_t(parity) * n + size_t(p)) * sizeof(ll::Packet8)));
        const uint64_t deadline = nowNs() + 20'000'000'000ull;
        while (ll::load(ack).flag < ll::flagForRound(uint64_t(r - 2)) || ll::load(ack).flag == 0xABABABABu) {
          expect(nowNs() < deadline,
                 "ack of round " + std::to_string(r - 2) + " from rank " + std::to_string(p) + " never came");
          std::this_thread::yield();
        }
      }
      const size_t bytes = sizeOf(r, me, p);
      for (size_t i = 0; i < bytes; ++i) src[mis + i] = pattern(seed + uint64_t(r), me, i ^ size_t(p));
      expect(ll::putPacketsToPeer<P>(CoopThread{}, dc, world, p, w, (size_t(parity) * n + size_t(me)) * buf,
                                     src.data() + mis, bytes, flag),
             "putPacketsToPeer refused");
    }
    for (int p = 0; p < n; ++p) {
      const size_t bytes = sizeOf(r, p, me);
      std::memset(dst.data(), kPoison, dst.size());
      expect(ll::getPacketsFromWindow<P>(CoopThread{}, dc, dst.data() + mis, w, (size_t(parity) * n + size_t(p)) * buf,
                                         bytes, flag, p),
             "getPackets gave up in round " + std::to_string(r) + " from rank " + std::to_string(p));
      bool poisonKept = true;
      for (size_t i = 0; i < mis; ++i) poisonKept &= dst[i] == kPoison;
      for (size_t i = mis + bytes; i < dst.size(); ++i) poisonKept &= dst[i] == kPoison;
      expect(poisonKept, "getPackets wrote outside the destination");
      for (size_t i = 0; i < bytes; ++i)
        if (dst[mis + i] != pattern(seed + uint64_t(r), p, i ^ size_t(me)))
          expect(false, std::string(packetName<P>()) + " rank " + std::to_string(me) + " round " + std::to_string(r) +
                            ": byte " + std::to_string(i) + " of " + std::to_string(bytes) + " from rank " +
                            std::to_string(p) + " is wrong");
      // Acknowledge: the writer may reuse buffer `parity` for round r + 2.
      const uint32_t ackPayload = uint32_t(r);
      expect(ll::putPacketsToPeer<ll::Packet8>(CoopThread{}, dc, world, p, w,
                                               ackBase + (size_t(parity) * n + size_t(me)) * sizeof(ll::Packet8),
                                               &ackPayload, sizeof ackPayload, flag),
             "ack put refused");
    }
  }
  // Bytes past the packets of the largest message are still poison.
  const auto* base = static_cast<const uint8_t*>(comm.localPointer(w));
  bool poisonKept = true;
  for (size_t i = ackBase + 2 * size_t(n) * sizeof(ll::Packet8); i < winBytes; ++i) poisonKept &= base[i] == kPoison;
  expect(poisonKept, "wrote past the packet buffers");
  comm.check();
  comm.bootstrap().barrier();
  comm.deregisterWindow(w);
}

uint32_t mix(uint32_t flag, size_t i) {
  uint64_t x = (uint64_t(flag) << 32) ^ (i * 0x9E3779B97F4A7C15ull);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  return uint32_t(x ^ (x >> 32));
}
}  // namespace

TEST_CASE("LL packet sizes and flags: counts round up, flags are never zero", "[ll]") {
  REQUIRE(ll::packetCount<ll::Packet8>(0) == 0);
  REQUIRE(ll::packetCount<ll::Packet8>(1) == 1);
  REQUIRE(ll::packetCount<ll::Packet8>(4) == 1);
  REQUIRE(ll::packetCount<ll::Packet8>(5) == 2);
  REQUIRE(ll::bufferBytes<ll::Packet8>(13) == 32);
  REQUIRE(ll::packetCount<ll::Packet16>(8) == 1);
  REQUIRE(ll::packetCount<ll::Packet16>(9) == 2);
  REQUIRE(ll::bufferBytes<ll::Packet16>(17) == 48);
  REQUIRE(ll::flagForRound(0) == 1);
  REQUIRE(ll::flagForRound(0xFFFFFFFEull) == 0xFFFFFFFFu);
  REQUIRE(ll::flagForRound(0xFFFFFFFFull) == 1);  // wraps past 0
  for (uint64_t r = 0; r < 5; ++r) REQUIRE(ll::flagForRound(r * 0xFFFFFFFFull + 0xFFFFFFFEull) != 0);
}

TEST_CASE("LL packets: one store and one load round-trip; a packet with another flag is not taken", "[ll]") {
  ll::Packet8 a{};
  ll::store(&a, 0xDEADBEEFu, 7);
  uint32_t v = 0;
  REQUIRE(ll::tryRead(&a, 7, &v));
  REQUIRE(v == 0xDEADBEEFu);
  REQUIRE_FALSE(ll::tryRead(&a, 8, &v));
  ll::Packet16 b{};
  ll::store(&b, 0x0123456789ABCDEFull, 9);
  uint64_t w = 0;
  REQUIRE(ll::tryRead(&b, 9, &w));
  REQUIRE(w == 0x0123456789ABCDEFull);
  // A half from another round (what a torn write would leave) is rejected.
  b.hi = (b.hi & 0xFFFFFFFFull) | (uint64_t(10) << 32);
  REQUIRE_FALSE(ll::tryRead(&b, 9, &w));
  REQUIRE_FALSE(ll::tryRead(&b, 10, &w));
  REQUIRE_FALSE(ll::load(&b).valid);
}

TEST_CASE("LL8 and LL16: every size from every rank to every rank over 100 rounds reusing two buffers, 1..8 ranks",
          "[ll]") {
  for (int n : {1, 2, 3, 5, 8}) {
    CAPTURE(n);
    REQUIRE_NOTHROW(runRanks(n, [](Comm& comm) { allPairsRounds<ll::Packet8>(comm, 100, 100); }));
    REQUIRE_NOTHROW(runRanks(n, [](Comm& comm) { allPairsRounds<ll::Packet16>(comm, 100, 200); }));
  }
}

namespace {
// A writer thread rewrites the same packets round after round with
// payload = mix(flag, index); a reader thread loads them concurrently. Every
// packet the reader accepts must carry exactly its round's payload.
template <class P>
void tornStress(int writes, size_t nPackets) {
  std::vector<P> buf(nPackets);
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (int f = 1; f <= writes; ++f)
      for (size_t i = 0; i < nPackets; ++i) {
        using Pl = ll::PayloadOf<P>;
        const Pl payload = sizeof(Pl) == 4 ? Pl(mix(uint32_t(f), i))
                                           : Pl((uint64_t(mix(uint32_t(f), i)) << 32) | mix(uint32_t(f) ^ 0x5555u, i));
        ll::store(&buf[i], payload, uint32_t(f));
      }
    done.store(true, std::memory_order_release);
  });
  uint64_t accepted = 0, rejected = 0, bad = 0;
  while (!done.load(std::memory_order_acquire)) {
    for (size_t i = 0; i < nPackets; ++i) {
      const ll::Seen<P> s = ll::load(&buf[i]);
      if (!s.valid) {
        ++rejected;
        continue;
      }
      if (s.flag == 0) continue;  // not written yet
      ++accepted;
      using Pl = ll::PayloadOf<P>;
      const Pl want =
          sizeof(Pl) == 4 ? Pl(mix(s.flag, i)) : Pl((uint64_t(mix(s.flag, i)) << 32) | mix(s.flag ^ 0x5555u, i));
      if (s.payload != want) ++bad;
    }
  }
  writer.join();
  INFO(packetName<P>() << ": accepted " << accepted << ", rejected as mixed " << rejected);
  REQUIRE(bad == 0);
  REQUIRE(accepted > 0);
}
}  // namespace

TEST_CASE("LL8 and LL16: a reader racing a writer never accepts torn or mixed-round data", "[ll][stress]") {
  tornStress<ll::Packet8>(300000, 64);
  tornStress<ll::Packet16>(300000, 64);
}

namespace {
// While one thread churns other flags through the packets, a reader waits for
// round `target`; the writer finally writes the target round and stops. The
// reader must return exactly the target round's data.
template <class P>
void churnThenTarget(Comm& comm, int trials) {
  const DevComm dc = comm.devComm();
  constexpr size_t kBytes = 1021;
  std::vector<P> buf(ll::packetCount<P>(kBytes));
  std::vector<uint8_t> data(kBytes), junk(kBytes), out(kBytes);
  for (int t = 0; t < trials; ++t) {
    const uint32_t target = ll::flagForRound(uint64_t(1000 + t));
    for (size_t i = 0; i < kBytes; ++i) data[i] = pattern(uint64_t(t), 0, i);
    std::memset(out.data(), kPoison, kBytes);
    bool ok = false;
    std::thread reader([&] { ok = ll::getPackets(CoopThread{}, dc, out.data(), buf.data(), kBytes, target); });
    for (int c = 0; c < 200; ++c) {
      for (size_t i = 0; i < kBytes; ++i) junk[i] = pattern(uint64_t(c + 77), 1, i);
      ll::putPackets(CoopThread{}, buf.data(), junk.data(), kBytes, target + 1 + uint32_t(c));
    }
    ll::putPackets(CoopThread{}, buf.data(), data.data(), kBytes, target);
    reader.join();
    expect(ok, "getPackets gave up");
    expect(std::memcmp(out.data(), data.data(), kBytes) == 0, "reader returned data of another round");
  }
  comm.check();
}
}  // namespace

TEST_CASE("LL8 and LL16: a reader waiting for its round ignores every other round a writer churns through", "[ll]") {
  REQUIRE_NOTHROW(runRanks(1, [](Comm& comm) {
    churnThenTarget<ll::Packet8>(comm, 20);
    churnThenTarget<ll::Packet16>(comm, 20);
  }));
}

TEST_CASE("LL: a packet that never arrives gives a gin::Error naming llWait, the packet and the flag", "[ll][errors]") {
  std::string msg;
  bool returned = true;
  REQUIRE_NOTHROW(runRanks(
      2,
      [&](Comm& comm) {
        const DevComm dc = comm.devComm();
        Window w = comm.allocWindow(4096);
        if (comm.rank() == 0) {
          // Packets 0..2 arrive, packet 3 holds last round's flag forever.
          uint8_t payload[3 * ll::kPayloadBytes<ll::Packet16>] = {};
          ll::Packet16* p = static_cast<ll::Packet16*>(comm.localPointer(w));
          ll::putPackets(CoopThread{}, p, payload, sizeof payload, 41);
          ll::store(p + 3, 0, 40);
          uint8_t out[64];
          returned = ll::getPacketsFromWindow<ll::Packet16>(CoopThread{}, dc, out, w, 0, 64, 41, 1);
          try {
            comm.check();
          } catch (const Error& e) {
            msg = e.what();
          }
        }
        comm.bootstrap().barrier();
      },
      gintest::cpuConfig(100'000'000ull)));
  CHECK_FALSE(returned);
  CHECK_THAT(msg, ContainsSubstring("llWait") && ContainsSubstring("rank 0") && ContainsSubstring("peer 1") &&
                      ContainsSubstring("id 3") && ContainsSubstring("expected 41") &&
                      ContainsSubstring("observed 40"));
}

TEST_CASE("LL: a misaligned or too large window range is a bad argument and writes nothing", "[ll][errors]") {
  std::string msg;
  REQUIRE_NOTHROW(runRanks(1, [&](Comm& comm) {
    const DevComm dc = comm.devComm();
    Window w = comm.allocWindow(256);
    std::memset(comm.localPointer(w), kPoison, 256);
    uint8_t src[64] = {1, 2, 3};
    expect(!ll::putPacketsToPeer<ll::Packet16>(CoopThread{}, dc, teamWorld(dc), 0, w, 8, src, 16, 1),
           "misaligned offset accepted");
    expect(!ll::putPacketsToPeer<ll::Packet8>(CoopThread{}, dc, teamWorld(dc), 0, w, 8, src, 254, 1),
           "range past the window accepted");
    const auto* b = static_cast<const uint8_t*>(comm.localPointer(w));
    for (size_t i = 0; i < 256; ++i) expect(b[i] == kPoison, "a refused put wrote");
    try {
      comm.check();
    } catch (const Error& e) {
      msg = e.what();
    }
  }));
  CHECK_THAT(msg, ContainsSubstring("badArgument"));
}
