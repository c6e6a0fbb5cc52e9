// examples/common/thread_ranks.hpp — run an example's ranks as threads of this
// process, one gin::Comm each (on GPU r when `onGpus`).
#pragma once

#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "gin/gin.hpp"

namespace examples {

// rank(comm) returns how many items it found wrong. Prints each rank's
// exception; returns the number of ranks that threw or found something wrong.
inline int runThreadRanks(int n, const gin::CommConfig& cfg, bool onGpus,
                          const std::function<size_t(gin::Comm&)>& rank) {
  gin::InProcessGroup group(n);
  std::vector<size_t> wrong(size_t(n), 0);
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        gin::CommConfig c = cfg;
        if (onGpus) c.cudaDevice = r;
        gin::Comm comm(group.rank(r), c);
        wrong[size_t(r)] = rank(comm);
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  int bad = 0;
  for (int r = 0; r < n; ++r) {
    if (!errors[size_t(r)].empty()) std::fprintf(stderr, "rank %d: %s\n", r, errors[size_t(r)].c_str());
    bad += !errors[size_t(r)].empty() || wrong[size_t(r)] != 0;
  }
  return bad;
}

}  // namespace examples
