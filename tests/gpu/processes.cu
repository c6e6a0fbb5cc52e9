// GPU suite, one process per GPU (the usual launch): the test starts itself
// once per GPU with torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR, MASTER_PORT); each rank bootstraps over TCP, maps its peers'
// windows with CUDA IPC handles, and runs put/signal/barrier kernels.
// Skips (exit 77) with fewer than 2 GPUs.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>

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

int worker() {
  auto bs = TcpBootstrap::fromEnvironment();
  CommConfig cfg;
  cfg.device = DeviceKind::Gpu;
  cfg.timeoutNs = gputest::suiteTimeoutNs();
  Comm comm(*bs, cfg);
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
  // Over the proxy the GPUs never address each other, so the processes may
  // share GPUs (round-robin): 2, 3 and 4 even on one GPU, each process its
  // own CUDA context (so CUDA_DEVICE_MAX_CONNECTIONS=1 holds nobody up).
  const char* tr = std::getenv("GIN_TRANSPORT");
  const bool shared = tr && std::string(tr) == "proxy";
  if (gpus == 0) return gputest::skipNoGpu("GPU processes suite");
  if (gpus < 2 && !shared) {
    std::printf("SKIP one-process-per-GPU suite: %d GPU(s) visible, need 2 (or GIN_TRANSPORT=proxy)\n", gpus);
    return 77;
  }
  int failures = 0;
  for (int n : {2, 3, 4}) {
    if (n > gpus && !shared) break;
    if (n == 3 && !shared) continue;
    std::vector<pid_t> pids;
    const int port = 20000 + int(getpid() % 20000) + n;
    for (int r = 0; r < n; ++r) {
      std::vector<std::string> env;
      for (char** e = environ; *e; ++e) env.emplace_back(*e);
      env.push_back("RANK=" + std::to_string(r));
      env.push_back("LOCAL_RANK=" + std::to_string(r));
      env.push_back("WORLD_SIZE=" + std::to_string(n));
      env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(n));
      env.push_back("MASTER_ADDR=127.0.0.1");
      env.push_back("MASTER_PORT=" + std::to_string(port));
      std::vector<char*> envp;
      for (auto& s : env) envp.push_back(s.data());
      envp.push_back(nullptr);
      char self[] = "/proc/self/exe";
      char* argv[] = {self, nullptr};
      pid_t pid = 0;
      if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()) != 0) return 2;
      pids.push_back(pid);
    }
    for (pid_t pid : pids) {
      int st = 0;
      waitpid(pid, &st, 0);
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) ++failures;
    }
    std::printf("%d processes on %d GPU(s): %s\n", n, std::min(n, gpus), failures ? "FAILED" : "passed");
  }
  return failures ? 1 : 0;
}
