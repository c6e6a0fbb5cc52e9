// gin/host/window_directory.hpp — WindowDirectory: a communicator's windows
// by id, as the proxy engine and the network wires' receivers resolve them,
// and the locks that keep a window alive under a copy.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <utility>
#include <vector>

namespace gin {

// The windows of a communicator by id: what the engine resolves descriptor
// window ids against. The Comm adds and removes entries; each engine thread
// holds mutex() shared (engineLock()) while it executes a batch, so a window
// never disappears under a copy and the threads do not serialise on it.
// Network receivers (the tcp wire's thread) look windows up under
// receiveMutex() instead: an engine thread may block in a send while it holds
// mutex(), and a receiver waiting for that mutex would stop draining the
// socket its peer's engine is blocked on (a cycle). add/remove take both,
// mutex() exclusively.
class WindowDirectory {
 public:
  struct Entry {
    uint64_t bytes = 0;
    char* local = nullptr;        // this rank's buffer
    std::vector<char*> lsaBases;  // [lsaSize] every lsa member's buffer, mapped here
  };
  void add(uint32_t id, Entry e) {
    Writer w(*this);
    map_[id] = std::move(e);
  }
  void remove(uint32_t id) {
    Writer w(*this);
    map_.erase(id);
  }
  std::shared_mutex& mutex() { return mu_; }
  std::mutex& receiveMutex() { return rxMu_; }
  // mutex() shared, once no add/remove is waiting: the rwlock prefers readers,
  // and busy engine threads overlapping their batches would starve a writer.
  std::shared_lock<std::shared_mutex> engineLock() {
    while (writers_.load(std::memory_order_acquire)) std::this_thread::yield();
    return std::shared_lock<std::shared_mutex>(mu_);
  }
  // Caller holds mutex() (shared or not) or receiveMutex().
  const Entry* find(uint32_t id) const {
    auto it = map_.find(id);
    return it == map_.end() ? nullptr : &it->second;
  }

 private:
  struct Writer {
    WindowDirectory& d;
    explicit Writer(WindowDirectory& dir) : d(dir) {
      d.writers_.fetch_add(1, std::memory_order_acq_rel);
      d.mu_.lock();
      d.rxMu_.lock();
    }
    ~Writer() {
      d.rxMu_.unlock();
      d.mu_.unlock();
      d.writers_.fetch_sub(1, std::memory_order_acq_rel);
    }
  };
  std::shared_mutex mu_;
  std::mutex rxMu_;
  std::atomic<int> writers_{0};
  std::map<uint32_t, Entry> map_;
};

}  // namespace gin
