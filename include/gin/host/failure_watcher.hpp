// gin/host/failure_watcher.hpp — the Comm's watcher thread: once this rank's
// error record is complete (a failure of its own, not a PeerFailed that
// another rank's failure caused), it raises every lsa member's team abort
// word to rank + 1 and tells the other hosts (AbortChannel), so their waits
// stop within about a millisecond (a few across hosts) instead of one
// timeout each. Until then, a failure another host reports raises this
// host's words the same way. The thread reads host memory and non-blocking
// sockets only: it never waits on CUDA. Nothing it watches may be freed
// before stop() returns.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "gin/core/atomic.hpp"
#include "gin/core/error.hpp"
#include "gin/device/comm.hpp"
#include "gin/host/abort_channel.hpp"
#include "gin/host/bootstrap.hpp"
#include "gin/host/tcp_wire.hpp"

namespace gin {

class FailureWatcher {
 public:
  FailureWatcher() = default;
  FailureWatcher(const FailureWatcher&) = delete;
  FailureWatcher& operator=(const FailureWatcher&) = delete;
  ~FailureWatcher() { stop(); }

  // Collective, on communicators over several hosts (every rank knows the
  // host count, so all or none take part): this rank will tell every rank of
  // the other hosts, the lowest of each host first.
  void openChannel(Bootstrap& bs, const DevComm& dev) {
    const int L = dev.lsaSize, me = dev.railRank;
    std::vector<int> targets;
    for (int i = 0; i < L; ++i)
      for (int node = 0; node < dev.railSize; ++node)
        if (node != me) targets.push_back(node * L + i);
    channel_.open(bs, detail::tcpWireAddress(bs, true), targets);
  }

  // Starts watching `record` (host address of the rank's error record) on
  // behalf of `rank`; `teamWords`: every lsa member's team abort word.
  void start(int rank, const DeviceErrorRecord* record, std::vector<uint32_t*> teamWords) {
    rank_ = rank;
    record_ = record;
    teamWords_ = std::move(teamWords);
    thread_ = std::thread([this] { run(); });
  }

  // Joins the thread; a failure recorded before this call is still passed on.
  void stop() {
    stop_.store(true, std::memory_order_release);
    if (thread_.joinable()) thread_.join();
  }

 private:
  AbortChannel channel_;  // several hosts: failures to and from the other hosts
  std::thread thread_;
  std::atomic<bool> stop_{false};
  int rank_ = 0;
  const DeviceErrorRecord* record_ = nullptr;
  std::vector<uint32_t*> teamWords_;

  // Every lsa member's team abort word to `origin` (failed rank + 1), where
  // no failure is there yet.
  void raiseTeamAbort(uint32_t origin) {
    for (uint32_t* w : teamWords_) {
      uint32_t idle = 0;
      (void)atomicCompareExchange<Scope::System>(w, idle, origin);
    }
  }

  void run() {
    for (;;) {
      // Read the flag first: a failure recorded just before ~Comm stops the
      // watcher is still passed on by this last look.
      const bool last = stop_.load(std::memory_order_acquire);
      if (atomicLoad<Scope::System>(&record_->state, MemoryOrder::Acquire) == 2u) {
        if (Op(record_->op) != Op::PeerFailed) {
          raiseTeamAbort(uint32_t(rank_ + 1));
          channel_.notify(uint32_t(rank_ + 1));  // bounded: about a second at most
        }
        return;
      }
      if (const uint32_t origin = channel_.poll()) raiseTeamAbort(origin);
      if (last) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
};

}  // namespace gin
