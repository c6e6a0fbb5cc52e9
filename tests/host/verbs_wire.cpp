// Tests of the verbs wire (gin/host/verbs_wire.hpp). Without an RDMA device
// (every machine these tests ran on so far) they check what can be checked:
// construction fails on every rank at once with a clear message, the failure
// vote, and the pure pieces (GID choice, signal records, message splitting,
// GIN_IB_DEVICE parsing) with random inputs. With a device (or GIN_IB_DEVICE
// set) a loopback put + signal runs through a real NIC; otherwise it is
// skipped with a message.
#include <algorithm>
#include <atomic>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "gin/host/verbs_wire.hpp"

using namespace gin;
using Catch::Matchers::ContainsSubstring;

namespace {

// Runs body(rank, bootstrap) on n threads of one InProcessGroup; returns each
// rank's exception message ("" when it returned normally).
std::vector<std::string> onRanks(int n, const std::function<void(int, Bootstrap&)>& body) {
  BootstrapConfig bcfg;
  bcfg.timeoutNs = 20'000'000'000ull;
  InProcessGroup group(n, bcfg);
  std::vector<std::string> msgs(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r, group.rank(r));
      } catch (const std::exception& e) {
        msgs[size_t(r)] = e.what();
        if (msgs[size_t(r)].empty()) msgs[size_t(r)] = "(empty message)";
      }
    });
  for (auto& t : threads) t.join();
  return msgs;
}

#if GIN_WITH_VERBS
bool rdmaDevicePresent() {
  int n = 0;
  ibv_device** l = ibv_get_device_list(&n);
  if (l) ibv_free_device_list(l);
  return l && n > 0;
}
#endif

}  // namespace

TEST_CASE("the failure vote: every rank throws iff some rank failed, naming the first that did") {
  std::mt19937 rng(12345);
  for (int trial = 0; trial < 40; ++trial) {
    const int n = 1 + int(rng() % 4);
    std::vector<std::string> local(static_cast<size_t>(n));
    int first = -1;
    for (int r = 0; r < n; ++r)
      if (rng() % 3 == 0) {
        local[size_t(r)] = "boom-" + std::to_string(rng()) + "-" + std::string(rng() % 500, 'x');
        if (first < 0) first = r;
      }
    const auto msgs = onRanks(n, [&](int r, Bootstrap& bs) { verbs::agreeOrThrow(bs, local[size_t(r)], "phase-x"); });
    for (int r = 0; r < n; ++r) {
      INFO("trial " << trial << " rank " << r << " of " << n << ": " << msgs[size_t(r)]);
      if (first < 0) {
        CHECK(msgs[size_t(r)].empty());
        continue;
      }
      const int who = local[size_t(r)].empty() ? first : r;
      const std::string expectedHead = local[size_t(who)].substr(0, 300);
      CHECK_THAT(msgs[size_t(r)], ContainsSubstring("phase-x failed on rank " + std::to_string(who)));
      CHECK_THAT(msgs[size_t(r)], ContainsSubstring(expectedHead));
    }
  }
}

#if GIN_WITH_VERBS
TEST_CASE("with no RDMA device, constructing the wire fails on every rank at once with a clear error") {
  if (rdmaDevicePresent() || std::getenv("GIN_IB_DEVICE")) {
    SKIP("an RDMA device is present: the no-device path cannot be exercised here");
  }
  const int n = GENERATE(1, 2, 3, 4);
  std::vector<uint64_t> signals(size_t(n) * 8, 0);
  const auto t0 = std::chrono::steady_clock::now();
  const auto msgs = onRanks(n, [&](int r, Bootstrap& bs) {
    VerbsWireConfig cfg;
    cfg.timeoutNs = 5'000'000'000ull;
    cfg.peers = std::vector<int>();
    for (int p = 0; p < n; ++p) cfg.peers->push_back(p);  // itself too: one rank alone still needs the device
    VerbsWire w(bs, signals.data() + 8 * r, 8, cfg);
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(n << " ranks, " << s << " s");
  CHECK(s < 5.0);  // no rank waited out a bootstrap timeout
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << msgs[size_t(r)]);
    CHECK_THAT(msgs[size_t(r)], ContainsSubstring("no RDMA device found: ibv_get_device_list returned none"));
    CHECK_THAT(msgs[size_t(r)], ContainsSubstring("GIN_PROXY_WIRE=tcp"));
    CHECK_THAT(msgs[size_t(r)], ContainsSubstring("opening the RDMA device failed on rank " + std::to_string(r)));
  }
}
#endif

TEST_CASE("GID choice: forced index, else the first RoCE v2 IPv4-mapped entry, else 0") {
  auto entry = [](uint32_t index, bool v2, bool v4) {
    verbs::GidCandidate c;
    c.index = index;
    c.rocev2 = v2;
    if (v4) {
      c.raw[10] = c.raw[11] = 0xff;
      c.raw[12] = 10, c.raw[15] = uint8_t(index);
    } else {
      c.raw[0] = 0xfe, c.raw[1] = 0x80, c.raw[15] = uint8_t(index + 1);  // link-local fe80::
    }
    return c;
  };
  // The usual mlx5 RoCE table: fe80 v1, fe80 v2, ::ffff:IPv4 v1, ::ffff:IPv4 v2.
  const std::vector<verbs::GidCandidate> mlx5 = {entry(0, false, false), entry(1, true, false), entry(2, false, true),
                                                 entry(3, true, true)};
  CHECK(verbs::chooseGidIndex(mlx5, -1) == 3);
  CHECK(verbs::chooseGidIndex(mlx5, 1) == 1);
  CHECK(verbs::chooseGidIndex({}, -1) == 0);
  CHECK(verbs::chooseGidIndex({entry(0, false, false), entry(1, true, false)}, -1) == 0);

  std::mt19937 rng(777);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<verbs::GidCandidate> t;
    uint32_t index = 0;
    const int len = int(rng() % 8);
    for (int i = 0; i < len; ++i) {
      index += 1 + rng() % 3;  // unused entries leave holes
      verbs::GidCandidate c = entry(index, rng() % 2, rng() % 2);
      if (rng() % 5 == 0) c.raw[int(rng() % 12)] ^= uint8_t(1 + rng() % 255);  // maybe no longer IPv4-mapped
      t.push_back(c);
    }
    const int forced = rng() % 4 == 0 ? int(rng() % 16) : -1;
    const uint32_t got = verbs::chooseGidIndex(t, forced);
    INFO("trial " << trial);
    if (forced >= 0) {
      CHECK(got == uint32_t(forced));
      continue;
    }
    size_t firstGood = t.size();
    for (size_t i = 0; i < t.size(); ++i)
      if (t[i].rocev2 && t[i].raw[10] == 0xff && t[i].raw[11] == 0xff &&
          std::all_of(t[i].raw, t[i].raw + 10, [](uint8_t b) { return b == 0; })) {
        firstGood = i;
        break;
      }
    CHECK(got == (firstGood < t.size() ? t[firstGood].index : 0u));
  }
}

TEST_CASE("a signal record decodes to what was encoded, and nothing else decodes") {
  std::mt19937_64 rng(4242);
  for (int trial = 0; trial < 5000; ++trial) {
    verbs::SignalRecord in;
    in.id = uint32_t(rng());
    in.op = rng() % 2 ? ProxyAction::Add : ProxyAction::Set;
    in.value = rng();
    unsigned char buf[verbs::kSignalRecordBytes];
    verbs::encodeSignal(in, buf);
    verbs::SignalRecord out;
    REQUIRE(verbs::decodeSignal(buf, &out));
    CHECK(out.id == in.id);
    CHECK(out.op == in.op);
    CHECK(out.value == in.value);
    // Little-endian on the wire whatever the host: the value's low byte first.
    CHECK(buf[8] == uint8_t(in.value));
    CHECK(buf[4] == uint8_t(in.id));
    // A corrupted header (magic, version, op) is refused and leaves *r alone.
    unsigned char bad[verbs::kSignalRecordBytes];
    std::memcpy(bad, buf, sizeof bad);
    const int at = int(rng() % 4);
    bad[at] = uint8_t(bad[at] ^ (1 + rng() % 255));
    verbs::SignalRecord untouched{7, ProxyAction::None, 9};
    const bool ok = verbs::decodeSignal(bad, &untouched);
    const bool stillValidOp = at == 3 && (bad[3] == uint8_t(ProxyAction::Add) || bad[3] == uint8_t(ProxyAction::Set));
    CHECK(ok == stillValidOp);
    if (!ok) CHECK((untouched.id == 7 && untouched.value == 9));
    // The immediate carries the message number modulo 2^32.
    const uint64_t seq = rng();
    CHECK(verbs::immediateMatches(verbs::signalImmediate(seq), seq));
    CHECK(verbs::immediateMatches(verbs::signalImmediate(seq), seq + (uint64_t(1) << 32)));
    CHECK_FALSE(verbs::immediateMatches(verbs::signalImmediate(seq), seq + 1 + rng() % 1000));
  }
  unsigned char none[verbs::kSignalRecordBytes];
  verbs::encodeSignal({1, ProxyAction::None, 1}, none);
  verbs::SignalRecord r;
  CHECK_FALSE(verbs::decodeSignal(none, &r));
}

TEST_CASE("a put is split into consecutive pieces of at most the maximum message size") {
  std::mt19937_64 rng(99);
  for (int trial = 0; trial < 3000; ++trial) {
    const uint64_t maxChunk = 1 + rng() % (trial % 2 ? 4096 : (1ull << 30));
    const uint64_t bytes = rng() % 8 == 0 ? 0 : rng() % (maxChunk * (1 + rng() % 9) + 3);
    uint64_t next = 0, pieces = 0;
    bool ok = true;
    verbs::forEachChunk(bytes, maxChunk, [&](uint64_t off, uint64_t len) {
      ok &= off == next && len >= 1 && len <= maxChunk;
      next = off + len;
      ++pieces;
    });
    INFO("bytes " << bytes << " max " << maxChunk);
    CHECK(ok);
    CHECK(next == bytes);
    CHECK(pieces == (bytes + maxChunk - 1) / maxChunk);
  }
  uint64_t pieces = 0;
  verbs::forEachChunk((5ull << 30) + 1, 1ull << 30, [&](uint64_t, uint64_t) { ++pieces; });
  CHECK(pieces == 6);
}

TEST_CASE("GIN_IB_DEVICE is name or name:port") {
  CHECK(verbs::parseDeviceSpec("").name.empty());
  CHECK(verbs::parseDeviceSpec("mlx5_0").name == "mlx5_0");
  CHECK(verbs::parseDeviceSpec("mlx5_0").port == 0);
  CHECK(verbs::parseDeviceSpec("mlx5_1:2").name == "mlx5_1");
  CHECK(verbs::parseDeviceSpec("mlx5_1:2").port == 2);
  for (const char* bad : {"mlx5_0:", "mlx5_0:x", "mlx5_0:0", "mlx5_0:1x", ":1", "mlx5_0:256"}) {
    INFO(bad);
    CHECK_THROWS_WITH(verbs::parseDeviceSpec(bad), ContainsSubstring("GIN_IB_DEVICE"));
  }
}

#if GIN_WITH_VERBS
TEST_CASE("loopback through a real NIC: a put lands before its signal, putValue and SignalSet work") {
  if (!rdmaDevicePresent()) {
    SKIP("no RDMA device (ibv_get_device_list returned none): the loopback test needs hardware or rxe");
  }
  const auto msgs = onRanks(1, [](int, Bootstrap& bs) {
    std::vector<uint64_t> signals(4, 0);
    VerbsWireConfig cfg;
    cfg.timeoutNs = 10'000'000'000ull;
    cfg.peers = std::vector<int>{0};  // a loopback QP to this rank
    VerbsWire w(bs, signals.data(), 4, cfg);
    std::vector<char> src(1 << 20), dst((1 << 20) + 64, 0);
    for (size_t i = 0; i < src.size(); ++i) src[i] = char(i * 131 + 7);
    w.registerWindow(1, src.data(), src.size(), false);
    w.registerWindow(2, dst.data(), dst.size(), false);
    WireReject why;
    if (w.put(0, 2, 65, src.data(), src.size(), &why)) throw Error("a put past the window was accepted");
    if (!w.put(0, 2, 64, src.data(), src.size(), &why)) throw Error("put refused");
    const uint64_t v = 0x1122334455667788ull;
    if (!w.putInline(0, 2, 0, &v, 8, &why)) throw Error("putInline refused");
    w.complete();
    if (!w.signal(0, 1, ProxyAction::Add, 5, &why) || !w.signal(0, 2, ProxyAction::Set, 0xabcdef0123ull, &why))
      throw Error("signal refused");
    if (w.signal(0, 4, ProxyAction::Add, 1, &why)) throw Error("a signal past the signal words was accepted");
    w.complete();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while ((atomicLoad(&signals[1], MemoryOrder::Acquire) != 5 ||
            atomicLoad(&signals[2], MemoryOrder::Acquire) != 0xabcdef0123ull) &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
    if (signals[1] != 5 || signals[2] != 0xabcdef0123ull) throw Error("signals did not arrive");
    if (std::memcmp(dst.data() + 64, src.data(), src.size()) != 0) throw Error("payload differs");
    uint64_t got;
    std::memcpy(&got, dst.data(), 8);
    if (got != v) throw Error("putInline value differs");
  });
  INFO(msgs[0]);
  CHECK(msgs[0].empty());
}
#endif
