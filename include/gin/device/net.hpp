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

template <class Coop>
class BarrierSession;  // gin/device/barrier.hpp

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
    if constexpr ((Backends & kBackendLsa) != 0) {
      if (const int li = lsaIndexOf(*c_, world); li >= 0 && !netForced()) {
        lsa::coopCopy(coop, lsaPointer(dstWin, dstOffset, li), localPointer(srcWin, srcOffset), bytes);
        lsaActions(coop, li, remote, local, /*wrote=*/true, alreadyReleased);
        return;
      }
    }
    if constexpr ((Backends & kBackendProxy) != 0) {
      if (viaProxy(world)) {
        if (const int li = proxyStoreIndex(world); li >= 0) {
          lsa::coopCopy(coop, lsaPointer(dstWin, dstOffset, li), localPointer(srcWin, srcOffset), bytes);
          proxyActions(coop, world, remote, local);
          return;
        }
        ProxyDesc d = proxyDesc(ProxyOp::Put, world, remote, local);
        d.dstWindow = loadConst(&dstWin.dev->id);
        d.dstOffset = dstOffset;
        d.srcWindow = loadConst(&srcWin.dev->id);
        d.srcOffset = srcOffset;
        d.bytes = bytes;
        if (bytes > kProxyMaxBytes) {
          recordError(*c_, Op::BadArgument, world, ctx_, d.dstWindow, bytes, kProxyMaxBytes);
          return;
        }
        proxyPush(coop, d, alreadyReleased);
        return;
      }
    }
    if constexpr ((Backends & kBackendIbgda) != 0) {
      if (viaIbgda(world)) {
        const Action a = resolve(remote, local);
        coop.sync();  // the coop's source writes before the post (released by its doorbell record)
        if (coop.rank() == 0)
          (void)ibgda::put(*c_, ctx_, world, dstWin.dev, dstOffset, srcWin.dev, srcOffset, bytes, a);
        return;
      }
    }
    noTransport(world);
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
    if constexpr ((Backends & kBackendLsa) != 0) {
      if (const int li = lsaIndexOf(*c_, world); li >= 0 && !netForced()) {
        if (coop.rank() == 0) lsa::storeValue(static_cast<T*>(lsaPointer(dstWin, dstOffset, li)), value);
        lsaActions(coop, li, remote, None{}, /*wrote=*/true, alreadyReleased);
        return;
      }
    }
    if constexpr ((Backends & kBackendProxy) != 0) {
      if (viaProxy(world)) {
        if (const int li = proxyStoreIndex(world); li >= 0) {
          if (coop.rank() == 0) lsa::storeValue(static_cast<T*>(lsaPointer(dstWin, dstOffset, li)), value);
          proxyActions(coop, world, remote, None{});
          return;
        }
        ProxyDesc d = proxyDesc(ProxyOp::PutValue, world, remote, None{});
        d.dstWindow = loadConst(&dstWin.dev->id);
        d.dstOffset = dstOffset;
        // Carried inline: byte i of the value in bits 8i..8i+7 (what the host unpacks).
        const unsigned char* vb = reinterpret_cast<const unsigned char*>(&value);
        d.srcOffset = 0;
        for (size_t i = 0; i < sizeof(T); ++i) d.srcOffset |= uint64_t(vb[i]) << (8 * i);
        d.bytes = sizeof(T);
        proxyPush(coop, d, alreadyReleased);
        return;
      }
    }
    if constexpr ((Backends & kBackendIbgda) != 0) {
      if (viaIbgda(world)) {
        const Action a = resolve(remote, None{});
        coop.sync();
        if (coop.rank() == 0) (void)ibgda::putValue(*c_, ctx_, world, dstWin.dev, dstOffset, &value, sizeof(T), a);
        return;
      }
    }
    noTransport(world);
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
    if constexpr ((Backends & kBackendLsa) != 0) {
      if (const int li = lsaIndexOf(*c_, world); li >= 0 && !netForced()) {
        lsaActions(coop, li, remote, None{}, /*wrote=*/false, alreadyReleased);
        return;
      }
    }
    if constexpr ((Backends & kBackendProxy) != 0) {
      if (viaProxy(world)) {
        const ProxyDesc d = proxyDesc(ProxyOp::Signal, world, remote, None{});
        // No action (None, or a bad id already recorded): nothing to carry.
        if (d.action != uint8_t(ProxyAction::None)) proxyPush(coop, d, alreadyReleased);
        return;
      }
    }
    if constexpr ((Backends & kBackendIbgda) != 0) {
      if (viaIbgda(world)) {
        const Action a = resolve(remote, None{});
        coop.sync();
        if (coop.rank() == 0) (void)ibgda::signal(*c_, ctx_, world, a);
        return;
      }
    }
    noTransport(world);
  }

  // Every source buffer of puts issued by `coop` on this context may be reused.
  // lsa completes in place. Over the proxy: wait until the host has consumed
  // every descriptor claimed on this context so far (by any coop: one counter
  // per ring is cheaper than per-coop bookkeeping, and the promise is stronger).
  // Returns false if the wait gave up (Op::ProxyFlush in the error record).
  template <class Coop>
  GIN_HD bool flush(Coop coop, MemoryOrder order = MemoryOrder::Acquire) const {
    coop.sync();
    bool ok = true;
    if constexpr ((Backends & kBackendProxy) != 0) {
      if (c_->proxyRings != nullptr && ctx_ >= 0) {
        if (coop.rank() == 0) ok = proxy::waitConsumed(*c_, ctx_, order);
        ok = coop.syncAll(ok);
      }
    } else {
      (void)order;
    }
    if constexpr ((Backends & kBackendIbgda) != 0) {
      // Over ibgda: every WQE reserved on this context's QPs before the call
      // has completed (polls the CQs; Op::IbgdaFlush or IbgdaCqe on failure).
      if (c_->ibgda != nullptr && ctx_ >= 0) {
        if (coop.rank() == 0) ok = ok && ibgda::flush(*c_, ctx_);
        ok = coop.syncAll(ok);
      }
    }
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
    progressIbgda();
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
            progressIbgda();
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

  template <class>
  friend class BarrierSession;
  // BarrierSession's rail round: SignalAdd{1} on barrier word `index`, one of
  // the signal words past the user's ids (nSignals + index), which the public
  // calls refuse. Rail peers are on other hosts: the proxy (or lsa if mapped).
  GIN_HD void barrierSignal(Team team, int peer, uint32_t index) const {
    const int world = teamToWorld(*c_, team, peer);
    if (!checkPeer(world, team, peer)) return;
    const uint32_t id = uint32_t(c_->nSignals) + index;
    if constexpr ((Backends & kBackendLsa) != 0) {
      if (const int li = lsaIndexOf(*c_, world); li >= 0 && !proxyForced()) {
        lsa::signalAdd(lsaSignalsOf(*c_, li) + id, 1, true);
        return;
      }
    }
    if constexpr ((Backends & kBackendProxy) != 0) {
      if (viaProxy(world)) {
        ProxyDesc d = proxyDesc(ProxyOp::Signal, world, None{}, None{});
        d.action = uint8_t(ProxyAction::Add);
        d.signalId = id;
        d.signalValue = 1;
        proxyPush(CoopThread{}, d, Scope::Thread);  // a barrier releases
        return;
      }
    }
    noTransport(world);
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
  // The host gives every member of the lsa team the lsa transport (unless the
  // proxy is forced), so the lsa test in each operation needs no table lookup.
  // Other peers dispatch on peerTransport; a peer no compiled-in transport
  // reaches is recorded as an error.
  GIN_HD void noTransport(int world) const { recordError(*c_, Op::NoTransport, world, ctx_, 0, 0, 0); }

  // Proxy forced for every peer (a parameter-space load). Read by every Net,
  // also one compiled without the proxy backend: on such a communicator the
  // lsa path is not set up (GPU ranks keep their signals in host memory), so
  // that Net must record NoTransport rather than take it.
  GIN_HD bool proxyForced() const { return c_->proxyAll != 0; }
  // A network transport forced for every peer, lsa members included.
  GIN_HD bool netForced() const { return c_->ibgdaAll != 0 || proxyForced(); }
  GIN_HD bool viaIbgda(int world) const {
    return c_->ibgda != nullptr && loadConst(c_->peerTransport + world) == uint8_t(Transport::Ibgda);
  }
  // Poll every ibgda CQ once (counters advance on completions).
  GIN_HD void progressIbgda() const {
    if constexpr ((Backends & kBackendIbgda) != 0)
      if (c_->ibgda != nullptr) ibgda::progressAll(*c_);
  }
  // The actions in the one form every transport reads; a bad id is recorded and the action dropped.
  template <class RemoteAction, class LocalAction>
  GIN_HD Action resolve(RemoteAction remote, LocalAction local) const {
    return Actions<RemoteAction, LocalAction>{remote, local}.resolve(*c_, ctx_);
  }
  GIN_HD bool viaProxy(int world) const {
    return c_->proxyRings != nullptr && loadConst(c_->peerTransport + world) == uint8_t(Transport::Proxy);
  }

  // A descriptor with the actions filled in (resolved: a bad id is recorded, the action dropped).
  template <class RemoteAction, class LocalAction>
  GIN_HD ProxyDesc proxyDesc(ProxyOp op, int world, RemoteAction remote, LocalAction local) const {
    const Action a = resolve(remote, local);
    ProxyDesc d{};
    d.op = uint8_t(op);
    d.peer = world;
    d.action = uint8_t(a.remote);
    d.signalId = a.signal;
    d.signalValue = a.value;
    d.counterId = a.counter;
    return d;
  }
  // The lsa index of a proxy peer whose window this rank stores into itself
  // (DevComm::proxyLsaStores), else -1.
  GIN_HD int proxyStoreIndex(int world) const { return c_->proxyLsaStores != 0 ? lsaIndexOf(*c_, world) : -1; }
  // After the producers stored a put's payload themselves: its actions alone,
  // as one descriptor (the push's system-scope release orders the coop's
  // stores before the engine's signal). Nothing to push without actions.
  template <class Coop, class RemoteAction, class LocalAction>
  GIN_HD void proxyActions(Coop coop, int world, RemoteAction remote, LocalAction local) const {
    if constexpr (!std::is_same_v<RemoteAction, None> || !std::is_same_v<LocalAction, None>) {
      const ProxyDesc d = proxyDesc(ProxyOp::Signal, world, remote, local);
      if (d.action != uint8_t(ProxyAction::None) || d.counterId != kProxyNoCounter)
        proxyPush(coop, d, Scope::Thread);  // always: the coop's own stores are not released yet
    } else {
      (void)coop, (void)world, (void)remote, (void)local;
    }
  }
  // The coop's writes (the put's source, the data a signal publishes) are
  // ordered before the push by the sync; one thread pushes, with a
  // system-scope fence first unless the caller already released at system
  // scope.
  template <class Coop>
  GIN_HD void proxyPush(Coop coop, const ProxyDesc& d, Scope alreadyReleased) const {
    coop.sync();
    if (coop.rank() == 0) (void)proxy::push(*c_, ctx_, d, alreadyReleased != Scope::System);
  }

  GIN_HD bool waitSignalValue(uint32_t signal, uint64_t least, int bits, MemoryOrder order, Op op) const {
    if (!checkSignal(signal)) return false;
    const uint64_t m = rollingMask(bits);
    return detail::boundedWait(
        *c_, c_->signals + signal, order, [&](uint64_t v) { return rollingLessEqual(least & m, v & m, bits); },
        detail::WaitWhat{op, -1, ctx_, signal, least & m});
  }

  // After an lsa copy/store by `coop`: one thread applies the remote action with
  // a system-scope release (covering the whole coop's writes, ordered by the
  // coop.sync before it), then the local action.
  template <class Coop, class RemoteAction, class LocalAction>
  GIN_HD void lsaActions(Coop coop, int li, RemoteAction remote, LocalAction local, bool wrote,
                         Scope alreadyReleased) const {
    const Actions<RemoteAction, LocalAction> acts{remote, local};
    if constexpr (Actions<RemoteAction, LocalAction>::kAny) {
      coop.sync();
      if (coop.rank() == 0) {
        const bool release = wrote || alreadyReleased != Scope::System;
        acts.visit(
            *c_, ctx_,
            [&](RemoteOp op, uint32_t signal, uint64_t value) {
              uint64_t* peerSignal = lsaSignalsOf(*c_, li) + signal;
              if (op == RemoteOp::Add)
                lsa::signalAdd(peerSignal, value, release);
              else
                lsa::signalSet(peerSignal, value, release);
            },
            [&](uint32_t counter) { atomicAdd<Scope::System>(c_->counters + counter, 1, MemoryOrder::Release); });
      }
    } else {
      (void)coop, (void)li, (void)wrote, (void)alreadyReleased;
    }
  }
};

}  // namespace gin
