// GPU suite: the device API over the lsa transport on 1, 2 and 4 GPUs driven
// by one process (one thread and one Comm per GPU). Thread, warp and block
// coops; random data; poisoned destinations; waits that time out.
// Skips (exit 77) where no GPU is visible.
#include <catch2/catch_session.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cstdlib>
#include <string>

#include "gpu_common.cuh"

using namespace gin;
using gputest::expect;
using gputest::runGpus;

namespace {
constexpr uint8_t kPoison = 0xAB;
enum class Kind { Thread, Tile8, Warp, WarpSpan, Block };

// Block b: peer b % nRanks, context b / nRanks. Each rank's block lands in
// slot (ctx, me) of the peer's destination, at offset `mis` inside the slot.
template <Kind K>
__global__ void putAll(DevComm dc, Window dst, Window src, size_t bytes, size_t slot, size_t mis) {
  const int p = blockIdx.x % dc.nRanks, ctx = blockIdx.x / dc.nRanks;
  Net net(dc, ctx);
  const size_t off = (size_t(ctx) * dc.nRanks + dc.rank) * slot + mis;
  if constexpr (K == Kind::Thread) {
    if (threadIdx.x == 0)
      net.put(teamWorld(dc), p, dst, off, src, 1, bytes, SignalInc{uint32_t(ctx)}, CounterInc{0}, CoopThread{});
  } else if constexpr (K == Kind::Tile8) {
    // Lanes 8..15 of warp 1: an aligned tile that is not at the start of its warp.
    if (threadIdx.x >= 40 && threadIdx.x < 48)
      net.put(teamWorld(dc), p, dst, off, src, 1, bytes, SignalInc{uint32_t(ctx)}, CounterInc{0}, CoopTile<8>{});
  } else if constexpr (K == Kind::Warp) {
    if (threadIdx.x < 32)
      net.put(teamWorld(dc), p, dst, off, src, 1, bytes, SignalInc{uint32_t(ctx)}, CounterInc{0}, CoopWarp{});
  } else if constexpr (K == Kind::WarpSpan) {
    // Warps 2..5 of the block, on named barrier 1+3.
    if (threadIdx.x >= 64 && threadIdx.x < 192)
      net.put(teamWorld(dc), p, dst, off, src, 1, bytes, SignalInc{uint32_t(ctx)}, CounterInc{0},
              CoopWarpSpan{2, 4, 3});
  } else {
    net.put(teamWorld(dc), p, dst, off, src, 1, bytes, SignalInc{uint32_t(ctx)}, CounterInc{0}, CoopBlock{});
  }
}

__global__ void waitAll(DevComm dc, uint64_t expected, uint64_t expectedCounter, int* ok) {
  Net net(dc, blockIdx.x);
  bool good = net.waitSignal(CoopBlock{}, blockIdx.x, expected);
  if (blockIdx.x == 0) good = net.waitCounter(CoopBlock{}, 0, expectedCounter) && good;
  if (threadIdx.x == 0) ok[blockIdx.x] = good ? 1 : 0;
}

template <Kind K>
void putTest(int n, size_t bytes, size_t mis, uint64_t seed) {
  runGpus(n, [&](Comm& comm) {
    const DevComm dc = comm.devComm();
    const int nCtx = dc.nContexts, me = comm.rank();
    const size_t slot = bytes + 64, dstBytes = slot * size_t(n) * size_t(nCtx);
    Window src = comm.allocWindow(bytes + 1);
    Window dst = comm.allocWindow(dstBytes);
    std::vector<uint8_t> h(bytes + 1);
    for (size_t i = 0; i < bytes; ++i) h[1 + i] = gputest::pattern(seed, me, i);
    GPU_CHECK(cudaMemcpy(comm.localPointer(src), h.data(), h.size(), cudaMemcpyHostToDevice));
    GPU_CHECK(cudaMemset(comm.localPointer(dst), kPoison, dstBytes));
    GPU_CHECK(cudaDeviceSynchronize());
    comm.bootstrap().barrier();
    int* ok = nullptr;
    GPU_CHECK(cudaMalloc(&ok, sizeof(int) * nCtx));
    putAll<K><<<n * nCtx, 256>>>(dc, dst, src, bytes, slot, mis);
    GPU_CHECK(cudaGetLastError());  // a launch that failed ran nothing
    waitAll<<<nCtx, 128>>>(dc, uint64_t(n), uint64_t(n * nCtx), ok);
    GPU_CHECK(cudaGetLastError());  // a launch that failed ran nothing
    comm.synchronize();
    std::vector<int> okh(static_cast<size_t>(nCtx));
    GPU_CHECK(cudaMemcpy(okh.data(), ok, sizeof(int) * nCtx, cudaMemcpyDeviceToHost));
    cudaFree(ok);
    for (int c = 0; c < nCtx; ++c) expect(okh[size_t(c)] == 1, "waitSignal gave up on context " + std::to_string(c));
    std::vector<uint8_t> d(dstBytes);
    GPU_CHECK(cudaMemcpy(d.data(), comm.localPointer(dst), dstBytes, cudaMemcpyDeviceToHost));
    for (int c = 0; c < nCtx; ++c)
      for (int p = 0; p < n; ++p) {
        const uint8_t* blk = d.data() + (size_t(c) * n + p) * slot;
        for (size_t i = 0; i < mis; ++i) expect(blk[i] == kPoison, "wrote before the destination");
        for (size_t i = 0; i < bytes; ++i)
          if (blk[mis + i] != gputest::pattern(seed, p, i))
            expect(false, "rank " + std::to_string(me) + " ctx " + std::to_string(c) + " byte " + std::to_string(i) +
                              " from rank " + std::to_string(p) + " wrong");
        for (size_t i = mis + bytes; i < slot; ++i) expect(blk[i] == kPoison, "wrote past the destination");
      }
    comm.bootstrap().barrier();
  });
}

// One rank per GPU (runGpus: rank r on GPU r, kernels on the legacy stream,
// which ranks sharing a GPU would share, so one rank's waiting kernel would
// hold the next one's back). Ranks sharing a GPU run in the proxy, ibgda and
// moe suites (a stream per rank) and in tests/gpu/processes.cu.
std::vector<int> rankCounts() {
  std::vector<int> v;
  for (int n : {1, 2, 4})
    if (n <= gputest::gpuCount() && n <= gputest::maxRanks()) v.push_back(n);
  return v;
}
}  // namespace

TEST_CASE("GPU put: thread, tile, warp, warp-span and block coops deliver random data to every peer, poison untouched",
          "[gpu][put]") {
  for (int n : rankCounts())
    for (size_t bytes : {size_t(1), size_t(13), size_t(4096), size_t(1 << 20) + 7})
      for (size_t mis : {size_t(0), size_t(3), size_t(8)}) {
        CAPTURE(n, bytes, mis);
        REQUIRE_NOTHROW(putTest<Kind::Thread>(n, bytes, mis, 11 + bytes));
        REQUIRE_NOTHROW(putTest<Kind::Tile8>(n, bytes, mis, 14 + bytes));
        REQUIRE_NOTHROW(putTest<Kind::Warp>(n, bytes, mis, 12 + bytes));
        REQUIRE_NOTHROW(putTest<Kind::WarpSpan>(n, bytes, mis, 15 + bytes));
        REQUIRE_NOTHROW(putTest<Kind::Block>(n, bytes, mis, 13 + bytes));
      }
}

namespace {
// Every warp of every CTA puts its own chunk to the next rank with a SignalInc
// on one of 4 contexts; the receiver checks the count and every chunk.
__global__ void contention(DevComm dc, Window dst, Window src, size_t chunk) {
  const int warp = threadIdx.x / 32, nWarps = blockDim.x / 32;
  const size_t id = size_t(blockIdx.x) * nWarps + warp;
  Net net(dc, int(id % 4));
  const int peer = (dc.rank + 1) % dc.nRanks;
  net.put(teamWorld(dc), peer, dst, id * chunk, src, id * chunk, chunk, SignalInc{uint32_t(id % 4)}, None{},
          CoopWarp{});
}
__global__ void waitContention(DevComm dc, uint64_t perCtx, int* ok) {
  Net net(dc, blockIdx.x);
  const bool good = net.waitSignal(CoopThread{}, blockIdx.x, perCtx);
  if (threadIdx.x == 0) ok[blockIdx.x] = good;
}
}  // namespace

TEST_CASE("GPU contention: every warp of 132 CTAs puts with a signal on 4 contexts", "[gpu][put][contention]") {
  for (int n : rankCounts()) {
    CAPTURE(n);
    REQUIRE_NOTHROW(runGpus(n, [](Comm& comm) {
      const DevComm dc = comm.devComm();
      constexpr int kCtas = 132, kWarps = 16;
      constexpr size_t kChunk = 1000;
      const size_t total = size_t(kCtas) * kWarps * kChunk;
      Window src = comm.allocWindow(total), dst = comm.allocWindow(total);
      std::vector<uint8_t> h(total);
      for (size_t i = 0; i < total; ++i) h[i] = gputest::pattern(99, comm.rank(), i);
      GPU_CHECK(cudaMemcpy(comm.localPointer(src), h.data(), total, cudaMemcpyHostToDevice));
      GPU_CHECK(cudaMemset(comm.localPointer(dst), kPoison, total));
      GPU_CHECK(cudaDeviceSynchronize());
      comm.bootstrap().barrier();
      int* ok = nullptr;
      GPU_CHECK(cudaMalloc(&ok, 4 * sizeof(int)));
      contention<<<kCtas, 32 * kWarps>>>(dc, dst, src, kChunk);
      GPU_CHECK(cudaGetLastError());  // a launch that failed ran nothing
      waitContention<<<4, 32>>>(dc, uint64_t(kCtas) * kWarps / 4, ok);
      GPU_CHECK(cudaGetLastError());  // a launch that failed ran nothing
      comm.synchronize();
      int okh[4];
      GPU_CHECK(cudaMemcpy(okh, ok, sizeof okh, cudaMemcpyDeviceToHost));
      cudaFree(ok);
      for (int c = 0; c < 4; ++c) expect(okh[c] == 1, "context wait failed");
      GPU_CHECK(cudaMemcpy(h.data(), comm.localPointer(dst), total, cudaMemcpyDeviceToHost));
      const int prev = (comm.rank() + comm.nRanks() - 1) % comm.nRanks();
      for (size_t i = 0; i < total; ++i)
        if (h[i] != gputest::pattern(99, prev, i)) expect(false, "byte " + std::to_string(i) + " wrong");
      comm.bootstrap().barrier();
    }));
  }
}

namespace {
// Signal operations, values, shadows and counters, checked on the device.
__global__ void signalOps(DevComm dc, Window w, unsigned long long* out) {
  if (threadIdx.x != 0) return;
  Net net(dc, 0);
  const int n = dc.nRanks, me = dc.rank;
  const Team world = teamWorld(dc);
  for (int p = 0; p < n; ++p) {
    net.signal(world, p, SignalInc{0});
    net.signal(world, p, SignalAdd{1, uint64_t(me + 1)});
    net.putValue(world, p, w, size_t(me) * 8, uint64_t(0x1234500 + me), SignalInc{2});
  }
  int i = 0;
  out[i++] = net.waitSignal(CoopThread{}, 0, n);
  out[i++] = net.waitSignal(CoopThread{}, 1, uint64_t(n) * (n + 1) / 2);
  out[i++] = net.waitSignal(CoopThread{}, 2, n);
  out[i++] = net.readSignal(0);
  out[i++] = net.readSignal(1);
  // Wrap-around: set near 2^64 on self, add past the wrap.
  net.signal(world, me, SignalSet{3, ~0ull - 2});
  net.signal(world, me, SignalAdd{3, 5});
  out[i++] = net.waitSignal(CoopThread{}, 3, 2);
  out[i++] = net.readSignal(3);
  // Shadows: follow from 0 to the sum; then the shadow equals the signal.
  uint64_t before = 0, delta = 0;
  out[i++] = net.waitSignalFollowShadow(CoopThread{}, 1, uint64_t(1), &before, &delta);
  out[i++] = before;
  out[i++] = delta;
  net.increaseSignalShadow(1, 0);
  out[i++] = net.waitSignalMeetShadow(CoopThread{}, 1) ? *net.getSignalShadowPtr(1) : 0;
  net.resetSignal(1);
  out[i++] = net.readSignal(1) + *net.getSignalShadowPtr(1);
  out[i++] = 0xF1F1;
}
}  // namespace

TEST_CASE("GPU signals: Inc/Add/Set, putValue, wrap-around, shadows and reset", "[gpu][signal]") {
  for (int n : rankCounts()) {
    CAPTURE(n);
    REQUIRE_NOTHROW(runGpus(n, [n](Comm& comm) {
      Window w = comm.allocWindow(8 * size_t(n));
      unsigned long long* out = nullptr;
      GPU_CHECK(cudaMalloc(&out, 16 * 8));
      GPU_CHECK(cudaMemset(out, 0, 16 * 8));
      signalOps<<<1, 32>>>(comm.devComm(), w, out);
      GPU_CHECK(cudaGetLastError());  // a launch that failed ran nothing
      comm.synchronize();
      unsigned long long h[16];
      GPU_CHECK(cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost));
      cudaFree(out);
      const uint64_t sum = uint64_t(n) * (n + 1) / 2;
      expect(h[0] == 1 && h[1] == 1 && h[2] == 1, "waits");
      expect(h[3] == uint64_t(n) && h[4] == sum, "signal values");
      expect(h[5] == 1 && h[6] == 2, "wrap-around: value " + std::to_string(h[6]));
      expect(h[7] == 1 && h[8] == 0 && h[9] == sum, "follow shadow");
      expect(h[10] == sum, "meet shadow");
      expect(h[11] == 0 && h[12] == 0xF1F1, "reset");
      std::vector<uint64_t> v(static_cast<size_t>(n));
      GPU_CHECK(cudaMemcpy(v.data(), comm.localPointer(w), 8 * size_t(n), cudaMemcpyDeviceToHost));
      for (int p = 0; p < n; ++p) expect(v[size_t(p)] == uint64_t(0x1234500 + p), "putValue payload");
      comm.bootstrap().barrier();
    }));
  }
}

namespace {
// Each CTA uses its own barrier index: write round tags into every peer's
// slot by lsa pointer, sync, check every peer's tag, sync again.
template <bool World>
__global__ void barrierRounds(DevComm dc, Window w, int rounds, int* bad) {
  const int n = dc.lsaSize, me = dc.lsaRank, b = blockIdx.x;
  uint64_t* mine = static_cast<uint64_t*>(localPointer(w, 0));
  for (int r = 1; r <= rounds; ++r) {
    const uint64_t tag = (uint64_t(r) << 32) | uint64_t(b);
    for (int p = threadIdx.x; p < n; p += blockDim.x)
      volatileStore(static_cast<uint64_t*>(lsaPointer(w, (size_t(b) * n + me) * 8, p)), tag);
    if constexpr (World) {
      BarrierSession<CoopBlock> bar(CoopBlock{}, dc, b);
      if (!bar.sync(CoopBlock{})) {
        atomicAdd(bad, 1000);
        return;
      }
    } else {
      LsaBarrierSession<CoopBlock> bar(CoopBlock{}, dc, b);
      if (!bar.sync(CoopBlock{})) {
        atomicAdd(bad, 1000);
        return;
      }
    }
    for (int p = threadIdx.x; p < n; p += blockDim.x)
      if (volatileLoad(mine + size_t(b) * n + p) != tag) atomicAdd(bad, 1);
    LsaBarrierSession<CoopBlock> again(CoopBlock{}, dc, b);
    again.sync(CoopBlock{});
  }
}
}  // namespace

TEST_CASE("GPU barriers: lsa and world sessions on 1, 32 and 132 CTAs, one index per CTA", "[gpu][barrier]") {
  for (int n : rankCounts())
    for (int ctas : {1, 32, 132}) {
      CAPTURE(n, ctas);
      REQUIRE_NOTHROW(runGpus(n, [n, ctas](Comm& comm) {
        Window w = comm.allocWindow(size_t(ctas) * n * 8);
        int* bad = nullptr;
        GPU_CHECK(cudaMalloc(&bad, sizeof(int)));
        GPU_CHECK(cudaMemset(bad, 0, sizeof(int)));
        barrierRounds<false><<<ctas, 128>>>(comm.devComm(), w, 50, bad);
        GPU_CHECK(cudaGetLastError());  // a launch that failed ran nothing
        barrierRounds<true><<<ctas, 64>>>(comm.devComm(), w, 20, bad);
        GPU_CHECK(cudaGetLastError());  // a launch that failed ran nothing
        comm.synchronize();
        int h = -1;
        GPU_CHECK(cudaMemcpy(&h, bad, sizeof h, cudaMemcpyDeviceToHost));
        cudaFree(bad);
        expect(h == 0, "barrier let a rank through before a peer's write was visible (" + std::to_string(h) + ")");
        comm.bootstrap().barrier();
      }));
    }
}

namespace {
// Every thread of every coop must see the wait's failure, not only the one
// that polled: counts the threads that were told "satisfied".
__global__ void waitForever(DevComm dc, int* toldOk) {
  Net net(dc, 2);
  if (net.waitSignal(CoopBlock{}, 42, 1)) atomicAdd(toldOk, 1);
  if (net.waitSignal(CoopWarp{}, 43, 1)) atomicAdd(toldOk, 1);
  if (threadIdx.x < 128 && net.waitSignal(CoopWarpSpan{0, 4, 2}, 44, 1)) atomicAdd(toldOk, 1);
  LsaBarrierSession<CoopBlock> bar(CoopBlock{}, dc, blockIdx.x);
  if (dc.nRanks > 1 && bar.sync(CoopBlock{})) atomicAdd(toldOk, 1);
}
}  // namespace

TEST_CASE("GPU: a wait that cannot finish gives a gin::Error naming rank, op, context and id", "[gpu][errors]") {
  std::string msg;
  int toldOkHost = -1;
  REQUIRE_NOTHROW(runGpus(
      1,
      [&](Comm& comm) {
        int* toldOk = nullptr;
        GPU_CHECK(cudaMalloc(&toldOk, sizeof(int)));
        GPU_CHECK(cudaMemset(toldOk, 0, sizeof(int)));
        waitForever<<<4, 256>>>(comm.devComm(), toldOk);
        GPU_CHECK(cudaGetLastError());  // a launch that failed ran nothing
        try {
          comm.synchronize();
        } catch (const Error& e) {
          msg = e.what();
        }
        GPU_CHECK(cudaMemcpy(&toldOkHost, toldOk, sizeof(int), cudaMemcpyDeviceToHost));
        cudaFree(toldOk);
      },
      gputest::gpuConfig(200'000'000ull)));
  CHECK(toldOkHost == 0);
  CHECK_THAT(msg, Catch::Matchers::ContainsSubstring("rank 0") && Catch::Matchers::ContainsSubstring("waitSignal") &&
                      Catch::Matchers::ContainsSubstring("context 2") && Catch::Matchers::ContainsSubstring("id 42"));
}

TEST_CASE("GPU: registerWindow of host memory fails on every rank with the reason", "[gpu][errors]") {
  const int n = rankCounts().back();
  std::vector<std::string> msgs(static_cast<size_t>(n));
  REQUIRE_NOTHROW(runGpus(n, [&](Comm& comm) {
    std::vector<char> host(4096);
    void* dev = nullptr;
    GPU_CHECK(cudaMalloc(&dev, 4096));
    try {
      comm.registerWindow(comm.rank() == 0 ? static_cast<void*>(host.data()) : dev, 4096);
    } catch (const Error& e) {
      msgs[size_t(comm.rank())] = e.what();
    }
    cudaFree(dev);
  }));
  for (auto& m : msgs)
    CHECK_THAT(m, Catch::Matchers::ContainsSubstring("registerWindow") &&
                      Catch::Matchers::ContainsSubstring("rank 0") && Catch::Matchers::ContainsSubstring("cudaMalloc"));
}

int main(int argc, char** argv) {
  if (gputest::gpuCount() == 0) return gputest::skipNoGpu("GPU lsa suite");
  std::printf("GPU lsa suite: %d GPU(s) visible, rank counts tested:", gputest::gpuCount());
  for (int n : rankCounts()) std::printf(" %d", n);
  std::printf("\n");
  return Catch::Session().run(argc, argv);
}
