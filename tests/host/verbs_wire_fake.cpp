// The verbs wire (gin/host/verbs_wire.hpp) end to end on CPU ranks as threads,
// over tests/common/fake_verbs.hpp, an in-process model of RC queue pairs that
// stands in for libibverbs (this executable does not link it). What this
// proves: the wire's own logic — connection exchange and QP attributes, GID
// choice, window registration and bounds, send-queue accounting with
// unsignaled WRs and fences, signals through the receiver thread, RNR
// back-pressure, dead and stuck peers. What it cannot prove: anything about a
// real NIC (see docs/host-api.md, "Verbs wire").
#include "../common/fake_verbs.hpp"  // first: defines the ibv_* functions this test links against

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>

#include "gin/host/verbs_wire.hpp"

using namespace gin;
using Catch::Matchers::ContainsSubstring;

namespace {

struct Fail : std::runtime_error {
  using std::runtime_error::runtime_error;
};
void expect(bool ok, const std::string& what) {
  if (!ok) throw Fail(what);
}

void resetFake() {
  fakeverbs::ctl.devicePresent = true;
  fakeverbs::ctl.linkLayer = IBV_LINK_LAYER_ETHERNET;
  fakeverbs::ctl.maxMsgBytes = 1u << 30;
  fakeverbs::ctl.overflows = 0;
  fakeverbs::ctl.badAttrs = 0;
  fakeverbs::ctl.rnrWaits = 0;
  fakeverbs::ctl.freezeSends = false;
}

// body(rank, bootstrap) on n rank threads; each rank's exception text ("" if none).
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
        msgs[size_t(r)] = std::string("rank ") + std::to_string(r) + ": " + e.what();
      }
    });
  for (auto& t : threads) t.join();
  return msgs;
}
void requireAllOk(const std::vector<std::string>& msgs) {
  for (const auto& m : msgs) {
    INFO(m);
    CHECK(m.empty());
  }
  CHECK(fakeverbs::ctl.overflows == 0);
  INFO(fakeverbs::ctl.lastBadAttr);
  CHECK(fakeverbs::ctl.badAttrs == 0);
}

uint8_t pat(uint64_t seed, int rank, size_t i) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ (uint64_t(rank) << 40) ^ i;
  x ^= x >> 31;
  x *= 0xff51afd7ed558ccdull;
  return uint8_t(x >> 29);
}

bool waitFor(const uint64_t* w, uint64_t v, double seconds = 10) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (atomicLoad(w, MemoryOrder::Acquire) != v)
    if (std::chrono::steady_clock::now() > end)
      return false;
    else
      std::this_thread::yield();
  return true;
}

// Every rank puts a fresh pattern into its slot of every peer's window each
// round (pieces of at most 1000 bytes: the port's max message here), then
// signals; the receiver sees the signal and checks every byte, and the bytes
// around the slot. Self is included when `self`.
void allToAll(int n, bool self, uint32_t sendDepth) {
  constexpr size_t S = 5000;
  constexpr int kRounds = 6;
  const auto msgs = onRanks(n, [&](int me, Bootstrap& bs) {
    std::vector<uint64_t> signals(size_t(n) + 1, 0);
    VerbsWireConfig cfg;
    cfg.sendDepth = sendDepth;
    std::vector<int> peers;
    for (int r = 0; r < n; ++r)
      if (r != me || self) peers.push_back(r);
    cfg.peers = peers;
    VerbsWire w(bs, signals.data(), uint32_t(signals.size()), cfg);
    expect(w.roce() && w.gidIndex() == 3, "RoCE v2 IPv4-mapped GID index 3 expected");
    std::vector<char> src(S), dst(size_t(n) * S + 64, char(0xAB));
    w.registerWindow(1, src.data(), src.size(), false);
    w.registerWindow(2, dst.data(), dst.size(), false);
    for (int round = 0; round < kRounds; ++round) {
      const size_t len = 1 + (size_t(round) * 977 + size_t(me) * 131) % S;
      for (size_t i = 0; i < len; ++i) src[i] = char(pat(uint64_t(round), me, i));
      bs.barrier();  // receivers finished checking the previous round
      WireReject why;
      for (int p : peers) expect(w.put(p, 2, uint64_t(me) * S, src.data(), len, &why), "put refused");
      w.complete();  // as the engine does before a signal
      for (int p : peers) expect(w.signal(p, uint32_t(me), ProxyAction::Add, 1, &why), "signal refused");
      w.complete();
      for (int p : peers) {
        expect(waitFor(&signals[size_t(p)], uint64_t(round) + 1),
               "signal from " + std::to_string(p) + " did not arrive in round " + std::to_string(round));
        const size_t plen = 1 + (size_t(round) * 977 + size_t(p) * 131) % S;
        for (size_t i = 0; i < plen; ++i)
          expect(uint8_t(dst[size_t(p) * S + i]) == pat(uint64_t(round), p, i),
                 "byte " + std::to_string(i) + " from " + std::to_string(p) + " differs in round " +
                     std::to_string(round));
      }
      expect(uint8_t(dst[size_t(n) * S]) == 0xAB, "a write ran past the last slot");
      bs.barrier();
    }
    // putValue (inline) and SignalSet to the next rank, past the slots.
    WireReject why;
    const int next = (me + 1) % n;
    if (next != me || self) {
      const uint64_t mine = 0x0102030405060708ull + uint64_t(me);
      expect(w.putInline(next, 2, uint64_t(n) * S + 32, &mine, 8, &why), "putInline refused");
      w.complete();
      expect(w.signal(next, uint32_t(n), ProxyAction::Set, 0xfeedull << 20 | uint64_t(me), &why), "Set refused");
      w.complete();
      const int prev = (me + n - 1) % n;
      expect(waitFor(&signals[size_t(n)], 0xfeedull << 20 | uint64_t(prev)), "SignalSet did not arrive");
      uint64_t got;
      std::memcpy(&got, &dst[size_t(n) * S + 32], 8);
      expect(got == 0x0102030405060708ull + uint64_t(prev), "putValue bytes differ");
    }
    bs.barrier();  // nobody destroys its QPs while a peer still sends
  });
  requireAllOk(msgs);
}

}  // namespace

TEST_CASE("fake RC: puts land before their signals on 1..4 ranks, split at the port's max message size") {
  resetFake();
  fakeverbs::ctl.maxMsgBytes = 1000;
  const uint64_t before = fakeverbs::ctl.postedSends;
  allToAll(1, true, 256);  // one rank, loopback QP
  allToAll(2, false, 256);
  allToAll(3, true, 256);
  allToAll(4, false, 16);
  CHECK(fakeverbs::ctl.postedSends - before > 500);  // the work went through the (fake) queues
}

TEST_CASE("fake RC: the send queue never overflows with thousands of WRs between completes") {
  resetFake();
  for (uint32_t depth : {4u, 8u, 64u}) {
    const auto msgs = onRanks(2, [&](int me, Bootstrap& bs) {
      std::vector<uint64_t> signals(2, 0);
      VerbsWireConfig cfg;
      cfg.sendDepth = depth;
      cfg.recvDepth = 4;
      VerbsWire w(bs, signals.data(), 2, cfg);
      std::vector<char> src(3000), dst(3000, 0);
      for (size_t i = 0; i < src.size(); ++i) src[i] = char(pat(depth, me, i));
      w.registerWindow(1, src.data(), src.size(), false);
      w.registerWindow(2, dst.data(), dst.size(), false);
      WireReject why;
      const int peer = 1 - me;
      for (size_t i = 0; i < src.size(); ++i) expect(w.put(peer, 2, i, &src[i], 1, &why), "put refused");
      for (int k = 0; k < 300; ++k) expect(w.signal(peer, 0, ProxyAction::Add, 1, &why), "signal refused");
      w.complete();
      expect(waitFor(&signals[0], 300), "300 signals expected");
      for (size_t i = 0; i < dst.size(); ++i) expect(uint8_t(dst[i]) == pat(depth, peer, i), "byte differs");
      bs.barrier();
    });
    INFO("sendDepth " << depth);
    requireAllOk(msgs);
  }
  CHECK(fakeverbs::ctl.rnrWaits > 0);  // 300 signals into 4 mailbox slots met an empty receive queue
}

TEST_CASE("fake RC: signals apply in order through few mailbox slots (Set then Adds)") {
  resetFake();
  const auto msgs = onRanks(2, [&](int me, Bootstrap& bs) {
    std::vector<uint64_t> signals(1, 0);
    VerbsWireConfig cfg;
    cfg.recvDepth = 1;
    VerbsWire w(bs, signals.data(), 1, cfg);
    WireReject why;
    if (me == 0) {
      for (int round = 0; round < 20; ++round) {
        expect(w.signal(1, 0, ProxyAction::Set, 1000 * uint64_t(round), &why), "Set refused");
        for (int k = 0; k < 7; ++k) expect(w.signal(1, 0, ProxyAction::Add, 1, &why), "Add refused");
      }
      w.complete();
    } else {
      expect(waitFor(&signals[0], 19007), "Set(19000) then 7 Adds expected last, got " +
                                              std::to_string(atomicLoad(&signals[0], MemoryOrder::Acquire)));
    }
    bs.barrier();
  });
  requireAllOk(msgs);
}

TEST_CASE("fake RC: a refused put or signal posts nothing") {
  resetFake();
  const auto msgs = onRanks(3, [&](int me, Bootstrap& bs) {
    std::vector<uint64_t> signals(6, 0);
    VerbsWireConfig cfg;
    cfg.peers = std::vector<int>{me == 0 ? 1 : me == 1 ? 0 : 2};
    VerbsWire w(bs, signals.data(), uint32_t(4 + me), cfg);  // ranks advertise different signal counts
    std::vector<char> src(100), dst(size_t(100 + 10 * me));
    w.registerWindow(1, src.data(), src.size(), false);
    w.registerWindow(2, dst.data(), dst.size(), false);
    bs.barrier();
    if (me == 0) {
      const uint64_t posted = fakeverbs::ctl.postedSends;
      WireReject why;
      expect(!w.put(1, 2, 100, src.data(), 11, &why), "put past rank 1's 110-byte window accepted");
      expect(why.id == 2 && why.value == 111 && why.limit == 110, "WireReject for the range");
      expect(!w.put(1, 2, ~0ull - 3, src.data(), 8, &why), "wrapping offset accepted");
      expect(!w.put(1, 9, 0, src.data(), 1, &why), "unknown window accepted");
      expect(why.id == 9 && why.limit == 0, "WireReject for the window");
      expect(!w.put(2, 2, 0, src.data(), 1, &why), "a peer not on this wire accepted");
      expect(why.id == 2, "WireReject names the peer");
      expect(!w.putInline(1, 2, 108, src.data(), 4, &why), "inline past the window accepted");
      expect(!w.signal(1, 5, ProxyAction::Add, 1, &why), "signal id past rank 1's 5 words accepted");
      expect(why.id == 5 && why.limit == 5, "WireReject for the signal id");
      expect(!w.signal(1, 0, ProxyAction::None, 1, &why), "op None accepted");
      expect(fakeverbs::ctl.postedSends == posted, "a refused operation posted a WR");
      expect(w.put(1, 2, 99, src.data(), 11, &why) && w.signal(1, 4, ProxyAction::Add, 1, &why), "edges refused");
      w.complete();
    }
    if (me == 1) expect(waitFor(&signals[4], 1), "the edge signal did not arrive");
    bs.barrier();
  });
  requireAllOk(msgs);
}

TEST_CASE("fake RC: a dead peer becomes an error naming the peer, the operation and the status") {
  resetFake();
  const auto msgs = onRanks(2, [&](int me, Bootstrap& bs) {
    std::vector<uint64_t> signals(1, 0);
    std::vector<char> buf(64);
    auto w = std::make_unique<VerbsWire>(bs, signals.data(), 1);
    w->registerWindow(1, buf.data(), buf.size(), false);
    bs.barrier();
    if (me == 1) w.reset();  // rank 1's QPs are gone: its NIC no longer answers
    bs.barrier();
    if (me == 0) {
      WireReject why;
      const auto t0 = std::chrono::steady_clock::now();
      std::string msg;
      try {
        expect(w->put(1, 1, 0, buf.data(), 8, &why), "put refused");
        w->complete();
      } catch (const Error& e) {
        msg = e.what();
      }
      expect(msg.find("peer 1") != std::string::npos && msg.find("RDMA WRITE (put)") != std::string::npos &&
                 msg.find("transport retry counter exceeded") != std::string::npos,
             "expected a dead-peer error, got: '" + msg + "'");
      expect(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5), "took too long");
      // The QP stays failed: later work to that peer throws, it does not hang.
      bool threw = false;
      try {
        (void)w->signal(1, 0, ProxyAction::Add, 1, &why);
      } catch (const Error&) {
        threw = true;
      }
      expect(threw, "a signal to the dead peer did not throw");
    }
  });
  requireAllOk(msgs);
}

TEST_CASE("fake RC: work that never completes is an error at the timeout, naming the peer") {
  resetFake();
  const auto msgs = onRanks(2, [&](int me, Bootstrap& bs) {
    std::vector<uint64_t> signals(1, 0);
    VerbsWireConfig cfg;
    cfg.timeoutNs = 300'000'000ull;
    VerbsWire w(bs, signals.data(), 1, cfg);
    bs.barrier();
    if (me == 0) {
      fakeverbs::ctl.freezeSends = true;  // the peer takes nothing, and no error comes back either
      WireReject why;
      std::string msg;
      const auto t0 = std::chrono::steady_clock::now();
      try {
        expect(w.signal(1, 0, ProxyAction::Add, 1, &why), "signal refused");
        w.complete();
      } catch (const Error& e) {
        msg = e.what();
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      fakeverbs::ctl.freezeSends = false;
      expect(msg.find("peer(s) 1 did not complete within 300 ms") != std::string::npos, "got: '" + msg + "'");
      expect(s >= 0.29 && s < 3, "gave up after " + std::to_string(s) + " s");
    }
    bs.barrier();
  });
  requireAllOk(msgs);
}

TEST_CASE("fake RC: peers lists that do not match fail on every rank") {
  resetFake();
  const auto msgs = onRanks(3, [&](int me, Bootstrap& bs) {
    std::vector<uint64_t> signals(1, 0);
    VerbsWireConfig cfg;
    cfg.peers = me == 0 ? std::vector<int>{1, 2} : me == 1 ? std::vector<int>{0} : std::vector<int>{1};
    VerbsWire w(bs, signals.data(), 1, cfg);
  });
  for (const auto& m : msgs) {
    INFO(m);
    CHECK_THAT(m, ContainsSubstring("connecting queue pairs failed on rank"));
    CHECK_THAT(m, ContainsSubstring("must be symmetric"));
  }
}

TEST_CASE("fake IB: LID addressing, no GRH") {
  resetFake();
  fakeverbs::ctl.linkLayer = IBV_LINK_LAYER_INFINIBAND;
  const auto msgs = onRanks(2, [&](int me, Bootstrap& bs) {
    std::vector<uint64_t> signals(1, 0);
    VerbsWire w(bs, signals.data(), 1);
    expect(!w.roce(), "IB expected");
    WireReject why;
    expect(w.signal(1 - me, 0, ProxyAction::Add, 3, &why), "signal refused");
    w.complete();
    expect(waitFor(&signals[0], 3), "signal did not arrive");
    bs.barrier();
  });
  requireAllOk(msgs);
}

TEST_CASE("fake: with no device every rank fails at once") {
  resetFake();
  fakeverbs::ctl.devicePresent = false;
  const auto msgs = onRanks(3, [&](int, Bootstrap& bs) {
    std::vector<uint64_t> signals(1, 0);
    VerbsWire w(bs, signals.data(), 1);
  });
  for (const auto& m : msgs) CHECK_THAT(m, ContainsSubstring("no RDMA device found"));
  fakeverbs::ctl.devicePresent = true;
}

TEST_CASE("fake RC: a rank with no verbs peers takes part in the collectives without opening a device") {
  resetFake();
  const uint64_t opened = fakeverbs::ctl.opened;
  const auto msgs = onRanks(3, [&](int me, Bootstrap& bs) {
    std::vector<uint64_t> signals(1, 0);
    VerbsWireConfig cfg;
    cfg.peers = me == 2 ? std::vector<int>{} : std::vector<int>{1 - me};
    VerbsWire w(bs, signals.data(), 1, cfg);
    std::vector<char> buf(64, char(me));
    w.registerWindow(1, buf.data(), buf.size(), false);
    WireReject why;
    if (me < 2) {
      expect(w.put(1 - me, 1, 8, buf.data(), 8, &why), "put refused");
      w.complete();
      expect(w.signal(1 - me, 0, ProxyAction::Add, 1, &why), "signal refused");
      w.complete();
      expect(waitFor(&signals[0], 1), "signal did not arrive");
      expect(buf[8] == char(1 - me), "payload did not arrive");
    } else {
      expect(!w.put(0, 1, 0, buf.data(), 8, &why), "rank 2 put to a rank it has no QP for");
      w.complete();
    }
    bs.barrier();
  });
  requireAllOk(msgs);
  CHECK(fakeverbs::ctl.opened - opened == 2);
}
