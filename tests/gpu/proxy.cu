// GPU suite, proxy transport: descriptor rings in mapped host memory filled
// by every warp of many CTAs, drained by the host engine (copy-engine copies,
// signals and counters applied by CPU atomics). The lsa suite also runs with
// GIN_TRANSPORT=proxy (meson test gpu_lsa_as_proxy); this file adds what only
// the proxy has: tiny rings whose credits wrap many times under contention,
// flush as a promise about sources, and failures found by the host engine.
// Skips (exit 77) where no GPU is visible.
#include <catch2/catch_session.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "gin/host/test_access.hpp"
#include "gpu_common.cuh"

using namespace gin;
using gin::test::CommAccess;
using gputest::expect;

namespace {
CommConfig proxyConfig(uint32_t ringSlots, uint64_t timeoutNs = gputest::suiteTimeoutNs()) {
  CommConfig c = gputest::gpuConfig(timeoutNs);
  c.transport = TransportChoice::Proxy;
  c.proxy.ringSlots = ringSlots;
  return c;
}

// Over the proxy the GPUs never address each other, so ranks may share a GPU
// (round-robin): 1, 2, 3, 4 and 8 ranks run even on a one-GPU machine. Each rank
// launches on its own non-blocking stream, so ranks sharing a GPU run their
// kernels side by side.
std::vector<int> rankCounts() {
  std::vector<int> v;
  for (int n : {1, 2, 3, 4, 8})
    if (gputest::queuesFor(n) && n <= gputest::maxRanks()) v.push_back(n);
  return v;
}

void runRanks(int n, const std::function<void(Comm&, cudaStream_t)>& body, CommConfig cfg) {
  gputest::runRanksOnStreams(n, body, cfg);
}

// Every warp sends `per` SignalAdds to every rank; warp w of CTA b adds
// (b * warps + w) % 7 + 1 each time, on context b % nContexts, signal
// b % nContexts. Lane 0 pushes, so every warp is a separate producer.
__global__ void signalStorm(DevComm dc, int per) {
  const int ctx = int(blockIdx.x) % dc.nContexts;
  Net net(dc, ctx);
  const int warp = int(threadIdx.x) / 32, warps = int(blockDim.x) / 32;
  const uint64_t add = uint64_t((int(blockIdx.x) * warps + warp) % 7 + 1);
  if (threadIdx.x % 32 != 0) return;
  for (int i = 0; i < per; ++i)
    for (int p = 0; p < dc.nRanks; ++p)
      net.signal(teamWorld(dc), (p + dc.rank) % dc.nRanks, SignalAdd{uint32_t(ctx), add}, CoopThread{});
}

__global__ void waitSums(DevComm dc, const uint64_t* want, int* ok) {
  Net net(dc, int(blockIdx.x));
  const bool good = net.waitSignal(CoopBlock{}, blockIdx.x, want[blockIdx.x]);
  if (threadIdx.x == 0) ok[blockIdx.x] = good ? 1 : 0;
}
}  // namespace

TEST_CASE("GPU proxy: every warp of 132 CTAs pushes signals through 16-slot rings; none lost, none run twice",
          "[gpu][proxy][contention]") {
  for (int n : rankCounts()) {
    CAPTURE(n);
    REQUIRE_NOTHROW(runRanks(
        n,
        [n](Comm& comm, cudaStream_t st) {
          const DevComm dc = comm.devComm();
          const int ctas = 132, threads = 256, warps = threads / 32, per = 8, nCtx = dc.nContexts;
          // Every rank runs the same storm, so each signal's total is the same everywhere.
          std::vector<uint64_t> want(static_cast<size_t>(nCtx), 0);
          for (int b = 0; b < ctas; ++b)
            for (int w = 0; w < warps; ++w) want[size_t(b % nCtx)] += uint64_t((b * warps + w) % 7 + 1) * per * n;
          uint64_t* wantDev = nullptr;
          int* ok = nullptr;
          GPU_CHECK(cudaMalloc(&wantDev, 8 * want.size()));
          GPU_CHECK(cudaMalloc(&ok, sizeof(int) * nCtx));
          GPU_CHECK(cudaMemcpy(wantDev, want.data(), 8 * want.size(), cudaMemcpyHostToDevice));
          comm.bootstrap().barrier();
          signalStorm<<<ctas, threads, 0, st>>>(dc, per);
          GPU_CHECK(cudaGetLastError());  // a launch that failed ran nothing
          waitSums<<<nCtx, 64, 0, st>>>(dc, wantDev, ok);
          GPU_CHECK(cudaGetLastError());  // a launch that failed ran nothing
          comm.synchronize();
          std::vector<int> okh(static_cast<size_t>(nCtx), 0);
          GPU_CHECK(cudaMemcpy(okh.data(), ok, sizeof(int) * nCtx, cudaMemcpyDeviceToHost));
          for (int c = 0; c < nCtx; ++c) expect(okh[size_t(c)] == 1, "signal " + std::to_string(c) + " short");
          // Every ring's consumer index counts exactly the descriptors pushed on it.
          comm.bootstrap().barrier();
          cudaFree(ok);  // after the barrier: see gpu_common.cuh
          cudaFree(wantDev);
          expect(CommAccess::proxyEngine(comm) && CommAccess::proxyEngine(comm)->quiesce(5'000'000'000ull),
                 "engine did not drain");
          expect(CommAccess::proxyEngine(comm)->executed() == uint64_t(ctas) * warps * per * n,
                 "executed " + std::to_string(CommAccess::proxyEngine(comm)->executed()));
          // Exact totals (not only "at least"): read the words after everyone is done.
          comm.bootstrap().barrier();
          std::vector<uint64_t> got(static_cast<size_t>(nCtx));
          GPU_CHECK(cudaMemcpy(got.data(), dc.signals, 8 * got.size(), cudaMemcpyDeviceToHost));
          for (int c = 0; c < nCtx; ++c)
            expect(got[size_t(c)] == want[size_t(c)], "signal " + std::to_string(c) + " = " +
                                                          std::to_string(got[size_t(c)]) + ", want " +
                                                          std::to_string(want[size_t(c)]));
          comm.bootstrap().barrier();
        },
        proxyConfig(16)));
  }
}

namespace {
// Round r: fill src with r's pattern, put it to the next rank with a counter,
// flush, then overwrite src at once. If flush returned before the engine had
// read src, the peer would see the overwrite (0xEE bytes) instead.
__global__ void putFlushReuse(DevComm dc, Window dst, Window src, size_t bytes, int rounds, int* bad) {
  Net net(dc, 1);
  const int next = (dc.rank + 1) % dc.nRanks;
  auto* s = static_cast<uint8_t*>(localPointer(src, 0));
  for (int r = 0; r < rounds; ++r) {
    for (size_t i = threadIdx.x; i < bytes; i += blockDim.x) s[i] = uint8_t(r * 31 + dc.rank * 7 + i);
    __syncthreads();
    net.put(teamWorld(dc), next, dst, size_t(r) * bytes, src, 0, bytes, SignalInc{3}, CounterInc{2}, CoopBlock{});
    if (!net.flush(CoopBlock{})) {
      if (threadIdx.x == 0) atomicAdd(bad, 1000);
      return;
    }
    if (net.readCounter(2) != uint64_t(r + 1) && threadIdx.x == 0) atomicAdd(bad, 1);
    for (size_t i = threadIdx.x; i < bytes; i += blockDim.x) s[i] = 0xEE;
    __syncthreads();
  }
  if (!net.waitSignal(CoopBlock{}, 3, uint64_t(rounds)) && threadIdx.x == 0) atomicAdd(bad, 100000);
}
}  // namespace

TEST_CASE("GPU proxy: flush means the engine has read the source; counters count consumed sources",
          "[gpu][proxy][flush]") {
  for (int n : rankCounts()) {
    CAPTURE(n);
    REQUIRE_NOTHROW(runRanks(
        n,
        [](Comm& comm, cudaStream_t st) {
          const DevComm dc = comm.devComm();
          const size_t bytes = 4099;  // odd size
          const int rounds = 40;
          Window src = comm.allocWindow(bytes);
          Window dst = comm.allocWindow(bytes * rounds);
          GPU_CHECK(cudaMemset(comm.localPointer(dst), 0xAB, bytes * rounds));
          int* bad = nullptr;
          GPU_CHECK(cudaMalloc(&bad, sizeof(int)));
          GPU_CHECK(cudaMemset(bad, 0, sizeof(int)));
          GPU_CHECK(cudaDeviceSynchronize());
          comm.bootstrap().barrier();
          putFlushReuse<<<1, 256, 0, st>>>(dc, dst, src, bytes, rounds, bad);
          GPU_CHECK(cudaGetLastError());  // a launch that failed ran nothing
          comm.synchronize();
          int h = -1;
          GPU_CHECK(cudaMemcpy(&h, bad, sizeof h, cudaMemcpyDeviceToHost));
          comm.bootstrap().barrier();  // no rank's kernel is waiting on its engine now (see gpu_common.cuh)
          cudaFree(bad);
          expect(h == 0, "flush/counter/signal failures: " + std::to_string(h));
          const int prev = (comm.rank() + comm.nRanks() - 1) % comm.nRanks();
          std::vector<uint8_t> d(bytes * rounds);
          GPU_CHECK(cudaMemcpy(d.data(), comm.localPointer(dst), d.size(), cudaMemcpyDeviceToHost));
          for (int r = 0; r < rounds; ++r)
            for (size_t i = 0; i < bytes; ++i)
              if (d[size_t(r) * bytes + i] != uint8_t(r * 31 + prev * 7 + i))
                expect(false, "round " + std::to_string(r) + " byte " + std::to_string(i) + " = " +
                                  std::to_string(d[size_t(r) * bytes + i]) + " (0xEE: flush came too early)");
          comm.bootstrap().barrier();
        },
        proxyConfig(64)));
  }
}

namespace {
// A descriptor naming a window that does not exist: only the host engine can
// tell. It must reject it (nothing written), record it, and stop the wait.
__global__ void badWindowThenWait(DevComm dc, int* toldOk) {
  if (threadIdx.x == 0) {
    ProxyDesc d{};
    d.op = uint8_t(ProxyOp::Put);
    d.peer = dc.rank;
    d.dstWindow = 9999;
    d.srcWindow = 9999;
    d.bytes = 8;
    d.counterId = kProxyNoCounter;
    proxy::push(dc, 0, d, true);
  }
  Net net(dc, 0);
  if (net.waitSignal(CoopBlock{}, 5, 1)) atomicAdd(toldOk, 1);
}
}  // namespace

TEST_CASE("GPU proxy: a descriptor the host engine rejects becomes a gin::Error and stops GPU waits",
          "[gpu][proxy][errors]") {
  std::string msg;
  int toldOk = -1;
  double seconds = 0;
  REQUIRE_NOTHROW(runRanks(
      1,
      [&](Comm& comm, cudaStream_t st) {
        int* d = nullptr;
        GPU_CHECK(cudaMalloc(&d, sizeof(int)));
        GPU_CHECK(cudaMemset(d, 0, sizeof(int)));
        const auto t0 = std::chrono::steady_clock::now();
        badWindowThenWait<<<2, 128, 0, st>>>(comm.devComm(), d);
        GPU_CHECK(cudaGetLastError());  // a launch that failed ran nothing
        try {
          comm.synchronize();
        } catch (const Error& e) {
          msg = e.what();
        }
        seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        GPU_CHECK(cudaMemcpy(&toldOk, d, sizeof(int), cudaMemcpyDeviceToHost));
        cudaFree(d);
      },
      proxyConfig(64, 30'000'000'000ull)));
  CHECK(toldOk == 0);
  CHECK(seconds < 20.0);  // the abort flag, not the 30 s timeout, ended the wait
  CHECK_THAT(msg, Catch::Matchers::ContainsSubstring("rank 0") && Catch::Matchers::ContainsSubstring("9999"));
}

int main(int argc, char** argv) {
  gputest::widenQueues();  // before CUDA starts
  if (gputest::gpuCount() == 0) return gputest::skipNoGpu("GPU proxy suite");
  std::printf("GPU proxy suite: %d GPU(s) visible\n", gputest::gpuCount());
  return Catch::Session().run(argc, argv);
}
