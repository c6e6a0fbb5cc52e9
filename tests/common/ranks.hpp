// tests/common/ranks.hpp — run a test body on N ranks (threads of this
// process), each with its own Comm, and rethrow the first failure. Used by
// the CPU tests and, through gpu_common.cuh, by the GPU suite.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gin/gin.hpp"

namespace gintest {

inline gin::CommConfig cpuConfig(uint64_t timeoutNs = 20'000'000'000ull) {
  gin::CommConfig c;
  c.device = gin::DeviceKind::Cpu;
  c.timeoutNs = timeoutNs;
  return c;
}

// Catch2 assertions are not thread-safe: rank bodies check with expect(),
// which throws, and the test asserts on the main thread.
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};
inline void expect(bool ok, const std::string& what) {
  if (!ok) throw Failure(what);
}

// Runs body(comm) on n rank threads of one InProcessGroup, rank r's Comm built
// with configFor(r). Exceptions (including Catch2 assertion failures raised
// with REQUIRE inside a rank) are collected and the first is rethrown on the
// calling thread once all ranks have ended. So that a failure says why:
// an expect() failure carries the rank's number and its error record (a wait
// that returned false says there which wait gave up, on what, having seen
// what), and every other rank's failure goes to stderr.
inline void runRankThreads(int n, const std::function<gin::CommConfig(int)>& configFor,
                           const std::function<void(gin::Comm&)>& body,
                           uint64_t bootstrapTimeoutNs = 20'000'000'000ull) {
  gin::BootstrapConfig bcfg;
  bcfg.timeoutNs = bootstrapTimeoutNs;
  gin::InProcessGroup group(n, bcfg);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::string> texts(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        gin::Comm comm(group.rank(r), configFor(r));
        try {
          body(comm);
        } catch (const Failure& f) {
          std::string record;
          try {
            comm.check();
          } catch (const std::exception& e) {
            record = e.what();
          }
          if (record.empty() || std::string(f.what()).find(record) != std::string::npos) throw;
          throw Failure(std::string(f.what()) + " [rank " + std::to_string(r) + "'s error record: " + record + "]");
        }
      } catch (const std::exception& e) {
        texts[size_t(r)] = e.what();
        errors[size_t(r)] = std::current_exception();
      } catch (...) {
        texts[size_t(r)] = "(not a std::exception: a Catch2 assertion)";
        errors[size_t(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  int first = -1;
  for (int r = 0; r < n; ++r)
    if (errors[size_t(r)]) {
      if (first < 0)
        first = r;
      else
        std::fprintf(stderr, "gintest: rank %d failed too (rank %d's failure is the one rethrown): %s\n", r, first,
                     texts[size_t(r)].c_str());
    }
  if (first >= 0) std::rethrow_exception(errors[size_t(first)]);
}

// N CPU ranks, all with `cfg`.
inline void runRanks(int n, const std::function<void(gin::Comm&)>& body, gin::CommConfig cfg = cpuConfig(),
                     uint64_t bootstrapTimeoutNs = 20'000'000'000ull) {
  runRankThreads(
      n, [&](int) { return cfg; }, body, bootstrapTimeoutNs);
}

// Every rank's exception text ("" when it returned) from building a Comm
// with `cfg` on n rank threads and running body: for failures that must reach
// every rank (none may hang, each must say why).
inline std::vector<std::string> rankErrors(int n, const gin::CommConfig& cfg,
                                           const std::function<void(gin::Comm&)>& body = {}) {
  gin::BootstrapConfig bcfg;
  bcfg.timeoutNs = 20'000'000'000ull;
  gin::InProcessGroup group(n, bcfg);
  std::vector<std::string> msgs(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        gin::Comm comm(group.rank(r), cfg);
        if (body) body(comm);
      } catch (const std::exception& e) {
        msgs[size_t(r)] = e.what();
        if (msgs[size_t(r)].empty()) msgs[size_t(r)] = "(empty message)";
      }
    });
  for (auto& t : threads) t.join();
  return msgs;
}

// Sets (or, with nullptr, unsets) an environment variable for one scope and
// restores what was there before.
struct EnvVar {
  std::string name, old;
  bool had;
  EnvVar(const char* n, const char* v) : name(n) {
    const char* o = std::getenv(n);
    had = o != nullptr;
    if (had) old = o;
    if (v)
      ::setenv(n, v, 1);
    else
      ::unsetenv(n);
  }
  ~EnvVar() {
    if (had)
      ::setenv(name.c_str(), old.c_str(), 1);
    else
      ::unsetenv(name.c_str());
  }
  EnvVar(const EnvVar&) = delete;
  EnvVar& operator=(const EnvVar&) = delete;
};

// Deterministic per-(seed, rank, index) byte pattern (host and device).
GIN_HD inline uint8_t pattern(uint64_t seed, int rank, size_t i) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ (uint64_t(rank) << 40) ^ i;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return uint8_t(x);
}

}  // namespace gintest
