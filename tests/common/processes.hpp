// tests/common/processes.hpp — run a test body as N forked processes.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

namespace gintest {

// Waits for `pids` (polling every 5 ms) until every one has exited or
// `limitS` seconds have passed since `since`, then kills those still running
// (status 124). Returns each exit status (128 + the signal for a process a
// signal ended); *lastS: seconds from `since` to the last exit seen.
inline std::vector<int> reap(const std::vector<pid_t>& pids, std::chrono::steady_clock::time_point since,
                             double limitS, double* lastS = nullptr) {
  using Clock = std::chrono::steady_clock;
  const size_t n = pids.size();
  std::vector<int> status(n, -1);
  double last = 0;
  for (size_t left = n; left > 0;) {
    for (size_t r = 0; r < n; ++r) {
      int st = 0;
      if (status[r] != -1 || waitpid(pids[r], &st, WNOHANG) != pids[r]) continue;
      status[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      last = std::max(last, std::chrono::duration<double>(Clock::now() - since).count());
      --left;
    }
    if (left > 0 && Clock::now() - since > std::chrono::duration<double>(limitS)) {
      for (size_t r = 0; r < n; ++r)
        if (status[r] == -1) {
          kill(pids[r], SIGKILL);
          waitpid(pids[r], nullptr, 0);
          status[r] = 124;
        }
      break;
    }
    if (left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (lastS) *lastS = last;
  return status;
}

// Runs body(rank) in n forked processes; returns each child's exit status
// (0 = passed; an exception in the child is printed and gives 2). Children
// that outlive `limitS` seconds are killed (status 124).
inline std::vector<int> forkRanks(int n, const std::function<int(int)>& body, int limitS = 60) {
  std::fflush(stdout);  // nothing buffered is written twice
  std::fflush(stderr);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      int rc = 1;
      try {
        rc = body(r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        rc = 2;
      }
      std::fflush(stderr);
      _exit(rc);
    }
    pids.push_back(pid);
  }
  return reap(pids, std::chrono::steady_clock::now(), limitS);
}

}  // namespace gintest
