// gin/device/net.hpp — Net: the put / signal / flush / wait API a kernel calls.
//
//   gin::Net net(devComm, contextIndex);      // every transport; Net<kBackendLsa> for lsa only
//   net.put(gin::teamWorld(devComm), peer, dstWin, dstOff, srcWin, srcOff, bytes,
//           gin::SignalInc{sig}, gin::None{}, gin::CoopWarp{});
//   net.waitSignal(gin::CoopBlock{}, sig, expected);
//
// Contract (every transport):
//  - A remote action (SignalInc/SignalAdd/SignalSet) on a put becomes visible at
//    the peer only after that put's payload, and the payloads of the calling
//    coop's earlier puts on this context to the same peer, are visible there.
//  - flush(coop): the source buffers of every put issued by `coop` on this
//    context may be reused. It does not promise remote visibility. (Over the
//    proxy it waits for every descriptor claimed on the context before the
//    call, whichever coop pushed it: a stronger promise.)
//  - Counters count local completion (source consumed); signals count arrival.
//  - Waits compare with rolling arithmetic (gin/core/rolling.hpp) and are bounded
//    by the communicator's timeout: on expiry the error record names rank, peer,
//    operation, id, expected and observed values, and every other wait stops.
//  - resetSignal/resetCounter must not race with updates to the same object.
//  - SignalInc may not be mixed with other signal operations on one signal
//    between resets (as in NCCL; gin itself treats it as SignalAdd{1}).
// Every thread of a coop calls with the same arguments.
#pragma once

#include "gin/core/coop.hpp"
#include "gin/core/rolling.hpp"
#include "gin/device/action.hpp"
#include "gin/device/transport/ibgda.hpp"
#include "gin/device/transport/lsa.hpp"
#include "gin/device/transport/proxy.hpp"
#include "gin/device/window.hpp"

namespace gin {

// Backend mask: which transports a Net may dispatch to. Leaving one out
// compiles its code out of the kernel.
inline constexpr unsigned kBackendLsa = unsigned(Transport::Lsa);
inline constexpr unsigned kBackendProxy = unsigned(Transport::Proxy);
inline constexpr unsigned kBackendIbgda = unsigned(Transport::Ibgda);
inline constexpr unsigned kBackendAll = kBackendLsa | kBackendProxy | kBackendIbgda;

template <class Coop, unsigned Backends = kBackendAll>
class BarrierSession;  // gin/device/barrier.hpp
template <unsigned Backends = kBackendAll>
class PostBatch;  // gin/device/batch.hpp

template <unsigned Backends = kBackendAll>
class Net {
 public:
  // Binds network context `contextIndex` (0 <= contextIndex < nContexts).
  GIN_HD Net(const DevComm& comm, int contextIndex) : c_(&comm), ctx_(contextIndex) {
    if (contextIndex < 0 || contextIndex >= comm.nContexts) {
      recordError(comm, Op::BadArgument, -1, contextIndex, 0, uint64_t(contextIndex), uint64_t(comm.nContexts));
      ctx_ = -1;
    }
  }

  GIN_HD const DevComm& comm() const { return *c_; }
  GIN_HD int context() const { return ctx_; }

  // Copy `bytes` from srcWin+srcOffset here to dstWin+dstOffset at `peer`
  // (an index in `team`), then apply the actions.
  template <class RemoteAction = None, class LocalAction = None, class Coop = CoopThread>
  GIN_HD void put(Team team, int peer, Window dstWin, size_t dstOffset, Window srcWin, size_t srcOffset, size_t bytes,
                  RemoteAction remote = None{}, LocalAction local = None{}, Coop coop = Coop{},
                  Scope alreadyReleased = Scope::Thread) const {
    const int world = teamToWorld(*c_, team, peer);
    if (!checkPeer(world, team, peer) || !checkRange(dstWin, dstOffset, bytes) || !checkRange(srcWin, srcOffset, bytes))
      return;
    const Actions<RemoteAction, LocalAction> acts{remote, local};
    dispatch(world,
             [&](const auto& b) { b.put(coop, dstWin, dstOffset, srcWin, srcOffset, bytes, acts, alreadyReleased); });
  }

  // Typed form: nElts elements from src (here) to dst (at peer).
  template <class T, class RemoteAction = None, class LocalAction = None, class Coop = CoopThread>
  GIN_HD void put(Team team, int peer, SymPtr<T> dst, SymPtr<T> src, size_t nElts, RemoteAction remote = None{},
                  LocalAction local = None{}, Coop coop = Coop{}, Scope alreadyReleased = Scope::Thread) const {
    put(team, peer, dst.window, dst.offset, src.window, src.offset, nElts * sizeof(T), remote, local, coop,
        alreadyReleased);
  }

  // Write one value of at most 8 bytes at the peer (carried inline: no source buffer).
  template <class T, class RemoteAction = None, class Coop = CoopThread>
  GIN_HD void putValue(Team team, int peer, Window dstWin, size_t dstOffset, T value, RemoteAction remote = None{},
                       Coop coop = Coop{}, Scope alreadyReleased = Scope::Thread) const {
    static_assert(sizeof(T) <= 8, "putValue carries at most 8 bytes; use put for more");
    const int world = teamToWorld(*c_, team, peer);
    if (!checkPeer(world, team, peer) || !checkRange(dstWin, dstOffset, sizeof(T))) return;
    const Actions<RemoteAction, None> acts{remote, None{}};
    dispatch(world, [&](const auto& b) { b.putValue(coop, dstWin, dstOffset, value, acts, alreadyReleased); });
  }
  template <class T, class RemoteAction = None, class Coop = CoopThread>
  GIN_HD void putValue(Team team, int peer, SymPtr<T> dst, T value, RemoteAction remote = None{}, Coop coop = Coop{},
                       Scope alreadyReleased = Scope::Thread) const {
    putValue(team, peer, dst.window, dst.offset, value, remote, coop, alreadyReleased);
  }

  // Apply a remote action alone. Earlier writes of the coop are released first
  // unless the caller says it already released them at system scope.
  template <class RemoteAction, class Coop = CoopThread>
  GIN_HD void signal(Team team, int peer, RemoteAction remote, Coop coop = Coop{},
                     Scope alreadyReleased = Scope::Thread) const {
    const int world = teamToWorld(*c_, team, peer);
    if (!checkPeer(world, team, peer)) return;
    const Actions<RemoteAction, None> acts{remote, None{}};
    dispatch(world, [&](const auto& b) { b.signal(coop, acts, alreadyReleased); });
  }

  // Every source buffer of puts issued by `coop` on this context may be reused
  // (each backend's flush says how; the proxy and ibgda also wait for other
  // coops' requests). Returns false if a wait gave up (see the error record).
  template <class Coop>
  GIN_HD bool flush(Coop coop, MemoryOrder order = MemoryOrder::Acquire) const {
    coop.sync();
    bool ok = true;
    forEachBackend([&](const auto& b) { ok = b.flush(coop, order, ok); });
    return ok;
  }

  // ---- signals (remote arrival) ----
  // The shadow is plain memory of this rank, the caller's to use (nullptr for a bad id).
  GIN_HD uint64_t* getSignalShadowPtr(uint32_t signal) const {
    return checkSignal(signal) ? c_->signalShadows + signal : nullptr;
  }
  GIN_HD void increaseSignalShadow(uint32_t signal, uint64_t delta) const {
    if (checkSignal(signal)) c_->signalShadows[signal] += delta;
  }

  // Current value, low `bits` bits.
  GIN_HD uint64_t readSignal(uint32_t signal, int bits = 64, MemoryOrder order = MemoryOrder::Acquire) const {
    if (!checkSignal(signal)) return 0;
    return atomicLoad<Scope::System>(c_->signals + signal, order) & rollingMask(bits);
  }

  // Wait until the signal reaches `least` (rolling). Returns false if it gave up
  // (timeout or abort; the error record says why).
  template <class Coop>
  GIN_HD bool waitSignal(Coop coop, uint32_t signal, uint64_t least, int bits = 64,
                         MemoryOrder order = MemoryOrder::Acquire) const {
    bool ok = true;
    if (coop.rank() == 0) ok = waitSignalValue(signal, least, bits, order, Op::WaitSignal);
    return coop.syncAll(ok);
  }

  // Wait until the signal reaches its shadow.
  template <class Coop>
  GIN_HD bool waitSignalMeetShadow(Coop coop, uint32_t signal, int bits = 64,
                                   MemoryOrder order = MemoryOrder::Acquire) const {
    bool ok = true;
    if (coop.rank() == 0)
      ok = checkSignal(signal) && waitSignalValue(signal, c_->signalShadows[signal], bits, order, Op::WaitShadow);
    return coop.syncAll(ok);
  }

  // Wait until the signal is at least shadow + leastDelta, then move the shadow
  // to the value seen; *before gets the old shadow and *delta the advance.
  template <class Coop, class Uint>
  GIN_HD bool waitSignalFollowShadow(Coop coop, uint32_t signal, Uint leastDelta, Uint* before, Uint* delta,
                                     int bits = 64, MemoryOrder order = MemoryOrder::Acquire) const {
    if (!checkSignal(signal)) return false;
    uint64_t* shadow = c_->signalShadows + signal;
    const uint64_t old = volatileLoad(shadow);
    coop.sync();  // everyone has read the old shadow before rank 0 moves it
    bool ok = true;
    if (coop.rank() == 0) {
      const uint64_t target = old + uint64_t(leastDelta);
      uint64_t seen = 0;
      ok = detail::boundedWait(
          *c_, c_->signals + signal, order,
          [&](uint64_t v) {
            seen = v & rollingMask(bits);
            return rollingLessEqual(target & rollingMask(bits), seen, bits);
          },
          detail::WaitWhat{Op::WaitShadow, -1, ctx_, signal, target});
      volatileStore(shadow, ok ? seen : old);
    }
    ok = coop.syncAll(ok);
    const uint64_t now = volatileLoad(shadow);
    if (before) *before = Uint(old);
    if (delta) *delta = Uint((now - old) & rollingMask(bits));
    return ok;
  }

  // Set signal and shadow to zero. Must not race with updates to the signal.
  GIN_HD void resetSignal(uint32_t signal) const {
    if (!checkSignal(signal)) return;
    c_->signalShadows[signal] = 0;
    atomicStore<Scope::System>(c_->signals + signal, uint64_t(0), MemoryOrder::Relaxed);
  }

  // ---- counters (local completion) ----
  // Over ibgda counters move when some thread polls the completion queues
  // (flush, waitCounter, readCounter, a producer waiting for room).
  GIN_HD uint64_t readCounter(uint32_t counter, int bits = 56, MemoryOrder order = MemoryOrder::Acquire) const {
    if (!checkCounter(counter)) return 0;
    progress();
    return atomicLoad<Scope::System>(c_->counters + counter, order) & rollingMask(bits);
  }
  template <class Coop>
  GIN_HD bool waitCounter(Coop coop, uint32_t counter, uint64_t least, int bits = 56,
                          MemoryOrder order = MemoryOrder::Acquire) const {
    bool ok = true;
    if (coop.rank() == 0 && checkCounter(counter)) {
      const uint64_t m = rollingMask(bits);
      ok = detail::boundedWait(
          *c_, c_->counters + counter, order,
          [&](uint64_t v) {
            if (rollingLessEqual(least & m, v & m, bits)) return true;
            progress();
            return false;
          },
          detail::WaitWhat{Op::WaitCounter, -1, ctx_, counter, least & m});
    }
    return coop.syncAll(ok);
  }
  GIN_HD void resetCounter(uint32_t counter) const {
    if (!checkCounter(counter)) return;
    atomicStore<Scope::System>(c_->counters + counter, uint64_t(0), MemoryOrder::Relaxed);
  }

 private:
  const DevComm* c_;
  int ctx_;

  template <class, unsigned>
  friend class BarrierSession;
  template <unsigned>
  friend class PostBatch;
  // BarrierSession's rail round: SignalAdd{1} on barrier word `index`, one of
  // the signal words past the user's ids (nSignals + index), which the public
  // calls refuse. Rail peers are on other hosts: the proxy (or lsa if mapped).
  GIN_HD void barrierSignal(Team team, int peer, uint32_t index) const {
    const int world = teamToWorld(*c_, team, peer);
    if (!checkPeer(world, team, peer)) return;
    const uint32_t id = uint32_t(c_->nSignals) + index;
    dispatch</*railBarrier=*/true>(world, [&](const auto& b) { b.barrierSignal(id); });
  }

  // The one transport choice: f(backend) with the backend that reaches world
  // rank `world`: lsa for an lsa member unless lsa::Backend::forced (no table
  // lookup: the host gives members lsa), else its peerTransport entry. Only
  // transports in Backends are compiled; none reaches: Op::NoTransport. The
  // barrier's rail round never takes ibgda.
  //   dispatch(world, [&](const auto& b) { b.signal(coop, acts, Scope::Thread); });
  template <bool railBarrier = false, class F>
  GIN_HD GIN_INLINE void dispatch(int world, F&& f) const {
    if constexpr ((Backends & kBackendLsa) != 0)
      if (const int li = lsaIndexOf(*c_, world); li >= 0 && !lsa::Backend::forced(*c_, railBarrier))
        return f(lsa::Backend{*c_, ctx_, li});
    if constexpr ((Backends & kBackendProxy) != 0)
      if (proxy::Backend::reaches(*c_, world)) return f(proxy::Backend{*c_, ctx_, world});
    if constexpr (!railBarrier && (Backends & kBackendIbgda) != 0)
      if (ibgda::Backend::reaches(*c_, world)) return f(ibgda::Backend{*c_, ctx_, world});
    recordError(*c_, Op::NoTransport, world, ctx_, 0, 0, 0);
  }
  // f(backend) for every transport in Backends, in the order lsa, proxy, ibgda.
  template <class F>
  GIN_HD GIN_INLINE void forEachBackend(F&& f) const {
    if constexpr ((Backends & kBackendLsa) != 0) f(lsa::Backend{*c_, ctx_, -1});
    if constexpr ((Backends & kBackendProxy) != 0) f(proxy::Backend{*c_, ctx_, -1});
    if constexpr ((Backends & kBackendIbgda) != 0) f(ibgda::Backend{*c_, ctx_, -1});
  }
  // What counters need polled to move (ibgda's CQs).
  GIN_HD void progress() const {
    forEachBackend([](const auto& b) { b.progress(); });
  }

  GIN_HD bool checkPeer(int world, Team team, int peer) const {
    if (ctx_ >= 0 && peer >= 0 && peer < team.nRanks && world >= 0 && world < c_->nRanks) return true;
    recordError(*c_, Op::BadArgument, world, ctx_, uint64_t(peer), uint64_t(peer), uint64_t(team.nRanks));
    return false;
  }
  GIN_HD bool checkRange(Window w, size_t offset, size_t bytes) const {
    const uint64_t size = w.dev ? loadConst(&w.dev->bytes) : 0;
    if (w.dev && offset <= size && bytes <= size - offset) return true;
    recordError(*c_, Op::BadArgument, -1, ctx_, w.dev ? w.dev->id : ~uint64_t(0), uint64_t(offset + bytes), size);
    return false;
  }
  GIN_HD bool checkSignal(uint32_t s) const { return checkSignalId(*c_, ctx_, s); }
  GIN_HD bool checkCounter(uint32_t s) const { return checkCounterId(*c_, ctx_, s); }

  GIN_HD bool waitSignalValue(uint32_t signal, uint64_t least, int bits, MemoryOrder order, Op op) const {
    if (!checkSignal(signal)) return false;
    const uint64_t m = rollingMask(bits);
    return detail::boundedWait(
        *c_, c_->signals + signal, order, [&](uint64_t v) { return rollingLessEqual(least & m, v & m, bits); },
        detail::WaitWhat{op, -1, ctx_, signal, least & m});
  }
};

}  // namespace gin
