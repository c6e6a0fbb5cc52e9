// GPU suite: LL8 / LL16 packets (gin/device/ll.hpp) and p2p send/recv
// (gin/device/p2p.hpp) between 1, 2 and 4 GPUs driven by one process (one
// thread and one Comm per GPU; the [shared] case: 2-8 ranks sharing them),
// over lsa. Thread, warp and block coops;
// random data; poisoned destinations; many rounds reusing the buffers; a
// reader racing a writer over NVLink. Skips (exit 77) where no GPU is visible.
#include <catch2/catch_session.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "../../examples/allreduce/ring_allreduce.hpp"
#include <cstdlib>
#include <string>

#include "gpu_common.cuh"
#include "shared_cases.cuh"

using namespace gin;
using gputest::expect;
using gputest::runGpus;

namespace {
constexpr uint8_t kPoison = 0xAB;
enum class Kind { Thread, Warp, Block };

// One rank per GPU (runGpus: rank r on GPU r, kernels on the legacy stream,
// which ranks sharing a GPU would share, so one rank's waiting kernel would
// hold the next one's back). The [shared] case runs ranks sharing GPUs, a
// stream each.
std::vector<int> rankCounts() {
  std::vector<int> v;
  for (int n : {1, 2, 4})
    if (n <= gputest::gpuCount() && n <= gputest::maxRanks()) v.push_back(n);
  return v;
}

// Runs `f(coop)` with the coop of kind K: thread 0, warp 0, or the whole block.
template <Kind K, class F>
__device__ void withCoop(F f) {
  if constexpr (K == Kind::Thread) {
    if (threadIdx.x == 0) f(CoopThread{});
  } else if constexpr (K == Kind::Warp) {
    if (threadIdx.x < 32) f(CoopWarp{});
  } else {
    f(CoopBlock{});
  }
}

// ---------------------------------------------------------------- LL packets

// Block p: write this round's message for peer p into p's buffer `parity`
// (slot of this rank), then read peer p's message from our buffer `parity`.
// Buffers alternate by round; stream order makes the reuse safe (a rank
// starts round r + 2 only after its round r + 1 read what the peer wrote after
// finishing round r).
template <Kind K, class P>
__global__ void llRound(DevComm dc, Window w, size_t buf, const uint8_t* src, size_t srcSlot, uint8_t* dst,
                        size_t dstSlot, size_t bytes, size_t mis, uint32_t flag, int parity, int* failed) {
  const int p = blockIdx.x, n = dc.nRanks, me = dc.rank;
  withCoop<K>([&](auto coop) {
    if (!ll::putPacketsToPeer<P>(coop, dc, teamWorld(dc), p, w, (size_t(parity) * n + me) * buf,
                                 src + size_t(p) * srcSlot + mis, bytes, flag))
      atomicAdd(failed, 1);
    if (!ll::getPacketsFromWindow<P>(coop, dc, dst + size_t(p) * dstSlot + mis, w, (size_t(parity) * n + p) * buf,
                                     bytes, flag, p) &&
        coop.rank() == 0)
      atomicAdd(failed, 1);
  });
}

template <Kind K, class P>
void llTest(int n, uint64_t seed) {
  runGpus(n, [&](Comm& comm) {
    const int me = comm.rank();
    const size_t sizes[] = {0, 1, 4, 5, 8, 13, 97, 4096, 65537};
    const size_t maxBytes = 65537, slot = maxBytes + 32, buf = ll::bufferBytes<P>(maxBytes);
    Window w = comm.allocWindow(2 * size_t(n) * buf);
    GPU_CHECK(cudaMemset(comm.localPointer(w), kPoison, 2 * size_t(n) * buf));  // flags 0xABABABAB: never a round's
    uint8_t *src = nullptr, *dst = nullptr;
    int* failed = nullptr;
    GPU_CHECK(cudaMalloc(&src, slot * n));
    GPU_CHECK(cudaMalloc(&dst, slot * n));
    GPU_CHECK(cudaMalloc(&failed, sizeof(int)));
    GPU_CHECK(cudaMemset(failed, 0, sizeof(int)));
    GPU_CHECK(cudaDeviceSynchronize());
    comm.bootstrap().barrier();
    std::vector<uint8_t> h(slot * n);
    for (int r = 0; r < 24; ++r) {
      const size_t bytes = sizes[size_t(r) % std::size(sizes)], mis = size_t(r % 3) * 3;
      for (int p = 0; p < n; ++p)
        for (size_t i = 0; i < bytes; ++i) h[p * slot + mis + i] = gputest::pattern(seed + r, me, i ^ size_t(p));
      GPU_CHECK(cudaMemcpy(src, h.data(), h.size(), cudaMemcpyHostToDevice));
      GPU_CHECK(cudaMemset(dst, kPoison, slot * n));
      llRound<K, P>
          <<<n, 256>>>(comm.devComm(), w, buf, src, slot, dst, slot, bytes, mis, ll::flagForRound(r), r % 2, failed);
      GPU_CHECK(cudaGetLastError());  // a launch that failed ran nothing
      comm.synchronize();
      GPU_CHECK(cudaMemcpy(h.data(), dst, h.size(), cudaMemcpyDeviceToHost));
      for (int p = 0; p < n; ++p) {
        const uint8_t* d = h.data() + p * slot;
        for (size_t i = 0; i < mis; ++i) expect(d[i] == kPoison, "LL read wrote before the destination");
        for (size_t i = 0; i < bytes; ++i)
          if (d[mis + i] != gputest::pattern(seed + r, p, i ^ size_t(me)))
            expect(false, "LL round " + std::to_string(r) + ": byte " + std::to_string(i) + " of " +
                              std::to_string(bytes) + " from rank " + std::to_string(p) + " wrong on rank " +
                              std::to_string(me));
        for (size_t i = mis + bytes; i < slot; ++i) expect(d[i] == kPoison, "LL read wrote past the destination");
      }
    }
    int f = -1;
    GPU_CHECK(cudaMemcpy(&f, failed, sizeof f, cudaMemcpyDeviceToHost));
    expect(f == 0, "an LL put or get reported failure");
    cudaFree(src), cudaFree(dst), cudaFree(failed);
    comm.bootstrap().barrier();
  });
}

__host__ __device__ uint32_t mix(uint32_t flag, uint32_t i) {
  uint64_t x = (uint64_t(flag) << 32) ^ (uint64_t(i) * 0x9E3779B97F4A7C15ull);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  return uint32_t(x ^ (x >> 32));
}
template <class P>
__host__ __device__ ll::PayloadOf<P> expected(uint32_t flag, uint32_t i) {
  if constexpr (sizeof(ll::PayloadOf<P>) == 4)
    return mix(flag, i);
  else
    return (uint64_t(mix(flag, i)) << 32) | mix(flag ^ 0x5555u, i);
}

// Block 0 rewrites the next rank's packets round after round (over NVLink
// when n > 1); block 1 loads this rank's packets concurrently until it sees
// the last round everywhere. Every packet it accepts must carry its round's
// payload. counts: [0] bad, [1] accepted, [2] rejected as mixed.
template <class P>
__global__ void llRace(DevComm dc, Window w, int nPackets, uint32_t rounds, unsigned long long* counts) {
  if (blockIdx.x == 0) {
    P* peer = static_cast<P*>(peerPointer(dc, teamWorld(dc), (dc.rank + 1) % dc.nRanks, w, 0));
    for (uint32_t f = 1; f <= rounds; ++f)
      for (int i = threadIdx.x; i < nPackets; i += blockDim.x) ll::store(peer + i, expected<P>(f, i), f);
  } else {
    const P* mine = static_cast<const P*>(localPointer(w, 0));
    unsigned long long bad = 0, ok = 0, mixed = 0;
    for (int i = threadIdx.x; i < nPackets; i += blockDim.x) {
      const uint64_t start = nowNs();
      for (;;) {
        const ll::Seen<P> s = ll::load(mine + i);
        if (!s.valid) {
          ++mixed;
        } else if (s.flag != 0) {
          ++ok;
          bad += s.payload != expected<P>(s.flag, i);
          if (s.flag == rounds) break;
        }
        if (nowNs() - start > 10'000'000'000ull) {
          ++bad;  // the last round never came
          break;
        }
      }
    }
    atomicAdd(counts + 0, bad);
    atomicAdd(counts + 1, ok);
    atomicAdd(counts + 2, mixed);
  }
}

template <class P>
void llRaceTest(int n) {
  runGpus(n, [&](Comm& comm) {
    constexpr int kPackets = 4096;
    Window w = comm.allocWindow(kPackets * sizeof(P));
    unsigned long long* counts = nullptr;
    GPU_CHECK(cudaMalloc(&counts, 3 * sizeof(unsigned long long)));
    GPU_CHECK(cudaMemset(counts, 0, 3 * sizeof(unsigned long long)));
    GPU_CHECK(cudaDeviceSynchronize());
    comm.bootstrap().barrier();
    llRace<P><<<2, 512>>>(comm.devComm(), w, kPackets, 2000, counts);
    GPU_CHECK(cudaGetLastError());  // a launch that failed ran nothing
    comm.synchronize();
    unsigned long long h[3];
    GPU_CHECK(cudaMemcpy(h, counts, sizeof h, cudaMemcpyDeviceToHost));
    cudaFree(counts);
    std::printf("  LL%zu race on rank %d: accepted %llu, rejected as mixed %llu\n", sizeof(P), comm.rank(), h[1], h[2]);
    expect(h[0] == 0,
           "a reader accepted a torn or mixed packet, or the last round never came (" + std::to_string(h[0]) + ")");
    comm.bootstrap().barrier();
  });
}
}  // namespace

TEST_CASE("GPU LL8 and LL16: every size to every peer with thread, warp and block coops, 24 rounds, poison intact",
          "[gpu][ll]") {
  for (int n : rankCounts()) {
    CAPTURE(n);
    REQUIRE_NOTHROW((llTest<Kind::Thread, ll::Packet8>(n, 1)));
    REQUIRE_NOTHROW((llTest<Kind::Warp, ll::Packet8>(n, 2)));
    REQUIRE_NOTHROW((llTest<Kind::Block, ll::Packet8>(n, 3)));
    REQUIRE_NOTHROW((llTest<Kind::Thread, ll::Packet16>(n, 4)));
    REQUIRE_NOTHROW((llTest<Kind::Warp, ll::Packet16>(n, 5)));
    REQUIRE_NOTHROW((llTest<Kind::Block, ll::Packet16>(n, 6)));
  }
}

TEST_CASE("GPU LL8 and LL16: a reader racing a writer over NVLink never accepts torn or mixed-round data",
          "[gpu][ll][stress]") {
  for (int n : rankCounts()) {
    CAPTURE(n);
    REQUIRE_NOTHROW(llRaceTest<ll::Packet8>(n));
    REQUIRE_NOTHROW(llRaceTest<ll::Packet16>(n));
  }
}

namespace {
// Packets that never get their flag: every thread of the block is told false,
// and the error names llWait.
__global__ void llNever(DevComm dc, Window w, int* toldOk) {
  uint8_t out[64];
  if (ll::getPacketsFromWindow<ll::Packet16>(CoopBlock{}, dc, out, w, 0, 64, 77, -1)) atomicAdd(toldOk, 1);
}
}  // namespace

TEST_CASE("GPU LL: a packet that never arrives gives a gin::Error naming llWait", "[gpu][ll][errors]") {
  std::string msg;
  int toldOk = -1;
  REQUIRE_NOTHROW(runGpus(
      1,
      [&](Comm& comm) {
        Window w = comm.allocWindow(4096);
        int* d = nullptr;
        GPU_CHECK(cudaMalloc(&d, sizeof(int)));
        GPU_CHECK(cudaMemset(d, 0, sizeof(int)));
        llNever<<<1, 128>>>(comm.devComm(), w, d);
        GPU_CHECK(cudaGetLastError());  // a launch that failed ran nothing
        try {
          comm.synchronize();
        } catch (const Error& e) {
          msg = e.what();
        }
        GPU_CHECK(cudaMemcpy(&toldOk, d, sizeof(int), cudaMemcpyDeviceToHost));
        cudaFree(d);
      },
      gputest::gpuConfig(200'000'000ull)));
  CHECK(toldOk == 0);
  CHECK_THAT(msg, Catch::Matchers::ContainsSubstring("llWait") && Catch::Matchers::ContainsSubstring("expected 77"));
}

// ---------------------------------------------------------------- p2p

namespace {
// Block 0 sends to `to`, block 1 receives from `from` (separate coops, as NCCL
// runs send and recv warps), or block 0 alone does sendRecv.
template <Kind K, bool Separate>
__global__ void p2pRing(DevComm dc, p2p::Fifo fifo, Window src, size_t smis, size_t sendBytes, uint8_t* dst,
                        size_t recvBytes, int* failed) {
  const int n = dc.nRanks, me = dc.rank, to = (me + 1) % n, from = (me + n - 1) % n;
  p2p::Endpoint ep(Net<kBackendLsa | kBackendProxy>(dc, 0), fifo);
  withCoop<K>([&](auto coop) {
    bool ok = true;
    if constexpr (Separate) {
      if (blockIdx.x == 0)
        ok = ep.send(coop, to, src, smis, sendBytes);
      else
        ok = ep.recv(coop, from, dst, recvBytes);
    } else {
      ok = ep.sendRecv(coop, to, src, smis, sendBytes, from, dst, recvBytes);
    }
    if (!ok && coop.rank() == 0) atomicAdd(failed, 1);
  });
}

// Runs body(comm, stream) on n ranks: one per GPU on the legacy stream
// (runGpus), or, `shared`, round-robin on the GPUs with a stream each
// (runRanksOnStreams), so that ranks sharing a GPU run side by side. The
// bodies below wait for their own stream only, read results after that
// wait (a pageable read queued behind a waiting kernel would hold up the
// other ranks' reads: docs/design/progress.md), and allocate and free
// between bootstrap barriers (cudaFree waits for the whole device).
void runRanks(int n, bool shared, const std::function<void(Comm&, cudaStream_t)>& body) {
  if (shared)
    gputest::runRanksOnStreams(n, body, gputest::gpuConfig());
  else
    runGpus(n, [&](Comm& comm) { body(comm, cudaStreamLegacy); });
}

// This rank's kernels on `st` are done, and no wait of theirs failed.
void finish(Comm& comm, cudaStream_t st) {
  GPU_CHECK(cudaStreamSynchronize(st));
  comm.check();
}

template <Kind K, bool Separate>
void p2pRingTest(int n, uint64_t seed, bool shared = false) {
  runRanks(n, shared, [&](Comm& comm, cudaStream_t st) {
    const int me = comm.rank(), from = (me + n - 1) % n;
    p2p::Config cfg;
    cfg.chunkBytes = 4096;
    cfg.nSlots = 8;
    p2p::Fifo fifo = p2p::create(comm, cfg);
    const size_t ring = cfg.chunkBytes * cfg.nSlots;
    // Up to cfg.llMaxBytes (16 KiB) an lsa peer's message is one LL step, above it FIFO steps.
    const size_t sizes[] = {0, 1, 13, 4095, 4096, 4097, ring, ring + 1, 5 * ring + 7, (1u << 20) + 3};
    const size_t maxBytes = (1u << 20) + 3, slot = maxBytes + 64;
    Window src = comm.allocWindow(slot);
    uint8_t* dst = nullptr;
    int* failed = nullptr;
    GPU_CHECK(cudaMalloc(&dst, slot));
    GPU_CHECK(cudaMalloc(&failed, sizeof(int)));
    GPU_CHECK(cudaMemset(failed, 0, sizeof(int)));
    GPU_CHECK(cudaDeviceSynchronize());
    comm.bootstrap().barrier();
    std::vector<uint8_t> h(slot);
    for (int it = 0; it < 20; ++it) {
      const size_t bytes = sizes[size_t(it) % std::size(sizes)], smis = size_t(it % 4) * 5, dmis = size_t(it % 3) * 8;
      for (size_t i = 0; i < bytes; ++i) h[smis + i] = gputest::pattern(seed + it, me, i);
      GPU_CHECK(cudaMemcpyAsync(comm.localPointer(src), h.data(), slot, cudaMemcpyHostToDevice, st));
      GPU_CHECK(cudaMemsetAsync(dst, kPoison, slot, st));
      p2pRing<K, Separate>
          <<<Separate ? 2 : 1, 256, 0, st>>>(comm.devComm(), fifo, src, smis, bytes, dst + dmis, bytes, failed);
      GPU_CHECK(cudaGetLastError());  // a launch that failed ran nothing
      finish(comm, st);
      GPU_CHECK(cudaMemcpy(h.data(), dst, slot, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < dmis; ++i) expect(h[i] == kPoison, "recv wrote before the destination");
      for (size_t i = 0; i < bytes; ++i)
        if (h[dmis + i] != gputest::pattern(seed + it, from, i))
          expect(false, "p2p iteration " + std::to_string(it) + ": byte " + std::to_string(i) + " of " +
                            std::to_string(bytes) + " from rank " + std::to_string(from) + " wrong on rank " +
                            std::to_string(me));
      for (size_t i = dmis + bytes; i < slot; ++i) expect(h[i] == kPoison, "recv wrote past the destination");
    }
    int f = -1;
    GPU_CHECK(cudaMemcpy(&f, failed, sizeof f, cudaMemcpyDeviceToHost));
    expect(f == 0, "a send or recv reported failure");
    comm.bootstrap().barrier();
    cudaFree(dst), cudaFree(failed);
    comm.deregisterWindow(src);
    p2p::destroy(comm, fifo);
  });
}

// All-to-all on n channels, all at once (block coops): block p sends to rank
// p, block n + p receives from rank p, and a pair's transfer uses the
// sender's rank as its channel (both ends must name the same one).
__global__ void p2pAllToAll(DevComm dc, p2p::Fifo fifo, Window src, size_t slot, size_t bytes, uint8_t* dst,
                            int* failed) {
  const int n = dc.nRanks, p = blockIdx.x % n;
  const int channel = int(blockIdx.x) < n ? dc.rank : p;
  p2p::Endpoint ep(Net<kBackendLsa | kBackendProxy>(dc, p % dc.nContexts), fifo, channel);
  const bool ok = blockIdx.x < n ? ep.send(CoopBlock{}, p, src, size_t(p) * slot, bytes)
                                 : ep.recv(CoopBlock{}, p, dst + size_t(p) * slot, bytes);
  if (!ok && threadIdx.x == 0) atomicAdd(failed, 1);
}

void p2pAllToAllTest(int n, bool shared = false) {
  runRanks(n, shared, [&](Comm& comm, cudaStream_t st) {
    const int me = comm.rank();
    p2p::Config cfg;
    cfg.chunkBytes = 16 << 10;
    cfg.nChannels = uint32_t(n);
    p2p::Fifo fifo = p2p::create(comm, cfg);
    const size_t bytes = (3u << 20) + 11, slot = bytes + 64;
    Window src = comm.allocWindow(slot * n);
    uint8_t* dst = nullptr;
    int* failed = nullptr;
    GPU_CHECK(cudaMalloc(&dst, slot * n));
    GPU_CHECK(cudaMalloc(&failed, sizeof(int)));
    GPU_CHECK(cudaMemset(failed, 0, sizeof(int)));
    GPU_CHECK(cudaDeviceSynchronize());
    comm.bootstrap().barrier();
    std::vector<uint8_t> h(slot * n);
    for (int it = 0; it < 3; ++it) {
      for (int p = 0; p < n; ++p)
        for (size_t i = 0; i < bytes; ++i) h[p * slot + i] = gputest::pattern(100 + it, me, i ^ size_t(p));
      GPU_CHECK(cudaMemcpyAsync(comm.localPointer(src), h.data(), h.size(), cudaMemcpyHostToDevice, st));
      GPU_CHECK(cudaMemsetAsync(dst, kPoison, slot * n, st));
      p2pAllToAll<<<2 * n, 512, 0, st>>>(comm.devComm(), fifo, src, slot, bytes, dst, failed);
      GPU_CHECK(cudaGetLastError());  // a launch that failed ran nothing
      finish(comm, st);
      GPU_CHECK(cudaMemcpy(h.data(), dst, h.size(), cudaMemcpyDeviceToHost));
      for (int p = 0; p < n; ++p) {
        for (size_t i = 0; i < bytes; ++i)
          if (h[p * slot + i] != gputest::pattern(100 + it, p, i ^ size_t(me)))
            expect(false, "all-to-all: byte " + std::to_string(i) + " from rank " + std::to_string(p) + " wrong");
        for (size_t i = bytes; i < slot; ++i) expect(h[p * slot + i] == kPoison, "recv wrote past the destination");
      }
    }
    int f = -1;
    GPU_CHECK(cudaMemcpy(&f, failed, sizeof f, cudaMemcpyDeviceToHost));
    expect(f == 0, "a send or recv reported failure");
    comm.bootstrap().barrier();
    cudaFree(dst), cudaFree(failed);
    comm.deregisterWindow(src);
    p2p::destroy(comm, fifo);
  });
}

__global__ void p2pNever(DevComm dc, p2p::Fifo fifo, uint8_t* dst, int* toldOk) {
  p2p::Endpoint ep(Net<kBackendLsa | kBackendProxy>(dc, 1), fifo);
  if (ep.recv(CoopBlock{}, 0, dst, 100)) atomicAdd(toldOk, 1);
}
}  // namespace

TEST_CASE("GPU p2p ring: send/recv in separate blocks and sendRecv in one, thread, warp and block coops",
          "[gpu][p2p]") {
  for (int n : rankCounts()) {
    CAPTURE(n);
    REQUIRE_NOTHROW((p2pRingTest<Kind::Thread, true>(n, 10)));
    REQUIRE_NOTHROW((p2pRingTest<Kind::Warp, true>(n, 20)));
    REQUIRE_NOTHROW((p2pRingTest<Kind::Block, true>(n, 30)));
    REQUIRE_NOTHROW((p2pRingTest<Kind::Thread, false>(n, 40)));
    REQUIRE_NOTHROW((p2pRingTest<Kind::Warp, false>(n, 50)));
    REQUIRE_NOTHROW((p2pRingTest<Kind::Block, false>(n, 60)));
  }
}

TEST_CASE("GPU p2p all-to-all: one channel per peer, every send and recv at once, 3 MiB each", "[gpu][p2p]") {
  for (int n : rankCounts()) {
    CAPTURE(n);
    REQUIRE_NOTHROW(p2pAllToAllTest(n));
  }
}

// The progress rule with ranks sharing a GPU (round-robin, one process, a
// stream each): LL steps, where the receiver polls packets another rank's
// kernel on the same GPU writes, and FIFO steps, where sender and receiver
// wait for each other's signals, need those kernels to run side by side.
TEST_CASE("GPU p2p with ranks sharing GPUs: ring (LL and FIFO steps) and all-to-all", "[gpu][p2p][shared]") {
  const std::vector<int> counts = gputest::sharingRankCountsOrSkip();
  for (int n : counts) {
    CAPTURE(n);
    REQUIRE_NOTHROW((p2pRingTest<Kind::Block, true>(n, 70, true)));
    REQUIRE_NOTHROW((p2pRingTest<Kind::Warp, false>(n, 80, true)));
    REQUIRE_NOTHROW((p2pRingTest<Kind::Thread, true>(n, 90, true)));
    REQUIRE_NOTHROW(p2pAllToAllTest(n, true));
  }
}

TEST_CASE("GPU p2p: a recv nobody sends to gives a gin::Error naming p2pRecv, every thread told false",
          "[gpu][p2p][errors]") {
  std::string msg;
  int toldOk = -1;
  REQUIRE_NOTHROW(runGpus(
      1,
      [&](Comm& comm) {
        p2p::Fifo fifo = p2p::create(comm);
        uint8_t* dst = nullptr;
        int* d = nullptr;
        GPU_CHECK(cudaMalloc(&dst, 128));
        GPU_CHECK(cudaMalloc(&d, sizeof(int)));
        GPU_CHECK(cudaMemset(d, 0, sizeof(int)));
        p2pNever<<<1, 256>>>(comm.devComm(), fifo, dst, d);
        GPU_CHECK(cudaGetLastError());  // a launch that failed ran nothing
        try {
          comm.synchronize();
        } catch (const Error& e) {
          msg = e.what();
        }
        GPU_CHECK(cudaMemcpy(&toldOk, d, sizeof(int), cudaMemcpyDeviceToHost));
        cudaFree(dst), cudaFree(d);
      },
      gputest::gpuConfig(200'000'000ull)));
  CHECK(toldOk == 0);
  CHECK_THAT(msg, Catch::Matchers::ContainsSubstring("p2pRecv") && Catch::Matchers::ContainsSubstring("context 1"));
}

// ---------------------------------------------------------------- ring AllReduce baseline

namespace {
template <class T>
__global__ void allReduceKernel(DevComm dc, p2p::Fifo fifo, Window w, size_t count, T* tmp, size_t tmpElts,
                                int* failed) {
  p2p::Endpoint ep(Net<kBackendLsa | kBackendProxy>(dc, 0), fifo);
  if (!ginex::ringAllReduce(CoopBlock{}, ep, w, 0, count, tmp, tmpElts, ginex::Sum{}) && threadIdx.x == 0)
    atomicAdd(failed, 1);
}

// Rank r's element i: small integers, so float sums are exact in any order.
template <class T>
T arInput(int rank, size_t i) {
  return T(int((gputest::pattern(7, rank, i) % 61)) - 30);
}

template <class T>
void allReduceTest(int n) {
  runGpus(n, [&](Comm& comm) {
    const int me = comm.rank();
    p2p::Config cfg;
    cfg.chunkBytes = 32 << 10;
    p2p::Fifo fifo = p2p::create(comm, cfg);
    const size_t maxCount = (1u << 20) + 3, tmpElts = 16 << 10;
    Window w = comm.allocWindow(maxCount * sizeof(T) + 64);
    T* tmp = nullptr;
    int* failed = nullptr;
    GPU_CHECK(cudaMalloc(&tmp, tmpElts * sizeof(T)));
    GPU_CHECK(cudaMalloc(&failed, sizeof(int)));
    GPU_CHECK(cudaMemset(failed, 0, sizeof(int)));
    for (size_t count : {size_t(0), size_t(1), size_t(97), size_t(4099), maxCount}) {
      std::vector<T> h(count + 16, T(-7777));  // poison after the data
      for (size_t i = 0; i < count; ++i) h[i] = arInput<T>(me, i);
      GPU_CHECK(cudaMemcpy(comm.localPointer(w), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
      GPU_CHECK(cudaDeviceSynchronize());
      comm.bootstrap().barrier();
      allReduceKernel<T><<<1, 256>>>(comm.devComm(), fifo, w, count, tmp, tmpElts, failed);
      GPU_CHECK(cudaGetLastError());  // a launch that failed ran nothing
      comm.synchronize();
      GPU_CHECK(cudaMemcpy(h.data(), comm.localPointer(w), h.size() * sizeof(T), cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < count; ++i) {
        T ref = 0;
        for (int r = 0; r < n; ++r) ref += arInput<T>(r, i);
        if (h[i] != ref)
          expect(false, "AllReduce count " + std::to_string(count) + ": element " + std::to_string(i) + " is " +
                            std::to_string(double(h[i])) + ", reference " + std::to_string(double(ref)));
      }
      for (size_t i = count; i < h.size(); ++i) expect(h[i] == T(-7777), "AllReduce wrote past the data");
      comm.bootstrap().barrier();
    }
    int f = -1;
    GPU_CHECK(cudaMemcpy(&f, failed, sizeof f, cudaMemcpyDeviceToHost));
    expect(f == 0, "ringAllReduce reported failure");
    cudaFree(tmp), cudaFree(failed);
    comm.deregisterWindow(w);
    p2p::destroy(comm, fifo);
  });
}
}  // namespace

TEST_CASE("GPU ring AllReduce baseline (block coop): float and int32 sums, counts 0, 1, 97, 4099, 1 Mi + 3",
          "[gpu][allreduce]") {
  for (int n : rankCounts()) {
    CAPTURE(n);
    REQUIRE_NOTHROW(allReduceTest<float>(n));
    REQUIRE_NOTHROW(allReduceTest<int32_t>(n));
  }
}

int main(int argc, char** argv) {
  if (gputest::gpuCount() == 0) return gputest::skipNoGpu("GPU p2p/LL suite");
  std::printf("GPU p2p/LL suite: %d GPU(s) visible, rank counts tested:", gputest::gpuCount());
  for (int n : rankCounts()) std::printf(" %d", n);
  std::printf("\n");
  return Catch::Session().run(argc, argv);
}
