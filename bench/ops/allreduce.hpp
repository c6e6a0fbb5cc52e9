// bench/ops/allreduce.hpp — gin-bench allreduce: the ring AllReduce (float sum), next to
// ncclAllReduce on GPUs.
#pragma once

#include "../common.hpp"
#include "../engine.hpp"
#include "../nccl.hpp"

namespace bench {

using gin::Window;

// Sizes: powers of two from MIN to MAX bytes of floats.
std::vector<uint64_t> arSizes(const Options& o, bool gpu) {
  const uint64_t lo = o.sizesGiven ? o.minSize : 4096;
  const uint64_t hi = o.sizesGiven ? o.maxSize : (gpu ? (1ull << 30) : (1ull << 20));
  std::vector<uint64_t> v;
  for (uint64_t b = lo; b <= hi; b *= 2) v.push_back(b / 4 * 4);
  return v;
}

// AllReduces per timed run: enough to amortize launches for small sizes.
int arIters(const Options& o, uint64_t bytes, bool gpu) {
  if (o.iters) return int(o.iters);
  if (!gpu) return bytes <= (64u << 10) ? 20 : 4;
  return bytes <= (1u << 20) ? 200 : bytes <= (64u << 20) ? 50 : 10;
}

// NCCL's bus bandwidth of an AllReduce: bytes x 2 (n - 1) / n / time.
double busBw(uint64_t bytes, int n, double seconds) {
  return seconds > 0 ? double(bytes) * 2.0 * (n - 1) / n / seconds / 1e9 : 0.0;
}

std::string shortPlan(const gin::coll::RingPlan& p) {
  if (p.ll) return fmt("LL16 %ux%u", p.nBlocks, p.blockSize);
  if (p.shot) return fmt("one-shot %ux%u", p.nBlocks, p.blockSize);
  if (p.direct) return fmt("direct %ux%u", p.nBlocks, p.blockSize);
  return fmt("d%u c%s %ux%u s%u %s", p.depth, sizeName(p.chunkBytes).c_str(), p.nBlocks, p.blockSize, p.slots,
             p.bidir ? "bi" : "uni");
}

void runAllReduce(gin::Comm& comm, Engine& e, const Options& o, const Setup& s, Report* rep,
                  const std::vector<std::string>& where) {
  const int me = comm.rank(), n = comm.nRanks();
  const bool gpu = e.gpu();
  const std::vector<uint64_t> sizes = arSizes(o, gpu);
  const uint64_t maxBytes = sizes.back();
  gin::coll::RingWorkspaceConfig wc;
  wc.tmpBytes = gpu ? (32ull << 20) : (1ull << 20);
  wc.maxBlocks = kArMaxBlocks;
  wc.signalBase = kArSignalBase;
  // Room for LL messages up to 1 MiB on GPUs, so GIN_ALLREDUCE_LL_MAX_SIZE can
  // be swept that far; the plan's own limit (1 MiB / nRanks by default) decides.
  if (gpu) wc.llMaxBytes = 1ull << 20;
  const gin::coll::RingWorkspace ws = gin::coll::createRingWorkspace(comm, wc);
  Window send = comm.allocWindow(size_t(maxBytes + kGuard)), recv = comm.allocWindow(size_t(maxBytes + kGuard));
  uint64_t seed = 1;

  std::string ncclReason = ncclSkipReason(o, gpu);
#if GIN_BENCH_NCCL
  NcclSide nccl;
  const bool withNccl = nccl.start(comm, ncclReason, 0, size_t(maxBytes), size_t(maxBytes + kGuard));
  float *ncclSend = static_cast<float*>(nccl.send), *ncclRecv = static_cast<float*>(nccl.recv);
#else
  const bool withNccl = false;
#endif

  // Every rank times its own run; a run counts the smallest time over the
  // ranks (the rank that started last has no start skew). Median over runs.
  auto timeRuns = [&](int iters, const std::function<double(int)>& once) {
    comm.bootstrap().barrier();
    once(std::max(1, iters / 10));  // warm-up
    std::vector<double> runs;
    for (int r = 0; r < kArRuns; ++r) {
      comm.bootstrap().barrier();
      const double t = once(iters);
      const auto all = allGather(comm, t);
      runs.push_back(*std::min_element(all.begin(), all.end()) / iters);
    }
    return runs;
  };
  auto agreeBad = [&](const char* who, uint64_t bytes, uint64_t bad) {
    const auto all = allGather(comm, bad);
    for (int r = 0; r < n; ++r)
      if (all[size_t(r)])
        throw Failure(fmt("allreduce verification failed: %s, %s: rank %d has %" PRIu64
                          " wrong floats or overwritten guard bytes",
                          who, sizeName(bytes).c_str(), r, all[size_t(r)]));
  };

  struct Row {
    uint64_t bytes;
    gin::coll::RingPlan plan;
    int iters;
    std::vector<double> gin, nccl;  // seconds per AllReduce, per run
  };
  std::vector<Row> rows;
  for (uint64_t bytes : sizes) {
    const size_t count = size_t(bytes / 4);
    const gin::coll::RingPlan plan = gin::coll::planRingAllReduce(comm, ws, count, sizeof(float));
    Row row{bytes, plan, arIters(o, bytes, gpu), {}, {}};
    // Verified first, twice (the second call reuses the slots and signals).
    for (int k = 0; k < 2; ++k) {
      ++seed;
      e.arFill(comm.localPointer(send), count, me, seed);
      e.poison(recv, size_t(maxBytes + kGuard));
      comm.bootstrap().barrier();
      (void)e.arRun(ws, plan, send, recv, 1);
      comm.bootstrap().barrier();
      agreeBad("gin ring", bytes, e.arCheck(comm.localPointer(recv), count, n, seed, kGuard));
    }
    row.gin = timeRuns(row.iters, [&](int it) { return e.arRun(ws, plan, send, recv, it); });
#if GIN_BENCH_NCCL
    if (withNccl) {
      auto& ge = static_cast<GpuEngine&>(e);
      ge.copyLocal(ncclSend, comm.localPointer(send), size_t(bytes));
      ge.poisonBytes(ncclRecv, size_t(bytes + kGuard));
      comm.bootstrap().barrier();
      (void)ge.ncclAllReduceTime(nccl.comm, ncclSend, ncclRecv, count, 1);
      agreeBad("ncclAllReduce", bytes, e.arCheck(ncclRecv, count, n, seed, kGuard));
      row.nccl =
          timeRuns(row.iters, [&](int it) { return ge.ncclAllReduceTime(nccl.comm, ncclSend, ncclRecv, count, it); });
    }
#endif
    rows.push_back(std::move(row));
  }
  comm.bootstrap().barrier();
#if GIN_BENCH_NCCL
  nccl.close();
#endif
  comm.deregisterWindow(send);
  comm.deregisterWindow(recv);
  gin::coll::destroyRingWorkspace(comm, ws);
  if (me != 0) return;

  rep->head = headLines(o, s, where);
  rep->method = {
      "gin: gin::coll ring AllReduce (CTRING: ReduceScatter + AllGather over puts into the next rank's temporary "
      "slots),",
      "  float sum, out of place, plan from gin::coll::planRingAllReduce (Hopper auto-tuning + GIN_ALLREDUCE_RING_*",
      "  overrides); plan column: LL16, one-shot or direct with blocks x threads, else the ring's pipeline depth, chunk",
      "  size, blocks x threads, slots per block, AllGather direction",
      gpu ? "launch: one kernel per AllReduce (launchRingAllReduce), ITERS back to back on the rank's stream"
          : "CPU emulation: each rank thread runs the plan's blocks one after another (runRingAllReduce)",
      fmt("timer: %s around ITERS AllReduces; per run the smallest time over the ranks / ITERS; warm-up ITERS/10;",
          timerName(gpu).c_str()),
      fmt("  %d runs, median reported", kArRuns),
      "busBw = bytes x 2 (n - 1) / n / time (NCCL's definition); algBw would be bytes / time",
      "verified first, twice per size: every float equals the exact sum (small integers), guard bytes untouched",
  };
  if (withNccl)
    rep->method.push_back(
        "nccl: ncclAllReduce(float, sum) on the same GPUs, same sizes, same timing, its own cudaMalloc buffers, "
        "verified the same way");
  if (gpu)
    rep->table.header = {"bytes", "gin us", "gin busBw GB/s", "nccl us", "nccl busBw GB/s", "gin/nccl time", "plan"};
  else
    rep->table.header = {"bytes", "us", "busBw GB/s", "plan"};
  J jrows = J::arr();
  for (const Row& r : rows) {
    const double g = median(r.gin), c = withNccl ? median(r.nccl) : 0.0;
    if (gpu)
      rep->table.rows.push_back({sizeName(r.bytes), fmt("%.2f", g * 1e6), fmt("%.2f", busBw(r.bytes, n, g)),
                                 withNccl ? fmt("%.2f", c * 1e6) : std::string("-"),
                                 withNccl ? fmt("%.2f", busBw(r.bytes, n, c)) : std::string("-"),
                                 withNccl && c > 0 ? fmt("%.2f", g / c) : std::string("-"), shortPlan(r.plan)});
    else
      rep->table.rows.push_back(
          {sizeName(r.bytes), fmt("%.2f", g * 1e6), fmt("%.3f", busBw(r.bytes, n, g)), shortPlan(r.plan)});
    J row = J::obj();
    J gr = J::arr();
    for (double x : r.gin) gr.push(J::num(x * 1e6));
    row.set("bytes", double(r.bytes))
        .set("iters", double(r.iters))
        .set("plan", gin::coll::describe(r.plan))
        .set("gin_us", g * 1e6)
        .set("gin_busbw_gbs", busBw(r.bytes, n, g))
        .set("gin_runs_us", std::move(gr));
    if (withNccl) {
      J nr = J::arr();
      for (double x : r.nccl) nr.push(J::num(x * 1e6));
      row.set("nccl_us", c * 1e6).set("nccl_busbw_gbs", busBw(r.bytes, n, c)).set("nccl_runs_us", std::move(nr));
    }
    jrows.push(std::move(row));
  }
  rep->notes.push_back(withNccl ? "nccl: measured (ncclAllReduce on the same GPUs, same sizes)"
                                : "nccl: not measured (" + ncclReason + ")");
  commonJson(*rep, o, s, where);
  rep->json.set("method", J::obj()
                              .set("operation", "gin::coll ring AllReduce, float sum, out of place")
                              .set("runs", double(kArRuns))
                              .set("statistic", "median over runs of the smallest per-rank time / iters")
                              .set("busbw", "bytes * 2 * (n - 1) / n / time")
                              .set("timer", timerName(gpu)));
  rep->json.set("verified", J::boolean(true));
  rep->json.set("results", std::move(jrows));
  rep->json.set("nccl", withNccl ? J::obj().set("measured", J::boolean(true))
                                 : J::obj().set("measured", J::boolean(false)).set("reason", ncclReason));
}

}  // namespace bench
