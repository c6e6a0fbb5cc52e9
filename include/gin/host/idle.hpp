// gin/host/idle.hpp — how gin's polling host threads (the proxy engine's
// threads, the soft NIC) behave between passes that found nothing to do, and
// how tests park them.
//
//   IdleBackoff idle(spinPolls, yieldPolls, sleepUs);
//   for (;;) {
//     if (parkIfPaused(paused, parks)) continue;     // test hook
//     if (onePass()) { idle.busy(); continue; }
//     idle.wait();                                     // spin, then yield, then sleep
//   }
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

#include "gin/core/clock.hpp"

namespace gin::detail {

// Spin (pause instruction) for the first spinPolls idle passes, yield the
// core for the next yieldPolls, then sleep sleepUs between passes: a busy
// poller answers within a pause instruction, an idle one gives its core back
// within about a millisecond.
class IdleBackoff {
 public:
  // The defaults (ProxyConfig's, and the soft NIC's).
  static constexpr uint32_t kSpinPolls = 2048, kYieldPolls = 256, kSleepUs = 50;
  IdleBackoff(uint64_t spinPolls = kSpinPolls, uint64_t yieldPolls = kYieldPolls, uint32_t sleepUs = kSleepUs)
      : spin_(spinPolls), yield_(spinPolls + yieldPolls), sleepUs_(sleepUs) {}
  // A pass did work: the next idle pass starts spinning again.
  void busy() { idle_ = 0; }
  // A pass found nothing.
  void wait() {
    ++idle_;
    if (idle_ <= spin_)
      spinPause();
    else if (idle_ <= yield_)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(sleepUs_));
  }

 private:
  uint64_t spin_, yield_;
  uint32_t sleepUs_;
  uint64_t idle_ = 0;
};

// The poller's side of a test pause: while `paused`, count a park and sleep
// (returns true: skip this pass). The pausing side stores paused = true and
// waits for `parks` to move, so nothing it does afterwards is consumed.
inline bool parkIfPaused(const std::atomic<bool>& paused, std::atomic<uint64_t>& parks) {
  if (!paused.load(std::memory_order_seq_cst)) return false;
  parks.fetch_add(1, std::memory_order_release);
  std::this_thread::sleep_for(std::chrono::microseconds(100));
  return true;
}

}  // namespace gin::detail
