// GPU suite: the ibgda transport's device code on a GPU, against the soft NIC.
// Every warp of 132 CTAs posts mlx5 WQEs (puts with SignalInc and CounterInc,
// putValue, SignalAdd, SignalSet) on 4 contexts to QPs whose send queues,
// doorbell records, UAR words and CQs are in pinned mapped host memory; a
// SoftNic thread on the host consumes them. One GPU, one rank, loopback QPs
// (the soft NIC reads and writes the windows and signals, also pinned mapped
// host memory); the DevComm is built by hand. The last case goes through the
// Comm: GPU ranks sharing the GPU, windows in device memory (the soft NIC
// copies), signals in mapped host memory. Skips (exit 77) where no GPU is
// visible.
#include <catch2/catch_session.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "gin/host/error_text.hpp"
#include "gin/host/soft_nic.hpp"
#include "gin/host/test_access.hpp"
#include "gpu_common.cuh"

using namespace gin;
using gin::test::CommAccess;
using gputest::expect;

namespace {
constexpr int kCtas = 132, kWarps = 16, kContexts = 4;
constexpr uint32_t kDepth = 64;
constexpr uint8_t kPoison = 0xAB;

void* hostMapped(size_t bytes) {
  void* p = nullptr;
  GPU_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
  std::memset(p, 0, bytes);
  return p;
}
template <class T>
T* devPtr(T* host) {
  void* d = nullptr;
  GPU_CHECK(cudaHostGetDevicePointer(&d, host, 0));
  return static_cast<T*>(d);
}
void* devAlloc(size_t bytes) {
  void* p = nullptr;
  GPU_CHECK(cudaMalloc(&p, bytes));
  GPU_CHECK(cudaMemset(p, 0, bytes));
  return p;
}

// A one-rank communicator whose every context has a loopback QP consumed by a
// soft NIC, built by hand in the memory a GPU rank would use.
struct Harness {
  static constexpr uint32_t kSrcId = 1, kDstId = 2, kMaxWindows = 8, kNSignals = 64, kNCounters = 64;
  size_t winBytes;
  SoftNic nic;
  std::vector<void*> hostBufs, devBufs;
  char *srcHost, *dstHost;
  uint64_t* signalsHost;
  DeviceErrorRecord* recordHost;
  DevComm dc{};
  Window src, dst;

  explicit Harness(size_t bytes) : winBytes(bytes) {
    // Windows and signals: pinned mapped host memory (the soft NIC writes there).
    srcHost = static_cast<char*>(host(winBytes));
    dstHost = static_cast<char*>(host(winBytes));
    signalsHost = static_cast<uint64_t*>(host(kNSignals * 8));
    recordHost = static_cast<DeviceErrorRecord*>(host(sizeof(DeviceErrorRecord)));
    constexpr uint32_t kLocalSrc = 0x101, kLocalDst = 0x202, kSig = 0x303, kScratch = 0x404;
    nic.addLocalRegion(kLocalSrc, uint64_t(uintptr_t(devPtr(srcHost))), winBytes, srcHost);
    nic.addLocalRegion(kLocalDst, uint64_t(uintptr_t(devPtr(dstHost))), winBytes, dstHost);
    nic.addRemoteRegion(0, kLocalDst, uint64_t(uintptr_t(devPtr(dstHost))), winBytes, dstHost);
    nic.addRemoteRegion(0, kLocalSrc, uint64_t(uintptr_t(devPtr(srcHost))), winBytes, srcHost);
    nic.addRemoteRegion(0, kSig, uint64_t(uintptr_t(devPtr(signalsHost))), kNSignals * 8,
                        reinterpret_cast<char*>(signalsHost));

    // QPs: NIC-facing memory mapped; producer state and counterOf on the device.
    char* nicMem = static_cast<char*>(host(kContexts * (kDepth * 128 + 128) + kContexts * 8));
    char* scratch = nicMem + kContexts * (kDepth * 128 + 128);
    nic.addLocalRegion(kScratch, uint64_t(uintptr_t(devPtr(scratch))), kContexts * 8, scratch);
    auto* state = static_cast<IbgdaQpState*>(dev(kContexts * sizeof(IbgdaQpState)));
    auto* counterOf = static_cast<uint32_t*>(dev(kContexts * kDepth * 4));
    GPU_CHECK(cudaMemset(counterOf, 0xFF, kContexts * kDepth * 4));  // kIbgdaNoCounter
    std::vector<IbgdaQpDev> qps(kContexts);
    for (int c = 0; c < kContexts; ++c) {
      char* q = nicMem + size_t(c) * (kDepth * 128 + 128);
      SoftNic::Qp s;
      s.sq = reinterpret_cast<uint8_t*>(q);
      s.cq = reinterpret_cast<mlx5::Cqe64*>(q + kDepth * 64);
      s.dbrec = reinterpret_cast<uint32_t*>(q + kDepth * 128);
      s.uar = reinterpret_cast<uint64_t*>(q + kDepth * 128 + 64);
      s.cqDbrec = reinterpret_cast<uint32_t*>(q + kDepth * 128 + 8);
      s.nWqe = s.nCqe = kDepth;
      s.qpn = 0x100 + uint32_t(c);
      s.peer = 0;
      nic.addQp(s);
      IbgdaQpDev& d = qps[size_t(c)];
      d.sq = devPtr(s.sq);
      d.cq = devPtr(s.cq);
      d.dbrec = devPtr(const_cast<uint32_t*>(s.dbrec));
      d.cqDbrec = devPtr(const_cast<uint32_t*>(s.cqDbrec));
      d.uar = devPtr(const_cast<uint64_t*>(s.uar));
      d.state = state + c;
      d.counterOf = counterOf + size_t(c) * kDepth;
      d.scratchAddr = uint64_t(uintptr_t(devPtr(scratch + 8 * c)));
      d.scratchLkey = kScratch;
      d.qpn = s.qpn;
      d.nWqe = d.nCqe = kDepth;
    }
    IbgdaWindowKey wins[kMaxWindows] = {};
    wins[kSrcId % kMaxWindows] = IbgdaWindowKey{kSrcId, kLocalSrc};
    wins[kDstId % kMaxWindows] = IbgdaWindowKey{kDstId, kLocalDst};
    IbgdaRemoteKey remotes[kMaxWindows] = {};
    remotes[kSrcId % kMaxWindows] = IbgdaRemoteKey{uint64_t(uintptr_t(devPtr(srcHost))), kLocalSrc, 0};
    remotes[kDstId % kMaxWindows] = IbgdaRemoteKey{uint64_t(uintptr_t(devPtr(dstHost))), kLocalDst, 0};
    const IbgdaRemoteKey sigRemote{uint64_t(uintptr_t(devPtr(signalsHost))), kSig, 0};
    IbgdaDev id{};
    id.qps = static_cast<IbgdaQpDev*>(upload(qps.data(), qps.size() * sizeof(IbgdaQpDev)));
    id.windows = static_cast<IbgdaWindowKey*>(upload(wins, sizeof wins));
    id.windowRemotes = static_cast<IbgdaRemoteKey*>(upload(remotes, sizeof remotes));
    id.signalRemotes = static_cast<IbgdaRemoteKey*>(upload(&sigRemote, sizeof sigRemote));
    id.maxWindows = kMaxWindows;
    id.maxWqeBytes = 4096;

    dc.rank = 0;
    dc.nRanks = 1;
    dc.lsaRank = 0;
    dc.lsaSize = 1;
    dc.railSize = 1;
    dc.nContexts = kContexts;
    dc.nSignals = kNSignals;
    dc.nCounters = kNCounters;
    dc.nBarriers = 1;
    dc.timeoutNs = gputest::suiteTimeoutNs();
    const uint8_t transport = uint8_t(Transport::Ibgda);
    dc.peerTransport = static_cast<const uint8_t*>(upload(&transport, 1));
    dc.signals = devPtr(signalsHost);
    dc.signalShadows = static_cast<uint64_t*>(dev(kNSignals * 8));
    dc.counters = static_cast<uint64_t*>(dev(kNCounters * 8));
    dc.error = devPtr(recordHost);
    dc.errorClaim = static_cast<uint32_t*>(dev(8));
    dc.abortFlag = dc.errorClaim + 1;
    dc.ibgda = static_cast<const IbgdaDev*>(upload(&id, sizeof id));
    dc.ibgdaAll = 1;

    src = window(kSrcId, devPtr(srcHost));
    dst = window(kDstId, devPtr(dstHost));
    nic.start();
  }
  ~Harness() {
    nic.stop();
    for (void* p : hostBufs) (void)cudaFreeHost(p);
    for (void* p : devBufs) (void)cudaFree(p);
  }

  void* host(size_t bytes) {
    hostBufs.push_back(hostMapped(bytes));
    return hostBufs.back();
  }
  void* dev(size_t bytes) {
    devBufs.push_back(devAlloc(bytes));
    return devBufs.back();
  }
  void* upload(const void* p, size_t bytes) {
    void* d = dev(bytes);
    GPU_CHECK(cudaMemcpy(d, p, bytes, cudaMemcpyHostToDevice));
    return d;
  }
  Window window(uint32_t id, char* base) {
    WindowDev w{};
    w.localBase = base;
    w.bytes = winBytes;
    w.id = id;
    w.lsaSize = 1;
    w.lsaBases = nullptr;
    return Window{static_cast<const WindowDev*>(upload(&w, sizeof w))};
  }
  std::string error() const { return recordHost->state == 2 ? describe(*recordHost) : std::string(); }
};

using NetI = Net<kBackendIbgda>;

// Warp w of CTA b: one put of `chunk` bytes on context (b*kWarps+w) % 4 with a
// SignalInc and a CounterInc on that context's ids.
__global__ void putEveryWarp(DevComm dc, Window dst, Window src, size_t chunk) {
  const int warp = threadIdx.x / 32;
  const size_t id = size_t(blockIdx.x) * kWarps + warp;
  const int ctx = int(id % kContexts);
  NetI net(dc, ctx);
  net.put(teamWorld(dc), 0, dst, id * chunk, src, id * chunk, chunk, SignalInc{uint32_t(ctx)},
          CounterInc{uint32_t(ctx)}, CoopWarp{});
}

// Per warp: putValue of its id with SignalAdd, then a SignalSet of a per-context word.
__global__ void valuesEveryWarp(DevComm dc, Window dst, size_t base) {
  const int warp = threadIdx.x / 32;
  const size_t id = size_t(blockIdx.x) * kWarps + warp;
  const int ctx = int(id % kContexts);
  NetI net(dc, ctx);
  net.putValue(teamWorld(dc), 0, dst, base + id * 8, uint64_t(id + 1), SignalAdd{uint32_t(8 + ctx), 3}, CoopWarp{});
  net.signal(teamWorld(dc), 0, SignalSet{uint32_t(16 + ctx), 0x5151}, CoopWarp{});
}

// Every thread puts `chunk` bytes with a SignalInc and a CounterInc on its
// context: its warp's (a whole warp on one QP: one aggregated post) or, when
// `split`, lane % 4 (groups of 8 lanes per QP).
__global__ void putEveryThread(DevComm dc, Window dst, Window src, size_t chunk, bool split) {
  const size_t id = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int ctx = int((split ? threadIdx.x : threadIdx.x / 32) % kContexts);
  NetI net(dc, ctx);
  net.put(teamWorld(dc), 0, dst, id * chunk, src, id * chunk, chunk, SignalInc{uint32_t(ctx)},
          CounterInc{uint32_t(ctx)}, CoopThread{});
}

// Thread c waits until signal base + c reaches `least`.
__global__ void waitSignalsAtLeast(DevComm dc, uint32_t base, uint64_t least) {
  (void)Net(dc, 0).waitSignal(CoopThread{}, base + threadIdx.x, least);
}

__global__ void waitAndFlush(DevComm dc, uint64_t perCtx, uint64_t counterPerCtx, int* ok) {
  NetI net(dc, blockIdx.x);
  bool good = net.flush(CoopBlock{});
  good = net.waitSignal(CoopBlock{}, blockIdx.x, perCtx) && good;
  good = net.waitCounter(CoopBlock{}, blockIdx.x, counterPerCtx) && good;
  if (threadIdx.x == 0) ok[blockIdx.x] = good ? 1 : 0;
}
}  // namespace

namespace {
// One block per context flushes and waits until its signal and its counter
// reach perCtx; every context must succeed (the NIC's error, if any, says why).
void flushEveryContext(Harness& h, uint64_t perCtx) {
  int* ok = nullptr;
  GPU_CHECK(cudaMallocManaged(&ok, kContexts * sizeof(int)));
  waitAndFlush<<<kContexts, 128>>>(h.dc, perCtx, perCtx, ok);
  GPU_CHECK(cudaGetLastError());  // a launch that failed ran nothing
  GPU_CHECK(cudaDeviceSynchronize());
  INFO(h.error());
  for (int c = 0; c < kContexts; ++c) REQUIRE(ok[c] == 1);
  GPU_CHECK(cudaFree(ok));
}
}  // namespace

TEST_CASE("GPU ibgda: every warp of 132 CTAs puts with signal and counter on 4 contexts through the soft NIC",
          "[gpu][ibgda]") {
  constexpr size_t kChunk = 1000;  // not a multiple of 16: unaligned WQE boundaries
  const size_t total = size_t(kCtas) * kWarps * kChunk;
  Harness h(total);
  for (size_t i = 0; i < total; ++i) h.srcHost[i] = char(gputest::pattern(3, 0, i));
  std::memset(h.dstHost, kPoison, total);
  putEveryWarp<<<kCtas, 32 * kWarps>>>(h.dc, h.dst, h.src, kChunk);
  GPU_CHECK(cudaGetLastError());  // a launch that failed ran nothing
  flushEveryContext(h, uint64_t(kCtas) * kWarps / kContexts);
  for (size_t i = 0; i < total; ++i)
    if (uint8_t(h.dstHost[i]) != gputest::pattern(3, 0, i)) FAIL("byte " << i << " is wrong");
  REQUIRE(h.nic.errors() == 0);
  REQUIRE(h.nic.executed() == 2 * uint64_t(kCtas) * kWarps);  // payload + signal per put
}

TEST_CASE("GPU ibgda: every thread puts (warp-aggregated posting), whole warps and split warps",
          "[gpu][ibgda]") {
  constexpr size_t kChunk = 72;  // not a multiple of 16
  constexpr int kThreads = 256;
  for (bool split : {false, true}) {
    CAPTURE(split);
    const size_t n = size_t(kCtas) * kThreads, total = n * kChunk;
    Harness h(total);
    for (size_t i = 0; i < total; ++i) h.srcHost[i] = char(gputest::pattern(5, int(split), i));
    std::memset(h.dstHost, kPoison, total);
    putEveryThread<<<kCtas, kThreads>>>(h.dc, h.dst, h.src, kChunk, split);
    GPU_CHECK(cudaGetLastError());  // a launch that failed ran nothing
    const uint64_t perCtx = n / kContexts;
    flushEveryContext(h, perCtx);
    for (size_t i = 0; i < total; ++i)
      if (uint8_t(h.dstHost[i]) != gputest::pattern(5, int(split), i)) FAIL("byte " << i << " is wrong");
    for (int c = 0; c < kContexts; ++c) REQUIRE(h.signalsHost[c] == perCtx);
    REQUIRE(h.nic.errors() == 0);
    REQUIRE(h.nic.executed() == 2 * n);  // payload + signal per put
  }
}

TEST_CASE("GPU ibgda: putValue with SignalAdd and SignalSet from every warp", "[gpu][ibgda]") {
  const size_t n = size_t(kCtas) * kWarps;
  Harness h(n * 8);
  std::memset(h.dstHost, kPoison, n * 8);
  valuesEveryWarp<<<kCtas, 32 * kWarps>>>(h.dc, h.dst, 0);
  GPU_CHECK(cudaGetLastError());  // a launch that failed ran nothing
  int* ok = nullptr;
  GPU_CHECK(cudaMallocManaged(&ok, kContexts * sizeof(int)));
  waitAndFlush<<<kContexts, 32>>>(h.dc, 0, 0, ok);
  GPU_CHECK(cudaGetLastError());  // a launch that failed ran nothing
  // A flush promises the sources, not arrival: wait for the signals that
  // say the values (and the SignalSets) have landed before reading them.
  waitSignalsAtLeast<<<1, kContexts>>>(h.dc, 8, 3 * n / kContexts);
  GPU_CHECK(cudaGetLastError());  // a launch that failed ran nothing
  waitSignalsAtLeast<<<1, kContexts>>>(h.dc, 16, 0x5151);
  GPU_CHECK(cudaGetLastError());  // a launch that failed ran nothing
  GPU_CHECK(cudaDeviceSynchronize());
  INFO(h.error());
  for (int c = 0; c < kContexts; ++c) REQUIRE(ok[c] == 1);
  for (size_t i = 0; i < n; ++i) {
    uint64_t v;
    std::memcpy(&v, h.dstHost + 8 * i, 8);
    REQUIRE(v == i + 1);
  }
  for (int c = 0; c < kContexts; ++c) {
    REQUIRE(h.signalsHost[8 + c] == 3 * n / kContexts);
    REQUIRE(h.signalsHost[16 + c] == 0x5151);
  }
  REQUIRE(h.nic.errors() == 0);
  GPU_CHECK(cudaFree(ok));
}

namespace {
// Through the Comm: GPU ranks sharing the GPU, the soft NIC copying into
// device-memory windows and applying signals in mapped host memory.
__global__ void putEveryWarpTo(DevComm dc, int peer, Window dst, Window src, size_t chunk, size_t puts) {
  const int warp = threadIdx.x / 32;
  const size_t id = size_t(blockIdx.x) * kWarps + warp;
  const int ctx = int(id % kContexts);
  NetI net(dc, ctx);
  net.put(teamWorld(dc), peer, dst, id * chunk, src, id * chunk, chunk, SignalInc{uint32_t(ctx)},
          CounterInc{uint32_t(ctx)}, CoopWarp{});
  net.putValue(teamWorld(dc), peer, dst, puts * chunk + id * 8, uint64_t(id + 1),
               SignalAdd{uint32_t(8 + ctx), 3}, CoopWarp{});
}

// putEveryWarpTo through a PostBatch of `slots` (gin/device/batch.hpp): lanes
// 0-30 put uneven pieces of the warp's chunk, each with a CounterInc (31 per
// warp; an empty piece is a NOP that carries it), then lane 0 alone adds the
// SignalInc (after every lane's piece, as one QP orders them) and the value.
__global__ void putBatchEveryWarpTo(DevComm dc, int peer, Window dst, Window src, size_t chunk, size_t puts,
                                    uint32_t slots) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const size_t id = size_t(blockIdx.x) * kWarps + warp;
  const int ctx = int(id % kContexts);
  NetI net(dc, ctx);
  PostBatch<kBackendIbgda> b(net, teamWorld(dc), peer, slots);
  const auto edge = [&](int l) { return chunk * size_t(l) * size_t(l) / (31 * 31); };
  const size_t o0 = edge(lane < 31 ? lane : 31), o1 = edge(lane < 31 ? lane + 1 : 31);
  b.put(dst, id * chunk + o0, src, id * chunk + o0, o1 - o0, None{}, CounterInc{uint32_t(ctx)}, lane < 31);
  b.signal(SignalInc{uint32_t(ctx)}, lane == 0);
  b.putValue(dst, puts * chunk + id * 8, uint64_t(id + 1), SignalAdd{uint32_t(8 + ctx), 3}, lane == 0);
}

// Thread c: signal base + c reads exactly `value`; counts the matches.
__global__ void exactSignals(DevComm dc, uint32_t base, uint64_t value, int* matches) {
  if (threadIdx.x == 0) *matches = 0;
  __syncthreads();
  if (Net(dc, 0).readSignal(base + threadIdx.x) == value) atomicAdd(matches, 1);
}

CommConfig nicConfig(IbgdaConfig::Device device) {
  CommConfig c = gputest::gpuConfig();
  c.transport = TransportChoice::Ibgda;
  c.ibgda.device = device;
  c.nContexts = kContexts;
  return c;
}

// Every rank puts ctasPerRank(n) x 16 chunks of 1000 bytes (and as many
// values) to the next rank through `device`, n ranks sharing the GPU, then
// checks what it received. batchSlots > 0: through PostBatches of that many
// slots (putBatchEveryWarpTo).
void putsToNextRank(IbgdaConfig::Device device, std::initializer_list<int> rankCounts, int (*ctasPerRank)(int),
                    uint32_t batchSlots = 0) {
  constexpr size_t kChunk = 1000;
  for (int n : rankCounts) {
    const int ctas = ctasPerRank(n);
    const size_t puts = size_t(ctas) * kWarps, total = puts * kChunk + puts * 8;
    if (n > gputest::maxRanks()) continue;
    if (!gputest::queuesFor(n)) {
      WARN(n << " ranks in one process need " << n + 1 << " hardware queues; CUDA_DEVICE_MAX_CONNECTIONS="
             << gputest::hardwareQueues() << " (tests/gpu/processes.cu runs ranks as processes)");
      continue;
    }
    CAPTURE(n);
    REQUIRE_NOTHROW(gputest::runRanksOnStreams(
        n,
        [&](Comm& comm, cudaStream_t st) {
          const int me = comm.rank(), next = (me + 1) % n, prev = (me + n - 1) % n;
          expect(comm.transportTo(next) == Transport::Ibgda, "transport is not ibgda");
          Window src = comm.allocWindow(total), dst = comm.allocWindow(total);
          std::vector<uint8_t> h(total);
          for (size_t i = 0; i < total; ++i) h[i] = gputest::pattern(7, me, i);
          GPU_CHECK(cudaMemcpy(comm.localPointer(src), h.data(), total, cudaMemcpyHostToDevice));
          GPU_CHECK(cudaMemset(comm.localPointer(dst), kPoison, total));
          int* ok = nullptr;
          GPU_CHECK(cudaMalloc(&ok, kContexts * sizeof(int)));
          GPU_CHECK(cudaDeviceSynchronize());
          comm.bootstrap().barrier();
          if (batchSlots > 0)
            putBatchEveryWarpTo<<<ctas, 32 * kWarps, 0, st>>>(comm.devComm(), next, dst, src, kChunk, puts,
                                                              batchSlots);
          else
            putEveryWarpTo<<<ctas, 32 * kWarps, 0, st>>>(comm.devComm(), next, dst, src, kChunk, puts);
          GPU_CHECK(cudaGetLastError());  // a launch that failed ran nothing
          // Every rank's posting kernel is queued before any rank's waiting
          // kernel: two ranks' streams may share a CUDA hardware queue (CUDA
          // assigns queues round-robin as streams are created, so even 32
          // queues get shared once the process has made that many streams),
          // and a posting kernel queued behind a kernel that waits for it never
          // starts (gputest::runRanksOnStreams).
          comm.bootstrap().barrier();
          const uint64_t perCtx = puts / kContexts;
          const uint64_t countersPerCtx = batchSlots > 0 ? 31 * perCtx : perCtx;
          waitAndFlush<<<kContexts, 128, 0, st>>>(comm.devComm(), perCtx, countersPerCtx, ok);
          GPU_CHECK(cudaGetLastError());  // a launch that failed ran nothing
          // flush covers this coop's WQEs only (ibgda's contract): the values
          // have landed once their SignalAdds have.
          waitSignalsAtLeast<<<1, kContexts, 0, st>>>(comm.devComm(), 8, 3 * perCtx);
          GPU_CHECK(cudaGetLastError());  // a launch that failed ran nothing
          try {
            comm.synchronize();
          } catch (const std::exception& e) {
            // Which wait gave up, and where the NIC stood: what a stall report needs.
            IbgdaTransport* ib = CommAccess::ibgda(comm);
            std::string qps;
            if (ib->softNic() && !ib->gpuNic()) {
              for (size_t i = 0; i < ib->nic().nQps(); ++i)
                qps += " " + std::to_string(ib->nic().consumed(int(i))) + (ib->nic().failed(int(i)) ? "!" : "");
              qps += "; waiting for its copies for " + std::to_string(ib->nic().flushingForNs() / 1000000) + " ms";
            }
            std::fprintf(stderr, "rank %d of %d: the NIC (%s) executed %llu WQEs (per QP:%s); %s\n", me, n,
                         ib->nicName().c_str(), (unsigned long long)ib->nicExecuted(), qps.c_str(), e.what());
            throw;
          }
          GPU_CHECK(cudaStreamSynchronize(st));
          int okh[kContexts];
          GPU_CHECK(cudaMemcpy(okh, ok, sizeof okh, cudaMemcpyDeviceToHost));
          for (int c = 0; c < kContexts; ++c) expect(okh[c] == 1, "flush/wait on context " + std::to_string(c));
          comm.bootstrap().barrier();  // every rank's puts have landed (the signals said so)
          GPU_CHECK(cudaMemcpy(h.data(), comm.localPointer(dst), total, cudaMemcpyDeviceToHost));
          for (size_t i = 0; i < puts * kChunk; ++i)
            if (h[i] != gputest::pattern(7, prev, i))
              expect(false, "byte " + std::to_string(i) + " from rank " + std::to_string(prev) + " is wrong");
          for (size_t i = 0; i < puts; ++i) {
            uint64_t v;
            std::memcpy(&v, h.data() + puts * kChunk + 8 * i, 8);
            if (v != i + 1) expect(false, "value " + std::to_string(i) + " is " + std::to_string(v));
          }
          exactSignals<<<1, kContexts, 0, st>>>(comm.devComm(), 8, 3 * perCtx, ok);
          GPU_CHECK(cudaGetLastError());  // a launch that failed ran nothing
          GPU_CHECK(cudaStreamSynchronize(st));
          GPU_CHECK(cudaMemcpy(okh, ok, sizeof(int), cudaMemcpyDeviceToHost));
          expect(okh[0] == kContexts, "SignalAdd totals");
          comm.bootstrap().barrier();
          cudaFree(ok);  // after the barrier: see gpu_common.cuh
          comm.deregisterWindow(src);
          comm.deregisterWindow(dst);
        },
        nicConfig(device)));
  }
}

// Rank 0 puts through the GPU NIC with a corrupted rkey: the NIC answers with
// ConnectX's remote access error CQE, the flush fails, and the Comm reports it.
__global__ void putOnce(DevComm dc, Window dst, Window src, int* ok) {
  NetI net(dc, 0);
  net.put(teamWorld(dc), 0, dst, 0, src, 0, 4096, SignalInc{0}, None{}, CoopBlock{});
  const bool good = net.flush(CoopBlock{});
  if (threadIdx.x == 0) *ok = good ? 1 : 0;
}
}  // namespace

TEST_CASE("GPU ibgda through the Comm: GPU ranks sharing a GPU put to the next rank through the soft NIC",
          "[gpu][ibgda][comm]") {
  // 3 and 4 ranks used to stop now and then: the soft NIC's copies shared
  // CUDA's hardware queues with the kernels waiting for them. The NIC now
  // copies with side-context kernels (gin/host/side_context.hpp), which never
  // queue behind them, but each wait for them takes a time slice of the GPU
  // (milliseconds) while these kernels run. 8 ranks (1056 posting CTAs) ran
  // out of the 20 s timeout while the NIC waited once per signal; it now
  // waits once per pass over its QPs (SoftNic::settle).
  putsToNextRank(IbgdaConfig::Device::Soft, {1, 2, 3, 4, 8}, [](int) { return kCtas; });
}

TEST_CASE("GPU ibgda: the GPU NIC refuses CUDA_DEVICE_MAX_CONNECTIONS=1 with an error that says why",
          "[gpu][ibgda][gpunic]") {
  if (gputest::hardwareQueues() != 1) {
    WARN("runs under CUDA_DEVICE_MAX_CONNECTIONS=1 only");
    return;
  }
  const std::vector<std::string> errs = gintest::rankErrors(1, nicConfig(IbgdaConfig::Device::GpuSoft));
  REQUIRE_THAT(errs[0], Catch::Matchers::ContainsSubstring("CUDA_DEVICE_MAX_CONNECTIONS=1"));
}

TEST_CASE("GPU ibgda through the Comm: GPU ranks sharing a GPU put to the next rank through the GPU NIC",
          "[gpu][ibgda][comm][gpunic]") {
  if (gputest::hardwareQueues() == 1) {
    WARN("the GPU NIC refuses CUDA_DEVICE_MAX_CONNECTIONS=1 (its own case checks that)");
    return;
  }
  // The GPU NIC's rule (docs/design/gpu-nic.md): kernels that post to it
  // leave room on the GPU for its CTAs, which may have to start again after
  // an idle spell. 96 CTAs of 512 threads over all ranks leave room on
  // every Hopper; 132 per rank (the soft NIC case) fill an H100 from 4 ranks on.
  putsToNextRank(IbgdaConfig::Device::GpuSoft, {1, 2, 3, 4, 8}, [](int n) { return 96 / n; });
}

TEST_CASE("GPU ibgda through the Comm: warps post through PostBatches, ranks sharing a GPU, both NICs",
          "[gpu][ibgda][comm][batch]") {
  // 7 slots: reservations close on NOPs after most calls; 1000: clamped to
  // the queue (255), several calls per reservation.
  for (const uint32_t slots : {7u, 1000u}) {
    CAPTURE(slots);
    putsToNextRank(IbgdaConfig::Device::Soft, {1, 3}, [](int) { return kCtas; }, slots);
    if (gputest::hardwareQueues() != 1)
      putsToNextRank(IbgdaConfig::Device::GpuSoft, {1, 3}, [](int n) { return 96 / n; }, slots);
  }
}

namespace {
// Rank 0 puts once through the GPU NIC with the remote key of dst (or the
// local key of src) corrupted where the device code reads it: the NIC
// answers with ConnectX's error CQE, the flush fails, and the Comm reports
// `expected` (the syndrome's text).
void badKeyCase(bool local, const char* expected) {
  if (gputest::hardwareQueues() == 1) {
    WARN("the GPU NIC refuses CUDA_DEVICE_MAX_CONNECTIONS=1 (its own case checks that)");
    return;
  }
  CommConfig cfg = nicConfig(IbgdaConfig::Device::GpuSoft);
  cfg.timeoutNs = 5'000'000'000ull;
  REQUIRE_NOTHROW(gputest::runRanksOnStreams(
      1,
      [&](Comm& comm, cudaStream_t st) {
        Window src = comm.allocWindow(1 << 16), dst = comm.allocWindow(1 << 16);
        IbgdaDev id{};
        GPU_CHECK(cudaMemcpy(&id, CommAccess::ibgda(comm)->dev(), sizeof id, cudaMemcpyDeviceToHost));
        WindowDev wd{};
        GPU_CHECK(cudaMemcpy(&wd, (local ? src : dst).dev, sizeof wd, cudaMemcpyDeviceToHost));
        const uint32_t slot = wd.id % id.maxWindows;
        if (local) {
          IbgdaWindowKey k{};
          GPU_CHECK(cudaMemcpy(&k, id.windows + slot, sizeof k, cudaMemcpyDeviceToHost));
          k.lkey ^= 0x5a5a00u;
          GPU_CHECK(cudaMemcpy(id.windows + slot, &k, sizeof k, cudaMemcpyHostToDevice));
        } else {
          IbgdaRemoteKey rk{};
          GPU_CHECK(cudaMemcpy(&rk, id.windowRemotes + slot, sizeof rk, cudaMemcpyDeviceToHost));
          rk.rkey ^= 0x5a5a00u;
          GPU_CHECK(cudaMemcpy(const_cast<IbgdaRemoteKey*>(id.windowRemotes) + slot, &rk, sizeof rk,
                               cudaMemcpyHostToDevice));
        }
        int* ok = nullptr;
        GPU_CHECK(cudaMallocManaged(&ok, sizeof(int)));
        *ok = -1;
        putOnce<<<1, 64, 0, st>>>(comm.devComm(), dst, src, ok);
        GPU_CHECK(cudaGetLastError());
        GPU_CHECK(cudaStreamSynchronize(st));
        expect(*ok == 0, "the flush after a put with a bad key did not fail");
        bool threw = false;
        try {
          comm.check();
        } catch (const std::exception& e) {
          threw = true;
          const std::string m = e.what();
          expect(m.find(expected) != std::string::npos, "unexpected error: " + m);
        }
        expect(threw, "the Comm did not report the error CQE");
        expect(CommAccess::ibgda(comm)->gpuNic()->errors() == 1, "the GPU NIC did not count one error");
        cudaFree(ok);
      },
      cfg));
}

// Rank 0 posts `posts` puts with SignalInc to rank 1 on context 0 and
// flushes; rank 1 waits for them all. result[rank]: 1 done, 0 a wait or
// flush gave up.
__global__ void postAndWait(DevComm dc, Window dst, Window src, int posts, int* result) {
  NetI net(dc, 0);
  bool good;
  if (dc.rank == 0) {
    for (int i = 0; i < posts; ++i) net.put(teamWorld(dc), 1, dst, 64 * size_t(i % 64), src, 0, 64, SignalInc{0});
    good = net.flush(CoopThread{});
  } else {
    good = net.waitSignal(CoopThread{}, 0, uint64_t(posts));
  }
  result[dc.rank] = good ? 1 : 0;
}
}  // namespace

TEST_CASE("GPU ibgda: the GPU NIC answers a bad rkey with a remote access error CQE", "[gpu][ibgda][gpunic]") {
  badKeyCase(false, "remote access error");
}

TEST_CASE("GPU ibgda: the GPU NIC answers a bad lkey with a local protection error CQE", "[gpu][ibgda][gpunic]") {
  badKeyCase(true, "local protection error");
}

TEST_CASE("GPU ibgda through the Comm: a soft NIC that stops consuming ends every rank's waits with its error",
          "[gpu][ibgda][fault]") {
  if (!gputest::queuesFor(2)) {
    WARN("2 ranks in one process need 3 hardware queues (tests/gpu/processes.cu runs ranks as processes)");
    return;
  }
  // Rank 0's NIC is paused: its kernel fills the send queue (4 times its
  // depth), the wait for room gives up after the 2 s timeout, and that
  // failure stops rank 1's wait for the signals that never come (within a
  // millisecond or so, not after its own timeout of a minute).
  CommConfig cfg = nicConfig(IbgdaConfig::Device::Soft);
  cfg.timeoutNs = 2'000'000'000ull;
  cfg.ibgda.qpDepth = 64;
  std::vector<std::string> msgs(2);
  std::vector<double> stopped(2, 0);
  REQUIRE_NOTHROW(gputest::runRanksOnStreams(
      2,
      [&](Comm& comm, cudaStream_t st) {
        const int me = comm.rank();
        Window src = comm.allocWindow(1 << 16), dst = comm.allocWindow(1 << 16);
        IbgdaTransport* ib = CommAccess::ibgda(comm);
        int* result = nullptr;
        GPU_CHECK(cudaMallocManaged(&result, 2 * sizeof(int)));
        result[0] = result[1] = -1;
        GPU_CHECK(cudaDeviceSynchronize());
        if (me == 0) gin::test::PauseAccess::pause(ib->nic(), true);
        comm.bootstrap().barrier();
        const auto t0 = std::chrono::steady_clock::now();
        // Rank 1's own wait would give up after a minute: only rank 0's
        // failure can end it within the bound below.
        DevComm dc = comm.devComm();
        if (me == 1) dc.timeoutNs = 60'000'000'000ull;
        postAndWait<<<1, 1, 0, st>>>(dc, dst, src, int(4 * ib->config().qpDepth), result);
        GPU_CHECK(cudaGetLastError());
        GPU_CHECK(cudaStreamSynchronize(st));
        stopped[size_t(me)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        expect(result[me] == 0, "rank " + std::to_string(me) + "'s kernel did not give up");
        try {
          comm.check();
        } catch (const std::exception& e) {
          msgs[size_t(me)] = e.what();
        }
        if (me == 0) gin::test::PauseAccess::pause(ib->nic(), false);
        comm.bootstrap().barrier();
        cudaFree(result);
      },
      cfg));
  std::printf("NIC stopped: rank 0 out after %.3f s: %s\nrank 1 out after %.3f s: %s\n", stopped[0],
              msgs[0].c_str(), stopped[1], msgs[1].c_str());
  CHECK_THAT(msgs[0], Catch::Matchers::ContainsSubstring("ibgda"));
  CHECK_THAT(msgs[1], Catch::Matchers::ContainsSubstring("because rank 0 failed first"));
  CHECK(stopped[0] < 2.0 + 3.0);
  CHECK(stopped[1] < 2.0 + 3.0);
}

int main(int argc, char** argv) {
  gputest::widenQueues();  // before CUDA starts
  if (gputest::gpuCount() == 0) return gputest::skipNoGpu("GPU ibgda suite");
  return Catch::Session().run(argc, argv);
}
