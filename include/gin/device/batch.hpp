// gin/device/batch.hpp — PostBatch: many posts to one peer, published together.
//
//   gin::Net net(devComm, ctx);
//   {
//     gin::PostBatch batch(net, gin::teamWorld(devComm), peer, 1024);  // the converged lanes of a warp
//     for (int i = 0; i < n; ++i)                                       // each lane its own put
//       batch.put(dstWin, dstOffset(i), srcWin, srcOffset(i), bytes, gin::SignalAdd{sig, 1});
//   }                                                                   // closed: published
//   net.flush(gin::CoopWarp{});
//
// Over ibgda every post pays a reservation (an atomic on the QP), a wait for
// its turn, a fence and a doorbell, a chain of memory round trips that no
// amount of WQE writing hides: one warp posts about 30x slower than it can
// store the same 64-byte WQEs (docs/performance.md). A batch pays them once
// per `slots` WQEs: it reserves slots+1 WQEs of the peer's QP on the net's
// context, each call writes the lanes' WQEs into the next free ones with
// plain stores (going on in the next reservation when one is full), and
// close() (or the destructor) fills the rest with NOPs and publishes them
// with one fence and one doorbell (the last NOP carries the reservation's
// one CQE). On lsa and the proxy each call runs at once, as the same call
// on Net with CoopThread would.
//
// Contract (beyond Net's):
//  - Opened by the converged lanes of one warp (on CPU ranks: one thread); the
//    same lanes make every call, converged, with the same peer. Each lane's
//    call is its own operation (active = false: this lane has none this time).
//  - Over ibgda nothing is visible to the NIC before the reservation it is in
//    is closed; a reservation holds up every later post to the peer's QP on
//    this context (the warp's own Net calls and other batches included), and
//    flush() waits for it. While a batch is open its warp makes no other
//    post to that peer on that context and waits for nothing (a wait, a
//    flush, a barrier); batches to one peer close in the order they opened.
//    Broken, the rule ends in the timeout error that names the open batch.
//  - Order: the operations of a batch reach the peer in call order, and
//    within a call in lane order; a signal follows every operation added
//    before it (of any lane), as on one QP.
//  - `slots` is clamped to half the queue less one (qpDepth/2 - 1), so the
//    NIC runs one reservation while the next is filled.
//  - close() returns false once a post of the batch gave up (the error
//    record says why); after that the batch posts nothing. A lane that
//    leaves while the others go on calling breaks the warp's collectives.
#pragma once

#include <type_traits>

#include "gin/device/net.hpp"

namespace gin {

template <unsigned Backends>
class PostBatch {
 public:
  GIN_HD PostBatch(const Net<Backends>& net, Team team, int peer, uint32_t slots)
      : net_(&net), world_(teamToWorld(net.comm(), team, peer)) {
    ok_ = net.checkPeer(world_, team, peer);
    b_ = ibgda::batchBegin(slots);
    // The transport, chosen once (Net::dispatch; none: recorded, ok_ false).
    bool reached = false;
    if (ok_)
      net.dispatch(world_, [&](const auto& be) {
        reached = true;
        ibgda_ = std::is_same_v<std::decay_t<decltype(be)>, ibgda::Backend>;
      });
    ok_ = ok_ && reached;
  }
  GIN_HD ~PostBatch() { (void)close(); }
  PostBatch(const PostBatch&) = delete;
  PostBatch& operator=(const PostBatch&) = delete;

  // Net::put of this lane (every lane with its own arguments).
  template <class RemoteAction = None, class LocalAction = None>
  GIN_HD void put(Window dstWin, size_t dstOffset, Window srcWin, size_t srcOffset, size_t bytes,
                  RemoteAction remote = None{}, LocalAction local = None{}, bool active = true) {
    const bool mine = active && ok_ && net_->checkRange(dstWin, dstOffset, bytes) &&
                      net_->checkRange(srcWin, srcOffset, bytes);
    const Actions<RemoteAction, LocalAction> acts{remote, local};
    each([&](const auto& be) {
      if (mine) be.put(CoopThread{}, dstWin, dstOffset, srcWin, srcOffset, bytes, acts, Scope::Thread);
    },
         [&](const DevComm& c, int ctx, const IbgdaQpDev* qp) {
           const Action a = acts.resolve(c, ctx);
           ibgda::PutWqes p{};
           if (!mine || !ibgda::putWqes(c, ctx, world_, dstWin.dev, dstOffset, srcWin.dev, srcOffset, bytes, a, p))
             p.total = 0;
           // By reference: a put's plan held by value costs a user kernel
           // some 20 registers (signal() and putValue() capture by value:
           // what their make() reads then stays in registers).
           (void)ibgda::batchAdd(c, ctx, world_, b_, p.total, a.counter,
                                 [&](uint64_t i, ibgda::Wqe& q) { p.make(i, q, c, qp, world_, a); });
         });
  }

  // Net::putValue of this lane.
  template <class T, class RemoteAction = None>
  GIN_HD void putValue(Window dstWin, size_t dstOffset, T value, RemoteAction remote = None{}, bool active = true) {
    static_assert(sizeof(T) <= 8, "putValue carries at most 8 bytes; use put for more");
    const bool mine = active && ok_ && net_->checkRange(dstWin, dstOffset, sizeof(T));
    const Actions<RemoteAction, None> acts{remote, None{}};
    each([&](const auto& be) {
      if (mine) be.putValue(CoopThread{}, dstWin, dstOffset, value, acts, Scope::Thread);
    },
         [&](const DevComm& c, int ctx, const IbgdaQpDev*) {
           const Action a = acts.resolve(c, ctx);
           ibgda::ValueWqes p{};
           if (!mine || !ibgda::valueWqes(c, ctx, world_, dstWin.dev, dstOffset, sizeof(T), a, p)) p.n = 0;
           (void)ibgda::batchAdd(c, ctx, world_, b_, p.n, a.counter,
                                 [p, a, value](uint64_t i, ibgda::Wqe& q) {
                                   p.make(uint32_t(i), q, &value, sizeof(T), a);
                                 });
         });
  }

  // Net::signal of this lane.
  template <class RemoteAction>
  GIN_HD void signal(RemoteAction remote, bool active = true) {
    const Actions<RemoteAction, None> acts{remote, None{}};
    each([&](const auto& be) {
      if (active) be.signal(CoopThread{}, acts, Scope::Thread);
    },
         [&](const DevComm& c, int ctx, const IbgdaQpDev* qp) {
           const Action a = acts.resolve(c, ctx);
           const bool any = active && a.remote != RemoteOp::None;
           // The peer's signal keys, loaded once per batch (a chain of
           // loads that would cost every call more than its WQE's stores).
           if (!sigKeysLoaded_) {
             sigKeys_ = ibgda::signalKeys(c, qp, world_, Action{});
             sigKeysLoaded_ = true;
           }
           const ibgda::SignalKeys k = ibgda::signalKeysAt(sigKeys_, a.signal);
           (void)ibgda::batchAdd(c, ctx, world_, b_, any ? 1 : 0, a.counter,
                                 [k, a](uint64_t, ibgda::Wqe& q) { ibgda::makeSignal(k, a, q); });
         });
  }

  // Publish what the batch holds (ibgda); the batch stays usable. False once
  // a post of the batch gave up.
  GIN_HD bool close() {
    if constexpr ((Backends & kBackendIbgda) != 0)
      if (b_.open) (void)ibgda::batchClose(net_->comm(), net_->context(), world_, b_);
    return ok_ && !b_.failed;
  }

 private:
  const Net<Backends>* net_;
  int world_;
  bool ok_;
  bool ibgda_ = false;  // the peer is reached through ibgda
  bool sigKeysLoaded_ = false;
  ibgda::Batch b_;
  ibgda::SignalKeys sigKeys_{};  // of signal 0 at the peer, once signal() needed them

  // onOther(backend) on lsa and the proxy, onIbgda(comm, ctx, qp) on ibgda:
  // the transport the constructor found (the same for every lane).
  template <class OnOther, class OnIbgda>
  GIN_HD GIN_INLINE void each(OnOther&& onOther, OnIbgda&& onIbgda) {
    if (!ok_) return;
    if constexpr ((Backends & kBackendIbgda) != 0)
      if (ibgda_) {
        const DevComm& c = net_->comm();
        return onIbgda(c, net_->context(), ibgda::qpOf(c, net_->context(), world_));
      }
    net_->dispatch(world_, [&](const auto& be) {
      if constexpr (!std::is_same_v<std::decay_t<decltype(be)>, ibgda::Backend>) onOther(be);
    });
  }
};

}  // namespace gin
