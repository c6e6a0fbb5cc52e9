// gin/device/action.hpp — what a put or signal does besides its payload, as the
// caller spells it (SignalInc{sig}, CounterInc{ctr}, ...) and as every
// transport reads it (Action: one remote kind, one signal, one counter).
//
//   const Actions<SignalAdd, CounterInc> acts{SignalAdd{sig, 2}, CounterInc{ctr}};
//   const Action a = acts.resolve(comm, ctx);  // {RemoteOp::Add, sig, 2, ctr}
//
// A bad signal or counter id is recorded (Op::BadArgument: id, id, the count)
// there, and that action dropped; the rest of the call goes ahead.
#pragma once

#include <type_traits>

#include "gin/device/comm.hpp"

namespace gin {

// Remote: applied at the peer once the payload is there.
struct None {};
struct SignalInc {
  uint32_t signal;
};
struct SignalAdd {
  uint32_t signal;
  uint64_t value;
};
struct SignalSet {
  uint32_t signal;
  uint64_t value;
};
// Local: applied here once the source has been consumed.
struct CounterInc {
  uint32_t counter;
};

// The remote kind; the numbers are ProxyAction's (the proxy descriptor's field).
enum class RemoteOp : uint8_t { None = 0, Add = 1, Set = 2 };
inline constexpr uint32_t kNoCounter = ~uint32_t(0);

// A call's actions as every transport reads them. SignalInc is Add of 1.
struct Action {
  RemoteOp remote = RemoteOp::None;
  uint32_t signal = 0;  // 0 without a remote action
  uint64_t value = 0;
  uint32_t counter = kNoCounter;
};

// Id checks: false (and recorded, with context `ctx`) past the communicator's count.
GIN_HD inline bool checkSignalId(const DevComm& c, int ctx, uint32_t s) {
  if (s < uint32_t(c.nSignals)) return true;
  recordError(c, Op::BadArgument, -1, ctx, s, s, uint64_t(c.nSignals));
  return false;
}
GIN_HD inline bool checkCounterId(const DevComm& c, int ctx, uint32_t s) {
  if (s < uint32_t(c.nCounters)) return true;
  recordError(c, Op::BadArgument, -1, ctx, s, s, uint64_t(c.nCounters));
  return false;
}

// The caller's two actions. kAny says at compile time whether there is any
// action at all (a plain put needs no sync and no signal code). visit checks
// the ids and hands each action that survives to its callback, the remote one
// first; resolve collects them into an Action. A transport does either once,
// where it needs the actions (lsa: on the thread that signals, after the
// payload; proxy and ibgda: before building the request).
template <class Remote, class Local>
struct Actions {
  static_assert(std::is_same_v<Remote, None> || std::is_same_v<Remote, SignalInc> ||
                    std::is_same_v<Remote, SignalAdd> || std::is_same_v<Remote, SignalSet>,
                "remote action must be None, SignalInc, SignalAdd or SignalSet");
  static_assert(std::is_same_v<Local, None> || std::is_same_v<Local, CounterInc>,
                "local action must be None or CounterInc");
  static constexpr bool kAny = !std::is_same_v<Remote, None> || !std::is_same_v<Local, None>;

  Remote remote;
  Local local;

  // onRemote(RemoteOp op, uint32_t signal, uint64_t value), onLocal(uint32_t counter).
  template <class OnRemote, class OnLocal>
  GIN_HD GIN_INLINE void visit(const DevComm& c, int ctx, OnRemote&& onRemote, OnLocal&& onLocal) const {
    if constexpr (std::is_same_v<Remote, SignalInc>) {
      if (checkSignalId(c, ctx, remote.signal)) onRemote(RemoteOp::Add, remote.signal, uint64_t(1));
    } else if constexpr (!std::is_same_v<Remote, None>) {
      if (checkSignalId(c, ctx, remote.signal))
        onRemote(std::is_same_v<Remote, SignalAdd> ? RemoteOp::Add : RemoteOp::Set, remote.signal, remote.value);
    } else {
      (void)onRemote;
    }
    if constexpr (!std::is_same_v<Local, None>) {
      if (checkCounterId(c, ctx, local.counter)) onLocal(local.counter);
    } else {
      (void)onLocal;
    }
    if constexpr (!kAny) (void)c, (void)ctx;
  }
  GIN_HD GIN_INLINE Action resolve(const DevComm& c, int ctx) const {
    Action a;
    visit(
        c, ctx, [&](RemoteOp op, uint32_t s, uint64_t v) { a.remote = op, a.signal = s, a.value = v; },
        [&](uint32_t k) { a.counter = k; });
    return a;
  }
};

}  // namespace gin
