// allreduce — an in-place float sum AllReduce around the ring, checked
// against the exact sum on every rank. By default the CTRING ring AllReduce
// of gin/device/allreduce.hpp (puts into the next rank's temporary slots,
// pipelined, several blocks, bidirectional AllGather; plan from
// gin::coll::planRingAllReduce); with --baseline the one-piece-at-a-time
// version over gin::p2p send/recv in ring_allreduce.hpp.
//
// Runs on the GPUs when there are some (one thread per GPU), and on CPU ranks
// (threads) otherwise:   allreduce [--ranks N] [--count C] [--cpu] [--baseline]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "../common/thread_ranks.hpp"
#include "gin/gin.hpp"
#include "ring_allreduce.hpp"

namespace {

// Small integers: the float sum is exact whatever the order, so the check is exact.
float input(int rank, size_t i) { return float(int((rank * 7 + i * 13 + (i >> 5)) % 41) - 20); }

#ifdef __CUDACC__
__global__ void allReduceKernel(gin::DevComm dc, gin::p2p::Fifo fifo, gin::Window data, size_t count, float* tmp,
                                size_t tmpElts) {
  gin::p2p::Endpoint ep(gin::Net<gin::kBackendLsa>(dc, 0), fifo);
  ginex::ringAllReduce(gin::CoopBlock{}, ep, data, 0, count, tmp, tmpElts, ginex::Sum{});
}
#endif

// Runs one rank: returns the number of wrong elements.
size_t runRank(gin::Comm& comm, size_t count, bool baseline) {
  const int me = comm.rank(), n = comm.nRanks();
  // Signal ids: the ring AllReduce takes 0..127 (4 x 32 blocks), p2p the top of the range.
  gin::coll::RingWorkspaceConfig wc;
  wc.signalBase = 0;
  wc.tmpBytes = comm.onGpu() ? 32u << 20 : 1u << 20;
  const gin::coll::RingWorkspace ws = gin::coll::createRingWorkspace(comm, wc);
  const gin::coll::RingPlan plan = gin::coll::planRingAllReduce(comm, ws, count, sizeof(float));
  if (me == 0 && !baseline) std::printf("plan: %s\n", gin::coll::describe(plan).c_str());
  gin::p2p::Fifo fifo = gin::p2p::create(comm);  // 8 slots x 128 KiB per connector
  gin::Window data = comm.allocWindow(count * sizeof(float) + 16);
  const size_t tmpElts = 32 << 10;
  std::vector<float> h(count);
  for (size_t i = 0; i < count; ++i) h[i] = input(me, i);
  double ms = 0;
  if (comm.onGpu()) {
#ifdef __CUDACC__
    float* tmp = nullptr;
    cudaMalloc(&tmp, tmpElts * sizeof(float));
    cudaMemcpy(comm.localPointer(data), h.data(), count * sizeof(float), cudaMemcpyHostToDevice);
    cudaDeviceSynchronize();
    comm.bootstrap().barrier();
    const auto t0 = std::chrono::steady_clock::now();
    if (baseline)
      allReduceKernel<<<1, 512>>>(comm.devComm(), fifo, data, count, tmp, tmpElts);
    else
      gin::coll::launchRingAllReduce<float, gin::coll::Sum>(comm, ws, plan, data, 0, data, 0, nullptr);
    comm.synchronize();
    ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    cudaMemcpy(h.data(), comm.localPointer(data), count * sizeof(float), cudaMemcpyDeviceToHost);
    cudaFree(tmp);
#endif
  } else {
    std::vector<float> tmp(tmpElts);
    std::copy(h.begin(), h.end(), static_cast<float*>(comm.localPointer(data)));
    comm.bootstrap().barrier();
    const auto t0 = std::chrono::steady_clock::now();
    if (baseline) {
      gin::p2p::Endpoint ep(gin::Net(comm.devComm(), 0), fifo);
      ginex::ringAllReduce(gin::CoopThread{}, ep, data, 0, count, tmp.data(), tmpElts, ginex::Sum{});
    } else {
      gin::coll::runRingAllReduce<float, gin::coll::Sum>(comm, ws, plan, data, 0, data, 0);
    }
    comm.check();
    ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const float* d = static_cast<const float*>(comm.localPointer(data));
    h.assign(d, d + count);
  }
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    float ref = 0;
    for (int r = 0; r < n; ++r) ref += input(r, i);
    wrong += h[i] != ref;
  }
  std::printf("rank %d: %zu floats summed over %d ranks in %.3f ms: %s\n", me, count, n, ms, wrong ? "WRONG" : "ok");
  comm.bootstrap().barrier();
  comm.deregisterWindow(data);
  gin::p2p::destroy(comm, fifo);
  gin::coll::destroyRingWorkspace(comm, ws);
  return wrong;
}

}  // namespace

int main(int argc, char** argv) {
  int ranks = 0;
  size_t count = (1 << 20) + 3;
  bool cpu = false, baseline = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--ranks" && i + 1 < argc)
      ranks = std::atoi(argv[++i]);
    else if (a == "--count" && i + 1 < argc)
      count = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--cpu")
      cpu = true;
    else if (a == "--baseline")
      baseline = true;
    else {
      std::fprintf(stderr, "usage: %s [--ranks N] [--count C] [--cpu] [--baseline]\n", argv[0]);
      return 2;
    }
  }
  gin::CommConfig cfg;
  const int gpus = cpu ? 0 : gin::cudaDeviceCountOrZero();
  cfg.device = gpus > 0 ? gin::DeviceKind::Gpu : gin::DeviceKind::Cpu;
  if (ranks <= 0) ranks = gpus > 0 ? gpus : 4;
  if (gpus > 0 && ranks > gpus) ranks = gpus;
  std::printf("allreduce (%s): %d ranks on %s, %zu floats\n", baseline ? "p2p baseline" : "ring, CTRING", ranks,
              gpus > 0 ? "GPUs" : "CPU ranks (threads)", count);
  try {
    const int bad =
        examples::runThreadRanks(ranks, cfg, gpus > 0, [&](gin::Comm& comm) { return runRank(comm, count, baseline); });
    std::printf("allreduce: %s\n", bad ? "FAILED" : "every rank holds the exact sum");
    return bad ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce: %s\n", e.what());
    return 1;
  }
}
