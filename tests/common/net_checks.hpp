// tests/common/net_checks.hpp — checks every transport's tests share.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gin/host/test_access.hpp"
#include "ranks.hpp"

namespace gintest {

inline constexpr uint8_t kPoisonByte = 0xAB;

// comm.check()'s message, or "" when nothing failed.
inline std::string checkMessage(const gin::Comm& comm) {
  try {
    comm.check();
  } catch (const gin::Error& e) {
    return e.what();
  }
  return "";
}

// Polls until `ready()` holds, for at most the communicator's timeout (less
// once an error is recorded); false if it never did. For what no signal
// counts (a value a put without one wrote) or what a rolling wait cannot
// tell apart from the word's old value (a SignalSet near 2^64 over a 0).
template <class Ready>
bool eventually(const gin::Comm& comm, Ready ready) {
  const uint64_t ns = comm.devComm().timeoutNs ? comm.devComm().timeoutNs : 30'000'000'000ull;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(ns);
  while (!ready()) {
    if (comm.hasError() || std::chrono::steady_clock::now() > deadline) return ready();
    std::this_thread::yield();
  }
  return true;
}

// The engine threads a Comm built with `cfg` runs: GIN_PROXY_THREADS (suites
// run again with it set, see tests/meson.build) overrides the config.
inline int expectedThreads(const gin::CommConfig& cfg) {
  const auto e = gin::env::integer("GIN_PROXY_THREADS");
  const uint32_t n = e ? uint32_t(*e) : cfg.proxy.threads;
  return int(std::min<uint32_t>(n, uint32_t(cfg.nContexts)));
}

// allocWindow returns on a rank while its peers may still be registering the
// window: a put issued at once must still land (a tcp receiver or a NIC that
// does not know the window yet would refuse it). `rounds` fresh windows, each
// written by every rank on every peer right away, checked, freed. Uses signal 7.
inline void putRightAfterAlloc(gin::Comm& comm, int rounds) {
  using namespace gin;
  const DevComm dc = comm.devComm();
  const int n = comm.nRanks(), me = comm.rank();
  for (int round = 0; round < rounds; ++round) {
    Window w = comm.allocWindow(8 * size_t(n));
    Net net(dc, round % dc.nContexts);
    for (int q = 1; q <= n; ++q)
      net.putValue(teamWorld(dc), (me + q) % n, w, 8 * size_t(me), (uint64_t(round + 1) << 8) | uint64_t(me),
                   SignalInc{7});
    if (!net.waitSignal(CoopThread{}, 7, uint64_t(n) * uint64_t(round + 1)))
      expect(false, "round " + std::to_string(round) + ": " + checkMessage(comm));
    const auto* got = static_cast<const uint64_t*>(comm.localPointer(w));
    for (int s = 0; s < n; ++s)
      expect(got[s] == ((uint64_t(round + 1) << 8) | uint64_t(s)),
             "round " + std::to_string(round) + ": the value from rank " + std::to_string(s) + " is missing");
    expect(net.flush(CoopThread{}), "flush");
    comm.deregisterWindow(w);
  }
  comm.check();
  Net(dc, 0).resetSignal(7);
  comm.bootstrap().barrier();
}

// Every rank puts `bytes` of random data (at `srcMis` in its source window)
// to every peer (rotated order) on every context with SignalInc and
// CounterInc, into slot [ctx][me] of the peer's destination at `dstMis`.
// Checks: flush returns and the counter then equals the puts (the sources
// were consumed: scribbling on them afterwards reaches nobody); every byte
// arrived and the poison around it is intact once the signal says so. The
// windows are freed at the end and the signals/counters [0, nContexts) reset.
inline void allToAllPut(gin::Comm& comm, size_t bytes, size_t srcMis, size_t dstMis, uint64_t seed) {
  using namespace gin;
  const DevComm dc = comm.devComm();
  const int n = comm.nRanks(), me = comm.rank();
  const size_t slot = bytes + 64;  // guard bytes between slots
  const size_t winBytes = slot * size_t(n) + 128;
  Window src = comm.allocWindow(winBytes);
  Window dst = comm.allocWindow(winBytes * size_t(dc.nContexts));
  auto* s = static_cast<uint8_t*>(comm.localPointer(src));
  auto* d = static_cast<uint8_t*>(comm.localPointer(dst));
  for (size_t i = 0; i < bytes; ++i) s[srcMis + i] = pattern(seed, me, i);
  std::memset(d, kPoisonByte, winBytes * size_t(dc.nContexts));
  comm.bootstrap().barrier();

  const Team world = teamWorld(dc);
  for (int ctx = 0; ctx < dc.nContexts; ++ctx) {
    Net net(dc, ctx);
    for (int q = 0; q < n; ++q)
      net.put(world, (me + q) % n, dst, size_t(ctx) * winBytes + size_t(me) * slot + dstMis, src, srcMis, bytes,
              SignalInc{uint32_t(ctx)}, CounterInc{uint32_t(ctx)});
    if (!net.flush(CoopThread{})) expect(false, "flush gave up: " + checkMessage(comm));
    const uint64_t counted = net.readCounter(uint32_t(ctx));
    expect(counted == uint64_t(n), "counter after flush is " + std::to_string(counted) + ", expected " +
                                       std::to_string(n) + " " + checkMessage(comm));
  }
  std::memset(s, 0x5A, winBytes);  // sources may be reused after flush
  for (int ctx = 0; ctx < dc.nContexts; ++ctx) {
    Net net(dc, ctx);
    if (!net.waitSignal(CoopThread{}, uint32_t(ctx), uint64_t(n)))
      expect(false, "waitSignal gave up: " + checkMessage(comm));
    for (int p = 0; p < n; ++p) {
      const uint8_t* blk = d + size_t(ctx) * winBytes + size_t(p) * slot;
      for (size_t i = 0; i < dstMis; ++i) expect(blk[i] == kPoisonByte, "bytes before the put were written");
      for (size_t i = 0; i < bytes; ++i)
        if (blk[dstMis + i] != pattern(seed, p, i))
          expect(false, "rank " + std::to_string(me) + " ctx " + std::to_string(ctx) + ": byte " + std::to_string(i) +
                            " of " + std::to_string(bytes) + " from rank " + std::to_string(p) + " is wrong");
      for (size_t i = dstMis + bytes; i < slot; ++i) expect(blk[i] == kPoisonByte, "bytes after the put were written");
    }
  }
  comm.check();
  comm.bootstrap().barrier();  // every rank has checked: nothing more arrives
  Net net(dc, 0);
  for (int c = 0; c < dc.nContexts; ++c) {
    net.resetSignal(uint32_t(c));
    net.resetCounter(uint32_t(c));
  }
  comm.deregisterWindow(dst);
  comm.deregisterWindow(src);
}

// putValue of 1, 2, 4 and 8 bytes, aligned and not, from every rank to every
// rank on context `ctx`, into the 64-byte slot [me] of `w` (64 * nRanks bytes,
// poisoned here); the last carries SignalInc{9}, so once signal 9 counts every
// rank, every value must be there and nothing outside them written.
inline void putValueWidths(gin::Comm& comm, gin::Window w, int ctx) {
  using namespace gin;
  const DevComm dc = comm.devComm();
  const int n = comm.nRanks(), me = comm.rank();
  std::memset(comm.localPointer(w), kPoisonByte, 64 * size_t(n));
  comm.bootstrap().barrier();
  Net net(dc, ctx);
  const Team world = teamWorld(dc);
  for (int p = 0; p < n; ++p) {
    const size_t o = size_t(me) * 64;
    net.putValue(world, p, w, o + 0, uint8_t(0x10 + me));
    net.putValue(world, p, w, o + 2, uint16_t(0x2000 + me));
    net.putValue(world, p, w, o + 4, uint32_t(0x30000000u + unsigned(me)));
    net.putValue(world, p, w, o + 8, uint64_t(0x4000000000000000ull + unsigned(me)));
    net.putValue(world, p, w, o + 17, uint32_t(0xdeadbeefu), SignalInc{9});  // unaligned
  }
  if (!net.waitSignal(CoopThread{}, 9, uint64_t(n)))
    expect(false, "signal 9 never arrived from everyone: " + checkMessage(comm));
  const auto* b = static_cast<const uint8_t*>(comm.localPointer(w));
  for (int p = 0; p < n; ++p) {
    const uint8_t* blk = b + size_t(p) * 64;
    uint16_t v16;
    uint32_t v32, u32;
    uint64_t v64;
    std::memcpy(&v16, blk + 2, 2);
    std::memcpy(&v32, blk + 4, 4);
    std::memcpy(&v64, blk + 8, 8);
    std::memcpy(&u32, blk + 17, 4);
    expect(blk[0] == 0x10 + p && v16 == 0x2000 + p && v32 == 0x30000000u + unsigned(p) &&
               v64 == 0x4000000000000000ull + unsigned(p) && u32 == 0xdeadbeefu,
           "putValue payload wrong from rank " + std::to_string(p));
    expect(blk[1] == kPoisonByte && blk[16] == kPoisonByte && blk[21] == kPoisonByte && blk[63] == kPoisonByte,
           "putValue wrote outside its bytes");
  }
}

// putValue of every width (the 8-byte one unaligned) from every rank to every
// rank with SignalInc, SignalAdd and SignalSet (values host-order), None
// posting nothing; resets; SignalSet after SignalAdd on one word and one
// context lands last; a zero-byte put with only a counter completes.
inline void putValueAndSignals(gin::Comm& comm) {
  using namespace gin;
  const DevComm dc = comm.devComm();
  const int n = comm.nRanks(), me = comm.rank();
  const Team world = teamWorld(dc);
  Window w = comm.allocWindow(64 * size_t(n));
  auto* mem = static_cast<uint8_t*>(comm.localPointer(w));
  std::memset(mem, kPoisonByte, 64 * size_t(n));
  comm.bootstrap().barrier();
  Net net(dc, 1);
  for (int p = 0; p < n; ++p) {
    const size_t base = 64 * size_t(me);
    net.putValue(world, p, w, base + 0, uint8_t(0x11 + me));
    net.putValue(world, p, w, base + 2, uint16_t(0x2222 + me));
    net.putValue(world, p, w, base + 4, uint32_t(0x33333333u + uint32_t(me)));
    net.putValue(world, p, w, base + 9, uint64_t(0x4444444444444444ull + uint64_t(me)), SignalInc{0});
    net.signal(world, p, SignalAdd{1, uint64_t(1000 + me)});
    net.signal(world, p, SignalSet{2, uint64_t(0x7777000000000000ull)});
    net.signal(world, p, None{});  // nothing posted
  }
  expect(net.flush(CoopThread{}), "flush gave up: " + checkMessage(comm));
  expect(net.waitSignal(CoopThread{}, 0, uint64_t(n)), "SignalInc via putValue");
  uint64_t sumAdd = 0;
  for (int p = 0; p < n; ++p) sumAdd += uint64_t(1000 + p);
  expect(net.waitSignal(CoopThread{}, 1, sumAdd), "SignalAdd");
  expect(net.waitSignal(CoopThread{}, 2, 0x7777000000000000ull), "SignalSet");
  expect(net.readSignal(2) == 0x7777000000000000ull, "SignalSet value is host-order");
  expect(net.readSignal(1) == sumAdd, "SignalAdd value (atomics act on host-order words)");
  for (int p = 0; p < n; ++p) {
    const uint8_t* b = mem + 64 * size_t(p);
    uint16_t v16;
    uint32_t v32;
    uint64_t v64;
    std::memcpy(&v16, b + 2, 2);
    std::memcpy(&v32, b + 4, 4);
    std::memcpy(&v64, b + 9, 8);
    expect(b[0] == uint8_t(0x11 + p) && b[1] == kPoisonByte, "putValue uint8");
    expect(v16 == uint16_t(0x2222 + p), "putValue uint16");
    expect(v32 == 0x33333333u + uint32_t(p), "putValue uint32");
    expect(v64 == 0x4444444444444444ull + uint64_t(p), "putValue uint64 (unaligned)");
    for (size_t i = 17; i < 64; ++i) expect(b[i] == kPoisonByte, "putValue wrote past its value");
    expect(b[8] == kPoisonByte, "putValue wrote into the gap");
  }
  comm.bootstrap().barrier();
  net.resetSignal(0);
  net.resetSignal(1);
  expect(net.readSignal(0) == 0 && net.readSignal(1) == 0, "resetSignal");
  comm.bootstrap().barrier();
  // SignalSet after a SignalAdd on the same word, same QP (each rank to
  // itself): the Set lands last (in order, behind the fence).
  for (int k = 0; k < 50; ++k) {
    net.signal(world, me, SignalAdd{3, 5});
    net.signal(world, me, SignalSet{3, uint64_t(k) << 20});
  }
  expect(net.flush(CoopThread{}), "flush gave up");
  // The flush frees the sources; it does not say the signals landed. Wait for
  // the last Set (every value before it is smaller), then read: a late Add
  // shows as 5 more.
  expect(net.waitSignal(CoopThread{}, 3, uint64_t(49) << 20), "the last SignalSet never landed: " + checkMessage(comm));
  expect(net.readSignal(3) == uint64_t(49) << 20, "SignalSet after SignalAdd on one QP was overtaken");
  comm.bootstrap().barrier();
  // Counters: a zero-byte put with only a counter still completes (a NOP carries it).
  net.put(world, me, w, 0, w, 0, 0, None{}, CounterInc{7});
  expect(net.waitCounter(CoopThread{}, 7, 1), "zero-byte put's counter");
  net.resetCounter(7);
  expect(net.readCounter(7) == 0, "resetCounter");
  comm.check();
  comm.bootstrap().barrier();
  comm.deregisterWindow(w);
}

// 300 rounds of a 3000-byte put then a signal alone on context 2 between two
// ranks: a waiter that sees signal count r sees every byte of round r.
inline void signalAfterPayload(gin::Comm& comm) {
  using namespace gin;
  const DevComm dc = comm.devComm();
  const int me = comm.rank(), peer = 1 - me;
  constexpr int kRounds = 300;
  constexpr size_t kBytes = 3000;
  Window src = comm.allocWindow(kBytes * kRounds);
  Window dst = comm.allocWindow(kBytes * kRounds);
  auto* s = static_cast<uint8_t*>(comm.localPointer(src));
  auto* d = static_cast<uint8_t*>(comm.localPointer(dst));
  for (size_t i = 0; i < kBytes * kRounds; ++i) s[i] = pattern(5, me, i);
  comm.bootstrap().barrier();
  Net net(dc, 2);
  const Team world = teamWorld(dc);
  for (int r = 0; r < kRounds; ++r) {
    // Payload without signal, then a signal alone: the signal still trails it.
    net.put(world, peer, dst, size_t(r) * kBytes, src, size_t(r) * kBytes, kBytes);
    net.signal(world, peer, SignalInc{4});
  }
  for (int r = 0; r < kRounds; ++r) {
    expect(net.waitSignal(CoopThread{}, 4, uint64_t(r + 1)), "waitSignal gave up");
    for (size_t i = size_t(r) * kBytes; i < size_t(r + 1) * kBytes; i += 97)
      if (d[i] != pattern(5, peer, i)) expect(false, "round " + std::to_string(r) + ": signal overtook payload");
  }
  expect(net.flush(CoopThread{}), "flush");
  comm.bootstrap().barrier();
  comm.deregisterWindow(dst);
  comm.deregisterWindow(src);
}

// ---- several producers and engine threads at once -------------------------

namespace detail {
inline uint64_t mix64(uint64_t x) {  // splitmix64's finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
// Message k of pusher t of rank s to rank p, as both ends derive it. Kinds:
// 0 put with the signal (and a CounterInc), 1 putValue with the signal, 2 put
// then the signal alone, 3 putValue then a put with the signal. The put's
// bytes (mostly 1..159, a quarter of them up to the slot's size) sit at `mis`
// in the slot (the same in the source slot), the value in the slot's last 8
// bytes.
struct StressMsg {
  int kind;
  size_t mis, bytes;
  int width;  // 1, 2, 4, 8
  uint64_t value, h;
};
inline StressMsg stressMsg(uint64_t seed, int s, int t, int p, int k, size_t slot) {
  const uint64_t h = mix64(seed ^ mix64((uint64_t(s) << 48) | (uint64_t(t) << 32) | (uint64_t(p) << 16) | uint64_t(k)));
  StressMsg m{};
  m.h = h;
  m.kind = int(h & 3);
  m.mis = size_t((h >> 8) % 24);
  m.bytes = 1 + size_t((h >> 16) % ((h >> 44) % 4 == 0 ? slot - 40 : 159));  // ends before the value
  m.width = 1 << ((h >> 28) & 3);
  m.value = mix64(h) & (m.width == 8 ? ~uint64_t(0) : (uint64_t(1) << (8 * m.width)) - 1);
  return m;
}
inline bool stressHasPut(const StressMsg& m) { return m.kind != 1; }
inline bool stressHasValue(const StressMsg& m) { return m.kind == 1 || m.kind == 3; }
inline int stressDescriptors(const StressMsg& m) { return m.kind >= 2 ? 2 : 1; }
inline uint8_t stressByte(const StressMsg& m, size_t i) { return uint8_t(mix64(m.h + i)); }
}  // namespace detail

// Every rank runs `pushers` threads (pusher t on context t % nContexts, so
// some rings have several producers); each sends `perPeer` messages to every
// rank (itself included) into slots of `slot` bytes (>= 192), a random mix of
// puts (misaligned; most short, some up to the slot's size; bigger ones keep a
// signal that overtook its payload visible longer),
// putValues of every width and signals (SignalInc or SignalAdd 1, with the
// payload or after it). Pusher t of rank s counts its messages to rank p on
// p's signal 100 + s * pushers + t, so while the messages arrive this rank's
// own thread checks: whenever that signal reads v, messages 0..v-1 are
// entirely there (payload before signal, earlier puts before later signals,
// per context and peer) and nothing else of their slots was written. Then:
// every signal exactly perPeer (none ran twice), each pusher's CounterInc
// count exact after its flush, the engine executed exactly the descriptors
// this rank pushed (a ring consumed by two threads would run some twice),
// nothing rejected, every ring consumed up to its head. Signals and counters
// it used are reset, its windows freed.
inline void engineStress(gin::Comm& comm, uint64_t seed, int pushers, int perPeer, size_t slot = 192) {
  using namespace gin;
  const size_t kStressSlot = slot, kStressValueAt = slot - 8;
  const DevComm dc = comm.devComm();
  const int n = comm.nRanks(), me = comm.rank(), C = dc.nContexts;
  expect(100 + n * pushers <= dc.nSignals && 100 + pushers <= dc.nCounters, "engineStress: too few signals");
  const size_t msgs = size_t(n) * size_t(pushers) * size_t(perPeer);
  // Destination slot [s][t][k] (from rank s's pusher t), source slot [t][p][k].
  Window dst = comm.allocWindow(msgs * kStressSlot);
  Window src = comm.allocWindow(msgs * kStressSlot);
  auto* d = static_cast<uint8_t*>(comm.localPointer(dst));
  auto* sb = static_cast<uint8_t*>(comm.localPointer(src));
  std::memset(d, kPoisonByte, msgs * kStressSlot);
  auto srcSlot = [&](int t, int p, int k) {
    return ((size_t(t) * size_t(n) + size_t(p)) * size_t(perPeer) + size_t(k)) * kStressSlot;
  };
  auto dstSlot = [&](int s, int t, int k) {
    return ((size_t(s) * size_t(pushers) + size_t(t)) * size_t(perPeer) + size_t(k)) * kStressSlot;
  };
  for (int t = 0; t < pushers; ++t)
    for (int p = 0; p < n; ++p)
      for (int k = 0; k < perPeer; ++k) {
        const auto m = detail::stressMsg(seed, me, t, p, k, slot);
        for (size_t i = 0; i < m.bytes; ++i) sb[srcSlot(t, p, k) + m.mis + i] = detail::stressByte(m, i);
      }
  comm.bootstrap().barrier();

  ProxyEngine* e = gin::test::CommAccess::proxyEngine(comm);
  expect(e != nullptr, "engineStress: no proxy engine");
  const uint64_t executedBefore = e->executed(), rejectedBefore = e->rejected();
  std::mutex errMu;
  std::string err;
  std::atomic<bool> failed{false};
  auto report = [&](const std::string& what) {
    std::lock_guard<std::mutex> lk(errMu);
    if (err.empty()) err = what;
    failed.store(true);
  };
  std::vector<uint64_t> pushed(size_t(pushers), 0), counted(size_t(pushers), 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < pushers; ++t)
    threads.emplace_back([&, t] {
      Net net(dc, t % C);
      const Team world = teamWorld(dc);
      const uint32_t sig = uint32_t(100 + me * pushers + t), cnt = uint32_t(100 + t);
      for (int k = 0; k < perPeer; ++k)
        for (int q = 0; q < n; ++q) {
          const int p = (me + q + t + k) % n;
          const auto m = detail::stressMsg(seed, me, t, p, k, slot);
          const size_t at = dstSlot(me, t, k), from = srcSlot(t, p, k);
          auto value = [&](auto signal) {
            const size_t off = at + kStressValueAt;
            switch (m.width) {
              case 1: net.putValue(world, p, dst, off, uint8_t(m.value), signal); break;
              case 2: net.putValue(world, p, dst, off, uint16_t(m.value), signal); break;
              case 4: net.putValue(world, p, dst, off, uint32_t(m.value), signal); break;
              default: net.putValue(world, p, dst, off, m.value, signal); break;
            }
          };
          const bool add = (m.h >> 40) & 1;
          switch (m.kind) {
            case 0:
              if (add)
                net.put(world, p, dst, at + m.mis, src, from + m.mis, m.bytes, SignalAdd{sig, 1}, CounterInc{cnt});
              else
                net.put(world, p, dst, at + m.mis, src, from + m.mis, m.bytes, SignalInc{sig}, CounterInc{cnt});
              ++counted[size_t(t)];
              break;
            case 1:
              if (add)
                value(SignalAdd{sig, 1});
              else
                value(SignalInc{sig});
              break;
            case 2:
              net.put(world, p, dst, at + m.mis, src, from + m.mis, m.bytes);
              net.signal(world, p, SignalInc{sig});
              break;
            default:
              value(None{});
              net.put(world, p, dst, at + m.mis, src, from + m.mis, m.bytes, SignalInc{sig});
              break;
          }
          // Producers that store to peers mapped here push only the actions:
          // one descriptor per message (every kind carries one signal).
          pushed[size_t(t)] += dc.proxyLsaStores && lsaIndexOf(dc, p) >= 0 ? 1u : uint64_t(detail::stressDescriptors(m));
        }
      if (!net.flush(CoopThread{})) return report("pusher " + std::to_string(t) + ": flush gave up");
      const uint64_t c = net.readCounter(cnt);
      if (c != counted[size_t(t)])
        report("pusher " + std::to_string(t) + ": counter after flush " + std::to_string(c) + ", expected " +
               std::to_string(counted[size_t(t)]));
    });

  // Meanwhile: check each message once its signal covers it.
  std::vector<int> checked(size_t(n) * size_t(pushers), 0);
  const Net net(dc, 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (bool all = false; !all && !failed.load();) {
    all = true;
    for (int s = 0; s < n; ++s)
      for (int t = 0; t < pushers; ++t) {
        int& done = checked[size_t(s) * size_t(pushers) + size_t(t)];
        const uint64_t v = net.readSignal(uint32_t(100 + s * pushers + t));
        if (v > uint64_t(perPeer))
          report("signal from rank " + std::to_string(s) + " pusher " + std::to_string(t) +
                 " overshot: " + std::to_string(v));
        // Newest first: it had the least time to land.
        const int upTo = int(std::min<uint64_t>(v, uint64_t(perPeer)));
        for (int k = upTo - 1; k >= done; --k) {
          const auto m = detail::stressMsg(seed, s, t, me, k, slot);
          const uint8_t* at = d + dstSlot(s, t, k);
          for (size_t i = 0; i < kStressSlot; ++i) {
            uint8_t want = kPoisonByte;
            if (detail::stressHasPut(m) && i >= m.mis && i < m.mis + m.bytes) want = detail::stressByte(m, i - m.mis);
            if (detail::stressHasValue(m) && i >= kStressValueAt && i < kStressValueAt + size_t(m.width))
              want = uint8_t(m.value >> (8 * (i - kStressValueAt)));
            if (at[i] != want) {
              report("rank " + std::to_string(me) + ": message " + std::to_string(k) + " (kind " +
                     std::to_string(m.kind) + ") from rank " + std::to_string(s) + " pusher " + std::to_string(t) +
                     ": byte " + std::to_string(i) + " is " + std::to_string(at[i]) + ", expected " +
                     std::to_string(want) + " when signal " + std::to_string(v) + " was seen");
              break;
            }
          }
        }
        done = std::max(done, upTo);
        all = all && done == perPeer;
      }
    if (std::chrono::steady_clock::now() > deadline) report("messages missing after 60 s: " + checkMessage(comm));
    if (!all) std::this_thread::yield();
  }
  for (auto& th : threads) th.join();
  expect(err.empty(), err);
  comm.check();
  // Everyone's engine is done with everything: an extra signal would show now.
  comm.bootstrap().barrier();
  for (int c = 0; c < C; ++c) expect(Net(dc, c).flush(CoopThread{}), "flush");
  if (gin::test::CommAccess::tcpWire(comm))
    expect(gin::test::CommAccess::tcpWire(comm)->fence(10'000'000'000ull), "fence: " + checkMessage(comm));
  comm.bootstrap().barrier();
  for (int s = 0; s < n; ++s)
    for (int t = 0; t < pushers; ++t) {
      const uint64_t v = net.readSignal(uint32_t(100 + s * pushers + t));
      expect(v == uint64_t(perPeer), "signal from rank " + std::to_string(s) + " pusher " + std::to_string(t) + " is " +
                                         std::to_string(v) + ", expected " + std::to_string(perPeer));
    }
  uint64_t total = 0;
  for (uint64_t p : pushed) total += p;
  const uint64_t executed = e->executed() - executedBefore, rejected = e->rejected() - rejectedBefore;
  expect(executed == total && rejected == 0,
         "rank " + std::to_string(me) + ": the engine executed " + std::to_string(executed) + " and rejected " +
             std::to_string(rejected) + " descriptors; " + std::to_string(total) + " were pushed");
  for (int c = 0; c < C; ++c) {
    const uint64_t head = *dc.proxyRings[c].head, consumed = *dc.proxyRings[c].consumed;
    expect(head == consumed,
           "ring " + std::to_string(c) + ": consumed " + std::to_string(consumed) + " of " + std::to_string(head));
  }
  comm.bootstrap().barrier();
  Net r(dc, 0);
  for (int s = 0; s < n; ++s)
    for (int t = 0; t < pushers; ++t) r.resetSignal(uint32_t(100 + s * pushers + t));
  for (int t = 0; t < pushers; ++t) r.resetCounter(uint32_t(100 + t));
  comm.deregisterWindow(src);
  comm.deregisterWindow(dst);
}

}  // namespace gintest
