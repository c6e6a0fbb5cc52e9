// gin/host/bootstrap_inprocess.hpp — N threads of one process as N ranks
// (tests, CPU emulation, one process driving several GPUs): InProcessGroup hands
// each thread an InProcessBootstrap. One failure breaks the whole group, so every
// rank throws the same error at once instead of waiting out its own timeout.
#pragma once

#include "gin/core/error.hpp"
#include "gin/host/bootstrap_base.hpp"
#include "gin/host/deadline.hpp"

#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace gin {
namespace detail {

// Every rank publishes one slot per phase. Collective k is phase 2k-1 (arrive,
// publish the buffer) and 2k (done copying, so buffers may be reused); a rank
// waits until every slot has reached the phase. Per-rank phases instead of one
// shared counter let a fast rank start the next collective while a slow one is
// still leaving the last, without either reading the other's newer slot.
struct InProcessState {
  struct Slot {
    uint64_t phase = 0;
    uint32_t op = 0;
    uint64_t seq = 0;
    uint64_t size = 0;
    int root = -1;
    void* data = nullptr;
  };
  InProcessState(int n, uint64_t t) : nRanks(n), timeoutNs(t), slots(static_cast<size_t>(n)) {}
  const int nRanks;
  const uint64_t timeoutNs;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Slot> slots;
  std::string failure;  // set once the group is broken; every later call throws it
};

}  // namespace detail

class InProcessGroup;

// One rank of an InProcessGroup. A failure (timeout, mismatched calls, bad
// arguments) breaks the whole group so the other threads fail at once with the
// same message instead of each waiting out its own timeout.
class InProcessBootstrap final : public Bootstrap {
 public:
  int rank() const override { return rank_; }
  int nRanks() const override { return s_->nRanks; }
  bool sameProcessGroup() const override { return true; }

  void allGather(void* data, size_t bytesPerRank) override {
    const size_t n = bytesPerRank;
    try {
      detail::gatherBytes(n, s_->nRanks);
      detail::checkBuffer(data, n, "allGather");
    } catch (const Error& e) {
      breakGroup(e.what());
    }
    collective(detail::kAllGather, n, -1, data, [&](const std::vector<void*>& peers) {
      char* mine = static_cast<char*>(data);
      for (int p = 0; p < s_->nRanks; ++p) {
        const char* src = static_cast<const char*>(peers[static_cast<size_t>(p)]) + p * n;
        // Threads may share one buffer; then the slot is already in place.
        if (p != rank_ && src != mine + p * n && n != 0) std::memcpy(mine + p * n, src, n);
      }
    });
  }

  void broadcast(void* data, size_t bytes, int root) override {
    try {
      if (root < 0 || root >= s_->nRanks)
        throw Error("broadcast: root " + std::to_string(root) + " is outside 0.." + std::to_string(s_->nRanks - 1));
      detail::checkBuffer(data, bytes, "broadcast");
    } catch (const Error& e) {
      breakGroup(e.what());
    }
    collective(detail::kBroadcast, bytes, root, data, [&](const std::vector<void*>& peers) {
      const void* src = peers[static_cast<size_t>(root)];
      if (rank_ != root && src != data && bytes != 0) std::memcpy(data, src, bytes);
    });
  }

  void barrier() override {
    collective(detail::kBarrier, 0, -1, nullptr, [](const std::vector<void*>&) {});
  }

 private:
  friend class InProcessGroup;
  InProcessBootstrap(detail::InProcessState* s, int rank) : s_(s), rank_(rank) {}

  [[noreturn]] void breakGroup(const std::string& why) {
    std::lock_guard lk(s_->mu);
    if (s_->failure.empty()) {
      // Error's text already carries "gin: "; keep one.
      std::string w = why.rfind("gin: ", 0) == 0 ? why.substr(5) : why;
      s_->failure = "in-process bootstrap rank " + std::to_string(rank_) + ": " + w;
    }
    s_->cv.notify_all();
    throw Error(s_->failure);
  }

  // Waits until every rank has published `phase`; the group's failure (or our
  // own timeout, which becomes it) ends the wait for everyone.
  void waitPhase(std::unique_lock<std::mutex>& lk, uint64_t phase, const std::string& call, const char* verb) {
    const auto deadline = detail::deadlineAfter(s_->timeoutNs);
    auto missing = [&] {
      std::vector<int> m;
      for (int p = 0; p < s_->nRanks; ++p)
        if (s_->slots[static_cast<size_t>(p)].phase < phase) m.push_back(p);
      return m;
    };
    for (;;) {
      const auto m = missing();
      if (m.empty()) return;  // checked first: a collective that completed is not failed afterwards
      if (!s_->failure.empty()) throw Error(s_->failure);
      if (s_->cv.wait_until(lk, deadline) == std::cv_status::timeout && Clock::now() >= deadline) {
        const auto late = missing();
        if (late.empty()) return;
        if (s_->failure.empty())
          s_->failure = "in-process bootstrap: " + detail::rankList(late) + " of " + std::to_string(s_->nRanks) +
                        " did not " + verb + " " + call + " within " + detail::secondsText(s_->timeoutNs) + " (rank " +
                        std::to_string(rank_) +
                        " gave up waiting); check that every thread calls the same collectives in "
                        "the same order, or raise BootstrapConfig::timeoutNs / GIN_BOOTSTRAP_TIMEOUT_MS";
        s_->cv.notify_all();
        throw Error(s_->failure);
      }
    }
  }

  template <class Copy>
  void collective(uint32_t op, uint64_t size, int root, void* data, Copy&& copy) {
    std::unique_lock lk(s_->mu);
    if (!s_->failure.empty()) throw Error(s_->failure);
    const uint64_t seq = ++seq_;
    const std::string call = detail::callText(op, seq, size, root);
    auto& mine = s_->slots[static_cast<size_t>(rank_)];
    mine.op = op;
    mine.seq = seq;
    mine.size = size;
    mine.root = root;
    mine.data = data;
    mine.phase = 2 * seq - 1;
    s_->cv.notify_all();
    waitPhase(lk, 2 * seq - 1, call, "reach");

    // Every rank compares against rank 0 and so reaches the same verdict and message.
    const auto& ref = s_->slots[0];
    for (int p = 1; p < s_->nRanks; ++p) {
      const auto& o = s_->slots[static_cast<size_t>(p)];
      if (o.op != ref.op || o.size != ref.size || o.root != ref.root) {
        if (s_->failure.empty())
          s_->failure = "in-process bootstrap: rank " + std::to_string(p) + " called " +
                        detail::callText(o.op, o.seq, o.size, o.root) + " while rank 0 called " +
                        detail::callText(ref.op, ref.seq, ref.size, ref.root) +
                        "; every rank must call the same collectives in the same order with the same sizes";
        s_->cv.notify_all();
        throw Error(s_->failure);
      }
    }
    std::vector<void*> peers(static_cast<size_t>(s_->nRanks));
    for (int p = 0; p < s_->nRanks; ++p) peers[static_cast<size_t>(p)] = s_->slots[static_cast<size_t>(p)].data;
    // Peers' buffers stay put until everyone reaches phase 2*seq, so copying unlocked is safe.
    lk.unlock();
    copy(peers);
    lk.lock();
    mine.phase = 2 * seq;
    s_->cv.notify_all();
    waitPhase(lk, 2 * seq, call, "finish");
  }

  using Clock = detail::Clock;
  detail::InProcessState* s_;
  int rank_;
  uint64_t seq_ = 0;
};

// N threads of one process as N ranks. Make the group once, hand one
// Bootstrap to each thread (group.rank(i)).
class InProcessGroup {
 public:
  explicit InProcessGroup(int nRanks, BootstrapConfig cfg = {}) {
    if (nRanks < 1 || nRanks > detail::kMaxRanks)
      throw Error("InProcessGroup: nRanks is " + std::to_string(nRanks) + "; it must be at least 1");
    state_ = std::make_unique<detail::InProcessState>(nRanks, detail::bootstrapTimeoutNs(cfg));
    for (int r = 0; r < nRanks; ++r) ranks_.emplace_back(new InProcessBootstrap(state_.get(), r));
  }
  Bootstrap& rank(int r) {  // the Bootstrap for rank r (owned by the group)
    if (r < 0 || r >= nRanks())
      throw Error("InProcessGroup::rank(" + std::to_string(r) + "): the group has ranks 0.." +
                  std::to_string(nRanks() - 1));
    return *ranks_[static_cast<size_t>(r)];
  }
  int nRanks() const { return state_->nRanks; }

 private:
  std::unique_ptr<detail::InProcessState> state_;
  std::vector<std::unique_ptr<InProcessBootstrap>> ranks_;
};

}  // namespace gin
