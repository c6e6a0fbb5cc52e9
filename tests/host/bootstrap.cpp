// Tests for gin/host/bootstrap.hpp: in-process groups (threads), TCP ranks
// (forked processes on 127.0.0.1), failure reports (missing rank, dead rank,
// mismatched calls, bad arguments) and launcher detection from the environment.
#include "gin/host/bootstrap.hpp"

#include <catch2/catch_get_random_seed.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "../common/processes.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <new>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

using Catch::Matchers::ContainsSubstring;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

constexpr uint64_t kMs = 1'000'000ull;

double secondsSince(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Every variable bootstrap.hpp reads. Tests start from none of them set and put
// the caller's environment back afterwards.
const char* const kEnvVars[] = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "GIN_BOOTSTRAP_PORT",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_NPROCS",
    "SLURM_LOCALID",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_NODEID",
    "SLURM_LAUNCH_NODE_IPADDR",
    "SLURM_JOB_ID",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "GIN_RANK",
    "GIN_NRANKS",
    "GIN_LOCAL_RANK",
    "GIN_LOCAL_SIZE",
    "GIN_BOOTSTRAP_TIMEOUT_MS",
    "GIN_BOOTSTRAP_ADDR",
    "GIN_BOOTSTRAP_SHM",
    "GIN_HOST_ID",
};

class CleanEnv {
 public:
  CleanEnv() {
    for (const char* n : kEnvVars) {
      const char* v = std::getenv(n);
      saved_.emplace_back(n, v ? std::optional<std::string>(v) : std::nullopt);
      ::unsetenv(n);
    }
  }
  ~CleanEnv() {
    for (auto& [n, v] : saved_) {
      if (v)
        ::setenv(n.c_str(), v->c_str(), 1);
      else
        ::unsetenv(n.c_str());
    }
  }
  void set(const char* name, const std::string& value) { ::setenv(name, value.c_str(), 1); }
  CleanEnv(const CleanEnv&) = delete;
  CleanEnv& operator=(const CleanEnv&) = delete;

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

void clearLaunchEnvInChild() {
  for (const char* n : kEnvVars) ::unsetenv(n);
}

// A free port on 127.0.0.1 from makeUniqueId(), so no test traffic leaves loopback.
gin::UniqueId loopbackId() {
  const char* old = std::getenv("GIN_BOOTSTRAP_ADDR");
  const std::optional<std::string> saved = old ? std::optional<std::string>(old) : std::nullopt;
  ::setenv("GIN_BOOTSTRAP_ADDR", "127.0.0.1", 1);
  const gin::UniqueId id = gin::makeUniqueId();
  if (saved)
    ::setenv("GIN_BOOTSTRAP_ADDR", saved->c_str(), 1);
  else
    ::unsetenv("GIN_BOOTSTRAP_ADDR");
  return id;
}

int portOf(const gin::UniqueId& id) { return gin::TcpBootstrap(id, 0, 1).port(); }

// ---- data patterns -----------------------------------------------------------

uint64_t mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t key(uint64_t seed, uint64_t rank, uint64_t tag) { return mix(seed ^ mix(rank * 1000003ull + tag)); }

void fill(unsigned char* p, size_t n, uint64_t k) {
  uint64_t s = k;
  for (size_t i = 0; i < n; ++i) {
    if (i % 8 == 0) s = mix(s + i);
    p[i] = static_cast<unsigned char>(s >> (8 * (i % 8)));
  }
}

// Index of the first byte that differs from the pattern, or n.
size_t firstMismatch(const unsigned char* p, size_t n, uint64_t k) {
  std::vector<unsigned char> want(n);
  fill(want.data(), n, k);
  for (size_t i = 0; i < n; ++i)
    if (p[i] != want[i]) return i;
  return n;
}

// ---- the collectives every group runs ----------------------------------------

struct Workload {
  uint64_t seed;
  std::vector<size_t> gatherSizes;  // allGather with per-rank random data
  std::vector<size_t> bcastSizes;   // broadcast from every root
  int barrierRounds;
  std::atomic<int>* counter;  // shared by all ranks (threads: plain memory; processes: MAP_SHARED)
  int mixedOps;               // a long random sequence of all three
};

std::string fail(const gin::Bootstrap& b, const std::string& what) {
  return "rank " + std::to_string(b.rank()) + ": " + what;
}

std::string checkedAllGather(gin::Bootstrap& b, size_t n, uint64_t seed, uint64_t tag) {
  const int N = b.nRanks();
  std::vector<unsigned char> buf(n * static_cast<size_t>(N) + 1, 0xAB);
  fill(buf.data() + static_cast<size_t>(b.rank()) * n, n, key(seed, static_cast<uint64_t>(b.rank()), tag));
  b.allGather(buf.data(), n);
  for (int p = 0; p < N; ++p) {
    const size_t at =
        firstMismatch(buf.data() + static_cast<size_t>(p) * n, n, key(seed, static_cast<uint64_t>(p), tag));
    if (at != n)
      return fail(b, "allGather of " + std::to_string(n) + " bytes (tag " + std::to_string(tag) + "): slot of rank " +
                         std::to_string(p) + " wrong at byte " + std::to_string(at));
  }
  if (buf.back() != 0xAB) return fail(b, "allGather wrote past nRanks*bytesPerRank");
  return {};
}

std::string checkedBroadcast(gin::Bootstrap& b, size_t n, int root, uint64_t seed, uint64_t tag) {
  std::vector<unsigned char> buf(n + 1, 0xCD);
  const uint64_t k = key(seed, static_cast<uint64_t>(root), tag);
  if (b.rank() == root) fill(buf.data(), n, k);
  b.broadcast(buf.data(), n, root);
  if (const size_t at = firstMismatch(buf.data(), n, k); at != n)
    return fail(b, "broadcast of " + std::to_string(n) + " bytes from root " + std::to_string(root) +
                       " wrong at byte " + std::to_string(at));
  if (buf.back() != 0xCD) return fail(b, "broadcast wrote past its bytes");
  return {};
}

std::string exercise(gin::Bootstrap& b, const Workload& w) {
  const int N = b.nRanks();
  uint64_t tag = 0;
  for (size_t n : w.gatherSizes)
    if (auto e = checkedAllGather(b, n, w.seed, ++tag); !e.empty()) return e;
  for (size_t n : w.bcastSizes)
    for (int root = 0; root < N; ++root)
      if (auto e = checkedBroadcast(b, n, root, w.seed, ++tag); !e.empty()) return e;
  // Everyone's increment before barrier k must be visible to everyone after it.
  // One rank per round arrives late so a barrier that does not wait shows up.
  for (int k = 0; k < w.barrierRounds; ++k) {
    if (k % N == b.rank()) std::this_thread::sleep_for(2ms);
    w.counter->fetch_add(1);
    b.barrier();
    const int seen = w.counter->load();
    if (seen != N * (k + 1))
      return fail(b, "after barrier round " + std::to_string(k) + " the counter is " + std::to_string(seen) +
                         ", expected " + std::to_string(N * (k + 1)));
    b.barrier();  // nobody starts round k+1 before everyone has checked round k
  }
  // The same pseudo-random sequence of calls on every rank.
  std::mt19937_64 rng(w.seed);
  for (int i = 0; i < w.mixedOps; ++i) {
    const auto op = rng() % 3;
    const size_t n = rng() % 300;
    const int root = static_cast<int>(rng() % static_cast<uint64_t>(N));
    std::string e;
    if (op == 0) e = checkedAllGather(b, n, w.seed, ++tag);
    if (op == 1) e = checkedBroadcast(b, n, root, w.seed, ++tag);
    if (op == 2) b.barrier();
    if (!e.empty()) return e + " (mixed op " + std::to_string(i) + ")";
  }
  return {};
}

// ---- running ranks as threads --------------------------------------------------

// Catch2 assertions are not thread-safe: threads report text, the test thread checks.
std::vector<std::string> runThreads(gin::InProcessGroup& g, const std::function<std::string(gin::Bootstrap&)>& body) {
  std::vector<std::string> out(static_cast<size_t>(g.nRanks()));
  std::vector<std::thread> ts;
  for (int r = 0; r < g.nRanks(); ++r)
    ts.emplace_back([&, r] {
      try {
        out[static_cast<size_t>(r)] = body(g.rank(r));
      } catch (const std::exception& e) {
        out[static_cast<size_t>(r)] = std::string("threw: ") + e.what();
      }
    });
  for (auto& t : ts) t.join();  // bounded: every collective has a timeout
  return out;
}

// ---- running ranks as processes -------------------------------------------------

// Memory the children write and the parent reads: a counter and one message per child.
struct Shared {
  std::atomic<int> counter;
  char msg[16][1024];
};

class SharedArea {
 public:
  SharedArea() {
    void* p = ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap failed");
    s_ = new (p) Shared{};
  }
  ~SharedArea() { ::munmap(s_, sizeof(Shared)); }
  Shared* operator->() { return s_; }
  Shared* get() { return s_; }
  SharedArea(const SharedArea&) = delete;
  SharedArea& operator=(const SharedArea&) = delete;

 private:
  Shared* s_;
};

void note(Shared* sh, int child, const std::string& text) {
  std::snprintf(sh->msg[child], sizeof sh->msg[child], "%s", text.c_str());
}

constexpr int kTimedOut = -1000;

// Runs body(i) in n forked children and returns their exit codes (-signal if
// killed by one, kTimedOut if still running after `limit`, then killed).
std::vector<int> forkRanks(int n, Shared* sh, const std::function<int(int)>& body, std::chrono::seconds limit = 20s) {
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int i = 0; i < n; ++i) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      for (pid_t p : pids) ::kill(p, SIGKILL);
      for (pid_t p : pids) ::waitpid(p, nullptr, 0);
      throw std::runtime_error("fork failed");
    }
    if (pid == 0) {
      int code = 0;
      try {
        code = body(i);
      } catch (const std::exception& e) {
        note(sh, i, std::string("unexpected exception: ") + e.what());
        code = 100;
      } catch (...) {
        code = 101;
      }
      ::_exit(code);  // never return into Catch2 in the child
    }
    pids.push_back(pid);
  }
  std::vector<int> codes(static_cast<size_t>(n), kTimedOut);
  std::vector<bool> done(static_cast<size_t>(n), false);
  const auto deadline = Clock::now() + limit;
  int left = n;
  while (left > 0 && Clock::now() < deadline) {
    for (int i = 0; i < n; ++i) {
      if (done[static_cast<size_t>(i)]) continue;
      int st = 0;
      if (::waitpid(pids[static_cast<size_t>(i)], &st, WNOHANG) == pids[static_cast<size_t>(i)]) {
        done[static_cast<size_t>(i)] = true;
        --left;
        codes[static_cast<size_t>(i)] = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
      }
    }
    if (left > 0) std::this_thread::sleep_for(5ms);
  }
  for (int i = 0; i < n; ++i) {
    if (done[static_cast<size_t>(i)]) continue;
    ::kill(pids[static_cast<size_t>(i)], SIGKILL);
    ::waitpid(pids[static_cast<size_t>(i)], nullptr, 0);
  }
  return codes;
}

// Explains a child's result in the failure output.
std::string report(const std::vector<int>& codes, Shared* sh) {
  std::string s;
  for (size_t i = 0; i < codes.size(); ++i)
    s += "child " + std::to_string(i) + ": exit " + std::to_string(codes[i]) + " \"" + sh->msg[i] + "\"\n";
  return s;
}

// A child that expects a gin::Error: checks the text and how long it took.
enum ExpectCode { kOk = 0, kNoThrow = 2, kWrongText = 3, kTooSlow = 4, kTooEarly = 5 };

int expectError(Shared* sh, int child, const std::function<void()>& action, const std::vector<std::string>& phrases,
                double maxSeconds, double minSeconds = 0) {
  const auto t0 = Clock::now();
  try {
    action();
  } catch (const gin::Error& e) {
    const double dt = secondsSince(t0);
    note(sh, child, std::string(e.what()) + " [after " + std::to_string(dt) + " s]");
    for (const auto& p : phrases)
      if (std::string(e.what()).find(p) == std::string::npos) return kWrongText;
    if (dt > maxSeconds) return kTooSlow;
    if (dt < minSeconds) return kTooEarly;
    return kOk;
  }
  note(sh, child, "no gin::Error was thrown");
  return kNoThrow;
}

gin::BootstrapConfig timeoutMs(uint64_t ms) { return gin::BootstrapConfig{ms * kMs}; }

}  // namespace

// =============================================================================
// In-process groups
// =============================================================================

TEST_CASE(
    "in-process group of 1, 2, 3, 5, 8 threads: allGather, broadcast from every root, barrier "
    "ordering and many collectives in a row give every rank the right data",
    "[bootstrap][inprocess]") {
  CleanEnv env;
  for (int n : {1, 2, 3, 5, 8}) {
    CAPTURE(n);
    gin::InProcessGroup g(n, timeoutMs(10'000));
    REQUIRE(g.nRanks() == n);
    std::atomic<int> counter{0};
    const Workload w{
        Catch::getSeed() + static_cast<uint64_t>(n), {0, 1, 7, 64, 4096, 65536}, {0, 1, 13, 1000}, 12, &counter, 300};
    const auto out = runThreads(g, [&](gin::Bootstrap& b) {
      if (b.nRanks() != n) return fail(b, "nRanks() is " + std::to_string(b.nRanks()));
      if (!b.sameProcessGroup()) return fail(b, "sameProcessGroup() is false");
      return exercise(b, w);
    });
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      CHECK(out[static_cast<size_t>(r)] == "");
      CHECK(g.rank(r).rank() == r);
    }
  }
}

TEST_CASE("in-process allGather works when all threads pass one shared buffer", "[bootstrap][inprocess]") {
  CleanEnv env;
  constexpr int n = 4;
  gin::InProcessGroup g(n, timeoutMs(10'000));
  std::vector<uint32_t> shared(n, 0);
  const auto out = runThreads(g, [&](gin::Bootstrap& b) {
    shared[static_cast<size_t>(b.rank())] = 100u + static_cast<uint32_t>(b.rank());
    b.allGather(shared.data(), sizeof(uint32_t));
    for (int p = 0; p < n; ++p)
      if (shared[static_cast<size_t>(p)] != 100u + static_cast<uint32_t>(p))
        return fail(b, "slot " + std::to_string(p));
    return std::string();
  });
  for (const auto& o : out) CHECK(o == "");
}

TEST_CASE("in-process: a rank that never calls the collective makes the others throw, naming it, after the timeout",
          "[bootstrap][inprocess][failure]") {
  CleanEnv env;
  gin::InProcessGroup g(3, timeoutMs(300));
  std::vector<std::string> msg(2);
  std::vector<double> dt(2, -1);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      const auto t0 = Clock::now();
      try {
        g.rank(r).barrier();
      } catch (const gin::Error& e) {
        msg[static_cast<size_t>(r)] = e.what();
      }
      dt[static_cast<size_t>(r)] = secondsSince(t0);
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r, dt[static_cast<size_t>(r)]);
    CHECK_THAT(msg[static_cast<size_t>(r)], ContainsSubstring("rank 2 of 3 did not reach barrier #1"));
    CHECK(dt[static_cast<size_t>(r)] < 3.0);
  }
  // The group is broken for good: the late rank learns why instead of hanging.
  CHECK_THROWS_WITH(g.rank(2).barrier(), ContainsSubstring("rank 2 of 3"));
}

TEST_CASE("GIN_BOOTSTRAP_TIMEOUT_MS overrides BootstrapConfig::timeoutNs and malformed values are rejected",
          "[bootstrap][inprocess][env]") {
  CleanEnv env;
  env.set("GIN_BOOTSTRAP_TIMEOUT_MS", "200");
  gin::InProcessGroup g(2, timeoutMs(60'000));
  const auto t0 = Clock::now();
  CHECK_THROWS_WITH(g.rank(0).barrier(), ContainsSubstring("rank 1 of 2") && ContainsSubstring("0.2 s"));
  CHECK(secondsSince(t0) < 3.0);
  CHECK(secondsSince(t0) > 0.15);

  for (const char* bad : {"abc", "0", "-5", "12ms"}) {
    CAPTURE(bad);
    env.set("GIN_BOOTSTRAP_TIMEOUT_MS", bad);
    CHECK_THROWS_WITH(gin::InProcessGroup(2), ContainsSubstring("GIN_BOOTSTRAP_TIMEOUT_MS") && ContainsSubstring(bad));
  }
}

TEST_CASE("in-process: mismatched calls (bytes, op, root) make every rank throw a message naming both calls",
          "[bootstrap][inprocess][failure]") {
  CleanEnv env;
  SECTION("allGather with different bytesPerRank") {
    gin::InProcessGroup g(2, timeoutMs(5'000));
    const auto out = runThreads(g, [](gin::Bootstrap& b) {
      std::vector<char> buf(64);
      b.allGather(buf.data(), b.rank() == 0 ? 8 : 16);
      return std::string("no error");
    });
    for (const auto& o : out) {
      CHECK_THAT(o, ContainsSubstring("rank 1 called allGather #1 (bytesPerRank 16)"));
      CHECK_THAT(o, ContainsSubstring("rank 0 called allGather #1 (bytesPerRank 8)"));
    }
  }
  SECTION("barrier against broadcast") {
    gin::InProcessGroup g(3, timeoutMs(5'000));
    const auto out = runThreads(g, [](gin::Bootstrap& b) {
      char c = 0;
      if (b.rank() == 2)
        b.broadcast(&c, 1, 0);
      else
        b.barrier();
      return std::string("no error");
    });
    for (const auto& o : out) CHECK_THAT(o, ContainsSubstring("rank 2 called broadcast #1"));
  }
  SECTION("broadcast with different roots") {
    gin::InProcessGroup g(2, timeoutMs(5'000));
    const auto out = runThreads(g, [](gin::Bootstrap& b) {
      char c = 0;
      b.broadcast(&c, 1, b.rank());
      return std::string("no error");
    });
    for (const auto& o : out) CHECK_THAT(o, ContainsSubstring("root 1") && ContainsSubstring("root 0"));
  }
}

TEST_CASE("in-process bad arguments throw gin::Error, and a bad call on one rank fails the others promptly",
          "[bootstrap][inprocess][args]") {
  CleanEnv env;
  CHECK_THROWS_AS(gin::InProcessGroup(0), gin::Error);
  CHECK_THROWS_WITH(gin::InProcessGroup(-3), ContainsSubstring("nRanks is -3"));
  gin::InProcessGroup g(2, timeoutMs(5'000));
  CHECK_THROWS_WITH(g.rank(2), ContainsSubstring("rank(2)"));
  CHECK_THROWS_AS(g.rank(-1), gin::Error);

  SECTION("null data") {
    const auto t0 = Clock::now();
    const auto out = runThreads(g, [](gin::Bootstrap& b) {
      std::vector<char> buf(16);
      b.allGather(b.rank() == 1 ? nullptr : buf.data(), 8);
      return std::string("no error");
    });
    for (const auto& o : out) CHECK_THAT(o, ContainsSubstring("data is null"));
    CHECK(secondsSince(t0) < 2.0);  // well before the 5 s timeout
  }
  SECTION("broadcast root out of range") {
    const auto out = runThreads(g, [](gin::Bootstrap& b) {
      char c = 0;
      b.broadcast(&c, 1, 2);
      return std::string("no error");
    });
    for (const auto& o : out) CHECK_THAT(o, ContainsSubstring("root 2 is outside 0..1"));
  }
  SECTION("zero bytes with null data is fine") {
    const auto out = runThreads(g, [](gin::Bootstrap& b) {
      b.allGather(nullptr, 0);
      b.broadcast(nullptr, 0, 1);
      return std::string();
    });
    for (const auto& o : out) CHECK(o == "");
  }
}

// =============================================================================
// TCP, ranks as processes on 127.0.0.1
// =============================================================================

TEST_CASE("makeUniqueId holds GIN_BOOTSTRAP_ADDR and a free port; damaged ids are rejected", "[bootstrap][tcp]") {
  CleanEnv env;
  const gin::UniqueId id = loopbackId();
  gin::TcpBootstrap solo(id, 0, 1);
  CHECK(solo.address() == "127.0.0.1");
  CHECK(solo.port() > 0);
  CHECK(solo.port() < 65536);
  // The port is free: a listener can take it.
  gin::detail::Socket s = gin::detail::tcpSocket();
  sockaddr_in sa = gin::detail::resolveIpv4("127.0.0.1", solo.port(), "test");
  CHECK(::bind(s.get(), reinterpret_cast<const sockaddr*>(&sa), sizeof sa) == 0);

  gin::UniqueId zero{};
  CHECK_THROWS_WITH(gin::TcpBootstrap(zero, 0, 2), ContainsSubstring("makeUniqueId"));
  gin::UniqueId badPort{};
  std::snprintf(badPort.bytes, sizeof badPort.bytes, "gin-bootstrap-v1 127.0.0.1 99999");
  CHECK_THROWS_WITH(gin::TcpBootstrap(badPort, 0, 2), ContainsSubstring("99999"));
}

TEST_CASE(
    "TCP with 2 and 4 processes: allGather, broadcast from every root, barrier ordering and many "
    "collectives in a row give every rank the right data",
    "[bootstrap][tcp]") {
  CleanEnv env;
  for (int n : {2, 4}) {
    CAPTURE(n);
    SharedArea sh;
    const gin::UniqueId id = loopbackId();
    const Workload w{Catch::getSeed() + 77u + static_cast<uint64_t>(n),
                     {0, 1, 7, 4096, 1 << 20},
                     {0, 1, 999, 300000},
                     8,
                     &sh->counter,
                     200};
    // Ranks start in reverse so the others must retry until rank 0 listens.
    const auto codes = forkRanks(n, sh.get(), [&](int i) {
      const int rank = n - 1 - i;
      if (rank == 0) std::this_thread::sleep_for(100ms);
      gin::TcpBootstrap b(id, rank, n, timeoutMs(10'000));
      if (b.rank() != rank || b.nRanks() != n || b.sameProcessGroup() || !b.sharedMemory()) {
        note(sh.get(), i, "wrong rank()/nRanks()/sameProcessGroup()/sharedMemory()");
        return 1;
      }
      const std::string e = exercise(b, w);
      note(sh.get(), i, e);
      return e.empty() ? 0 : 1;
    });
    INFO(report(codes, sh.get()));
    for (int c : codes) CHECK(c == 0);
  }
}

TEST_CASE("fromEnvironment: torchrun and Slurm variables (set in each child) form a working TCP group",
          "[bootstrap][tcp][env]") {
  CleanEnv env;
  SharedArea sh;
  constexpr int n = 3;
  const int port = portOf(loopbackId());
  const uint64_t seed = Catch::getSeed() + 5u;
  for (const std::string launcher : {"torchrun", "slurm"}) {
    CAPTURE(launcher);
    sh->counter = 0;
    const auto codes = forkRanks(n, sh.get(), [&](int i) {
      clearLaunchEnvInChild();
      if (launcher == "torchrun") {
        ::setenv("RANK", std::to_string(i).c_str(), 1);
        ::setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
        ::setenv("LOCAL_RANK", std::to_string(i).c_str(), 1);
        ::setenv("LOCAL_WORLD_SIZE", std::to_string(n).c_str(), 1);
        ::setenv("MASTER_ADDR", "127.0.0.1", 1);
        ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      } else {
        ::setenv("SLURM_PROCID", std::to_string(i).c_str(), 1);
        ::setenv("SLURM_NTASKS", std::to_string(n).c_str(), 1);
        ::setenv("SLURM_LOCALID", std::to_string(i).c_str(), 1);
        ::setenv("SLURM_LAUNCH_NODE_IPADDR", "127.0.0.1", 1);
        ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
        ::setenv("SLURM_JOB_ID", "4242", 1);
      }
      ::setenv("GIN_BOOTSTRAP_TIMEOUT_MS", "10000", 1);
      const gin::LaunchInfo li = gin::detectLaunch();
      if (li.source != launcher || li.rank != i || li.nRanks != n || li.masterPort != port) {
        note(sh.get(), i, "detectLaunch gave source " + li.source + " rank " + std::to_string(li.rank));
        return 1;
      }
      auto b = gin::TcpBootstrap::fromEnvironment(timeoutMs(1));  // the variable's 10 s wins over 1 ms
      const Workload w{seed, {0, 3, 100}, {5}, 3, &sh->counter, 50};
      const std::string e = exercise(*b, w);
      note(sh.get(), i, e);
      return e.empty() ? 0 : 1;
    });
    INFO(report(codes, sh.get()));
    for (int c : codes) CHECK(c == 0);
  }
}

TEST_CASE("TCP: with 3 ranks expected and 2 started, both throw within the timeout naming the missing rank 2",
          "[bootstrap][tcp][failure]") {
  CleanEnv env;
  SharedArea sh;
  const gin::UniqueId id = loopbackId();
  const int port = portOf(id);
  const auto codes = forkRanks(2, sh.get(), [&](int rank) {
    return expectError(
        sh.get(), rank, [&] { gin::TcpBootstrap b(id, rank, 3, timeoutMs(1500)); },
        {"rank 2 of 3 never connected to 127.0.0.1:" + std::to_string(port), "within 1.5 s"},
        /*max*/ 1.5 + 1.0, /*min*/ rank == 0 ? 1.4 : 0);
  });
  INFO(report(codes, sh.get()));
  CHECK(codes == std::vector<int>{kOk, kOk});
}

TEST_CASE("TCP: a rank that cannot reach rank 0 throws within the timeout naming rank 0 and its address",
          "[bootstrap][tcp][failure]") {
  CleanEnv env;
  const int port = portOf(loopbackId());
  const auto t0 = Clock::now();
  CHECK_THROWS_WITH(gin::TcpBootstrap("127.0.0.1", port, 1, 2, timeoutMs(800)),
                    ContainsSubstring("could not connect to rank 0 at 127.0.0.1:" + std::to_string(port)) &&
                        ContainsSubstring("bootstrap rank 1/2"));
  CHECK(secondsSince(t0) < 2.0);
  CHECK(secondsSince(t0) > 0.7);
}

TEST_CASE("TCP: a rank that dies mid-run gives every other rank an error naming it within the timeout",
          "[bootstrap][tcp][failure]") {
  CleanEnv env;
  constexpr int n = 3;
  for (int victim : {2, 0}) {
    CAPTURE(victim);
    SharedArea sh;
    const gin::UniqueId id = loopbackId();
    const std::string phrase = victim == 0 ? std::string("lost the connection to rank 0")
                                           : "rank " + std::to_string(victim) + " closed its connection";
    const auto codes = forkRanks(n, sh.get(), [&](int rank) {
      gin::TcpBootstrap b(id, rank, n, timeoutMs(5000));
      for (int i = 0; i < 5; ++i) b.barrier();
      int x = rank;
      b.allGather(&x, 0);
      if (rank == victim) ::_exit(42);  // gone without a word, like a crash
      return expectError(
          sh.get(), rank, [&] { b.barrier(); }, {phrase, "barrier #7"}, /*max*/ 4.5);
    });
    INFO(report(codes, sh.get()));
    for (int r = 0; r < n; ++r) CHECK(codes[static_cast<size_t>(r)] == (r == victim ? 42 : kOk));
  }
}

TEST_CASE("TCP: mismatched calls between processes make both throw, naming the calls", "[bootstrap][tcp][failure]") {
  CleanEnv env;
  SharedArea sh;
  const gin::UniqueId id = loopbackId();
  const auto codes = forkRanks(2, sh.get(), [&](int rank) {
    gin::TcpBootstrap b(id, rank, 2, timeoutMs(5000));
    b.barrier();
    std::vector<char> buf(64);
    return expectError(
        sh.get(), rank, [&] { b.allGather(buf.data(), rank == 0 ? 8 : 16); },
        {"rank 1 called allGather #2 (bytesPerRank 16) while rank 0 called allGather #2 (bytesPerRank 8)"}, 2.0);
  });
  INFO(report(codes, sh.get()));
  CHECK(codes == std::vector<int>{kOk, kOk});
}

TEST_CASE("TCP: nRanks disagreeing between processes, or a rank started twice, fails every process clearly",
          "[bootstrap][tcp][failure]") {
  CleanEnv env;
  SECTION("nRanks mismatch") {
    SharedArea sh;
    const gin::UniqueId id = loopbackId();
    const auto codes = forkRanks(2, sh.get(), [&](int rank) {
      return expectError(
          sh.get(), rank, [&] { gin::TcpBootstrap b(id, rank, rank == 0 ? 2 : 3, timeoutMs(3000)); },
          {"rank 1", "nRanks 3 but rank 0 with nRanks 2"}, 2.5);
    });
    INFO(report(codes, sh.get()));
    CHECK(codes == std::vector<int>{kOk, kOk});
  }
  SECTION("duplicate rank") {
    SharedArea sh;
    const gin::UniqueId id = loopbackId();
    const auto codes = forkRanks(3, sh.get(), [&](int i) {
      const int rank = i == 0 ? 0 : 1;
      return expectError(
          sh.get(), i, [&] { gin::TcpBootstrap b(id, rank, 3, timeoutMs(3000)); }, {"rank 1 connected twice"}, 2.5);
    });
    INFO(report(codes, sh.get()));
    CHECK(codes == std::vector<int>{kOk, kOk, kOk});
  }
}

TEST_CASE("TCP: a non-gin client on the rendezvous port is reported, not accepted", "[bootstrap][tcp][failure]") {
  CleanEnv env;
  const int port = portOf(loopbackId());
  std::string msg;
  std::thread root([&] {
    try {
      gin::TcpBootstrap b("127.0.0.1", port, 0, 2, timeoutMs(3000));
    } catch (const gin::Error& e) {
      msg = e.what();
    }
  });
  // Connect (retrying until rank 0 listens) and send 40 bytes that are not a hello.
  bool sent = false;
  const auto deadline = Clock::now() + 2s;
  while (!sent && Clock::now() < deadline) {
    gin::detail::Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in sa = gin::detail::resolveIpv4("127.0.0.1", port, "test");
    if (::connect(s.get(), reinterpret_cast<const sockaddr*>(&sa), sizeof sa) == 0) {
      const char junk[40] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
      sent = ::send(s.get(), junk, sizeof junk, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof junk);
      std::this_thread::sleep_for(50ms);  // let rank 0 read it before we close
    } else {
      std::this_thread::sleep_for(10ms);
    }
  }
  root.join();
  CHECK(sent);
  CHECK_THAT(msg, ContainsSubstring("instead of a gin bootstrap hello") && ContainsSubstring("another program"));
}

TEST_CASE("TCP bad arguments throw gin::Error; a single rank needs no network", "[bootstrap][tcp][args]") {
  CleanEnv env;
  CHECK_THROWS_WITH(gin::TcpBootstrap("127.0.0.1", 29500, 2, 2), ContainsSubstring("rank 2 is outside 0..1"));
  CHECK_THROWS_WITH(gin::TcpBootstrap("127.0.0.1", 29500, -1, 2), ContainsSubstring("rank -1"));
  CHECK_THROWS_WITH(gin::TcpBootstrap("127.0.0.1", 29500, 0, 0), ContainsSubstring("nRanks is 0"));
  CHECK_THROWS_WITH(gin::TcpBootstrap("127.0.0.1", 0, 1, 2), ContainsSubstring("port 0"));
  CHECK_THROWS_WITH(gin::TcpBootstrap("127.0.0.1", 70000, 1, 2), ContainsSubstring("port 70000"));
  CHECK_THROWS_WITH(gin::TcpBootstrap("", 29500, 1, 2), ContainsSubstring("address is empty"));
  CHECK_THROWS_WITH(gin::TcpBootstrap("127.0.0.1", 29500, 1, 2, gin::BootstrapConfig{0}),
                    ContainsSubstring("timeoutNs is 0"));

  gin::TcpBootstrap solo("", 0, 0, 1);
  uint64_t v = 7;
  solo.allGather(&v, sizeof v);
  solo.broadcast(&v, sizeof v, 0);
  solo.barrier();
  CHECK(v == 7);
  CHECK_THROWS_WITH(solo.broadcast(&v, sizeof v, 1), ContainsSubstring("root 1 is outside 0..0"));
  // After a failure the object says so instead of carrying on half-broken.
  CHECK_THROWS_WITH(solo.barrier(), ContainsSubstring("unusable after an earlier failure"));
  gin::TcpBootstrap solo2("", 0, 0, 1);
  CHECK_THROWS_WITH(solo2.allGather(nullptr, 4), ContainsSubstring("data is null"));
}

TEST_CASE(
    "TCP: a bad argument on one process fails the others promptly with its reason, even a rank that "
    "arrives after rank 0 has exited",
    "[bootstrap][tcp][args]") {
  CleanEnv env;
  SharedArea sh;
  const gin::UniqueId id = loopbackId();
  const auto codes = forkRanks(3, sh.get(), [&](int rank) {
    gin::TcpBootstrap b(id, rank, 3, timeoutMs(5000));
    std::vector<char> buf(24);
    // Rank 1 sends into a connection rank 0 has closed: the reason must still reach it.
    if (rank == 1) std::this_thread::sleep_for(300ms);
    return expectError(
        sh.get(), rank, [&] { b.allGather(rank == 2 ? nullptr : buf.data(), 8); },
        rank == 2 ? std::vector<std::string>{"allGather #1 (bytesPerRank 8): allGather: data is null"}
                  : std::vector<std::string>{"rank 2 failed in allGather #1", "data is null"},
        2.0);
  });
  INFO(report(codes, sh.get()));
  CHECK(codes == std::vector<int>{kOk, kOk, kOk});
}

// =============================================================================
// TCP ranks on one host: the collectives meet in shared memory
// =============================================================================

namespace {

// The bootstrap segments of the job whose rank 0 listens on `port` that are
// still in /dev/shm (rank 0 names them "gin.bootstrap.<port>.<pid>.<random>").
std::vector<std::string> shmLeft(int port) {
  std::vector<std::string> left;
  const std::string prefix = "gin.bootstrap." + std::to_string(port) + ".";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec))
    if (e.path().filename().string().rfind(prefix, 0) == 0) left.push_back(e.path().filename().string());
  return left;
}

// A long random sequence of all three collectives with sizes from `sizes`
// (the same on every rank), checked against the reference patterns. Each rank
// also sleeps at its own random moments, so ranks run ahead of each other by
// up to a call and the two slots of every rank are both in use.
std::string exerciseMixed(gin::Bootstrap& b, uint64_t seed, int nOps, const std::vector<size_t>& sizes) {
  const int N = b.nRanks();
  std::mt19937_64 rng(seed);
  std::mt19937_64 jitter(seed ^ mix(static_cast<uint64_t>(b.rank()) + 1));
  uint64_t tag = 1u << 20;
  for (int i = 0; i < nOps; ++i) {
    const auto op = rng() % 3;
    const size_t n = sizes[rng() % sizes.size()];
    const int root = static_cast<int>(rng() % static_cast<uint64_t>(N));
    if (jitter() % 8 == 0) std::this_thread::sleep_for(std::chrono::microseconds(jitter() % 300));
    std::string e;
    if (op == 0) e = checkedAllGather(b, n, seed, ++tag);
    if (op == 1) e = checkedBroadcast(b, n, root, seed, ++tag);
    if (op == 2) b.barrier();
    if (!e.empty()) return e + " (mixed op " + std::to_string(i) + ")";
  }
  return {};
}

constexpr size_t kSlot = gin::detail::BootstrapShm::kSlotBytes;

}  // namespace

TEST_CASE(
    "TCP ranks on one host meet in shared memory; GIN_BOOTSTRAP_SHM=0 on any rank, or ranks that claim "
    "different hosts (GIN_HOST_ID), keep every rank on TCP, and both paths give the right data",
    "[bootstrap][tcp][shm]") {
  CleanEnv env;
  struct Case {
    const char* name;
    std::function<void(int)> setEnv;  // in the child, before the bootstrap
    bool shm;
  };
  const std::vector<Case> cases = {
      {"default", [](int) {}, true},
      {"GIN_BOOTSTRAP_SHM=1", [](int) { ::setenv("GIN_BOOTSTRAP_SHM", "1", 1); }, true},
      {"GIN_BOOTSTRAP_SHM=0 everywhere", [](int) { ::setenv("GIN_BOOTSTRAP_SHM", "0", 1); }, false},
      {"GIN_BOOTSTRAP_SHM=0 on rank 1",
       [](int r) {
         if (r == 1) ::setenv("GIN_BOOTSTRAP_SHM", "0", 1);
       },
       false},
      {"GIN_BOOTSTRAP_SHM=0 on rank 0",
       [](int r) {
         if (r == 0) ::setenv("GIN_BOOTSTRAP_SHM", "0", 1);
       },
       false},
      {"rank 2 on another host by GIN_HOST_ID",
       [](int r) {
         if (r == 2) ::setenv("GIN_HOST_ID", "elsewhere", 1);
       },
       false},
  };
  constexpr int n = 3;
  for (const Case& c : cases) {
    CAPTURE(c.name);
    SharedArea sh;
    const gin::UniqueId id = loopbackId();
    const Workload w{Catch::getSeed() + 11u, {0, 1, 7, kSlot, kSlot + 1}, {0, 5, kSlot + 3}, 4, &sh->counter, 100};
    const auto codes = forkRanks(n, sh.get(), [&](int rank) {
      ::unsetenv("GIN_HOST_ID");
      c.setEnv(rank);
      gin::TcpBootstrap b(id, rank, n, timeoutMs(10'000));
      if (b.sharedMemory() != c.shm) {
        note(sh.get(), rank, "sharedMemory() is " + std::to_string(b.sharedMemory()));
        return 1;
      }
      const std::string e = exercise(b, w);
      note(sh.get(), rank, e);
      return e.empty() ? 0 : 1;
    });
    INFO(report(codes, sh.get()));
    CHECK(codes == std::vector<int>{0, 0, 0});
    CHECK(shmLeft(portOf(id)) == std::vector<std::string>{});
  }
  // One rank has nothing to share; a malformed switch is an error naming it.
  CHECK_FALSE(gin::TcpBootstrap("", 0, 0, 1).sharedMemory());
  env.set("GIN_BOOTSTRAP_SHM", "yes");
  CHECK_THROWS_WITH(gin::TcpBootstrap("", 0, 0, 1),
                    ContainsSubstring("GIN_BOOTSTRAP_SHM=\"yes\"") && ContainsSubstring("0 or 1"));
}

TEST_CASE(
    "TCP in shared memory with 1, 2, 3, 5 processes: allGather, broadcast and barrier match the reference "
    "for sizes 0, 1, odd, the slot's 64 KiB and beyond it (over TCP), mixed in one run, ranks racing ahead",
    "[bootstrap][tcp][shm]") {
  CleanEnv env;
  for (int n : {1, 2, 3, 5}) {
    CAPTURE(n);
    SharedArea sh;
    const gin::UniqueId id = loopbackId();
    const uint64_t seed = Catch::getSeed() + 1000u + static_cast<uint64_t>(n);
    const Workload w{seed,
                     {0, 1, 3, 4093, kSlot - 1, kSlot, kSlot + 1, 3 * kSlot + 5},
                     {0, 1, 61, kSlot, kSlot + 1},
                     6,
                     &sh->counter,
                     0};
    // Mostly small calls, as the expert-parallel buffers make them; now and then one over TCP.
    const std::vector<size_t> sizes = {0, 1, 1, 3, 8, 8, 8, 61, 1000, 4093, 4096, kSlot, kSlot + 1, 100'001};
    const auto codes = forkRanks(
        n, sh.get(),
        [&](int rank) {
          gin::TcpBootstrap b(id, rank, n, timeoutMs(20'000));
          if (b.sharedMemory() != (n > 1)) {
            note(sh.get(), rank, "sharedMemory() is " + std::to_string(b.sharedMemory()));
            return 1;
          }
          std::string e = exercise(b, w);
          if (e.empty()) e = exerciseMixed(b, seed, 1500, sizes);
          note(sh.get(), rank, e);
          return e.empty() ? 0 : 1;
        },
        60s);
    INFO(report(codes, sh.get()));
    for (int c : codes) CHECK(c == 0);
    CHECK(shmLeft(portOf(id)) == std::vector<std::string>{});
  }
}

TEST_CASE(
    "TCP in shared memory: mismatched calls make every rank throw, naming both calls, also when one size "
    "is beyond the slot",
    "[bootstrap][tcp][shm][failure]") {
  CleanEnv env;
  constexpr int n = 3;
  struct Case {
    const char* name;
    std::function<void(gin::Bootstrap&, std::vector<char>&)> call;
    std::string phrase;
  };
  const std::vector<Case> cases = {
      {"bytesPerRank 8 and 16",
       [](gin::Bootstrap& b, std::vector<char>& buf) { b.allGather(buf.data(), b.rank() == 1 ? 16 : 8); },
       "rank 1 called allGather #2 (bytesPerRank 16) while rank 0 called allGather #2 (bytesPerRank 8)"},
      {"bytesPerRank 8 and one beyond the slot",
       [](gin::Bootstrap& b, std::vector<char>& buf) { b.allGather(buf.data(), b.rank() == 2 ? 100'000 : 8); },
       "rank 2 called allGather #2 (bytesPerRank 100000) while rank 0 called allGather #2 (bytesPerRank 8)"},
      {"a broadcast beyond the slot against barriers",
       [](gin::Bootstrap& b, std::vector<char>& buf) {
         if (b.rank() == 0)
           b.broadcast(buf.data(), 70'000, 0);
         else
           b.barrier();
       },
       "rank 1 called barrier #2 while rank 0 called broadcast #2 (bytes 70000, root 0)"},
      {"broadcast roots", [](gin::Bootstrap& b, std::vector<char>& buf) { b.broadcast(buf.data(), 4, b.rank() / 2); },
       "rank 2 called broadcast #2 (bytes 4, root 1) while rank 0 called broadcast #2 (bytes 4, root 0)"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    SharedArea sh;
    const gin::UniqueId id = loopbackId();
    const auto codes = forkRanks(n, sh.get(), [&](int rank) {
      gin::TcpBootstrap b(id, rank, n, timeoutMs(5000));
      if (!b.sharedMemory()) return 1;
      b.barrier();
      std::vector<char> buf(n * 100'000);
      return expectError(sh.get(), rank, [&] { c.call(b, buf); }, {c.phrase}, 2.0);
    });
    INFO(report(codes, sh.get()));
    CHECK(codes == std::vector<int>{kOk, kOk, kOk});
  }
}

TEST_CASE(
    "TCP in shared memory: a bad argument on one rank mid-sequence fails every other rank promptly with its reason",
    "[bootstrap][tcp][shm][failure]") {
  CleanEnv env;
  constexpr int n = 3;
  for (int bad : {2, 0}) {
    for (bool late : {false, true}) {
      CAPTURE(bad, late);
      SharedArea sh;
      const gin::UniqueId id = loopbackId();
      const auto codes = forkRanks(n, sh.get(), [&](int rank) {
        gin::TcpBootstrap b(id, rank, n, timeoutMs(10'000));
        if (!b.sharedMemory()) return 1;
        std::vector<uint64_t> buf(n);
        for (int i = 0; i < 20; ++i) {
          buf[static_cast<size_t>(rank)] = static_cast<uint64_t>(rank * 1000 + i);
          b.allGather(buf.data(), sizeof(uint64_t));
          for (int p = 0; p < n; ++p)
            if (buf[static_cast<size_t>(p)] != static_cast<uint64_t>(p * 1000 + i)) return 1;
        }
        // Late: the others are already waiting in the call when the bad one arrives.
        if (late && rank == bad) std::this_thread::sleep_for(200ms);
        const std::vector<std::string> phrases =
            rank == bad ? std::vector<std::string>{"allGather #21 (bytesPerRank 8): allGather: data is null"}
                        : std::vector<std::string>{"rank " + std::to_string(bad) + " failed in allGather #21",
                                                   "data is null"};
        const int code = expectError(
            sh.get(), rank, [&] { b.allGather(rank == bad ? nullptr : buf.data(), sizeof(uint64_t)); }, phrases,
            2.0);
        if (code != kOk) return code;
        try {
          b.barrier();
        } catch (const gin::Error& e) {
          return std::string(e.what()).find("unusable after an earlier failure") != std::string::npos ? kOk : 9;
        }
        return 10;
      });
      INFO(report(codes, sh.get()));
      CHECK(codes == std::vector<int>{kOk, kOk, kOk});
    }
  }
}

TEST_CASE(
    "TCP in shared memory: a rank process that is killed makes every other rank throw, naming it, long before "
    "the timeout; the segment was gone from /dev/shm since the rendezvous",
    "[bootstrap][tcp][shm][failure]") {
  CleanEnv env;
  constexpr int n = 4;
  for (int victim : {2, 0}) {
    CAPTURE(victim);
    SharedArea sh;
    const gin::UniqueId id = loopbackId();
    const int port = portOf(id);
    const std::string phrase = victim == 0 ? std::string("lost the connection to rank 0")
                                           : "rank " + std::to_string(victim) + " closed its connection";
    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    std::fflush(nullptr);
    std::vector<pid_t> pids;
    for (int rank = 0; rank < n; ++rank) {
      const pid_t pid = ::fork();
      REQUIRE(pid >= 0);
      if (pid == 0) {
        ::close(ready[0]);
        int code = 1;
        try {
          gin::TcpBootstrap b(id, rank, n, timeoutMs(30'000));
          uint64_t x[n] = {};
          code = !b.sharedMemory() ? 1
                                   : expectError(
                                         sh.get(), rank,
                                         [&] {
                                           for (int k = 1; k <= 10'000'000; ++k) {  // the victim dies long before
                                             b.barrier();
                                             x[rank] = static_cast<uint64_t>(k);
                                             b.allGather(x, sizeof x[0]);
                                             if (k == 200 && rank == victim) (void)!::write(ready[1], "x", 1);
                                           }
                                         },
                                         {phrase}, 30.0);
        } catch (const std::exception& e) {
          note(sh.get(), rank, std::string("unexpected: ") + e.what());
          code = 100;
        }
        ::_exit(code);
      }
      pids.push_back(pid);
    }
    ::close(ready[1]);
    pollfd p{ready[0], POLLIN, 0};
    REQUIRE(::poll(&p, 1, 30'000) == 1);
    // Every rank mapped the segment long ago; its name must be gone already.
    CHECK(shmLeft(port) == std::vector<std::string>{});
    ::kill(pids[static_cast<size_t>(victim)], SIGKILL);
    double lastS = 0;
    const auto status = gintest::reap(pids, Clock::now(), 25, &lastS);
    ::close(ready[0]);
    INFO(report(status, sh.get()));
    for (int r = 0; r < n; ++r) CHECK(status[static_cast<size_t>(r)] == (r == victim ? 128 + SIGKILL : kOk));
    CHECK(lastS < 3.0);  // the 30 s timeout was not waited out
    CHECK(shmLeft(port) == std::vector<std::string>{});
  }
}

TEST_CASE(
    "TCP in shared memory: a rank that does not arrive makes the others throw at the timeout naming it, "
    "and the late rank learns why when it comes",
    "[bootstrap][tcp][shm][failure]") {
  CleanEnv env;
  SharedArea sh;
  const gin::UniqueId id = loopbackId();
  const auto codes = forkRanks(3, sh.get(), [&](int rank) {
    gin::TcpBootstrap b(id, rank, 3, timeoutMs(500));
    if (!b.sharedMemory()) return 1;
    b.barrier();
    if (rank == 2) {
      std::this_thread::sleep_for(1500ms);
      return expectError(sh.get(), rank, [&] { b.barrier(); }, {"rank 2 of 3 did not join barrier #2"}, 0.2);
    }
    return expectError(
        sh.get(), rank, [&] { b.barrier(); }, {"rank 2 of 3 did not join barrier #2 within 0.5 s"}, 1.5, 0.45);
  });
  INFO(report(codes, sh.get()));
  CHECK(codes == std::vector<int>{kOk, kOk, kOk});
}

// =============================================================================
// detectLaunch
// =============================================================================

TEST_CASE("detectLaunch with no launcher variables is a single rank", "[bootstrap][env]") {
  CleanEnv env;
  const auto li = gin::detectLaunch();
  CHECK(li.source == "single");
  CHECK(li.rank == 0);
  CHECK(li.nRanks == 1);
  CHECK(li.localRank == 0);
  CHECK(li.localSize == 1);
  CHECK(li.masterAddr == "127.0.0.1");
}

TEST_CASE("detectLaunch reads torchrun's variables, and they take precedence over Slurm and Open MPI",
          "[bootstrap][env]") {
  CleanEnv env;
  env.set("RANK", "3");
  env.set("WORLD_SIZE", "8");
  env.set("LOCAL_RANK", "1");
  env.set("LOCAL_WORLD_SIZE", "2");
  env.set("MASTER_ADDR", "10.1.2.3");
  env.set("MASTER_PORT", "29500");
  env.set("SLURM_PROCID", "6");
  env.set("SLURM_NTASKS", "7");
  env.set("OMPI_COMM_WORLD_RANK", "5");
  env.set("OMPI_COMM_WORLD_SIZE", "6");
  const auto li = gin::detectLaunch();
  CHECK(li.source == "torchrun");
  CHECK(li.rank == 3);
  CHECK(li.nRanks == 8);
  CHECK(li.localRank == 1);
  CHECK(li.localSize == 2);
  CHECK(li.masterAddr == "10.1.2.3");
  CHECK(li.masterPort == 29500);
}

TEST_CASE("detectLaunch under torchrun's agent (TORCHELASTIC_RUN_ID) takes MASTER_PORT + 1; GIN_BOOTSTRAP_PORT wins",
          "[bootstrap][env]") {
  CleanEnv env;
  env.set("RANK", "0");
  env.set("WORLD_SIZE", "2");
  env.set("MASTER_ADDR", "127.0.0.1");
  env.set("MASTER_PORT", "29500");
  env.set("TORCHELASTIC_RUN_ID", "none");
  CHECK(gin::detectLaunch().masterPort == 29501);  // the agent's TCPStore listens on 29500
  env.set("GIN_BOOTSTRAP_PORT", "31000");
  CHECK(gin::detectLaunch().masterPort == 31000);
  env.set("GIN_BOOTSTRAP_PORT", "70000");
  CHECK_THROWS_WITH(gin::detectLaunch(), ContainsSubstring("GIN_BOOTSTRAP_PORT"));
  ::unsetenv("GIN_BOOTSTRAP_PORT");
  env.set("MASTER_PORT", "65535");
  CHECK_THROWS_WITH(gin::detectLaunch(), ContainsSubstring("set GIN_BOOTSTRAP_PORT"));
  ::unsetenv("TORCHELASTIC_RUN_ID");
  CHECK(gin::detectLaunch().masterPort == 65535);
}

TEST_CASE(
    "detectLaunch reads Slurm's variables: address and port fallbacks, tasks per node, precedence over "
    "Open MPI",
    "[bootstrap][env]") {
  CleanEnv env;
  env.set("SLURM_PROCID", "5");
  env.set("SLURM_NTASKS", "8");
  env.set("SLURM_LOCALID", "1");
  env.set("SLURM_NTASKS_PER_NODE", "4");
  env.set("SLURM_LAUNCH_NODE_IPADDR", "10.0.0.7");
  env.set("SLURM_JOB_ID", "123456");
  env.set("OMPI_COMM_WORLD_RANK", "0");
  env.set("OMPI_COMM_WORLD_SIZE", "2");
  auto li = gin::detectLaunch();
  CHECK(li.source == "slurm");
  CHECK(li.rank == 5);
  CHECK(li.nRanks == 8);
  CHECK(li.localRank == 1);
  CHECK(li.localSize == 4);
  CHECK(li.masterAddr == "10.0.0.7");
  CHECK(li.masterPort == 20000 + 123456 % 20000);

  env.set("MASTER_ADDR", "node17");
  env.set("MASTER_PORT", "31000");
  li = gin::detectLaunch();
  CHECK(li.masterAddr == "node17");
  CHECK(li.masterPort == 31000);

  // Without SLURM_NTASKS_PER_NODE the node's count comes from SLURM_TASKS_PER_NODE.
  ::unsetenv("SLURM_NTASKS_PER_NODE");
  env.set("SLURM_TASKS_PER_NODE", "2(x3),1");
  env.set("SLURM_NODEID", "2");
  CHECK(gin::detectLaunch().localSize == 2);
  env.set("SLURM_NODEID", "3");
  env.set("SLURM_LOCALID", "0");
  CHECK(gin::detectLaunch().localSize == 1);
  env.set("SLURM_NODEID", "4");
  CHECK_THROWS_WITH(gin::detectLaunch(), ContainsSubstring("SLURM_TASKS_PER_NODE=\"2(x3),1\""));
  env.set("SLURM_TASKS_PER_NODE", "2(y3)");
  env.set("SLURM_NODEID", "0");
  CHECK_THROWS_WITH(gin::detectLaunch(), ContainsSubstring("SLURM_TASKS_PER_NODE"));

  // No address at all for a multi-rank job: say what to set.
  ::unsetenv("MASTER_ADDR");
  ::unsetenv("SLURM_LAUNCH_NODE_IPADDR");
  env.set("SLURM_TASKS_PER_NODE", "8");
  CHECK_THROWS_WITH(gin::detectLaunch(), ContainsSubstring("MASTER_ADDR") && ContainsSubstring("slurm"));
}

TEST_CASE("detectLaunch reads Open MPI's variables and asks for MASTER_ADDR/MASTER_PORT when they are missing",
          "[bootstrap][env]") {
  CleanEnv env;
  env.set("OMPI_COMM_WORLD_RANK", "2");
  env.set("OMPI_COMM_WORLD_SIZE", "4");
  env.set("OMPI_COMM_WORLD_LOCAL_RANK", "0");
  env.set("OMPI_COMM_WORLD_LOCAL_SIZE", "2");
  CHECK_THROWS_WITH(gin::detectLaunch(), ContainsSubstring("MASTER_ADDR") && ContainsSubstring("MASTER_PORT"));
  env.set("MASTER_ADDR", "192.168.1.10");
  CHECK_THROWS_WITH(gin::detectLaunch(), ContainsSubstring("MASTER_PORT"));
  env.set("MASTER_PORT", "29400");
  const auto li = gin::detectLaunch();
  CHECK(li.source == "openmpi");
  CHECK(li.rank == 2);
  CHECK(li.nRanks == 4);
  CHECK(li.localRank == 0);
  CHECK(li.localSize == 2);
  CHECK(li.masterAddr == "192.168.1.10");
  CHECK(li.masterPort == 29400);
}

TEST_CASE("detectLaunch reads GIN_RANK/GIN_NRANKS when no launcher is found", "[bootstrap][env]") {
  CleanEnv env;
  env.set("GIN_RANK", "1");
  env.set("GIN_NRANKS", "2");
  env.set("MASTER_ADDR", "127.0.0.1");
  env.set("MASTER_PORT", "29501");
  const auto li = gin::detectLaunch();
  CHECK(li.source == "gin");
  CHECK(li.rank == 1);
  CHECK(li.nRanks == 2);
  CHECK(li.masterPort == 29501);
}

TEST_CASE("detectLaunch rejects malformed values with an error naming the variable and the value", "[bootstrap][env]") {
  struct Case {
    std::vector<std::pair<const char*, const char*>> vars;
    std::vector<std::string> phrases;
  };
  const std::vector<Case> cases = {
      {{{"RANK", "abc"}, {"WORLD_SIZE", "4"}}, {"RANK=\"abc\"", "is not allowed: expected an integer from 0 to"}},
      {{{"RANK", "1"}, {"WORLD_SIZE", "4x"}}, {"WORLD_SIZE=\"4x\""}},
      {{{"RANK", " 1"}, {"WORLD_SIZE", "4"}}, {"RANK=\" 1\""}},
      {{{"RANK", "4"}, {"WORLD_SIZE", "4"}}, {"RANK=4 is not below WORLD_SIZE=4"}},
      {{{"RANK", "-1"}, {"WORLD_SIZE", "4"}}, {"RANK=\"-1\"", "expected an integer from 0 to"}},
      {{{"RANK", "0"}, {"WORLD_SIZE", "0"}}, {"WORLD_SIZE=\"0\"", "expected an integer from 1 to"}},
      {{{"RANK", "0"}, {"WORLD_SIZE", "99999999999999999999"}}, {"WORLD_SIZE=\"99999999999999999999\""}},
      {{{"RANK", "1"}}, {"RANK is set but WORLD_SIZE is not"}},
      {{{"WORLD_SIZE", "2"}}, {"WORLD_SIZE is set but RANK is not"}},
      {{{"RANK", "1"},
        {"WORLD_SIZE", "2"},
        {"LOCAL_RANK", "2"},
        {"LOCAL_WORLD_SIZE", "2"},
        {"MASTER_ADDR", "h"},
        {"MASTER_PORT", "1"}},
       {"LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"}},
      {{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}}, {"MASTER_PORT=\"70000\"", "expected an integer from 1 to 65535"}},
      {{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "http"}}, {"MASTER_PORT=\"http\""}},
      {{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}}, {"MASTER_ADDR"}},
      {{{"SLURM_PROCID", "x"}, {"SLURM_NTASKS", "2"}}, {"SLURM_PROCID=\"x\""}},
      {{{"SLURM_PROCID", "0"}}, {"SLURM_NTASKS is not"}},
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LAUNCH_NODE_IPADDR", "h"}, {"SLURM_JOB_ID", "j1"}},
       {"SLURM_JOB_ID=\"j1\""}},
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "3"}, {"SLURM_NTASKS_PER_NODE", "2"}},
       {"SLURM_LOCALID=3"}},
      {{{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2x"}}, {"OMPI_COMM_WORLD_SIZE=\"2x\""}},
      {{{"OMPI_COMM_WORLD_RANK", "1"}}, {"OMPI_COMM_WORLD_SIZE is not"}},
      {{{"GIN_RANK", "2"}, {"GIN_NRANKS", "2"}}, {"GIN_RANK=2 is not below GIN_NRANKS=2"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    CleanEnv env;
    std::string setting;
    for (auto [k, v] : cases[i].vars) {
      env.set(k, v);
      setting += std::string(k) + "=" + v + " ";
    }
    CAPTURE(i, setting);
    std::string msg;
    try {
      gin::detectLaunch();
    } catch (const gin::Error& e) {
      msg = e.what();
    }
    for (const auto& p : cases[i].phrases) CHECK_THAT(msg, ContainsSubstring(p));
  }
}

TEST_CASE("detectLaunch treats empty variables as unset and allows a one-rank job without MASTER_ADDR",
          "[bootstrap][env]") {
  CleanEnv env;
  env.set("RANK", "");
  env.set("WORLD_SIZE", "");
  CHECK(gin::detectLaunch().source == "single");
  env.set("OMPI_COMM_WORLD_RANK", "0");
  env.set("OMPI_COMM_WORLD_SIZE", "1");
  const auto li = gin::detectLaunch();
  CHECK(li.source == "openmpi");
  CHECK(li.nRanks == 1);
  auto b = gin::TcpBootstrap::fromEnvironment();
  CHECK(b->nRanks() == 1);
  b->barrier();
}

TEST_CASE("the environment is restored after the detectLaunch tests", "[bootstrap][env]") {
  const char* before = std::getenv("RANK");
  const std::string saved = before ? before : "<unset>";
  {
    CleanEnv env;
    env.set("RANK", "123");
  }
  const char* after = std::getenv("RANK");
  CHECK((after ? std::string(after) : std::string("<unset>")) == saved);
}
