// gin/device/transport/ibgda.hpp — the ibgda transport, device side: threads
// build mlx5 work requests in a queue pair's send queue, ring its doorbell and
// poll its completion queue themselves (no CPU on the data path). One RC QP per
// (context, peer), shared by many threads: reserve slots with a fetch-add,
// wait for room by polling the CQ, fill, publish in order, ring. The protocol,
// the WQE shapes per operation and the atomics' byte order:
// docs/design/ibgda.md.
//
// Contract (beyond Net's): a put's signal WQE follows its payload WQEs on the
// same QP (RC executes in order at the responder); flush waits for every WQE
// reserved on the context's QPs before the call; an error CQE (or a compressed
// one) fills the error record (rank, peer, context, WQE index, syndrome, QP
// number) and raises the abort flag, so every wait stops. putValue carries at
// most kIbgdaMaxInline bytes inline; more is refused (Op::BadArgument).
#pragma once

#include <type_traits>

#include "gin/core/atomic.hpp"
#include "gin/core/coop.hpp"
#include "gin/core/rolling.hpp"
#include "gin/device/action.hpp"
#include "gin/device/comm.hpp"
#include "gin/device/mlx5/prm.hpp"
#include "gin/device/window.hpp"

namespace gin {

inline constexpr uint32_t kIbgdaNoCounter = kNoCounter;
// The most bytes putValue carries inline: Net::putValue's limit, and the
// max_inline_data the mlx5 NIC creates its QPs with (gin/host/ibgda_mlx5.hpp).
inline constexpr uint32_t kIbgdaMaxInline = 8;
static_assert(kIbgdaMaxInline <= mlx5::kMaxInlineInOneBB, "an inline WRITE must fit one 64-byte WQE");

// Producer and poller state of one QP: each word on its own 64-byte line
// (producers hammer resv and ready; pollers write done).
struct IbgdaQpState {
  alignas(64) uint64_t resv;      // next WQE index to reserve
  alignas(64) uint64_t ready;     // WQEs published (doorbell rung), in order
  alignas(64) uint64_t done;      // WQEs known complete (CQ polled)
  alignas(64) uint32_t pollLock;  // 1 while a thread polls the CQ
  uint32_t failed;                // 1 once an error CQE was seen
  uint64_t cqCi;                  // CQ consumer index (under pollLock)
  uint32_t ringLock;              // deferred doorbells: 1 while a thread rings
  uint32_t pad;
  uint64_t rung;  // deferred doorbells: producer index last rung (under ringLock)
};
static_assert(sizeof(IbgdaQpState) == 256);

// One QP as the producers see it. Send queue, doorbell record, UAR word and CQ
// are what the NIC reads and writes (pinned host memory for the soft NIC);
// state and counterOf are the producers' own (device memory on a GPU).
struct IbgdaQpDev {
  uint8_t* sq;           // nWqe * 64 bytes
  uint32_t* dbrec;       // [2] big-endian: [kDbrRecv], [kDbrSend] = SQ producer index mod 2^16
  uint64_t* uar;         // doorbell register: 8-byte write of the last WQE's control segment head
  mlx5::Cqe64* cq;       // [nCqe]
  uint32_t* cqDbrec;     // [2] big-endian: [0] = CQ consumer index mod 2^24
  IbgdaQpState* state;   //
  uint32_t* counterOf;   // [nWqe] counter to bump when the WQE in that slot completes
  uint64_t scratchAddr;  // 8 bytes, where fetch-adds return the old value
  uint32_t scratchLkey;
  uint32_t qpn;
  uint32_t nWqe;  // power of two, <= 2^15 (WQE indices are 16 bits)
  uint32_t nCqe;  // == nWqe
};
static_assert(std::is_trivially_copyable_v<IbgdaQpDev>);

// Where a window (or the signal array) lives at one peer, and its rkey there.
struct IbgdaRemoteKey {
  uint64_t addr;
  uint32_t rkey;
  uint32_t pad;
};
// A window as this rank's NIC knows it: slot id % maxWindows; `id` tells a
// stale slot from the live one.
struct IbgdaWindowKey {
  uint32_t id;  // 0: empty
  uint32_t lkey;
};

struct IbgdaDev {
  IbgdaQpDev* qps;                // [nContexts * nRanks], index ctx * nRanks + peer
  IbgdaWindowKey* windows;        // [maxWindows]
  IbgdaRemoteKey* windowRemotes;  // [maxWindows * nRanks]
  IbgdaRemoteKey* signalRemotes;  // [nRanks] each peer's signal array
  uint32_t maxWindows;
  uint32_t maxWqeBytes;    // largest RDMA WRITE one WQE carries (< 2^31)
  uint32_t deferDoorbell;  // 1: posts only publish; flush and waits ring (one ring covers a batch)
  uint32_t nicOnGpu;       // 1: the NIC is a kernel on this GPU (the GPU NIC): GPU-scope doorbells and CQEs
};
static_assert(std::is_trivially_copyable_v<IbgdaDev>);

// Posts of the converged lanes of a warp to one QP go out as one batch
// (post() below); 0 turns it off (each lane reserves and publishes alone).
#ifndef GIN_IBGDA_WARP_AGGREGATE
#define GIN_IBGDA_WARP_AGGREGATE 1
#endif

namespace ibgda {

GIN_HD GIN_INLINE const IbgdaQpDev* qpOf(const DevComm& c, int ctx, int peer) {
  return loadConst(&c.ibgda->qps) + size_t(ctx) * size_t(c.nRanks) + size_t(peer);
}

// A read that a fence after it acquires: relaxed on the GPU (a relaxed read
// then fence.acq_rel is an acquire), acquire on the host (ThreadSanitizer
// ties a fence to the last relaxed load only; acquire loads cost x86 nothing).
inline constexpr MemoryOrder kFencedRead = GIN_DEVICE_CODE ? MemoryOrder::Relaxed : MemoryOrder::Acquire;

GIN_HD GIN_INLINE bool deferred(const DevComm& c) { return loadConst(&c.ibgda->deferDoorbell) != 0; }
GIN_HD GIN_INLINE bool nicOnGpu(const DevComm& c) { return loadConst(&c.ibgda->nicOnGpu) != 0; }

// The doorbell for WQEs up to pi (the last one's control head `head`), after
// a fence that released them (and what the caller wrote before) to the NIC:
// the doorbell record, then the UAR word. A NIC across PCIe needs the UAR
// write ordered after the record (release, system scope). A NIC on this GPU
// (the GPU NIC) reads the UAR word only to know it must start again (its
// watcher compares it with what it consumed), so that store is relaxed.
GIN_HD GIN_INLINE void ringAfterFence(uint32_t* dbrec, uint64_t* uar, uint64_t pi, uint64_t head, bool gpuNic) {
  atomicStore<Scope::System>(dbrec + mlx5::kDbrSend, mlx5::bswap32(uint32_t(pi) & 0xffffu), MemoryOrder::Relaxed);
  atomicStore<Scope::System>(uar, head, gpuNic ? MemoryOrder::Relaxed : MemoryOrder::Release);
}

// The fence that releases WQEs to the NIC: GPU scope for the GPU NIC, system
// scope for a NIC across PCIe.
GIN_HD GIN_INLINE void nicFence(bool gpuNic) {
  if (gpuNic)
    fence<Scope::Device>();
  else
    fence<Scope::System>();
}

// The doorbell with its fence.
GIN_HD GIN_INLINE void doorbell(const IbgdaQpDev* qp, uint64_t pi, uint64_t head, bool gpuNic) {
  nicFence(gpuNic);
  ringAfterFence(loadConst(&qp->dbrec), loadConst(&qp->uar), pi, head, gpuNic);
}

// Deferred doorbells: ring for every WQE published so far, unless another
// thread is ringing (the caller's wait loop comes back). The lock keeps
// doorbell-record writes monotonic, as the ready token does otherwise.
GIN_HD inline void ring(const IbgdaQpDev* qp, bool gpuNic) {
  IbgdaQpState* st = loadConst(&qp->state);
  uint32_t unlocked = 0;
  if (!atomicCompareExchange<Scope::Device>(&st->ringLock, unlocked, 1u, MemoryOrder::Acquire)) return;
  // Acquire: the WQEs of every publication up to r are visible to us, and
  // the release below passes them on (cumulatively) to the NIC.
  const uint64_t r = atomicLoad<Scope::Device>(&st->ready, MemoryOrder::Acquire);
  if (r != st->rung) {
    const uint32_t nWqe = loadConst(&qp->nWqe);
    // Read WQE r-1's control head before the doorbell record announces it:
    // once the record says r, the NIC may run WQE r-1, complete it, and a
    // producer may reuse its slot while we would still be reading it.
    const uint64_t head = *reinterpret_cast<const uint64_t*>(loadConst(&qp->sq) + ((r - 1) & (nWqe - 1)) * 64);
    doorbell(qp, r, head, gpuNic);
    st->rung = r;
  }
  atomicStore<Scope::Device>(&st->ringLock, 0u, MemoryOrder::Release);
}

// Poll the QP's CQ if no other thread is: advance `done` past every completed
// WQE, apply their counters, free the CQ entries. An error CQE is recorded and
// stops the poll (done stays before the failed WQE). Returns false once the
// QP has failed. The CQEs are read kCqBatch at a time (independent loads, one
// acquire fence after them), then checked in order: a poll costs about one
// memory round trip per batch, not one per CQE.
inline constexpr uint32_t kCqBatch = 8;
GIN_HD inline bool progress(const DevComm& c, const IbgdaQpDev* qp, int ctx, int peer) {
  IbgdaQpState* st = loadConst(&qp->state);
  if (atomicLoad<Scope::Device>(&st->failed, MemoryOrder::Relaxed) != 0) return false;
  // Look before taking the lock: many waiters poll one QP, and a CAS from each
  // of them on every spin would slow the one that holds it.
  if (atomicLoad<Scope::Device>(&st->pollLock, MemoryOrder::Relaxed) != 0) return true;
  uint32_t unlocked = 0;
  // Acquire: we see the previous poller's cqCi/done (released by its unlock).
  if (!atomicCompareExchange<Scope::Device>(&st->pollLock, unlocked, 1u, MemoryOrder::Acquire)) return true;
  mlx5::Cqe64* cq = loadConst(&qp->cq);
  const uint32_t nCqe = loadConst(&qp->nCqe), nWqe = loadConst(&qp->nWqe);
  const bool gpuNic = nicOnGpu(c);
  const uint32_t* counterOf = loadConst(&qp->counterOf);
  const uint64_t ci0 = st->cqCi, done0 = st->done;
  uint64_t ci = ci0, done = done0;
  bool ok = true, more = true;
  while (more && ci - ci0 < nCqe) {
    // wqe_counter, signature and op_own share the CQE's last 4-byte word; the
    // NIC writes it last with release, so these loads and the fence after
    // them (acquire) see each complete CQE whole (kFencedRead).
    uint32_t tails[kCqBatch];
    GIN_UNROLL
    for (uint32_t k = 0; k < kCqBatch; ++k) {
      const uint32_t* tailWord = reinterpret_cast<const uint32_t*>(cq[(ci + k) & (nCqe - 1)].b + mlx5::kCqeWqeCounter);
      tails[k] = gpuNic ? atomicLoad<Scope::Device>(tailWord, kFencedRead)
                        : atomicLoad<Scope::System>(tailWord, kFencedRead);
    }
    if constexpr (kFencedRead == MemoryOrder::Relaxed) {
      if (gpuNic)
        fence<Scope::Device>();
      else
        fence<Scope::System>();
    }
    for (uint32_t k = 0; k < kCqBatch; ++k) {
      const uint32_t tail = tails[k];
      const uint8_t opOwn = uint8_t(tail >> 24);
      // The NIC may still be writing CQEs past the first one we saw missing:
      // stop there, they are read again next time. nCqe bounds one poll.
      if (ci - ci0 == nCqe || mlx5::cqeOwner(opOwn) != mlx5::cqeExpectedOwner(ci, nCqe)) {
        more = false;
        break;
      }
      // A mini-CQE array (checked before the opcode: its high nibble is not
      // one): its wqe_counter bytes are not a WQE index, and reading it as a
      // CQE would count WQEs complete that may not be. Stop and say so.
      if (mlx5::cqeFormat(opOwn) == mlx5::kCqeFormatCompressed) {
        atomicStore<Scope::Device>(&st->failed, 1u, MemoryOrder::Relaxed);
        recordError(c, Op::IbgdaCqeCompressed, peer, ctx, done, opOwn, ci);
        ok = more = false;
        break;
      }
      if (mlx5::cqeOpcode(opOwn) == mlx5::kCqeInvalid) {
        more = false;
        break;
      }
      const uint16_t wc = uint16_t(((tail & 0xff) << 8) | ((tail >> 8) & 0xff));
      // The completed WQE's full index: the first index >= done with these low 16 bits.
      const uint64_t w = done + uint16_t(wc - uint16_t(done));
      const mlx5::Cqe64* e = cq + (ci & (nCqe - 1));
      ++ci;
      if (mlx5::cqeOpcode(opOwn) != mlx5::kCqeReq) {
        atomicStore<Scope::Device>(&st->failed, 1u, MemoryOrder::Relaxed);
        const uint64_t qpnAndVendor = (uint64_t(mlx5::cqeVendorSyndrome(*e)) << 32) | mlx5::cqeQpn(*e);
        recordError(c, Op::IbgdaCqe, peer, ctx, w, mlx5::cqeSyndrome(*e), qpnAndVendor);
        ok = more = false;
        break;
      }
      // In-order completion on an RC QP: every WQE up to w is complete (the
      // WQEs posted without a CQE before it included).
      for (uint64_t x = done; x <= w; ++x) {
        const uint32_t cid = counterOf[x & (nWqe - 1)];
        if (cid != kIbgdaNoCounter) atomicAdd<Scope::System>(c.counters + cid, 1, MemoryOrder::Release);
      }
      done = w + 1;
    }
  }
  if (done != done0)
    // Release: the counters above, and our reads of the freed slots'
    // counterOf entries, happen before a producer reuses the slots.
    atomicStore<Scope::Device>(&st->done, done, MemoryOrder::Release);
  if (ci != ci0) {
    st->cqCi = ci;
    // Release: we finished reading these CQEs before the NIC may overwrite them.
    const uint32_t rec = mlx5::bswap32(uint32_t(ci) & 0xffffffu);
    if (gpuNic)
      atomicStore<Scope::Device>(loadConst(&qp->cqDbrec), rec, MemoryOrder::Release);
    else
      atomicStore<Scope::System>(loadConst(&qp->cqDbrec), rec, MemoryOrder::Release);
  }
  atomicStore<Scope::Device>(&st->pollLock, 0u, MemoryOrder::Release);
  return ok;
}

// Wait (bounded) until WQEs [0, target) of the QP have completed, polling the
// CQ meanwhile. `op` names the wait in the error record.
GIN_HD inline bool waitDone(const DevComm& c, const IbgdaQpDev* qp, int ctx, int peer, uint64_t target, Op op) {
  IbgdaQpState* st = loadConst(&qp->state);
  const bool defer = deferred(c);
  return detail::boundedWait(
      c, &st->done, MemoryOrder::Acquire,
      [&](uint64_t v) {
        if (rollingLessEqual(target, v)) return true;
        if (defer) ring(qp, nicOnGpu(c));
        (void)progress(c, qp, ctx, peer);
        return false;
      },
      detail::WaitWhat{op, peer, ctx, target, target});
}

// Poll every QP of every context once (counter waits call this: counters move
// only when someone polls), ringing deferred doorbells first.
GIN_HD inline void progressAll(const DevComm& c) {
  const bool defer = deferred(c);
  for (int ctx = 0; ctx < c.nContexts; ++ctx)
    for (int p = 0; p < c.nRanks; ++p)
      if (loadConst(c.peerTransport + p) == uint8_t(Transport::Ibgda)) {
        const IbgdaQpDev* qp = qpOf(c, ctx, p);
        if (defer) ring(qp, nicOnGpu(c));
        (void)progress(c, qp, ctx, p);
      }
}

// Store a 64-byte WQE into its send-queue slot (64-byte aligned): four
// 16-byte stores on the GPU (a lone thread's or a warp's posts cost about one
// L2 write per store instruction; eight 8-byte stores took twice as long).
GIN_HD GIN_INLINE void storeWqe(uint8_t* slot, const uint64_t (&w)[8]) {
#if GIN_DEVICE_CODE
  ulonglong2* d = reinterpret_cast<ulonglong2*>(slot);
  GIN_UNROLL
  for (int i = 0; i < 4; ++i) d[i] = make_ulonglong2(w[2 * i], w[2 * i + 1]);
#else
  uint64_t* d = reinterpret_cast<uint64_t*>(slot);
  for (int i = 0; i < 8; ++i) d[i] = w[i];
#endif
}

// One WQE to post, 64 bytes (one basic block). post() fills in the control
// segment's WQE index and QP number.
struct Wqe {
  uint64_t w[8];
};

// WQE q's control segment as slot t of QP qpn carries it: WQE index and QP
// number patched in, the CQ-update flag set only if `cqe`.
GIN_HD GIN_INLINE void finishCtrl(Wqe& q, uint64_t t, uint32_t qpn, bool cqe) {
  mlx5::CtrlSeg ctrl;
  __builtin_memcpy(&ctrl, q.w, sizeof ctrl);
  ctrl = mlx5::makeCtrl(uint16_t(t), mlx5::ctrlOpcode(ctrl), mlx5::ctrlOpmod(ctrl), qpn, mlx5::ctrlDs(ctrl),
                        uint8_t(cqe ? ctrl.fmCeSe | mlx5::kCtrlCqUpdate : ctrl.fmCeSe & ~mlx5::kCtrlCqUpdate),
                        ctrl.imm, ctrl.signature);
  __builtin_memcpy(q.w, &ctrl, sizeof ctrl);
}

// Build WQEs [t, t+n) with make(i, Wqe&) into their send-queue slots (WQE
// index and QP number patched into each control segment), mark the last
// one's counter; returns the last one's control head (what the UAR gets).
// Only the last WQE asks for a CQE, and only if cqeLast: an RC QP completes in
// order, so one CQE covers every WQE before it (the poller applies their
// counters too), and the NIC writes, and the poller reads, one CQE per post
// instead of one per WQE. Errors produce a CQE whatever the flag.
template <class Make>
GIN_HD GIN_INLINE uint64_t fillWqes(uint8_t* sq, uint32_t* counterOf, uint32_t nWqe, uint32_t qpn, uint64_t t,
                                    uint32_t n, uint32_t counter, Make& make, bool cqeLast) {
  uint64_t ctrlHead = 0;
  for (uint32_t i = 0; i < n; ++i) {
    Wqe q;
    make(i, q);
    finishCtrl(q, t + i, qpn, cqeLast && i + 1 == n);
    const uint64_t slot = (t + i) & (nWqe - 1);
    storeWqe(sq + slot * mlx5::kSendWqeBB, q.w);
    counterOf[slot] = i + 1 == n ? counter : kIbgdaNoCounter;
    ctrlHead = q.w[0];
  }
  return ctrlHead;
}

// What a producer learns in the memory round trip of its reservation: its
// first slot t, and `done` (room), loaded while the atomic is in flight;
// `done` only grows, so an old value only sends the producer the slow way
// (wait). Acquire: the NIC and the poller are finished with the slots
// before we overwrite them.
struct Claim {
  uint64_t t, done;
};
GIN_HD GIN_INLINE Claim claim(IbgdaQpState* st, uint64_t n) {
  Claim k;
  // Relaxed: the reservation orders nothing by itself.
  k.t = atomicFetchAdd<Scope::Device>(&st->resv, n, MemoryOrder::Relaxed);
  k.done = atomicLoad<Scope::Device>(&st->done, MemoryOrder::Acquire);
  return k;
}

// Room for slots [t, t+n): they were last used by WQEs [t-nWqe, t+n-nWqe),
// which must have completed. No cycle: this depends only on earlier
// reservations. Acquire (in waitDone): as claim()'s load of `done`.
GIN_HD GIN_INLINE bool room(const DevComm& c, const IbgdaQpDev* qp, int ctx, int peer, const Claim& k, uint64_t n,
                            uint32_t nWqe) {
  if (k.t + n <= nWqe || rollingLessEqual(k.t + n - nWqe, k.done)) return true;
  return waitDone(c, qp, ctx, peer, k.t + n - nWqe, Op::IbgdaFull);
}

// A QP's fields as post() uses them, loaded together before the reservation
// (the acquire and the fences after it empty the L1 cache, so a field read
// later costs a memory round trip of its own).
struct QpView {
  IbgdaQpState* st;
  uint8_t* sq;
  uint32_t* counterOf;
  uint32_t nWqe, qpn;
};
GIN_HD GIN_INLINE QpView viewOf(const IbgdaQpDev* qp) {
  return QpView{loadConst(&qp->state), loadConst(&qp->sq), loadConst(&qp->counterOf), loadConst(&qp->nWqe),
                loadConst(&qp->qpn)};
}

// In-order publication of WQEs [t, end) (already in their slots): wait for
// the turn (ready == t), ring the doorbell unless doorbells are deferred,
// hand the turn on. One fence acquires the turn (the previous holder's
// doorbell happens before ours, so the record never moves backwards) and
// releases the WQEs, counterOf and the caller's writes (a put's source) to
// the NIC; with a doorbell, a second one orders it before the hand-off.
// With deferred doorbells the hand-off is also what ring() acquires.
GIN_HD GIN_INLINE bool publish(const DevComm& c, const IbgdaQpDev* qp, IbgdaQpState* st, int ctx, int peer,
                               const Claim& k, uint64_t end, uint64_t head) {
  // Loaded before the fence (which waits for them anyway); not held through
  // the post: a user kernel's registers are short (processes.cu's ring at
  // 512 threads may use 128).
  uint32_t* dbrec = loadConst(&qp->dbrec);
  uint64_t* uar = loadConst(&qp->uar);
  const bool gpuNic = nicOnGpu(c), defer = deferred(c);
  // The turn: on the GPU relaxed loads that the fence below acquires (a
  // relaxed read then fence.acq_rel); on the host acquire loads (what
  // ThreadSanitizer follows). The first overlaps the loads above.
  if (atomicLoad<Scope::Device>(&st->ready, kFencedRead) != k.t &&
      !detail::boundedWait(
          c, &st->ready, kFencedRead, [&](uint64_t r) { return r == k.t; },
          detail::WaitWhat{Op::IbgdaFull, peer, ctx, k.t, k.t}))
    return false;
  nicFence(gpuNic);
  if (!defer) {
    ringAfterFence(dbrec, uar, end, head, gpuNic);
    fence<Scope::Device>();
  }
  atomicStore<Scope::Device>(&st->ready, end, MemoryOrder::Relaxed);  // after a fence: a release
  return true;
}

// Post n (1 <= n <= nWqe) WQEs produced by make(i, Wqe&) for i in [0, n) to
// the QP of (ctx, peer); `counter` (or kIbgdaNoCounter) is applied when the
// last one completes. The caller's writes (a put's source) are ordered before
// the NIC reads them by publish()'s fence. An uncontended post waits for
// four memory round trips (the QP's fields, the reservation with `done`,
// the turn with the doorbell's addresses) and publish()'s two fences.
template <class Make>
GIN_HD bool post(const DevComm& c, int ctx, int peer, uint32_t n, uint32_t counter, Make make) {
  const IbgdaQpDev* qp = qpOf(c, ctx, peer);
  const QpView v = viewOf(qp);
  const uint32_t nWqe = v.nWqe;
#if GIN_DEVICE_CODE && GIN_IBGDA_WARP_AGGREGATE
  // Warp aggregation: the converged lanes of a warp that post to this QP
  // reserve, publish and ring once for all of them (one atomic on `resv`,
  // one turn, one doorbell), in lane order.
  const unsigned active = __activemask();
  const unsigned group = __match_any_sync(active, reinterpret_cast<unsigned long long>(qp));
  if (__popc(group) > 1) {
    const int lane = int(threadIdx.x & 31), leader = __ffs(group) - 1, last = 31 - __clz(group);
    uint32_t before = 0, total = 0;
    for (unsigned m = group; m; m &= m - 1) {
      const int l = __ffs(m) - 1;
      const uint32_t nl = __shfl_sync(group, n, l);
      if (l < lane) before += nl;
      total += nl;
    }
    if (total <= nWqe) {
      Claim k{0, 0};
      int ok = 1;
      if (lane == leader) {
        k = claim(v.st, total);
        ok = room(c, qp, ctx, peer, k, total, nWqe) ? 1 : 0;  // the leader waits for the group's room
      }
      // __syncwarp: the leader's acquire (room) before the lanes' slot writes.
      __syncwarp(group);
      if (!__shfl_sync(group, ok, leader)) return false;
      const uint64_t base = __shfl_sync(group, static_cast<unsigned long long>(k.t), leader);
      // One CQE for the group: its last lane's last WQE asks for it.
      unsigned long long head =
          fillWqes(v.sq, v.counterOf, nWqe, v.qpn, base + before, n, counter, make, lane == last);
      head = __shfl_sync(group, head, last);
      // Every lane's WQEs and counterOf entries before the leader's fence.
      __syncwarp(group);
      if (lane == leader) ok = publish(c, qp, v.st, ctx, peer, k, base + total, head) ? 1 : 0;
      return __shfl_sync(group, ok, leader) != 0;
    }
  }
#endif
  const Claim k = claim(v.st, n);
  if (!room(c, qp, ctx, peer, k, n, nWqe)) return false;
  const uint64_t ctrlHead = fillWqes(v.sq, v.counterOf, nWqe, v.qpn, k.t, n, counter, make, true);
  return publish(c, qp, v.st, ctx, peer, k, k.t + n, ctrlHead);
}

// ---- WQE shapes ----

GIN_HD GIN_INLINE void setSegs(Wqe& q, const mlx5::CtrlSeg& c, const void* s1, const void* s2, const void* s3) {
  for (int i = 0; i < 8; ++i) q.w[i] = 0;
  __builtin_memcpy(reinterpret_cast<char*>(q.w), &c, 16);
  if (s1) __builtin_memcpy(reinterpret_cast<char*>(q.w) + 16, s1, 16);
  if (s2) __builtin_memcpy(reinterpret_cast<char*>(q.w) + 32, s2, 16);
  if (s3) __builtin_memcpy(reinterpret_cast<char*>(q.w) + 48, s3, 16);
}

GIN_HD GIN_INLINE void makeWrite(Wqe& q, uint64_t raddr, uint32_t rkey, uint64_t laddr, uint32_t lkey, uint32_t bytes) {
  const mlx5::CtrlSeg c = mlx5::makeCtrl(0, mlx5::kOpRdmaWrite, 0, 0, mlx5::kDsWrite, mlx5::kCtrlCqUpdate);
  const mlx5::RaddrSeg r = mlx5::makeRaddr(raddr, rkey);
  const mlx5::DataSeg d = mlx5::makeData(bytes, lkey, laddr);
  setSegs(q, c, &r, &d, nullptr);
}

// RDMA WRITE of `bytes` carried inline. The data follows the control, remote
// address and inline header in the same 64-byte slot, so at most
// mlx5::kMaxInlineInOneBB bytes fit: for more it returns false and leaves q
// as it was (post nothing: the caller refuses the operation).
GIN_HD GIN_INLINE bool makeWriteInline(Wqe& q, uint64_t raddr, uint32_t rkey, const void* value, uint32_t bytes,
                                       uint8_t extraFlags) {
  if (bytes > mlx5::kMaxInlineInOneBB) return false;
  const mlx5::CtrlSeg c =
      mlx5::makeCtrl(0, mlx5::kOpRdmaWrite, 0, 0, mlx5::dsInline(bytes), uint8_t(mlx5::kCtrlCqUpdate | extraFlags));
  const mlx5::RaddrSeg r = mlx5::makeRaddr(raddr, rkey);
  setSegs(q, c, &r, nullptr, nullptr);
  const mlx5::InlineSeg h = mlx5::makeInline(bytes);
  char* p = reinterpret_cast<char*>(q.w) + 32;
  __builtin_memcpy(p, &h, 4);
  const char* v = static_cast<const char*>(value);
  for (uint32_t i = 0; i < bytes; ++i) p[4 + i] = v[i];
  return true;
}

GIN_HD GIN_INLINE void makeFetchAdd(Wqe& q, uint64_t raddr, uint32_t rkey, uint64_t add, uint64_t scratch,
                                    uint32_t scratchLkey) {
  const mlx5::CtrlSeg c = mlx5::makeCtrl(0, mlx5::kOpAtomicFa, 0, 0, mlx5::kDsAtomic, mlx5::kCtrlCqUpdate);
  const mlx5::RaddrSeg r = mlx5::makeRaddr(raddr, rkey);
  const mlx5::AtomicSeg a = mlx5::makeFetchAdd(add);
  const mlx5::DataSeg d = mlx5::makeData(8, scratchLkey, scratch);
  setSegs(q, c, &r, &a, &d);
}

GIN_HD GIN_INLINE void makeNop(Wqe& q) {
  setSegs(q, mlx5::makeCtrl(0, mlx5::kOpNop, 0, 0, mlx5::kDsNop, mlx5::kCtrlCqUpdate), nullptr, nullptr, nullptr);
}

// What to do besides the payload (gin/device/action.hpp); ids are checked
// by the caller (Actions::resolve).
using Action = gin::Action;

// Where the signal WQE of an action goes, read before post() (its loads then
// overlap the QP's; the WQE itself is built in the slot, so a post does not
// hold 64 bytes of it in registers).
struct SignalKeys {
  uint64_t raddr, scratchAddr;
  uint32_t rkey, scratchLkey;
};
GIN_HD GIN_INLINE SignalKeys signalKeys(const DevComm& c, const IbgdaQpDev* qp, int peer, const Action& a) {
  const IbgdaRemoteKey* sr = loadConst(&c.ibgda->signalRemotes) + peer;
  return SignalKeys{loadConst(&sr->addr) + uint64_t(a.signal) * 8, loadConst(&qp->scratchAddr), loadConst(&sr->rkey),
                    loadConst(&qp->scratchLkey)};
}
// The keys of signal `id` from those of signal 0 (PostBatch keeps them).
GIN_HD GIN_INLINE SignalKeys signalKeysAt(const SignalKeys& zero, uint32_t id) {
  return SignalKeys{zero.raddr + uint64_t(id) * 8, zero.scratchAddr, zero.rkey, zero.scratchLkey};
}
// The signal WQE of an action (remote != none).
GIN_HD GIN_INLINE void makeSignal(const SignalKeys& k, const Action& a, Wqe& q) {
  if (a.remote == RemoteOp::Add)
    makeFetchAdd(q, k.raddr, k.rkey, a.value, k.scratchAddr, k.scratchLkey);
  else
    (void)makeWriteInline(q, k.raddr, k.rkey, &a.value, 8, mlx5::kCtrlFence);  // 8 <= kIbgdaMaxInline: always built
}

// A window's key-table slot, or nullptr (recorded) when the window is not
// registered with ibgda.
GIN_HD GIN_INLINE const IbgdaWindowKey* windowKey(const DevComm& c, int ctx, int peer, uint32_t id, uint32_t* slot) {
  const uint32_t maxW = loadConst(&c.ibgda->maxWindows);
  *slot = id % maxW;
  const IbgdaWindowKey* k = loadConst(&c.ibgda->windows) + *slot;
  if (loadConst(&k->id) == id) return k;
  recordError(c, Op::BadArgument, peer, ctx, id, id, maxW);
  return nullptr;
}

// A put's WQEs: payload WRITEs of at most maxWqeBytes, then the signal WQE;
// a zero-byte put with only a counter is one NOP. total == 0: nothing to post.
struct PutWqes {
  uint64_t raddr, laddr, maxB, nData, bytes, total;
  uint32_t rkey, lkey;
  bool nop;
  // WQE k of the put (k < total).
  GIN_HD GIN_INLINE void make(uint64_t k, Wqe& q, const DevComm& c, const IbgdaQpDev* qp, int peer,
                              const Action& a) const {
    if (nop)
      makeNop(q);
    else if (k < nData) {
      const uint64_t off = k * maxB;
      const uint64_t len = bytes - off < maxB ? bytes - off : maxB;
      makeWrite(q, raddr + off, rkey, laddr + off, lkey, uint32_t(len));
    } else {
      makeSignal(signalKeys(c, qp, peer, a), a, q);
    }
  }
};
// False (recorded) when a window is not registered with ibgda.
GIN_HD GIN_INLINE bool putWqes(const DevComm& c, int ctx, int peer, const WindowDev* dst, uint64_t dstOffset,
                               const WindowDev* src, uint64_t srcOffset, uint64_t bytes, const Action& a, PutWqes& p) {
  uint32_t dslot = 0, sslot = 0;
  const IbgdaWindowKey* dk = windowKey(c, ctx, peer, loadConst(&dst->id), &dslot);
  const IbgdaWindowKey* sk = windowKey(c, ctx, peer, loadConst(&src->id), &sslot);
  if (!dk || !sk) return false;
  const IbgdaRemoteKey* rk = loadConst(&c.ibgda->windowRemotes) + size_t(dslot) * size_t(c.nRanks) + size_t(peer);
  p.raddr = loadConst(&rk->addr) + dstOffset;
  p.rkey = loadConst(&rk->rkey);
  p.lkey = loadConst(&sk->lkey);
  p.laddr = uint64_t(reinterpret_cast<uintptr_t>(loadConst(&src->localBase))) + srcOffset;
  // The host refuses maxWqeBytes >= 2^31; the clamp keeps a corrupt table
  // from building a data segment the NIC would read as inline.
  const uint32_t maxWqe = loadConst(&c.ibgda->maxWqeBytes);
  p.maxB = maxWqe < mlx5::kMaxDataSegBytes ? maxWqe : mlx5::kMaxDataSegBytes;
  p.bytes = bytes;
  p.nData = (bytes + p.maxB - 1) / p.maxB;
  p.total = p.nData + (a.remote != RemoteOp::None ? 1 : 0);
  p.nop = p.total == 0 && a.counter != kIbgdaNoCounter;
  if (p.nop) p.total = 1;
  return true;
}

// put: the WQEs of putWqes, the counter on the last one; posted in batches of
// at most half the queue so a huge put never needs more slots than exist (the
// batches stay in order on the QP).
GIN_HD inline bool put(const DevComm& c, int ctx, int peer, const WindowDev* dst, uint64_t dstOffset,
                       const WindowDev* src, uint64_t srcOffset, uint64_t bytes, const Action& a) {
  PutWqes p;
  if (!putWqes(c, ctx, peer, dst, dstOffset, src, srcOffset, bytes, a, p)) return false;
  const IbgdaQpDev* qp = qpOf(c, ctx, peer);
  const uint64_t batch = loadConst(&qp->nWqe) / 2 > 0 ? loadConst(&qp->nWqe) / 2 : 1;
  for (uint64_t i0 = 0; i0 < p.total; i0 += batch) {
    const uint32_t n = uint32_t(p.total - i0 < batch ? p.total - i0 : batch);
    const bool last = i0 + n == p.total;
    const bool ok = post(c, ctx, peer, n, last ? a.counter : kIbgdaNoCounter,
                         [&](uint32_t i, Wqe& q) { p.make(i0 + i, q, c, qp, peer, a); });
    if (!ok) return false;
  }
  return true;
}

// putValue's WQEs: one RDMA WRITE with the value inline, then the signal WQE.
struct ValueWqes {
  uint64_t raddr;
  uint32_t rkey, n;
  SignalKeys keys;  // n == 2
  GIN_HD GIN_INLINE void make(uint32_t i, Wqe& q, const void* value, uint32_t bytes, const Action& a) const {
    if (i == 0)
      (void)makeWriteInline(q, raddr, rkey, value, bytes, 0);  // bytes <= kIbgdaMaxInline: always built
    else
      makeSignal(keys, a, q);
  }
};
// More than kIbgdaMaxInline bytes, or a window not registered with ibgda,
// are refused (recorded; false) before any slot is reserved (a reserved slot
// must be posted, or the queue stalls behind it).
GIN_HD GIN_INLINE bool valueWqes(const DevComm& c, int ctx, int peer, const WindowDev* dst, uint64_t dstOffset,
                                 uint32_t bytes, const Action& a, ValueWqes& p) {
  if (bytes > kIbgdaMaxInline) {
    recordError(c, Op::BadArgument, peer, ctx, loadConst(&dst->id), bytes, kIbgdaMaxInline);
    return false;
  }
  uint32_t dslot = 0;
  if (!windowKey(c, ctx, peer, loadConst(&dst->id), &dslot)) return false;
  const IbgdaRemoteKey* rk = loadConst(&c.ibgda->windowRemotes) + size_t(dslot) * size_t(c.nRanks) + size_t(peer);
  p.raddr = loadConst(&rk->addr) + dstOffset;
  p.rkey = loadConst(&rk->rkey);
  p.n = a.remote != RemoteOp::None ? 2 : 1;
  p.keys = p.n == 2 ? signalKeys(c, qpOf(c, ctx, peer), peer, a) : SignalKeys{};
  return true;
}
GIN_HD inline bool putValue(const DevComm& c, int ctx, int peer, const WindowDev* dst, uint64_t dstOffset,
                            const void* value, uint32_t bytes, const Action& a) {
  ValueWqes p;
  if (!valueWqes(c, ctx, peer, dst, dstOffset, bytes, a, p)) return false;
  return post(c, ctx, peer, p.n, a.counter, [&](uint32_t i, Wqe& q) { p.make(i, q, value, bytes, a); });
}

// A remote action alone (nothing to do when there is none).
GIN_HD inline bool signal(const DevComm& c, int ctx, int peer, const Action& a) {
  if (a.remote == RemoteOp::None) return true;
  const SignalKeys sigKeys = signalKeys(c, qpOf(c, ctx, peer), peer, a);
  return post(c, ctx, peer, 1, a.counter, [&](uint32_t, Wqe& q) { makeSignal(sigKeys, a, q); });
}

// ---- batches (gin::PostBatch, gin/device/batch.hpp) ----
// A group (the converged lanes of a warp that opened the batch; one thread on
// the host) posts to one QP through reservations of slots+1 WQEs: each
// batchAdd() writes the lanes' WQEs, in lane order, into the next free slots
// (no atomic, no fence), continuing in the next reservation when one is full,
// and batchClose() fills what is left with NOPs, the last one asking for the
// reservation's one CQE, and publishes it with one fence and one doorbell.
// Until it is closed a reservation holds up every later post to the QP (the
// group's own plain posts and other batches included), and flush waits for
// it: a batch must be closed before its group posts otherwise to that QP or
// waits for anything.
struct Batch {
  QpView v;            // loaded at the first operation (v.st == nullptr before)
  uint64_t base;       // the open reservation's first WQE
  uint32_t slots;      // WQEs the group's operations fill per reservation (1 .. batchMostSlots(nWqe))
  uint32_t cursor;     // WQEs filled in the open reservation
  unsigned group;      // the lanes that opened the batch (1 on the host)
  bool open, failed;
};

namespace detail {
GIN_HD GIN_INLINE unsigned groupOfCaller() {
#if GIN_DEVICE_CODE
  return __activemask();
#else
  return 1u;
#endif
}
GIN_HD GIN_INLINE int laneOfCaller() {
#if GIN_DEVICE_CODE
  return int(threadIdx.x & 31);
#else
  return 0;
#endif
}
GIN_HD GIN_INLINE int lowestBit(unsigned m) {
#if GIN_DEVICE_CODE
  return __ffs(int(m)) - 1;
#else
  return __builtin_ctz(m);
#endif
}
GIN_HD GIN_INLINE uint32_t bitCount(unsigned m) {
#if GIN_DEVICE_CODE
  return uint32_t(__popc(m));
#else
  return uint32_t(__builtin_popcount(m));
#endif
}
// v as the group's lane `lane` holds it (a broadcast).
template <class T>
GIN_HD GIN_INLINE T fromLane(unsigned group, T v, int lane) {
#if GIN_DEVICE_CODE
  if constexpr (sizeof(T) == 8)
    return T(__shfl_sync(group, static_cast<unsigned long long>(v), lane));
  else
    return T(__shfl_sync(group, static_cast<unsigned>(v), lane));
#else
  (void)group, (void)lane;
  return v;
#endif
}
// This lane's first WQE among the group's (*before) and the group's total,
// when each lane has n: two ballots when no lane has more than 3 (puts of one
// WRITE and a signal, values, signals), else a broadcast per lane.
GIN_HD GIN_INLINE void groupPrefix(unsigned group, uint64_t n, uint64_t& before, uint64_t& total) {
#if GIN_DEVICE_CODE
  const unsigned below = (1u << (threadIdx.x & 31)) - 1u;
  if (__all_sync(group, n <= 3)) {
    const unsigned b0 = __ballot_sync(group, (n & 1) != 0), b1 = __ballot_sync(group, (n & 2) != 0);
    before = uint64_t(__popc(b0 & below)) + 2 * uint64_t(__popc(b1 & below));
    total = uint64_t(__popc(b0)) + 2 * uint64_t(__popc(b1));
    return;
  }
  before = total = 0;
  for (unsigned m = group; m; m &= m - 1) {
    const int l = __ffs(int(m)) - 1;
    const uint64_t nl = __shfl_sync(group, static_cast<unsigned long long>(n), l);
    if (unsigned(l) < (threadIdx.x & 31)) before += nl;
    total += nl;
  }
#else
  (void)group;
  before = 0;
  total = n;
#endif
}
GIN_HD GIN_INLINE void syncGroup(unsigned group) {
#if GIN_DEVICE_CODE
  __syncwarp(group);
#else
  (void)group;
#endif
}
}  // namespace detail

// Called by every lane of the group.
GIN_HD GIN_INLINE Batch batchBegin(uint32_t slots) {
  Batch b{};
  b.slots = slots == 0 ? 1 : slots;  // clamped to the queue at the first operation
  b.group = detail::groupOfCaller();
  return b;
}

// The most slots a batch uses per reservation on a queue of nWqe WQEs: a
// reservation (slots+1) is at most half the queue.
GIN_HD GIN_INLINE uint32_t batchMostSlots(uint32_t nWqe) { return nWqe / 2 > 1 ? nWqe / 2 - 1 : 1; }

// The slow path, out of line (the fast path stays a few instructions in the
// user's loop; the batch is passed and returned by value so it stays in
// registers there): at the first operation load the QP's fields and clamp
// slots to half the queue (so the NIC runs one reservation while the next
// is filled); close the open reservation (NOPs fill slots [cursor, slots],
// the last with the CQE; one publication); then, if `reopen`, open the next
// reservation of slots+1 WQEs. Group-collective.
GIN_HD GIN_NOINLINE inline Batch batchSettle(const DevComm& c, int ctx, int peer, Batch b, bool reopen) {
  const int lane = detail::laneOfCaller(), leader = detail::lowestBit(b.group);
  const IbgdaQpDev* qp = qpOf(c, ctx, peer);
  if (b.v.st == nullptr) {
    b.v = viewOf(qp);
    if (b.slots > batchMostSlots(b.v.nWqe)) b.slots = batchMostSlots(b.v.nWqe);
  }
  if (b.open) {
    const uint32_t rank = detail::bitCount(b.group & ((1u << lane) - 1u));
    const uint32_t size = detail::bitCount(b.group), m = b.slots + 1 - b.cursor;
    auto nop = [](uint32_t, Wqe& q) { makeNop(q); };
    for (uint32_t j = rank; j < m; j += size)
      (void)fillWqes(b.v.sq, b.v.counterOf, b.v.nWqe, b.v.qpn, b.base + b.cursor + j, 1, kIbgdaNoCounter, nop,
                     j + 1 == m);
    // Every lane's WQEs and counterOf entries before the leader's fence.
    detail::syncGroup(b.group);
    int ok = 1;
    if (lane == leader) {
      Wqe last;  // the closing NOP's control head, what the UAR gets
      makeNop(last);
      finishCtrl(last, b.base + b.slots, b.v.qpn, true);
      ok = publish(c, qp, b.v.st, ctx, peer, Claim{b.base, 0}, b.base + b.slots + 1, last.w[0]) ? 1 : 0;
    }
    b.open = false;
    b.failed = b.failed || !detail::fromLane(b.group, ok, leader);
  }
  if (!reopen || b.failed) return b;
  Claim k{0, 0};
  int ok = 1;
  if (lane == leader) {
    k = claim(b.v.st, b.slots + 1);
    ok = room(c, qp, ctx, peer, k, b.slots + 1, b.v.nWqe) ? 1 : 0;
  }
  // The leader's acquire (room) before the lanes' slot writes.
  detail::syncGroup(b.group);
  if (!detail::fromLane(b.group, ok, leader)) {
    b.failed = true;
    return b;
  }
  b.base = detail::fromLane(b.group, k.t, leader);
  b.cursor = 0;
  b.open = true;
  return b;
}

// Publish the open reservation. Group-collective.
GIN_HD GIN_INLINE bool batchClose(const DevComm& c, int ctx, int peer, Batch& b) {
  if (b.open) b = batchSettle(c, ctx, peer, b, false);
  return !b.failed;
}

// A call's WQEs in segments [done, done + seg), one per reservation: the
// slow path of batchAdd (out of line), when the call does not fit the open
// reservation. Group-collective.
template <class Make>
GIN_HD GIN_NOINLINE Batch batchAddSpill(const DevComm& c, int ctx, int peer, Batch b, uint64_t n, uint64_t before,
                                        uint64_t total, uint32_t counter, Make make) {
  for (uint64_t done = 0; done < total;) {
    if (!b.open || b.cursor == b.slots) {
      b = batchSettle(c, ctx, peer, b, true);
      if (b.failed) return b;
    }
    const uint64_t left = b.slots - b.cursor, seg = total - done < left ? total - done : left;
    // This lane's WQEs in the segment: [lo, hi) of the call's, i.e. its own
    // [lo - before, hi - before).
    const uint64_t lo = before > done ? before : done, end = done + seg;
    const uint64_t hi = before + n < end ? before + n : end;
    if (lo < hi) {
      auto part = [&](uint32_t i, Wqe& q) { make(lo - before + i, q); };
      (void)fillWqes(b.v.sq, b.v.counterOf, b.v.nWqe, b.v.qpn, b.base + b.cursor + (lo - done), uint32_t(hi - lo),
                     hi == before + n ? counter : kIbgdaNoCounter, part, false);
    }
    b.cursor += uint32_t(seg);
    done = end;
  }
  return b;
}

// The group's next operations: this lane's n WQEs from make(i, Wqe&), i in
// [0, n) (n may be 0), `counter` on its last one. The call's WQEs go in lane
// order into the open reservation's next slots; what does not fit goes on in
// the next reservation (in order: reservations are published in order).
// Group-collective. The fast path (the call fits) is the lanes' offsets (two
// ballots when every lane has at most 3 WQEs) and the WQE stores.
template <class Make>
GIN_HD GIN_INLINE bool batchAdd(const DevComm& c, int ctx, int peer, Batch& b, uint64_t n, uint32_t counter,
                                Make make) {
  uint64_t before = 0, total = 0;
  detail::groupPrefix(b.group, n, before, total);
  if (b.failed) return false;
  if (total == 0) return true;
  if (!b.open || b.cursor + total > b.slots) {
    b = batchAddSpill(c, ctx, peer, b, n, before, total, counter, make);
    return !b.failed;
  }
  (void)fillWqes(b.v.sq, b.v.counterOf, b.v.nWqe, b.v.qpn, b.base + b.cursor + before, uint32_t(n), counter, make,
                 false);
  b.cursor += uint32_t(total);
  return true;
}

// Flush: every WQE reserved on context ctx's QPs before the call completes.
GIN_HD inline bool flush(const DevComm& c, int ctx) {
  bool ok = true;
  for (int p = 0; p < c.nRanks && ok; ++p) {
    if (loadConst(c.peerTransport + p) != uint8_t(Transport::Ibgda)) continue;
    const IbgdaQpDev* qp = qpOf(c, ctx, p);
    const uint64_t target = atomicLoad<Scope::Device>(&loadConst(&qp->state)->resv, MemoryOrder::Relaxed);
    if (target != 0) ok = waitDone(c, qp, ctx, p, target, Op::IbgdaFlush);
  }
  return ok;
}

// The ibgda backend of Net (gin/device/net.hpp): calls to world rank `peer`
// on context `ctx`. The coop syncs (its source writes before the post, which
// the doorbell record's release passes on to the NIC) and thread 0 posts.
struct Backend {
  const DevComm& c;
  int ctx;
  int peer;  // world rank; -1 for the per-context calls (flush, progress)

  GIN_HD static bool reaches(const DevComm& c, int world) {
    return c.ibgda != nullptr && loadConst(c.peerTransport + world) == uint8_t(Transport::Ibgda);
  }

  template <class Coop, class Acts>
  GIN_HD void put(Coop coop, Window dst, size_t dstOffset, Window src, size_t srcOffset, size_t bytes, const Acts& acts,
                  Scope) const {
    const Action a = acts.resolve(c, ctx);
    coop.sync();
    if (coop.rank() == 0) (void)ibgda::put(c, ctx, peer, dst.dev, dstOffset, src.dev, srcOffset, bytes, a);
  }
  template <class T, class Coop, class Acts>
  GIN_HD void putValue(Coop coop, Window dst, size_t dstOffset, T value, const Acts& acts, Scope) const {
    const Action a = acts.resolve(c, ctx);
    coop.sync();
    if (coop.rank() == 0) (void)ibgda::putValue(c, ctx, peer, dst.dev, dstOffset, &value, sizeof(T), a);
  }
  template <class Coop, class Acts>
  GIN_HD void signal(Coop coop, const Acts& acts, Scope) const {
    const Action a = acts.resolve(c, ctx);
    coop.sync();
    if (coop.rank() == 0) (void)ibgda::signal(c, ctx, peer, a);
  }
  // Every WQE reserved on this context's QPs before the call has completed
  // (polls the CQs; Op::IbgdaFlush or IbgdaCqe on failure).
  template <class Coop>
  GIN_HD bool flush(Coop coop, MemoryOrder, bool ok) const {
    if (c.ibgda != nullptr && ctx >= 0) {
      if (coop.rank() == 0) ok = ok && ibgda::flush(c, ctx);
      ok = coop.syncAll(ok);
    }
    return ok;
  }
  // Poll every CQ once (counters advance on completions).
  GIN_HD void progress() const {
    if (c.ibgda != nullptr) progressAll(c);
  }
};

}  // namespace ibgda
}  // namespace gin
