// GPU suite, one process per rank (the usual launch): the test starts
// itself once per rank with torchrun's variables (RANK, WORLD_SIZE,
// LOCAL_RANK, MASTER_ADDR, MASTER_PORT), 2, 3 and 4 ranks (and 8 on 4 GPUs),
// round-robin on the GPUs, so processes share a GPU where there are more
// ranks than GPUs; each rank bootstraps over TCP, maps its peers' windows
// with CUDA IPC handles (lsa) and runs put/signal/barrier kernels. Skips
// (exit 77) where no GPU is visible.
//
// Over the proxy (GIN_TRANSPORT=proxy) it then
// injects faults into 3 GPU ranks whose kernels spin in a put/wait ring:
// rank 2 killed (SIGKILL) mid-run, and over the tcp wire rank 1 cutting its
// connection to rank 2. The survivors' kernels must stop, every survivor
// must report a gin::Error, and within a bound: 10 s where the wire sees the
// loss (tcp, 20 s wait timeout), the timeout plus 10 s where only a wait can
// notice (the local wire: one rank times out, its failure stops the others).
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "../common/processes.hpp"
#include "gin/host/test_access.hpp"
#include "gpu_common.cuh"

extern char** environ;
using namespace gin;

namespace {
__global__ void ring(DevComm dc, Window dst, Window src, size_t bytes, int rounds, int* bad) {
  Net net(dc, blockIdx.x % dc.nContexts);
  const int next = (dc.rank + 1) % dc.nRanks;
  for (int r = 1; r <= rounds; ++r) {
    // Each CTA moves its own share with the whole block.
    const size_t share = (bytes + gridDim.x - 1) / gridDim.x, off = share * blockIdx.x;
    const size_t len = off >= bytes ? 0 : (bytes - off < share ? bytes - off : share);
    net.put(teamWorld(dc), next, dst, off, src, off, len, SignalInc{blockIdx.x}, None{}, CoopBlock{});
    if (!net.waitSignal(CoopBlock{}, blockIdx.x, uint64_t(r))) {
      atomicAdd(bad, 1000);
      return;
    }
    LsaBarrierSession<CoopBlock> bar(CoopBlock{}, dc, blockIdx.x);
    if (!bar.sync(CoopBlock{})) {
      atomicAdd(bad, 1000);
      return;
    }
  }
}

// One thread per rank: put 256 bytes with SignalInc to the next rank, wait
// for the previous rank's signal to reach the round, for `rounds` rounds;
// every 64 rounds the round number goes to mapped host memory.
__global__ void faultRing(DevComm dc, Window w, uint64_t rounds, volatile uint64_t* progress, int* bad) {
  Net net(dc, 0);
  const int next = (dc.rank + 1) % dc.nRanks;
  for (uint64_t r = 1; r <= rounds; ++r) {
    net.put(teamWorld(dc), next, w, 0, w, 4096, 256, SignalInc{0});
    if (!net.waitSignal(CoopThread{}, 0, r)) {
      *bad = 1;
      return;
    }
    if (r % 64 == 0) {
      *progress = r;
      __threadfence_system();
    }
  }
}

constexpr int kVictim = 2;

// A rank of the fault cases (GIN_TEST_FAULT=kill or cut). Exit 0: this
// rank's kernel stopped and its Comm holds an error (survivors), or it is
// the victim of "cut" and did the same.
int faultWorker(const std::string& mode) {
  auto bs = TcpBootstrap::fromEnvironment();
  Comm comm(*bs, gputest::gpuConfig());
  const int me = comm.rank();
  const int readyFd = std::atoi(std::getenv("GIN_TEST_READY_FD"));
  Window w = comm.allocWindow(8192);
  uint64_t* progress = nullptr;
  int* bad = nullptr;
  GPU_CHECK(cudaHostAlloc(&progress, sizeof *progress, cudaHostAllocMapped));
  *progress = 0;
  GPU_CHECK(cudaMalloc(&bad, sizeof(int)));
  GPU_CHECK(cudaMemset(bad, 0, sizeof(int)));
  cudaStream_t st = nullptr;
  GPU_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  GPU_CHECK(cudaDeviceSynchronize());
  comm.bootstrap().barrier();
  // Rank 1's device waits give up after a minute only: within the bound it
  // stops because a wire noticed the fault or another rank's failure says so.
  DevComm dc = comm.devComm();
  if (me == 1) dc.timeoutNs = 60'000'000'000ull;
  faultRing<<<1, 1, 0, st>>>(dc, w, uint64_t(1) << 40, progress, bad);
  GPU_CHECK(cudaGetLastError());
  bool told = false;
  cudaError_t q;
  while ((q = cudaStreamQuery(st)) == cudaErrorNotReady) {
    if (!told && *static_cast<volatile uint64_t*>(progress) >= 256) {
      told = true;
      // The ring runs: now the fault. "kill": the parent kills the victim
      // when it says so; "cut": rank 1 shuts its tcp send side to rank 2.
      if (mode == "cut" && me == 1) gin::test::CommAccess::tcpWire(comm)->shutdownSendForTest(kVictim);
      if ((mode == "kill" && me == kVictim) || (mode == "cut" && me == 1)) {
        const char b = 1;
        (void)!write(readyFd, &b, 1);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  int hb = 0;
  cudaMemcpy(&hb, bad, sizeof hb, cudaMemcpyDeviceToHost);
  std::string msg;
  try {
    comm.check();
  } catch (const gin::Error& e) {
    msg = e.what();
  }
  std::fprintf(stderr, "rank %d (%s): kernel %s after %llu rounds; %s\n", me, mode.c_str(),
               q == cudaSuccess ? "ended" : cudaGetErrorString(q), (unsigned long long)*progress,
               msg.empty() ? "no error recorded" : msg.c_str());
  std::fflush(stderr);
  const bool ok = q == cudaSuccess && hb == 1 && !msg.empty();
  _exit(ok ? 0 : 11);  // not through the Comm's collective teardown: a peer is gone
}

int worker() {
  if (const char* f = std::getenv("GIN_TEST_FAULT")) return faultWorker(f);
  auto bs = TcpBootstrap::fromEnvironment();
  Comm comm(*bs, gputest::gpuConfig());
  const int me = comm.rank(), n = comm.nRanks(), prev = (me + n - 1) % n;
  if (comm.lsaSize() != n) {
    std::fprintf(stderr, "rank %d: expected all %d ranks in the lsa team, got %d\n", me, n, comm.lsaSize());
    return 3;
  }
  constexpr size_t kBytes = (8 << 20) + 5;
  Window src = comm.allocWindow(kBytes), dst = comm.allocWindow(kBytes);
  std::vector<uint8_t> h(kBytes);
  for (size_t i = 0; i < kBytes; ++i) h[i] = gputest::pattern(7, me, i);
  cudaMemcpy(comm.localPointer(src), h.data(), kBytes, cudaMemcpyHostToDevice);
  cudaMemset(comm.localPointer(dst), 0xAB, kBytes);
  // A user buffer from cudaMalloc, registered at an interior offset.
  char* user = nullptr;
  GPU_CHECK(cudaMalloc(&user, 1 << 16));
  Window uw = comm.registerWindow(user + 256, 4096);
  cudaDeviceSynchronize();
  comm.bootstrap().barrier();
  int* bad = nullptr;
  GPU_CHECK(cudaMalloc(&bad, sizeof(int)));
  GPU_CHECK(cudaMemset(bad, 0, sizeof(int)));
  ring<<<32, 512>>>(comm.devComm(), dst, src, kBytes, 10, bad);
  GPU_CHECK(cudaGetLastError());  // a launch that failed ran nothing
  comm.synchronize();
  int hb = -1;
  cudaMemcpy(&hb, bad, sizeof hb, cudaMemcpyDeviceToHost);
  cudaMemcpy(h.data(), comm.localPointer(dst), kBytes, cudaMemcpyDeviceToHost);
  size_t wrong = 0;
  for (size_t i = 0; i < kBytes; ++i) wrong += h[i] != gputest::pattern(7, prev, i);
  comm.bootstrap().barrier();
  comm.deregisterWindow(uw);
  cudaFree(user);
  cudaFree(bad);
  std::printf("rank %d of %d (GPU %d): %zu wrong bytes, barrier/wait failures %d\n", me, n, comm.cudaDevice(), wrong,
              hb);
  return (wrong == 0 && hb == 0) ? 0 : 1;
}
}  // namespace

// Starts rank r of n as a fresh program (not fork: CUDA state is never
// shared) with torchrun's variables and `extra`.
pid_t spawnRank(int r, int n, int port, const std::vector<std::string>& extra) {
  std::vector<std::string> set = {"RANK=" + std::to_string(r), "LOCAL_RANK=" + std::to_string(r),
                                  "WORLD_SIZE=" + std::to_string(n), "LOCAL_WORLD_SIZE=" + std::to_string(n),
                                  "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port)};
  set.insert(set.end(), extra.begin(), extra.end());
  // The parent's environment without the variables set here (getenv would
  // return the first of two).
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e, key = kv.substr(0, kv.find('=') + 1);
    if (std::none_of(set.begin(), set.end(), [&](const std::string& v) { return v.rfind(key, 0) == 0; }))
      env.push_back(kv);
  }
  env.insert(env.end(), set.begin(), set.end());
  std::vector<char*> envp;
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  char self[] = "/proc/self/exe";
  char* argv[] = {self, nullptr};
  pid_t pid = 0;
  if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()) != 0) return -1;
  return pid;
}

// One fault case with 3 ranks: true when it passed. `boundS`: the most
// seconds from the fault to the last survivor's exit.
bool faultCase(const std::string& mode, uint64_t timeoutMs, double boundS) {
  using Clock = std::chrono::steady_clock;
  int ready[2];
  if (pipe(ready) != 0) return false;
  const int port = 20000 + int(getpid() % 20000) + (mode == "kill" ? 7 : 8);
  std::vector<pid_t> pids;
  for (int r = 0; r < 3; ++r)
    pids.push_back(spawnRank(r, 3, port,
                             {"GIN_TEST_FAULT=" + mode, "GIN_TEST_READY_FD=" + std::to_string(ready[1]),
                              "GIN_TIMEOUT_MS=" + std::to_string(timeoutMs)}));
  close(ready[1]);
  pollfd p{ready[0], POLLIN, 0};
  const bool started = poll(&p, 1, 120000) == 1;
  if (started && mode == "kill") kill(pids[kVictim], SIGKILL);
  // Not started within 2 minutes: reaped at once (killed, status 124).
  double last = 0;
  const std::vector<int> status = gintest::reap(pids, Clock::now(), started ? boundS + 30 : 0, &last);
  close(ready[0]);
  bool ok = started;
  for (int r = 0; r < 3; ++r) ok = ok && status[size_t(r)] == (mode == "kill" && r == kVictim ? 128 + SIGKILL : 0);
  ok = ok && last < boundS;
  std::printf("fault '%s' (3 processes, %llu ms wait timeout): exit codes %d %d %d, every rank out %.3f s after the "
              "fault (bound %.0f s): %s\n",
              mode.c_str(), (unsigned long long)timeoutMs, status[0], status[1], status[2], last, boundS,
              ok ? "passed" : "FAILED");
  std::fflush(stdout);
  return ok;
}

int main() {
  if (std::getenv("RANK")) {
    try {
      return worker();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %s: %s\n", std::getenv("RANK"), e.what());
      return 2;
    }
  }
  // Parent: spawn fresh programs (not fork), so CUDA state is never shared.
  const int gpus = gputest::gpuCount();
  if (gpus == 0) return gputest::skipNoGpu("GPU processes suite");
  // Processes go round-robin on the GPUs: one per GPU up to the GPU count,
  // then several share one, each its own CUDA context (so
  // CUDA_DEVICE_MAX_CONNECTIONS=1 holds nobody up). Over lsa the processes
  // sharing a GPU map each other's windows with CUDA IPC handles and their
  // kernels take turns on it (time slices): every wait must still end.
  // Over the proxy (GIN_TRANSPORT=proxy) the GPUs never address each other.
  const char* tr = std::getenv("GIN_TRANSPORT");
  const bool proxy = tr && std::string(tr) == "proxy";
  int failures = 0;
  std::vector<int> counts = {2, 3, 4};
  if (gpus >= 4) counts.push_back(2 * gpus);  // two processes per GPU on every GPU
  for (int n : counts) {
    std::vector<pid_t> pids;
    const int port = 20000 + int(getpid() % 20000) + n;
    for (int r = 0; r < n; ++r) {
      const pid_t pid = spawnRank(r, n, port, {});
      if (pid < 0) return 2;
      pids.push_back(pid);
    }
    int failed = 0;
    for (pid_t pid : pids) {
      int st = 0;
      waitpid(pid, &st, 0);
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) ++failed;
    }
    failures += failed;
    std::printf("%d processes on %d GPU(s)%s: %s\n", n, std::min(n, gpus), n > gpus ? " (sharing)" : "",
                failed ? "FAILED" : "passed");
    std::fflush(stdout);
  }
  if (proxy) {
    const char* w = std::getenv("GIN_PROXY_WIRE");
    if (w && std::string(w) == "tcp") {
      // The wire notices: well inside the 20 s timeout.
      failures += !faultCase("kill", 20000, 10);
      failures += !faultCase("cut", 20000, 10);
    } else {
      // Shared memory: a dead peer is noticed by the first wait that times
      // out (5 s here); its failure ends the others' waits.
      failures += !faultCase("kill", 5000, 15);
    }
  }
  return failures ? 1 : 0;
}
