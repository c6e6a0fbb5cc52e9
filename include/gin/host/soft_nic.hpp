// gin/host/soft_nic.hpp — a software mlx5 send-queue consumer: a host thread
// that plays the NIC for queue pairs whose send queue, doorbell record and
// completion queue are in host memory, so the ibgda transport runs end to end
// without ConnectX hardware. A test and development device, not a performance
// model of a NIC.
//
// Per QP, in WQE order: consume every WQE the doorbell record announces, check
// it as a ConnectX would (a bad one writes nothing, gets the error CQE a
// ConnectX reports, and stops the QP), execute RDMA WRITE (gather or inline),
// WRITE with immediate, fetch-add, compare-and-swap, NOP, and write a CQE with
// the right owner bit (its last word with release). GPU memory is reached
// through the copy function given to setDeviceCopy; atomics need host memory.
// Sink mode completes every WQE (a CQE where it asks for one) without
// running it (posting cost alone).
// Details: docs/design/ibgda.md.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gin/core/atomic.hpp"
#include "gin/core/clock.hpp"
#include "gin/core/error.hpp"
#include "gin/device/mlx5/prm.hpp"
#include "gin/device/mlx5/wqe.hpp"
#include "gin/host/idle.hpp"

namespace gin {

namespace test {
struct PauseAccess;  // gin/host/test_access.hpp
}

class SoftNic {
 public:
  enum class Mode { Execute, Sink };

  // A QP's NIC-facing memory, host addresses. `peer` names whose regions its
  // rkeys resolve against.
  struct Qp {
    uint8_t* sq = nullptr;
    uint32_t nWqe = 0;  // power of two <= 2^15
    const uint32_t* dbrec = nullptr;
    const uint64_t* uar = nullptr;
    mlx5::Cqe64* cq = nullptr;
    uint32_t nCqe = 0;  // power of two
    const uint32_t* cqDbrec = nullptr;
    uint32_t qpn = 0;
    int peer = 0;
  };

  explicit SoftNic(Mode mode = Mode::Execute) : mode_(mode) {}
  ~SoftNic() { stop(); }
  SoftNic(const SoftNic&) = delete;
  SoftNic& operator=(const SoftNic&) = delete;

  Mode mode() const { return mode_; }

  // Before start(): the QPs this NIC consumes. Initialises every CQE as
  // invalid with owner 1 (what software does before handing a CQ over).
  int addQp(const Qp& q) {
    if (q.nWqe == 0 || (q.nWqe & (q.nWqe - 1)) || q.nWqe > (1u << 15) || q.nCqe == 0 || (q.nCqe & (q.nCqe - 1)))
      throw Error("SoftNic::addQp: nWqe must be a power of two <= 2^15 and nCqe a power of two (got " +
                  std::to_string(q.nWqe) + ", " + std::to_string(q.nCqe) + ")");
    for (uint32_t i = 0; i < q.nCqe; ++i) {
      std::memset(q.cq + i, 0, sizeof(mlx5::Cqe64));
      q.cq[i].b[mlx5::kCqeOpOwn] = mlx5::kCqeInitOpOwn;
    }
    qps_.push_back(QpState{q});
    return int(qps_.size()) - 1;
  }

  // Memory regions. Local regions (lkey) are this NIC's own; a remote region
  // (peer, rkey) is a peer's registered memory: `addr` is the address the peer
  // advertised (what WQEs carry), `map` where those bytes are in this process.
  // device: `map` is device memory, reached through the device copy.
  void addLocalRegion(uint32_t lkey, uint64_t addr, uint64_t bytes, char* map, bool device = false) {
    std::lock_guard<std::mutex> lk(mu_);
    regions_[regionKey(-1, lkey)] = Region{addr, bytes, map, device};
  }
  void addRemoteRegion(int peer, uint32_t rkey, uint64_t addr, uint64_t bytes, char* map, bool device = false) {
    std::lock_guard<std::mutex> lk(mu_);
    regions_[regionKey(peer, rkey)] = Region{addr, bytes, map, device};
  }
  // Before start(): how to copy when either side is device memory; returns
  // once the bytes have landed (or, with a flush, once they are queued).
  // inlineBytes: `src` is a WQE's inline payload (at most 28 bytes) in plain
  // host memory that is gone after the call; otherwise both ends are memory
  // the NIC's regions name (device memory, or host memory registered with it).
  using DeviceCopy = std::function<void(void* dst, const void* src, size_t n, bool inlineBytes)>;
  void setDeviceCopy(DeviceCopy copy) { deviceCopy_ = std::move(copy); }
  // Before start(), optional: with a flush, the device copy may return before
  // its bytes land. The NIC then writes the CQEs of the WRITEs that used it
  // only after flush() returned; atomics and aligned 8-byte stores (signals)
  // of later WQEs wait in order behind them, other host writes and errors
  // flush first, and every pass over the QPs ends with a flush: the payload
  // still lands before its CQE and before any later WQE's effect, and a run of
  // puts with signals costs one wait per pass, not one per signal.
  using DeviceFlush = std::function<void()>;
  void setDeviceFlush(DeviceFlush flush) { deviceFlush_ = std::move(flush); }
  // Called once, on the NIC thread, if it stops on an error (a copy that
  // failed, say): what the owner does to stop the waits that depend on it.
  using Stopped = std::function<void(const char* why)>;
  void setOnStop(Stopped f) {
    std::lock_guard<std::mutex> lk(mu_);
    onStop_ = std::move(f);
  }
  void removeLocalRegion(uint32_t lkey) {
    std::lock_guard<std::mutex> lk(mu_);
    regions_.erase(regionKey(-1, lkey));
  }
  void removeRemoteRegion(int peer, uint32_t rkey) {
    std::lock_guard<std::mutex> lk(mu_);
    regions_.erase(regionKey(peer, rkey));
  }

  void start() {
    if (thread_.joinable()) return;
    thread_ = std::thread([this] { run(); });
  }
  // Consumes what is published (unless paused with a full CQ: then gives up), then joins.
  void stop() {
    stop_.store(true, std::memory_order_release);
    if (thread_.joinable()) thread_.join();
  }

  // Wait until every QP has consumed every WQE its doorbell record announces
  // (or has failed), at most timeoutNs. False on timeout.
  bool quiesce(uint64_t timeoutNs) const {
    const uint64_t start = nowNs();
    for (const QpState& q : qps_) {
      for (;;) {
        if (q.failed.load(std::memory_order_acquire)) break;
        const uint16_t pi = uint16_t(mlx5::bswap32(atomicLoad(q.qp.dbrec + mlx5::kDbrSend, MemoryOrder::Acquire)));
        if (uint16_t(q.consumed.load(std::memory_order_acquire)) == pi) break;
        if (nowNs() - start > timeoutNs || done_.load(std::memory_order_acquire)) return false;
        std::this_thread::yield();
      }
    }
    return true;
  }

  uint64_t executed() const { return executed_.load(std::memory_order_relaxed); }
  // How long the NIC thread has been waiting for its device copies (0: it is not).
  uint64_t flushingForNs() const {
    const uint64_t t = flushingSince_.load(std::memory_order_relaxed);
    return t ? nowNs() - t : 0;
  }
  uint64_t errors() const { return errors_.load(std::memory_order_relaxed); }
  // WQEs QP `i` has consumed, and whether it is in error.
  uint64_t consumed(int i) const { return qps_.at(size_t(i)).consumed.load(std::memory_order_acquire); }
  bool failed(int i) const { return qps_.at(size_t(i)).failed.load(std::memory_order_acquire); }
  size_t nQps() const { return qps_.size(); }

 private:
  friend struct test::PauseAccess;

  // Test hook (test::PauseAccess): a paused NIC consumes nothing. pause(true)
  // returns once the thread has parked, so nothing posted afterwards is
  // consumed until resumed.
  void pause(bool p) {
    const uint64_t seen = parks_.load(std::memory_order_acquire);
    paused_.store(p, std::memory_order_seq_cst);
    if (!p || !thread_.joinable()) return;
    while (parks_.load(std::memory_order_acquire) == seen && !done_.load(std::memory_order_acquire))
      std::this_thread::yield();
  }

  struct Region {
    uint64_t addr = 0, bytes = 0;
    char* map = nullptr;
    bool device = false;
  };
  struct QpState {
    Qp qp;
    uint64_t pi = 0;    // next WQE to consume (NIC thread only)
    uint64_t cqPi = 0;  // next CQE to write (NIC thread only)
    std::atomic<uint64_t> consumed{0};
    std::atomic<bool> failed{false};
    explicit QpState(const Qp& q) : qp(q) {}
    QpState(QpState&& o) noexcept : qp(o.qp), pi(o.pi), cqPi(o.cqPi) {}
  };
  // Why a WQE failed.
  struct Fault {
    uint8_t syndrome = 0;
  };

  Mode mode_;
  std::vector<QpState> qps_;
  std::mutex mu_;
  std::map<uint64_t, Region> regions_;
  DeviceCopy deviceCopy_;
  DeviceFlush deviceFlush_;
  Stopped onStop_;  // under mu_
  // WQEs waiting for the next settle(): WRITEs whose device copies may still
  // be in flight, and the host atomics and stores queued behind them, with
  // their CQEs (index in the CQ reserved, or ~0 for none).
  struct Later {
    enum Kind : uint8_t { Landed, Store, FetchAdd, CompareSwap };
    QpState* q = nullptr;
    uint64_t pi = 0, cqIndex = 0;
    Kind kind = Landed;
    uint64_t* word = nullptr;  // Store, FetchAdd, CompareSwap: the target word
    char* ret = nullptr;       // FetchAdd, CompareSwap: where the old value goes
    uint64_t a = 0, b = 0;     // the value stored, added or swapped in; b: CompareSwap's compare
  };
  std::vector<Later> later_;
  std::atomic<bool> stop_{false}, paused_{false}, done_{false};
  std::atomic<uint64_t> executed_{0}, errors_{0}, parks_{0}, flushingSince_{0};
  std::thread thread_;

  static uint64_t regionKey(int peer, uint32_t key) { return (uint64_t(uint32_t(peer + 1)) << 32) | key; }

  // [addr, addr+bytes) inside a region: its address in this process, or
  // nullptr (also for device memory when no device copy was given). *device:
  // whether it is device memory.
  char* resolve(int peer, uint32_t key, uint64_t addr, uint64_t bytes, bool* device = nullptr) const {
    auto it = regions_.find(regionKey(peer, key));
    if (it == regions_.end()) return nullptr;
    const Region& r = it->second;
    if (addr < r.addr || addr - r.addr > r.bytes || bytes > r.bytes - (addr - r.addr)) return nullptr;
    if (r.device && !deviceCopy_) return nullptr;
    if (device) *device = r.device;
    return r.map + (addr - r.addr);
  }

  void run() {
    try {
      detail::IdleBackoff idle;  // the proxy engine's defaults
      for (;;) {
        const bool stopping = stop_.load(std::memory_order_acquire);
        if (!stopping && detail::parkIfPaused(paused_, parks_)) continue;
        size_t did = 0;
        bool blocked = false;
        {
          std::lock_guard<std::mutex> lk(mu_);
          for (QpState& q : qps_) did += drain(q, blocked);
          settle();  // one wait for the pass's device copies, then their CQEs and the atomics behind them
        }
        if (did) {
          idle.busy();
          continue;
        }
        // Stopping: nothing consumable is left (a QP waiting for CQ room
        // would wait forever once its poller is gone).
        if (stopping) break;
        idle.wait();
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "gin: soft NIC stopped: %s\n", e.what());
      Stopped tell;
      {
        std::lock_guard<std::mutex> lk(mu_);
        tell = onStop_;
      }
      if (tell) tell(e.what());  // the Comm records it: waits on this NIC's work stop now, not at their timeout
    }
    done_.store(true, std::memory_order_release);
  }

  // Consume up to a batch of WQEs of one QP.
  size_t drain(QpState& q, bool& blocked) {
    if (q.failed.load(std::memory_order_relaxed)) return 0;
    const Qp& p = q.qp;
    // Acquire: pairs with the producer's release of the doorbell record, so
    // the WQEs (and the data they point at) are visible.
    const uint16_t pi16 = uint16_t(mlx5::bswap32(atomicLoad(p.dbrec + mlx5::kDbrSend, MemoryOrder::Acquire)));
    const uint32_t avail = uint16_t(pi16 - uint16_t(q.pi));
    if (avail > p.nWqe) {
      // The producer index ran more than a queue ahead of us: impossible for a
      // correct producer. Fail the QP rather than read slots being rewritten.
      complete(q, mlx5::kSynLocalQpOpErr, mlx5::kOpNop, true);
      return 1;
    }
    size_t did = 0;
    for (uint32_t k = 0; k < avail && k < 64; ++k) {
      // Room for a CQE: the consumer index (acquire: the poller finished reading).
      const uint32_t ci = mlx5::bswap32(atomicLoad(p.cqDbrec, MemoryOrder::Acquire)) & 0xffffffu;
      if (((uint32_t(q.cqPi) - ci) & 0xffffffu) >= p.nCqe) {
        blocked = true;
        break;
      }
      execute(q);
      ++did;
      if (q.failed.load(std::memory_order_relaxed)) break;
    }
    return did;
  }

  // CQE number cqIndex of QP p, for WQE pi; stored last word last, with release.
  static void writeCqe(const Qp& p, uint64_t cqIndex, uint64_t pi, uint8_t syndrome, uint8_t wqeOpcode, bool err) {
    mlx5::Cqe64* e = p.cq + (cqIndex & (p.nCqe - 1));
    mlx5::Cqe64 c;
    mlx5::fillCqe(c, uint16_t(pi), p.qpn, 0, err ? syndrome : 0, 0, err ? wqeOpcode : 0);
    c.b[mlx5::kCqeOpOwn] =
        mlx5::makeOpOwn(err ? mlx5::kCqeReqErr : mlx5::kCqeReq, mlx5::cqeExpectedOwner(cqIndex, p.nCqe));
    std::memcpy(e->b, c.b, mlx5::kCqeWqeCounter);
    uint32_t tail;
    std::memcpy(&tail, c.b + mlx5::kCqeWqeCounter, 4);
    // Release: the CQE body, and every effect of the WQE, before the owner bit.
    atomicStore(reinterpret_cast<uint32_t*>(e->b + mlx5::kCqeWqeCounter), tail, MemoryOrder::Release);
  }

  // A WRITE whose payload went to the device copy: complete it now, or (with
  // a device flush) once the copies have landed.
  void completeWrite(QpState& q, uint8_t op, bool wantCqe) {
    if (!deviceFlush_) return complete(q, 0, op, false, wantCqe);
    queueLater(q, Later{}, wantCqe);
  }

  // An atomic or an aligned 8-byte store into host memory (a signal) of WQE
  // q.pi: applied now when no device copy is in flight, else queued behind
  // them, so a run of puts with signals costs one flush per pass, not one per
  // signal (a flush waits for a time slice of the side context while the
  // user's kernels run: milliseconds).
  void hostEffect(QpState& q, const Later& e, uint8_t op, bool wantCqe) {
    if (later_.empty()) {
      applyEffect(e);
      return complete(q, 0, op, false, wantCqe);
    }
    queueLater(q, e, wantCqe);
  }
  void queueLater(QpState& q, Later e, bool wantCqe) {
    e.q = &q;
    e.pi = q.pi;
    e.cqIndex = wantCqe ? q.cqPi++ : ~uint64_t(0);
    later_.push_back(e);
    ++q.pi;
  }
  static void applyEffect(const Later& e) {
    switch (e.kind) {
      case Later::Landed: return;
      case Later::Store:
        // Release: a waiter's acquire load sees earlier WQEs' payload.
        return atomicStore(e.word, e.a, MemoryOrder::Release);
      case Later::FetchAdd:
      case Later::CompareSwap: {
        // AcqRel: earlier WQEs' payload is visible before the new value (the
        // signal-after-payload rule at the target).
        uint64_t old = e.b;
        if (e.kind == Later::FetchAdd)
          old = atomicFetchAdd(e.word, e.a, MemoryOrder::AcqRel);
        else
          (void)atomicCompareExchange(e.word, old, e.a, MemoryOrder::AcqRel);
        std::memcpy(e.ret, &old, 8);
        return;
      }
    }
  }

  // Wait for the queued device copies, then, in WQE order, apply the atomics
  // and 8-byte stores queued behind them and write the CQEs.
  void settle() {
    if (later_.empty()) return;
    flushingSince_.store(nowNs(), std::memory_order_relaxed);
    deviceFlush_();
    flushingSince_.store(0, std::memory_order_relaxed);
    for (const Later& l : later_) {
      applyEffect(l);
      if (l.cqIndex != ~uint64_t(0)) writeCqe(l.q->qp, l.cqIndex, l.pi, 0, 0, false);
      l.q->consumed.store(l.pi + 1, std::memory_order_release);
      executed_.fetch_add(1, std::memory_order_relaxed);
    }
    later_.clear();
  }

  // Write the CQE for WQE q.pi, then advance. err: an error CQE and the QP fails.
  void complete(QpState& q, uint8_t syndrome, uint8_t wqeOpcode, bool err, bool wantCqe = true) {
    settle();  // earlier WRITEs land (and complete) first
    const Qp& p = q.qp;
    if (err || wantCqe) {
      writeCqe(p, q.cqPi, q.pi, syndrome, wqeOpcode, err);
      ++q.cqPi;
    }
    ++q.pi;
    q.consumed.store(q.pi, std::memory_order_release);
    if (err) {
      errors_.fetch_add(1, std::memory_order_relaxed);
      q.failed.store(true, std::memory_order_release);
    } else {
      executed_.fetch_add(1, std::memory_order_relaxed);
    }
  }

  void execute(QpState& q) {
    const Qp& p = q.qp;
    uint8_t w[mlx5::kSendWqeBB];
    std::memcpy(w, p.sq + (q.pi & (p.nWqe - 1)) * mlx5::kSendWqeBB, sizeof w);
    if (mode_ == Mode::Sink) {
      mlx5::CtrlSeg ctrl;
      std::memcpy(&ctrl, w, sizeof ctrl);
      return complete(q, 0, mlx5::ctrlOpcode(ctrl), false, (ctrl.fmCeSe & mlx5::kCtrlCqUpdate) != 0);
    }
    const mlx5::WqeRequest r = mlx5::decodeWqe(w, uint16_t(q.pi), p.qpn);
    const uint8_t op = r.opcode;
    switch (r.kind) {
      case mlx5::WqeRequest::Bad: return complete(q, r.syndrome, op, true);
      case mlx5::WqeRequest::Nop: return complete(q, 0, op, false, r.wantCqe);
      case mlx5::WqeRequest::WriteInline: {
        const uint32_t n = r.bytes;
        bool dstDevice = false;
        char* dst = resolve(p.peer, r.rkey, r.raddr, n, &dstDevice);
        if (!dst) return complete(q, mlx5::kSynRemoteAccessErr, op, true);
        const uint8_t* bytes = w + mlx5::kInlinePayloadOffset;
        if (dstDevice) {
          if (n) deviceCopy_(dst, bytes, n, true);
          return completeWrite(q, op, r.wantCqe);
        }
        if (n == 8 && (r.raddr & 7) == 0) {
          // An aligned 8-byte write (SignalSet): one store, after every
          // earlier payload (see hostEffect).
          Later e;
          e.kind = Later::Store;
          e.word = reinterpret_cast<uint64_t*>(dst);
          std::memcpy(&e.a, bytes, 8);
          return hostEffect(q, e, op, r.wantCqe);
        }
        settle();  // a host write after every earlier payload
        std::memcpy(dst, bytes, n);
        return complete(q, 0, op, false, r.wantCqe);
      }
      case mlx5::WqeRequest::Write: {
        const uint32_t n = r.bytes;
        bool srcDevice = false, dstDevice = false;
        const char* src = resolve(-1, r.lkey, r.laddr, n, &srcDevice);
        if (!src) return complete(q, mlx5::kSynLocalProtErr, op, true);
        char* dst = resolve(p.peer, r.rkey, r.raddr, n, &dstDevice);
        if (!dst) return complete(q, mlx5::kSynRemoteAccessErr, op, true);
        if (n && (srcDevice || dstDevice)) {
          deviceCopy_(dst, src, n, false);
          return completeWrite(q, op, r.wantCqe);
        }
        settle();
        if (n) std::memmove(dst, src, n);
        return complete(q, 0, op, false, r.wantCqe);
      }
      case mlx5::WqeRequest::FetchAdd:
      case mlx5::WqeRequest::CompareSwap: {
        bool retDevice = false, dstDevice = false;
        char* ret = resolve(-1, r.lkey, r.laddr, 8, &retDevice);
        if (!ret || retDevice) return complete(q, mlx5::kSynLocalProtErr, op, true);
        if (r.raddr & 7) return complete(q, mlx5::kSynRemoteInvalReqErr, op, true);
        char* dst = resolve(p.peer, r.rkey, r.raddr, 8, &dstDevice);
        if (!dst || dstDevice) return complete(q, mlx5::kSynRemoteAccessErr, op, true);
        // The signal-after-payload rule: applied after earlier WRITEs land.
        Later e;
        e.kind = r.kind == mlx5::WqeRequest::FetchAdd ? Later::FetchAdd : Later::CompareSwap;
        e.word = reinterpret_cast<uint64_t*>(dst);
        e.ret = ret;
        e.a = r.swapAdd;
        e.b = r.compare;
        return hostEffect(q, e, op, r.wantCqe);
      }
    }
    return complete(q, mlx5::kSynLocalQpOpErr, op, true);
  }
};

}  // namespace gin
