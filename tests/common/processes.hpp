// tests/common/processes.hpp — run a test body as N forked processes.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

namespace gintest {

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
  std::vector<int> status(size_t(n), -1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(limitS);
  for (int left = n; left > 0;) {
    for (int r = 0; r < n; ++r) {
      if (status[size_t(r)] != -1) continue;
      int st = 0;
      if (waitpid(pids[size_t(r)], &st, WNOHANG) == pids[size_t(r)]) {
        status[size_t(r)] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        --left;
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < n; ++r)
        if (status[size_t(r)] == -1) {
          kill(pids[size_t(r)], SIGKILL);
          waitpid(pids[size_t(r)], nullptr, 0);
          status[size_t(r)] = 124;
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return status;
}

}  // namespace gintest
